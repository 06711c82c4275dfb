"""What the connector needs of a store: the typed calls of :class:`~mooncake_py.Client`
(:class:`KvStore`) or of :class:`~mooncake_py.AsyncClient` (:class:`AsyncKvStore`).

The connector depends on these protocols, not on the client classes, so any object with the
same typed methods (a wrapper adding tracing, a test double of a remote store) serves. Its
existence checks are ``batch_probe_key`` (lease-free) calls; only its loads
(``batch_get_into``) lease, for the length of their copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from mooncake_py.client.results import BatchResult
from mooncake_py.types import ReleaseResult, ReplicateConfig


class KvStore(Protocol):
    """The synchronous store calls the connector makes."""

    def batch_probe_key(self, keys: Sequence[str]) -> BatchResult[bool]: ...

    def batch_get_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> BatchResult[int]: ...

    def batch_put_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> BatchResult[None]: ...

    def attach_kv_session(self, session_id: str, keys: Sequence[str]) -> BatchResult[None]: ...

    def pin_kv_session(self, session_id: str) -> None: ...

    def unpin_kv_session(self, session_id: str) -> None: ...

    def update_kv_session(self, session_id: str, keep_keys: Sequence[str]) -> None: ...

    def close_kv_session(self, session_id: str) -> None: ...

    def release_kv_session(self, session_id: str) -> ReleaseResult: ...


class AsyncKvStore(Protocol):
    """The asyncio store calls the connector makes (the same, as coroutines)."""

    async def batch_probe_key(self, keys: Sequence[str]) -> BatchResult[bool]: ...

    async def batch_get_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> BatchResult[int]: ...

    async def batch_put_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> BatchResult[None]: ...

    async def attach_kv_session(
        self, session_id: str, keys: Sequence[str]
    ) -> BatchResult[None]: ...

    async def pin_kv_session(self, session_id: str) -> None: ...

    async def unpin_kv_session(self, session_id: str) -> None: ...

    async def update_kv_session(self, session_id: str, keep_keys: Sequence[str]) -> None: ...

    async def close_kv_session(self, session_id: str) -> None: ...

    async def release_kv_session(self, session_id: str) -> ReleaseResult: ...
