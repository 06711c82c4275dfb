"""The mooncake-py client: segment hosting, the data plane, and the drop-in store API."""

from .compat import MooncakeDistributedStore
from .compat_async import AsyncMooncakeStore
from .config import ClientConfig

__all__ = ["AsyncMooncakeStore", "ClientConfig", "MooncakeDistributedStore"]
