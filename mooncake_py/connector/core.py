"""The connector's operations, written once for both the synchronous and the asyncio store.

Each operation is a generator ("sans-I/O"): it yields a :data:`StoreCall` (one dataclass per
store call it needs, e.g. :class:`Probe`), and is sent back the store's typed answer (or has
the store's exception thrown into it). :class:`Stepper` runs that exchange one call at a time;
the synchronous connector performs each call on a :class:`~.store_protocol.KvStore` (such as
:class:`~mooncake_py.Client`), the asyncio one awaits the same calls of an
:class:`~.store_protocol.AsyncKvStore` (such as :class:`~mooncake_py.AsyncClient`). The
decisions themselves are the pure functions of :mod:`mooncake_py.connector.planning`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Sequence
from typing import Any, Generic, TypeVar

from mooncake_py.connector.keys import PageKeys
from mooncake_py.connector.planning import (
    Buffer,
    Page,
    SaveResult,
    chunks,
    count_attached,
    loaded_prefix,
    plan_save,
    stored_prefix,
    tally_put,
    write_config,
)
from mooncake_py.errors import ErrorCode, NotFoundError
from mooncake_py.types import ReleaseResult, ReplicateConfig

T = TypeVar("T")
StoreT = TypeVar("StoreT")

DEFAULT_BATCH_PAGES = 256


@dataclasses.dataclass(frozen=True)
class Probe:
    """``batch_probe_key(keys)`` (holds nothing), answered with a ``BatchResult[bool]``."""

    keys: list[str]


@dataclasses.dataclass(frozen=True)
class ReadInto:
    """``batch_get_into(keys, ptrs, sizes)``, answered with a ``BatchResult[int]``."""

    keys: list[str]
    ptrs: list[int]
    sizes: list[int]


@dataclasses.dataclass(frozen=True)
class WriteFrom:
    """``batch_put_from(keys, ptrs, sizes, config)``, answered with a ``BatchResult[None]``."""

    keys: list[str]
    ptrs: list[int]
    sizes: list[int]
    config: ReplicateConfig


@dataclasses.dataclass(frozen=True)
class Attach:
    """``attach_kv_session(session_id, keys)``, answered with a ``BatchResult[None]``."""

    session_id: str
    keys: list[str]


@dataclasses.dataclass(frozen=True)
class SetPin:
    """``pin_kv_session`` / ``unpin_kv_session``, answered with None."""

    session_id: str
    pinned: bool


@dataclasses.dataclass(frozen=True)
class Keep:
    """``update_kv_session(session_id, keep_keys)``, answered with None."""

    session_id: str
    keep_keys: list[str]


@dataclasses.dataclass(frozen=True)
class Close:
    """``close_kv_session(session_id)``, answered with None."""

    session_id: str


@dataclasses.dataclass(frozen=True)
class Release:
    """``release_kv_session(session_id)``, answered with a ``ReleaseResult``."""

    session_id: str


StoreCall = Probe | ReadInto | WriteFrom | Attach | SetPin | Keep | Close | Release
Steps = Generator[StoreCall, Any, T]


class Stepper(Generic[T]):
    """Runs an operation's generator: hands out its calls and feeds back their outcomes.

    Usage: ``while (call := stepper.next_call()) is not None: stepper.outcome = <answer>``,
    then read :attr:`result`. An exception stored in :attr:`outcome` is thrown into the
    operation, which may handle it or let it propagate out of :meth:`next_call`.
    """

    def __init__(self, steps: Steps[T]) -> None:
        self._steps = steps
        self._started = False
        self.outcome: Any = None
        self._result: T | None = None
        self._done = False

    def next_call(self) -> StoreCall | None:
        """The next call to make, or None when the operation has finished."""
        try:
            if not self._started:
                self._started = True
                return next(self._steps)
            if isinstance(self.outcome, BaseException):
                return self._steps.throw(self.outcome)
            return self._steps.send(self.outcome)
        except StopIteration as stop:
            self._result, self._done = stop.value, True
            return None

    @property
    def result(self) -> T:
        """The operation's return value (only once :meth:`next_call` returned None)."""
        if not self._done:
            raise RuntimeError("the operation has not finished")
        return self._result  # type: ignore[return-value]


def _validate_pages(pages: Sequence[Page]) -> None:
    for page in pages:
        if page.size <= 0 or page.ptr <= 0:
            raise ValueError(f"page {page.hash[:12]} needs a positive address and size")


def _unless_unknown(call: StoreCall) -> Steps[bool]:
    """Make a session call: True, or False when the store says SESSION_NOT_FOUND."""
    try:
        yield call
    except NotFoundError as exc:
        if exc.code == ErrorCode.SESSION_NOT_FOUND:
            return False
        raise
    return True


class ConnectorCore:
    """Operations of a KV offload connector over one store client.

    Args:
        keys: how page hashes become store keys (model, rank, prefix).
        batch_pages: most pages per store call; a save stops between such batches when the
            store pushes back.

    Thread-safety: holds no mutable state; operations may run concurrently.
    """

    def __init__(self, keys: PageKeys, batch_pages: int = DEFAULT_BATCH_PAGES) -> None:
        if batch_pages <= 0:
            raise ValueError(f"batch_pages must be positive: {batch_pages}")
        self.keys = keys
        self.batch_pages = batch_pages

    def lookup(self, page_hashes: Sequence[str]) -> Steps[int]:
        """Length of the longest stored prefix of ``page_hashes``, in one ``batch_probe_key``.

        The probe holds nothing (the connector probes without leases and leases only what it
        loads): a page found now may be evicted before a later load, which then reports the
        shorter prefix and the engine recomputes the rest.
        """
        if not page_hashes:
            return 0
        found = yield Probe(self.keys.keys(page_hashes))
        return stored_prefix(found.values)

    def load(
        self, page_hashes: Sequence[str], buffers: Sequence[Buffer], session_id: str | None
    ) -> Steps[int]:
        """Read pages into ``buffers`` with ``batch_get_into``; see ``KVConnector.load``."""
        if len(page_hashes) != len(buffers):
            raise ValueError(f"{len(page_hashes)} pages but {len(buffers)} buffers")
        if not page_hashes:
            return 0
        keys = self.keys.keys(page_hashes)
        sizes = [b.size for b in buffers]
        read = yield ReadInto(keys, [b.ptr for b in buffers], sizes)
        loaded = loaded_prefix(read.codes, read.values, sizes)
        if session_id and loaded:
            yield from self._attach_keys(session_id, keys[:loaded])
        return loaded

    def save(self, pages: Sequence[Page], session_id: str | None) -> Steps[SaveResult]:
        """Write the pages not yet stored; see ``KVConnector.save``."""
        _validate_pages(pages)
        if not pages:
            return SaveResult()
        keys = self.keys.keys(p.hash for p in pages)
        plan = plan_save((yield Probe(keys)).values)
        result = SaveResult(requested=len(pages), present=len(plan.present))
        batches = list(chunks(plan.missing, self.batch_pages))
        for number, batch in enumerate(batches):
            sizes = [pages[i].size for i in batch]
            call = WriteFrom(
                [keys[i] for i in batch],
                [pages[i].ptr for i in batch],
                sizes,
                write_config(len(batch), session_id),
            )
            written = yield call
            remaining = sum(len(later) for later in batches[number + 1 :])
            result = tally_put(result, sizes, written.codes, remaining)
            if result.backpressure:
                break
        if session_id and plan.present:
            attached = yield from self._attach_keys(session_id, [keys[i] for i in plan.present])
            result = dataclasses.replace(result, attached=attached)
        return result

    def attach(self, session_id: str, page_hashes: Sequence[str]) -> Steps[int]:
        """Attach stored pages to a session; returns how many were attached."""
        return (yield from self._attach_keys(session_id, self.keys.keys(page_hashes)))

    def _attach_keys(self, session_id: str, keys: Sequence[str]) -> Steps[int]:
        attached = 0
        for batch in chunks(range(len(keys)), self.batch_pages):
            outcome = yield Attach(session_id, [keys[i] for i in batch])
            attached += count_attached(outcome.codes)
        return attached

    def set_pinned(self, session_id: str, pinned: bool) -> Steps[bool]:
        """Pin or unpin a session; False when the session does not exist (any more).

        A session exists while it has members: once eviction or release took every page it
        is gone, and there is nothing to pin or unpin.
        """
        return (yield from _unless_unknown(SetPin(session_id, pinned)))

    def compact(self, session_id: str, keep_hashes: Sequence[str]) -> Steps[bool]:
        """Shrink a session to the pages in ``keep_hashes``; see ``KVConnector.compact``."""
        call = Keep(session_id, self.keys.keys(keep_hashes))
        return (yield from _unless_unknown(call))

    def end(self, session_id: str, release: bool) -> Steps[ReleaseResult | None]:
        """Close or release a session; see ``KVConnector.end``."""
        if release:
            released: ReleaseResult = yield Release(session_id)
            return released
        yield Close(session_id)
        return None


class ConnectorBase(Generic[StoreT]):
    """What both connectors hold: the store they call and the shared operations.

    Args:
        store: a set-up store (synchronous or asyncio).
        keys: model, rank and prefix of the keys.
        batch_pages: most pages per store call.
    """

    def __init__(
        self, store: StoreT, keys: PageKeys, batch_pages: int = DEFAULT_BATCH_PAGES
    ) -> None:
        self.store = store
        self.core = ConnectorCore(keys, batch_pages)

    @property
    def keys(self) -> PageKeys:
        """How page hashes map to store keys."""
        return self.core.keys
