"""``AsyncMooncakeStore``: the drop-in store API as coroutines, for asyncio serving engines.

Every method of :class:`~mooncake_py.MooncakeDistributedStore` that talks to the master or
moves bytes is here under the same name, signature and return convention, as a coroutine; the
cheap local ones (``get_hostname``, ``health_check``, ``register_buffer``,
``unregister_buffer``) stay plain methods. Calls run on a small dedicated thread pool (see
:class:`~mooncake_py.client.async_api.Offloader`).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

from mooncake_py.types import KvSessionInfo, KvSessionPage, ReleaseResult, ReplicateConfig

from .async_api import DEFAULT_WORKERS, Offloader
from .buffer_handle import BufferHandle
from .compat import MooncakeDistributedStore
from .compat_ranged import AsyncRangedTransfers
from .compat_tasks import AsyncTaskTransfers
from .compat_tensor_async import AsyncTensorCalls
from .compat_tensor_files_async import AsyncTensorFileCalls
from .replica_desc import ReplicaDescriptor


class AsyncMooncakeStore(
    AsyncRangedTransfers, AsyncTaskTransfers, AsyncTensorCalls, AsyncTensorFileCalls, Offloader
):
    """Asyncio twin of :class:`~mooncake_py.MooncakeDistributedStore`.

    Args:
        store: an existing synchronous store to wrap (a new one by default).
        max_workers: threads running calls concurrently.

    Attributes:
        store: the wrapped synchronous store.
    """

    def __init__(
        self, store: MooncakeDistributedStore | None = None, max_workers: int = DEFAULT_WORKERS
    ) -> None:
        super().__init__(max_workers)
        self.store = store or MooncakeDistributedStore()

    async def __aenter__(self) -> AsyncMooncakeStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._run(self.store.close)
        self._shutdown()

    def get_hostname(self) -> str:
        """See :meth:`~mooncake_py.MooncakeDistributedStore.get_hostname`."""
        return self.store.get_hostname()

    def get_offload_rpc_read_count(self) -> int:
        """See :meth:`~mooncake_py.MooncakeDistributedStore.get_offload_rpc_read_count`."""
        return self.store.get_offload_rpc_read_count()

    def health_check(self) -> int:
        """See :meth:`~mooncake_py.MooncakeDistributedStore.health_check`."""
        return self.store.health_check()

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """See :meth:`~mooncake_py.MooncakeDistributedStore.register_buffer`."""
        return self.store.register_buffer(buffer_ptr, size)

    def unregister_buffer(self, buffer_ptr: int) -> int:
        """See :meth:`~mooncake_py.MooncakeDistributedStore.unregister_buffer`."""
        return self.store.unregister_buffer(buffer_ptr)

    async def setup(self, *args: Any, **kwargs: Any) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.setup`."""
        return await self._run(self.store.setup, *args, **kwargs)

    async def setup_dummy(
        self, mem_pool_size: int, local_buffer_size: int, server_address: str
    ) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.setup_dummy`."""
        return await self._run(
            self.store.setup_dummy, mem_pool_size, local_buffer_size, server_address
        )

    async def alloc_from_mem_pool(self, size: int) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.alloc_from_mem_pool`."""
        return await self._run(self.store.alloc_from_mem_pool, size)

    async def close(self) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.close`."""
        return await self._run(self.store.close)

    async def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.put`."""
        return await self._run(self.store.put, key, value, config)

    async def put_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.put_batch`."""
        return await self._run(self.store.put_batch, keys, values, config)

    async def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.put_parts`."""
        return await self._run(self.store.put_parts, key, *parts, config=config)

    async def put_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.put_from`."""
        return await self._run(self.store.put_from, key, buffer_ptr, size, config)

    async def batch_put_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.batch_put_from`."""
        return await self._run(self.store.batch_put_from, keys, buffer_ptrs, sizes, config)

    async def batch_put_from_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Coroutine of
        :meth:`~mooncake_py.MooncakeDistributedStore.batch_put_from_multi_buffers`."""
        return await self._run(
            self.store.batch_put_from_multi_buffers, keys, all_buffer_ptrs, all_sizes, config
        )

    async def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.upsert`."""
        return await self._run(self.store.upsert, key, value, config)

    async def upsert_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.upsert_batch`."""
        return await self._run(self.store.upsert_batch, keys, values, config)

    async def upsert_parts(
        self, key: str, *parts: Any, config: ReplicateConfig | None = None
    ) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.upsert_parts`."""
        return await self._run(self.store.upsert_parts, key, *parts, config=config)

    async def upsert_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.upsert_from`."""
        return await self._run(self.store.upsert_from, key, buffer_ptr, size, config)

    async def batch_upsert_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.batch_upsert_from`."""
        return await self._run(self.store.batch_upsert_from, keys, buffer_ptrs, sizes, config)

    async def get(self, key: str) -> bytes:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.get`."""
        return await self._run(self.store.get, key)

    async def get_batch(self, keys: Sequence[str]) -> list[bytes]:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.get_batch`."""
        return await self._run(self.store.get_batch, keys)

    async def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.get_into`."""
        return await self._run(self.store.get_into, key, buffer_ptr, size)

    async def batch_get_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.batch_get_into`."""
        return await self._run(self.store.batch_get_into, keys, buffer_ptrs, sizes)

    async def batch_get_into_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> list[int]:
        """Coroutine of
        :meth:`~mooncake_py.MooncakeDistributedStore.batch_get_into_multi_buffers`."""
        return await self._run(
            self.store.batch_get_into_multi_buffers,
            keys,
            all_buffer_ptrs,
            all_sizes,
            prefer_alloc_in_same_node,
        )

    async def get_buffer(self, key: str) -> BufferHandle | None:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.get_buffer`."""
        return await self._run(self.store.get_buffer, key)

    async def batch_get_buffer(self, keys: Sequence[str]) -> list[BufferHandle | None]:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.batch_get_buffer`."""
        return await self._run(self.store.batch_get_buffer, keys)

    async def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.get_replica_desc`."""
        return await self._run(self.store.get_replica_desc, key)

    async def batch_get_replica_desc(
        self, keys: Sequence[str]
    ) -> dict[str, list[ReplicaDescriptor]]:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.batch_get_replica_desc`."""
        return await self._run(self.store.batch_get_replica_desc, keys)

    async def is_exist(self, key: str) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.is_exist`."""
        return await self._run(self.store.is_exist, key)

    async def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.batch_is_exist`."""
        return await self._run(self.store.batch_is_exist, keys)

    async def probe_key(self, key: str) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.probe_key`."""
        return await self._run(self.store.probe_key, key)

    async def batch_probe_key(
        self, keys: Sequence[str], policy: str = "none", candidate_size: int = 1
    ) -> list[int]:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.batch_probe_key`."""
        return await self._run(self.store.batch_probe_key, keys, policy, candidate_size)

    async def get_size(self, key: str) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.get_size`."""
        return await self._run(self.store.get_size, key)

    async def remove(self, key: str, force: bool = False) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.remove`."""
        return await self._run(self.store.remove, key, force)

    async def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.batch_remove`."""
        return await self._run(self.store.batch_remove, keys, force)

    async def batch_demote(self, keys: Sequence[str]) -> list[int]:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.batch_demote`."""
        return await self._run(self.store.batch_demote, keys)

    async def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.remove_by_regex`."""
        return await self._run(self.store.remove_by_regex, regex_pattern, force)

    async def remove_all(self, force: bool = False) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.remove_all`."""
        return await self._run(self.store.remove_all, force)

    async def batch_replica_clear(self, keys: Sequence[str], segment_name: str = "") -> list[str]:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.batch_replica_clear`."""
        return await self._run(self.store.batch_replica_clear, keys, segment_name)

    async def attach_kv_session(self, session_id: str, keys: Sequence[str]) -> list[int]:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.attach_kv_session`."""
        return await self._run(self.store.attach_kv_session, session_id, keys)

    async def pin_kv_session(self, session_id: str) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.pin_kv_session`."""
        return await self._run(self.store.pin_kv_session, session_id)

    async def unpin_kv_session(self, session_id: str) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.unpin_kv_session`."""
        return await self._run(self.store.unpin_kv_session, session_id)

    async def update_kv_session(self, session_id: str, keep_keys: Sequence[str]) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.update_kv_session`."""
        return await self._run(self.store.update_kv_session, session_id, keep_keys)

    async def close_kv_session(self, session_id: str) -> int:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.close_kv_session`."""
        return await self._run(self.store.close_kv_session, session_id)

    async def get_kv_session(self, session_id: str) -> KvSessionInfo:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.get_kv_session`."""
        return await self._run(self.store.get_kv_session, session_id)

    async def list_kv_session_keys(
        self, session_id: str, cursor: str = "", limit: int = 1024
    ) -> KvSessionPage:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.list_kv_session_keys`."""
        return await self._run(self.store.list_kv_session_keys, session_id, cursor, limit)

    async def list_kv_sessions(
        self,
        cursor: str = "",
        limit: int = 1024,
        pinned: bool | None = None,
        min_idle_ms: int = 0,
    ) -> tuple[list[KvSessionInfo], str]:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.list_kv_sessions`."""
        return await self._run(self.store.list_kv_sessions, cursor, limit, pinned, min_idle_ms)

    async def release_kv_session(self, session_id: str, all_pages: bool = False) -> ReleaseResult:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.release_kv_session`."""
        return await self._run(self.store.release_kv_session, session_id, all_pages)

    async def release_stale_kv_sessions(
        self, max_idle_ms: int, include_pinned: bool = False
    ) -> ReleaseResult:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.release_stale_kv_sessions`."""
        return await self._run(self.store.release_stale_kv_sessions, max_idle_ms, include_pinned)

    async def release_all_kv_sessions(self, confirm: bool = False) -> ReleaseResult:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.release_all_kv_sessions`."""
        return await self._run(self.store.release_all_kv_sessions, confirm)

    async def release_kv_cache(self, keep_pinned: bool = True) -> ReleaseResult:
        """Coroutine of :meth:`~mooncake_py.MooncakeDistributedStore.release_kv_cache`."""
        return await self._run(self.store.release_kv_cache, keep_pinned)
