"""mooncake-py: a Mooncake-style distributed KV object store for LLM KV-cache offload.

Drop-in for upstream's Python API::

    from mooncake_py import MooncakeDistributedStore, ReplicateConfig
"""

from mooncake_py.client import AsyncMooncakeStore, ClientConfig, MooncakeDistributedStore
from mooncake_py.errors import ErrorCode, MooncakeError
from mooncake_py.types import (
    KvSessionInfo,
    KvSessionPage,
    ObjectDataType,
    ReleaseResult,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncMooncakeStore",
    "ClientConfig",
    "ErrorCode",
    "KvSessionInfo",
    "KvSessionPage",
    "MooncakeDistributedStore",
    "MooncakeError",
    "ObjectDataType",
    "ReleaseResult",
    "ReplicaStatus",
    "ReplicateConfig",
    "SoftPinAction",
    "__version__",
]
