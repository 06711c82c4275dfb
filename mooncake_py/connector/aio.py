"""``AsyncKVConnector``: :class:`~mooncake_py.connector.sync.KVConnector` for asyncio engines.

Same operations, arguments, results and errors, as coroutines over an
:class:`~mooncake_py.AsyncClient` (any :class:`~.store_protocol.AsyncKvStore`); the client
runs each call off the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from mooncake_py.connector.core import (
    Attach,
    Close,
    ConnectorBase,
    Keep,
    Probe,
    ReadInto,
    Release,
    SetPin,
    Stepper,
    Steps,
    StoreCall,
    WriteFrom,
)
from mooncake_py.connector.planning import Buffer, Page, SaveResult
from mooncake_py.connector.store_protocol import AsyncKvStore
from mooncake_py.types import ReleaseResult

T = TypeVar("T")


async def perform_async(store: AsyncKvStore, call: StoreCall) -> object:
    """Make one store call; returns the store's typed answer (exceptions propagate)."""
    match call:
        case Probe(keys):
            return await store.batch_probe_key(keys)
        case ReadInto(keys, ptrs, sizes):
            return await store.batch_get_into(keys, ptrs, sizes)
        case WriteFrom(keys, ptrs, sizes, config):
            return await store.batch_put_from(keys, ptrs, sizes, config)
        case Attach(session_id, keys):
            return await store.attach_kv_session(session_id, keys)
        case SetPin(session_id, True):
            await store.pin_kv_session(session_id)
        case SetPin(session_id, False):
            await store.unpin_kv_session(session_id)
        case Keep(session_id, keep_keys):
            await store.update_kv_session(session_id, keep_keys)
        case Close(session_id):
            await store.close_kv_session(session_id)
        case Release(session_id):
            return await store.release_kv_session(session_id)
        case _:
            raise TypeError(f"not a store call: {call!r}")
    return None


async def run_steps_async(store: AsyncKvStore, steps: Steps[T]) -> T:
    """Run a connector operation against an asyncio store; returns its result."""
    stepper = Stepper(steps)
    while (call := stepper.next_call()) is not None:
        try:
            stepper.outcome = await perform_async(store, call)
        except Exception as exc:  # handed to the operation, which re-raises what it can't use
            stepper.outcome = exc
    return stepper.result


class AsyncKVConnector(ConnectorBase[AsyncKvStore]):
    """Page-level KV offload over an :class:`~mooncake_py.AsyncClient`; see ``KVConnector``.

    Args:
        store: a set-up asyncio store.
        keys: model, rank and prefix of the keys.
        batch_pages: most pages per store call.
    """

    async def lookup(self, page_hashes: Sequence[str]) -> int:
        """Leading stored pages; see ``KVConnector.lookup``."""
        return await run_steps_async(self.store, self.core.lookup(page_hashes))

    async def load(
        self,
        page_hashes: Sequence[str],
        buffers: Sequence[Buffer],
        session_id: str | None = None,
    ) -> int:
        """Leading pages loaded into ``buffers``; see ``KVConnector.load``."""
        steps = self.core.load(page_hashes, buffers, session_id)
        return await run_steps_async(self.store, steps)

    async def save(self, pages: Sequence[Page], session_id: str | None = None) -> SaveResult:
        """Store the missing pages; see ``KVConnector.save`` (back-pressure included)."""
        return await run_steps_async(self.store, self.core.save(pages, session_id))

    async def attach(self, session_id: str, page_hashes: Sequence[str]) -> int:
        """Attach stored pages to a session; see ``KVConnector.attach``."""
        return await run_steps_async(self.store, self.core.attach(session_id, page_hashes))

    async def pin(self, session_id: str) -> bool:
        """Pin a session; False when it no longer exists."""
        return await run_steps_async(self.store, self.core.set_pinned(session_id, True))

    async def unpin(self, session_id: str) -> bool:
        """Unpin a session; False when it no longer exists."""
        return await run_steps_async(self.store, self.core.set_pinned(session_id, False))

    async def compact(self, session_id: str, keep_hashes: Sequence[str]) -> bool:
        """Keep only ``keep_hashes`` in the session; see ``KVConnector.compact``."""
        return await run_steps_async(self.store, self.core.compact(session_id, keep_hashes))

    async def end(self, session_id: str, release: bool = False) -> ReleaseResult | None:
        """Close or release a session; see ``KVConnector.end``."""
        return await run_steps_async(self.store, self.core.end(session_id, release))
