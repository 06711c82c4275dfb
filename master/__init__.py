"""The mooncake-py master: object metadata, segments, allocation, leases and liveness."""

from .config import MasterConfig
from .server import MasterServer
from .service.facade import MasterService

__all__ = ["MasterConfig", "MasterServer", "MasterService"]
