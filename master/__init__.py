"""The mooncake-py master: object metadata, segments, allocation, leases and liveness."""

from mooncake_py.master.config import MasterConfig
from mooncake_py.master.server import MasterServer
from mooncake_py.master.service import MasterService

__all__ = ["MasterConfig", "MasterServer", "MasterService"]
