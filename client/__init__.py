"""The mooncake-py client: segment hosting, the data plane, and the drop-in store API."""

from mooncake_py.client.async_store import AsyncMooncakeStore
from mooncake_py.client.config import ClientConfig
from mooncake_py.client.store import MooncakeDistributedStore

__all__ = ["AsyncMooncakeStore", "ClientConfig", "MooncakeDistributedStore"]
