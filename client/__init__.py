"""The mooncake-py client: segment hosting, the data plane, the typed :class:`Client` and the
drop-in :class:`MooncakeDistributedStore`, each with an asyncio twin."""

from .api import Client
from .async_api import AsyncClient
from .compat import MooncakeDistributedStore
from .compat_async import AsyncMooncakeStore
from .config import ClientConfig
from .results import BatchResult, KeyResult, KvSessionListing, SegmentStatus

__all__ = [
    "AsyncClient",
    "AsyncMooncakeStore",
    "BatchResult",
    "Client",
    "ClientConfig",
    "KeyResult",
    "KvSessionListing",
    "MooncakeDistributedStore",
    "SegmentStatus",
]
