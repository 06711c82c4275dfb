"""``AsyncMooncakeStore``: the store API as coroutines, for asyncio serving engines.

Every method of :class:`MooncakeDistributedStore` that talks to the master or moves bytes is
available here under the same name and signature, as a coroutine. Calls run on a small
dedicated thread pool so the event loop never blocks on a master round trip or a copy; the
blocking parts (gRPC, memcpy of large values, socket I/O) release the GIL, so calls overlap.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from .compat import MooncakeDistributedStore

# Methods offered as coroutines; the cheap local ones (get_hostname, health_check,
# register_buffer, unregister_buffer) stay plain methods.
ASYNC_METHODS = (
    "setup",
    "close",
    "put",
    "put_batch",
    "put_parts",
    "put_from",
    "batch_put_from",
    "upsert",
    "upsert_batch",
    "upsert_parts",
    "upsert_from",
    "batch_upsert_from",
    "get",
    "get_batch",
    "get_into",
    "batch_get_into",
    "get_buffer",
    "batch_get_buffer",
    "is_exist",
    "batch_is_exist",
    "get_size",
    "remove",
    "batch_remove",
    "remove_by_regex",
    "remove_all",
    "attach_kv_session",
    "pin_kv_session",
    "unpin_kv_session",
    "update_kv_session",
    "close_kv_session",
    "get_kv_session",
    "list_kv_session_keys",
    "list_kv_sessions",
    "release_kv_session",
    "release_stale_kv_sessions",
    "release_all_kv_sessions",
    "release_kv_cache",
)
SYNC_METHODS = ("get_hostname", "health_check", "register_buffer", "unregister_buffer")


def _offloaded(name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
    sync_method = getattr(MooncakeDistributedStore, name)

    @functools.wraps(sync_method)
    async def method(self: AsyncMooncakeStore, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        call = functools.partial(getattr(self.store, name), *args, **kwargs)
        return await loop.run_in_executor(self._executor, call)

    return method


def _direct(name: str) -> Callable[..., Any]:
    sync_method = getattr(MooncakeDistributedStore, name)

    @functools.wraps(sync_method)
    def method(self: AsyncMooncakeStore, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.store, name)(*args, **kwargs)

    return method


class AsyncMooncakeStore:
    """Asyncio twin of :class:`MooncakeDistributedStore`.

    Args:
        store: an existing synchronous store to wrap (a new one by default).
        max_workers: threads running calls concurrently.

    Attributes:
        store: the wrapped synchronous store.
    """

    def __init__(self, store: MooncakeDistributedStore | None = None, max_workers: int = 8) -> None:
        self.store = store or MooncakeDistributedStore()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="mooncake-async"
        )

    async def __aenter__(self) -> AsyncMooncakeStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self.store.close)
        self._executor.shutdown(wait=False)


for _name in ASYNC_METHODS:
    setattr(AsyncMooncakeStore, _name, _offloaded(_name))
for _name in SYNC_METHODS:
    setattr(AsyncMooncakeStore, _name, _direct(_name))
