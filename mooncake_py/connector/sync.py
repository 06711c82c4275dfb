"""``KVConnector``: what a serving engine's KV offload layer calls, over the synchronous typed
store (:class:`~mooncake_py.Client`)."""

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
from mooncake_py.connector.store_protocol import KvStore
from mooncake_py.types import ReleaseResult

T = TypeVar("T")


def perform(store: KvStore, call: StoreCall) -> object:
    """Make one store call; returns the store's typed answer (exceptions propagate)."""
    match call:
        case Probe(keys):
            return store.batch_probe_key(keys)
        case ReadInto(keys, ptrs, sizes):
            return store.batch_get_into(keys, ptrs, sizes)
        case WriteFrom(keys, ptrs, sizes, config):
            return store.batch_put_from(keys, ptrs, sizes, config)
        case Attach(session_id, keys):
            return store.attach_kv_session(session_id, keys)
        case SetPin(session_id, True):
            store.pin_kv_session(session_id)
        case SetPin(session_id, False):
            store.unpin_kv_session(session_id)
        case Keep(session_id, keep_keys):
            store.update_kv_session(session_id, keep_keys)
        case Close(session_id):
            store.close_kv_session(session_id)
        case Release(session_id):
            return store.release_kv_session(session_id)
        case _:
            raise TypeError(f"not a store call: {call!r}")
    return None


def run_steps(store: KvStore, steps: Steps[T]) -> T:
    """Run a connector operation against a synchronous store; returns its result."""
    stepper = Stepper(steps)
    while (call := stepper.next_call()) is not None:
        try:
            stepper.outcome = perform(store, call)
        except Exception as exc:  # handed to the operation, which re-raises what it can't use
            stepper.outcome = exc
    return stepper.result


class KVConnector(ConnectorBase[KvStore]):
    """Page-level KV offload over a typed store (:class:`~mooncake_py.Client`).

    The engine hashes its token pages (:func:`~mooncake_py.connector.keys.page_hashes`) and
    calls :meth:`lookup` before prefill, :meth:`load` for the stored prefix, and :meth:`save`
    for the pages it computed. Sessions (one per conversation) tell the store which pages are
    in use: a turn's hits and writes join the conversation's session; a live conversation is
    pinned (:meth:`pin`), an idle one unpinned, a compacted or rolled-back one shrunk to what it
    still uses (:meth:`compact`), a finished one closed or released (:meth:`end`).

    Args:
        store: a set-up store; the buffers named in pages must be registered with it.
        keys: model, rank and prefix of the keys.
        batch_pages: most pages per store call.

    Thread-safety: as safe as the store (which is): the connector holds no mutable state.
    """

    def lookup(self, page_hashes: Sequence[str]) -> int:
        """The number of leading pages stored (one ``batch_probe_key``; misses and errors end
        the prefix). The probe holds nothing: a page may still be evicted before it is loaded,
        and :meth:`load` then reports the shorter prefix."""
        return run_steps(self.store, self.core.lookup(page_hashes))

    def load(
        self,
        page_hashes: Sequence[str],
        buffers: Sequence[Buffer],
        session_id: str | None = None,
    ) -> int:
        """Read each page into its buffer (one ``batch_get_into``).

        Args:
            page_hashes: pages of a prefix, in order (usually the first :meth:`lookup` ones).
            buffers: registered memory per page; ``size`` is the page's exact size.
            session_id: attach the loaded pages to this session (the turn's prefix hits).

        Returns:
            Pages loaded in full from the start. The first miss, error or short read ends
            the prefix: the engine recomputes from there, and buffers after it hold no
            usable data.

        Raises:
            ValueError: the lists differ in length.
            MooncakeError: attaching failed (INVALID_PARAMS, RPC_FAIL).
        """
        return run_steps(self.store, self.core.load(page_hashes, buffers, session_id))

    def save(self, pages: Sequence[Page], session_id: str | None = None) -> SaveResult:
        """Store the pages that are not stored yet (one probe, then ``batch_put_from``).

        Pages are written in order in batches of ``batch_pages``, as KV-cache objects, tagged
        with ``session_id`` when given; pages already stored are attached to the session
        instead. NO_AVAILABLE_HANDLE is back-pressure, not a failure to retry: the save stops
        after that batch, reports ``backpressure`` and the pages it skipped, and the engine
        simply goes on (those pages are recomputed if needed again).

        Raises:
            ValueError: a page has no address or size.
            MooncakeError: attaching failed (INVALID_PARAMS, RPC_FAIL).
        """
        return run_steps(self.store, self.core.save(pages, session_id))

    def attach(self, session_id: str, page_hashes: Sequence[str]) -> int:
        """Attach stored pages to a session (creating it); returns how many were attached."""
        return run_steps(self.store, self.core.attach(session_id, page_hashes))

    def pin(self, session_id: str) -> bool:
        """Protect the session's pages, current and future, from ordinary eviction.

        Pin before saving a turn's new pages when the session exists (e.g. after :meth:`load`
        attached the hits): tagged writes of a pinned session are protected from admission
        on, whereas pages written before the pin are the first eviction candidates until then.

        Returns:
            True, or False when the session has no member left (nothing to pin).

        Raises:
            MooncakeError: INVALID_PARAMS, RPC_FAIL.
        """
        return run_steps(self.store, self.core.set_pinned(session_id, True))

    def unpin(self, session_id: str) -> bool:
        """Make the session's pages ordinary cache again (membership stays); False when the
        session no longer exists."""
        return run_steps(self.store, self.core.set_pinned(session_id, False))

    def compact(self, session_id: str, keep_hashes: Sequence[str]) -> bool:
        """After compaction or rollback: keep only ``keep_hashes`` in the session.

        Nothing is added or deleted; the dropped pages lose this session's protection and
        become ordinary cache (or stay protected by other sessions).

        Returns:
            True; False only when the store reports the session unknown (this store treats
            an unknown session as empty and accepts the call).

        Raises:
            MooncakeError: SESSION_LIMIT_EXCEEDED (keep set too large), INVALID_PARAMS,
                RPC_FAIL.
        """
        return run_steps(self.store, self.core.compact(session_id, keep_hashes))

    def end(self, session_id: str, release: bool = False) -> ReleaseResult | None:
        """End a conversation.

        Args:
            session_id: the conversation's session.
            release: remove the pages no other session holds (an abandoned conversation),
                instead of leaving them cached (a finished one, whose prefix may be reused).

        Returns:
            What the release freed, or None for a close. Closing drops the session's pin along
            with its memberships. Unknown sessions are fine (nothing happens).
        """
        return run_steps(self.store, self.core.end(session_id, release))
