"""``AsyncClient``: the typed :class:`~mooncake_py.Client` as coroutines, for asyncio engines.

Every call of :class:`~mooncake_py.Client` that talks to the master or moves bytes is here
under the same name, arguments, result and exceptions, as a coroutine. Calls run on a small
dedicated thread pool so the event loop never blocks on a master round trip or a copy; the
blocking parts (socket I/O, memcpy of large values, gRPC) release the GIL, so calls overlap.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

import pyarrow as pa

from mooncake_py.types import (
    KvSessionInfo,
    KvSessionPage,
    ProbeLeaseMode,
    QueryTaskResponse,
    ReleaseResult,
    ReplicateConfig,
)

from .api import Client
from .buffer_handle import BufferHandle
from .config import ClientConfig
from .replica_desc import ReplicaDescriptor
from .results import BatchResult, KvSessionListing, SegmentStatus

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_WORKERS = 8


class Offloader:
    """Runs blocking calls on a private thread pool and awaits them.

    Args:
        max_workers: threads running calls concurrently.
        name: thread name prefix.
    """

    def __init__(self, max_workers: int = DEFAULT_WORKERS, name: str = "mooncake-async") -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix=name
        )

    async def _run(self, call: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(call, *args, **kwargs))

    def _shutdown(self) -> None:
        self._executor.shutdown(wait=False)


class AsyncClient(Offloader):
    """Asyncio twin of :class:`~mooncake_py.Client`.

    Build one with ``await AsyncClient.connect(config)`` (joins off the event loop), or wrap
    an existing client with ``AsyncClient(client)``.

    Args:
        client: the joined client to run calls on.
        max_workers: threads running calls concurrently.
    """

    def __init__(self, client: Client, max_workers: int = DEFAULT_WORKERS) -> None:
        super().__init__(max_workers)
        self._client = client

    @classmethod
    async def connect(
        cls, config: ClientConfig | None = None, max_workers: int = DEFAULT_WORKERS
    ) -> AsyncClient:
        """Join the store off the event loop; raises as :class:`~mooncake_py.Client`."""
        loop = asyncio.get_running_loop()
        client = await loop.run_in_executor(None, Client, config)
        return cls(client, max_workers)

    @property
    def client(self) -> Client:
        """The wrapped synchronous client."""
        return self._client

    @property
    def hostname(self) -> str:
        """The name of this client's segment (``host:port``)."""
        return self._client.hostname

    @property
    def master_reachable(self) -> bool:
        """Whether the last heartbeat reached the master."""
        return self._client.master_reachable

    def register_buffer(self, buffer_ptr: int, size: int) -> None:
        """Allow zero-copy calls on a range (local bookkeeping: not a coroutine)."""
        self._client.register_buffer(buffer_ptr, size)

    def unregister_buffer(self, buffer_ptr: int) -> None:
        """Forget a registered buffer (not a coroutine)."""
        self._client.unregister_buffer(buffer_ptr)

    async def close(self) -> None:
        """Leave the store and stop the thread pool."""
        await self._run(self._client.close)
        self._shutdown()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> None:
        """Coroutine of :meth:`~mooncake_py.Client.put`."""
        return await self._run(self._client.put, key, value, config)

    async def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> None:
        """Coroutine of :meth:`~mooncake_py.Client.put_parts`."""
        return await self._run(self._client.put_parts, key, *parts, config=config)

    async def put_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> None:
        """Coroutine of :meth:`~mooncake_py.Client.put_from`."""
        return await self._run(self._client.put_from, key, buffer_ptr, size, config)

    async def put_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> BatchResult[None]:
        """Coroutine of :meth:`~mooncake_py.Client.put_batch`."""
        return await self._run(self._client.put_batch, keys, values, config)

    async def batch_put_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> BatchResult[None]:
        """Coroutine of :meth:`~mooncake_py.Client.batch_put_from`."""
        return await self._run(self._client.batch_put_from, keys, buffer_ptrs, sizes, config)

    async def batch_put_from_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        config: ReplicateConfig | None = None,
    ) -> BatchResult[None]:
        """Coroutine of :meth:`~mooncake_py.Client.batch_put_from_multi_buffers`."""
        return await self._run(
            self._client.batch_put_from_multi_buffers, keys, all_buffer_ptrs, all_sizes, config
        )

    async def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> None:
        """Coroutine of :meth:`~mooncake_py.Client.upsert`."""
        return await self._run(self._client.upsert, key, value, config)

    async def upsert_parts(
        self, key: str, *parts: Any, config: ReplicateConfig | None = None
    ) -> None:
        """Coroutine of :meth:`~mooncake_py.Client.upsert_parts`."""
        return await self._run(self._client.upsert_parts, key, *parts, config=config)

    async def upsert_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> None:
        """Coroutine of :meth:`~mooncake_py.Client.upsert_from`."""
        return await self._run(self._client.upsert_from, key, buffer_ptr, size, config)

    async def upsert_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> BatchResult[None]:
        """Coroutine of :meth:`~mooncake_py.Client.upsert_batch`."""
        return await self._run(self._client.upsert_batch, keys, values, config)

    async def batch_upsert_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> BatchResult[None]:
        """Coroutine of :meth:`~mooncake_py.Client.batch_upsert_from`."""
        return await self._run(self._client.batch_upsert_from, keys, buffer_ptrs, sizes, config)

    async def get(self, key: str) -> bytes:
        """Coroutine of :meth:`~mooncake_py.Client.get`."""
        return await self._run(self._client.get, key)

    async def get_batch(self, keys: Sequence[str]) -> BatchResult[bytes]:
        """Coroutine of :meth:`~mooncake_py.Client.get_batch`."""
        return await self._run(self._client.get_batch, keys)

    async def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Coroutine of :meth:`~mooncake_py.Client.get_into`."""
        return await self._run(self._client.get_into, key, buffer_ptr, size)

    async def batch_get_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> BatchResult[int]:
        """Coroutine of :meth:`~mooncake_py.Client.batch_get_into`."""
        return await self._run(self._client.batch_get_into, keys, buffer_ptrs, sizes)

    async def batch_get_into_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> BatchResult[int]:
        """Coroutine of :meth:`~mooncake_py.Client.batch_get_into_multi_buffers`."""
        return await self._run(
            self._client.batch_get_into_multi_buffers,
            keys,
            all_buffer_ptrs,
            all_sizes,
            prefer_alloc_in_same_node,
        )

    async def get_buffer(self, key: str) -> pa.Buffer:
        """Coroutine of :meth:`~mooncake_py.Client.get_buffer`."""
        return await self._run(self._client.get_buffer, key)

    async def batch_get_buffer(self, keys: Sequence[str]) -> BatchResult[pa.Buffer]:
        """Coroutine of :meth:`~mooncake_py.Client.batch_get_buffer`."""
        return await self._run(self._client.batch_get_buffer, keys)

    async def get_buffer_handle(self, key: str) -> BufferHandle:
        """Coroutine of :meth:`~mooncake_py.Client.get_buffer_handle`."""
        return await self._run(self._client.get_buffer_handle, key)

    async def batch_get_buffer_handle(self, keys: Sequence[str]) -> BatchResult[BufferHandle]:
        """Coroutine of :meth:`~mooncake_py.Client.batch_get_buffer_handle`."""
        return await self._run(self._client.batch_get_buffer_handle, keys)

    async def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        """Coroutine of :meth:`~mooncake_py.Client.get_replica_desc`."""
        return await self._run(self._client.get_replica_desc, key)

    async def batch_get_replica_desc(
        self, keys: Sequence[str]
    ) -> BatchResult[list[ReplicaDescriptor]]:
        """Coroutine of :meth:`~mooncake_py.Client.batch_get_replica_desc`."""
        return await self._run(self._client.batch_get_replica_desc, keys)

    async def is_exist(self, key: str) -> bool:
        """Coroutine of :meth:`~mooncake_py.Client.is_exist`."""
        return await self._run(self._client.is_exist, key)

    async def batch_is_exist(self, keys: Sequence[str]) -> BatchResult[bool]:
        """Coroutine of :meth:`~mooncake_py.Client.batch_is_exist`."""
        return await self._run(self._client.batch_is_exist, keys)

    async def probe_key(self, key: str) -> bool:
        """Coroutine of :meth:`~mooncake_py.Client.probe_key`."""
        return await self._run(self._client.probe_key, key)

    async def batch_probe_key(
        self,
        keys: Sequence[str],
        lease_mode: ProbeLeaseMode = ProbeLeaseMode.NONE,
        candidate_size: int = 1,
    ) -> BatchResult[bool]:
        """Coroutine of :meth:`~mooncake_py.Client.batch_probe_key`."""
        return await self._run(self._client.batch_probe_key, keys, lease_mode, candidate_size)

    async def get_size(self, key: str) -> int:
        """Coroutine of :meth:`~mooncake_py.Client.get_size`."""
        return await self._run(self._client.get_size, key)

    async def remove(self, key: str, force: bool = False) -> None:
        """Coroutine of :meth:`~mooncake_py.Client.remove`."""
        return await self._run(self._client.remove, key, force)

    async def batch_remove(self, keys: Sequence[str], force: bool = False) -> BatchResult[None]:
        """Coroutine of :meth:`~mooncake_py.Client.batch_remove`."""
        return await self._run(self._client.batch_remove, keys, force)

    async def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Coroutine of :meth:`~mooncake_py.Client.remove_by_regex`."""
        return await self._run(self._client.remove_by_regex, regex_pattern, force)

    async def remove_all(self, force: bool = False) -> int:
        """Coroutine of :meth:`~mooncake_py.Client.remove_all`."""
        return await self._run(self._client.remove_all, force)

    async def batch_demote(self, keys: Sequence[str]) -> BatchResult[None]:
        """Coroutine of :meth:`~mooncake_py.Client.batch_demote`."""
        return await self._run(self._client.batch_demote, keys)

    async def batch_replica_clear(self, keys: Sequence[str], segment_name: str = "") -> list[str]:
        """Coroutine of :meth:`~mooncake_py.Client.batch_replica_clear`."""
        return await self._run(self._client.batch_replica_clear, keys, segment_name)

    async def create_copy_task(self, key: str, targets: Sequence[str]) -> tuple[int, int]:
        """Coroutine of :meth:`~mooncake_py.Client.create_copy_task`."""
        return await self._run(self._client.create_copy_task, key, targets)

    async def create_move_task(self, key: str, source: str, target: str) -> tuple[int, int]:
        """Coroutine of :meth:`~mooncake_py.Client.create_move_task`."""
        return await self._run(self._client.create_move_task, key, source, target)

    async def query_task(self, task_id: tuple[int, int]) -> QueryTaskResponse:
        """Coroutine of :meth:`~mooncake_py.Client.query_task`."""
        return await self._run(self._client.query_task, task_id)

    async def attach_kv_session(self, session_id: str, keys: Sequence[str]) -> BatchResult[None]:
        """Coroutine of :meth:`~mooncake_py.Client.attach_kv_session`."""
        return await self._run(self._client.attach_kv_session, session_id, keys)

    async def pin_kv_session(self, session_id: str) -> None:
        """Coroutine of :meth:`~mooncake_py.Client.pin_kv_session`."""
        return await self._run(self._client.pin_kv_session, session_id)

    async def unpin_kv_session(self, session_id: str) -> None:
        """Coroutine of :meth:`~mooncake_py.Client.unpin_kv_session`."""
        return await self._run(self._client.unpin_kv_session, session_id)

    async def update_kv_session(self, session_id: str, keep_keys: Sequence[str]) -> None:
        """Coroutine of :meth:`~mooncake_py.Client.update_kv_session`."""
        return await self._run(self._client.update_kv_session, session_id, keep_keys)

    async def close_kv_session(self, session_id: str) -> None:
        """Coroutine of :meth:`~mooncake_py.Client.close_kv_session`."""
        return await self._run(self._client.close_kv_session, session_id)

    async def get_kv_session(self, session_id: str) -> KvSessionInfo:
        """Coroutine of :meth:`~mooncake_py.Client.get_kv_session`."""
        return await self._run(self._client.get_kv_session, session_id)

    async def list_kv_session_keys(
        self, session_id: str, cursor: str = "", limit: int = 1024
    ) -> KvSessionPage:
        """Coroutine of :meth:`~mooncake_py.Client.list_kv_session_keys`."""
        return await self._run(self._client.list_kv_session_keys, session_id, cursor, limit)

    async def list_kv_sessions(
        self,
        cursor: str = "",
        limit: int = 1024,
        pinned: bool | None = None,
        min_idle_ms: int = 0,
    ) -> KvSessionListing:
        """Coroutine of :meth:`~mooncake_py.Client.list_kv_sessions`."""
        return await self._run(self._client.list_kv_sessions, cursor, limit, pinned, min_idle_ms)

    async def release_kv_session(self, session_id: str, all_pages: bool = False) -> ReleaseResult:
        """Coroutine of :meth:`~mooncake_py.Client.release_kv_session`."""
        return await self._run(self._client.release_kv_session, session_id, all_pages)

    async def release_stale_kv_sessions(
        self, max_idle_ms: int, include_pinned: bool = False
    ) -> ReleaseResult:
        """Coroutine of :meth:`~mooncake_py.Client.release_stale_kv_sessions`."""
        return await self._run(self._client.release_stale_kv_sessions, max_idle_ms, include_pinned)

    async def release_all_kv_sessions(self, confirm: bool = False) -> ReleaseResult:
        """Coroutine of :meth:`~mooncake_py.Client.release_all_kv_sessions`."""
        return await self._run(self._client.release_all_kv_sessions, confirm)

    async def release_kv_cache(self, keep_pinned: bool = True) -> ReleaseResult:
        """Coroutine of :meth:`~mooncake_py.Client.release_kv_cache`."""
        return await self._run(self._client.release_kv_cache, keep_pinned)

    async def stats(self) -> dict[str, int]:
        """Coroutine of :meth:`~mooncake_py.Client.stats`."""
        return await self._run(self._client.stats)

    async def segments(self) -> list[SegmentStatus]:
        """Coroutine of :meth:`~mooncake_py.Client.segments`."""
        return await self._run(self._client.segments)
