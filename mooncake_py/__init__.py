"""mooncake-py: a Mooncake-style distributed KV object store for LLM KV-cache offload.

The typed API raises one exception class per family of error codes and returns per-key
results for batches::

    from mooncake_py import Client, ClientConfig

    with Client(ClientConfig(master_server_addr="127.0.0.1:50051")) as client:
        client.put("key", b"value")
        assert client.get("key") == b"value"

The drop-in for upstream's Python API keeps its int / bytes / list conventions::

    from mooncake_py import MooncakeDistributedStore, ReplicateConfig
"""

from mooncake_py.client import (
    AsyncClient,
    AsyncMooncakeStore,
    BatchResult,
    Client,
    ClientConfig,
    KeyResult,
    KvSessionListing,
    MooncakeDistributedStore,
    SegmentStatus,
)
from mooncake_py.client.buffer_handle import BufferHandle
from mooncake_py.client.compat_standalone import MooncakeHostMemAllocator
from mooncake_py.client.replica_desc import (
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    ReplicaDescriptor,
)
from mooncake_py.client.tensor_parallel import ParallelAxis, ReadTarget, TensorParallelism
from mooncake_py.errors import (
    AlreadyExistsError,
    AuthenticationError,
    BusyError,
    ErrorCode,
    InternalError,
    InvalidParamsError,
    LeaseExpiredError,
    LimitExceededError,
    MooncakeError,
    NoSpaceError,
    NotFoundError,
    NotSupportedError,
    PermissionDeniedError,
    TransferError,
    UnavailableError,
)
from mooncake_py.numa import bind_to_numa_node
from mooncake_py.types import (
    KvSessionInfo,
    KvSessionPage,
    ObjectDataType,
    ProbeLeaseMode,
    QueryTaskResponse,
    ReleaseResult,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
    TaskStatus,
    TaskType,
)

__version__ = "0.1.0"

__all__ = [
    "ParallelAxis",
    "ReadTarget",
    "TensorParallelism",
    "MooncakeHostMemAllocator",
    "AlreadyExistsError",
    "AsyncClient",
    "AsyncMooncakeStore",
    "AuthenticationError",
    "BatchResult",
    "BufferHandle",
    "BusyError",
    "Client",
    "ClientConfig",
    "Descriptor",
    "DiskDescriptor",
    "ErrorCode",
    "InternalError",
    "InvalidParamsError",
    "KeyResult",
    "KvSessionInfo",
    "KvSessionListing",
    "KvSessionPage",
    "LeaseExpiredError",
    "LimitExceededError",
    "MemoryDescriptor",
    "MooncakeDistributedStore",
    "MooncakeError",
    "NoSpaceError",
    "NotFoundError",
    "NotSupportedError",
    "PermissionDeniedError",
    "ObjectDataType",
    "ProbeLeaseMode",
    "ReleaseResult",
    "ReplicaDescriptor",
    "QueryTaskResponse",
    "ReplicaStatus",
    "TaskStatus",
    "TaskType",
    "ReplicateConfig",
    "SegmentStatus",
    "SoftPinAction",
    "TransferError",
    "UnavailableError",
    "__version__",
    "bind_to_numa_node",
]
