"""``AsyncKVConnector``: :class:`~mooncake_py.connector.sync.KVConnector` for asyncio engines.

Same operations, arguments, results and errors, as coroutines over
:class:`~mooncake_py.AsyncMooncakeStore`; the store runs each call off the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from mooncake_py.client.compat_async import AsyncMooncakeStore
from mooncake_py.connector.core import ConnectorBase, Stepper, Steps
from mooncake_py.connector.planning import Buffer, Page, SaveResult
from mooncake_py.types import ReleaseResult

T = TypeVar("T")


async def run_steps_async(store: Any, steps: Steps[T]) -> T:
    """Run a connector operation against an asyncio store; returns its result."""
    stepper = Stepper(steps)
    while (call := stepper.next_call()) is not None:
        try:
            stepper.outcome = await getattr(store, call.method)(*call.args)
        except Exception as exc:  # handed to the operation, which re-raises what it can't use
            stepper.outcome = exc
    return stepper.result


class AsyncKVConnector(ConnectorBase[AsyncMooncakeStore]):
    """Page-level KV offload over an :class:`AsyncMooncakeStore`; see ``KVConnector``.

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
