"""The data-path calls of the master facade: put and upsert start, end and revoke, with the
per-key helpers every data-path call shares (one hold of the lock per slice, expired read leases
ended first).

:class:`WriteCalls` is a base of :class:`~mooncake_py.master.service.facade.MasterService`; it
works on the attributes the facade sets up (declared below for the type checker). A batch runs
as a sliced operation (:mod:`.slices`); a single-key call runs the same checks and the same step
directly under the lock, without the slicing machinery, since one key is one short step.

Thread-safety: as the facade's: every call takes the context's one lock (a sliced one once per
slice).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from mooncake_py.errors import ErrorCode
from mooncake_py.types import PutStartResult, ReplicateConfig

from ..config import MasterConfig
from ..state.objects import PendingSoftPin, valid_key
from ..state.store import StoreState
from .batch_start import BatchStart, flat_start_applies
from .slices import Steps, drive, map_in_slices, map_runs_in_slices
from .writes import WritePath

MAX_REPLICA_NUM = 64
# A value can be no larger than a segment; this bound only rejects nonsense early.
MAX_VALUE_BYTES = 1 << 50


class WriteCalls:
    """Put, upsert, end and revoke (single and batch), and the per-key slicing helpers.

    Attributes (set by the facade):
        config: the master configuration (``max_batch_keys``).
    """

    config: MasterConfig
    _lock: threading.Lock
    _state: StoreState
    _clock: Callable[[], float]
    _resolve_tenant: Callable[[str], str | None]
    _writes: WritePath
    _batch_start: BatchStart

    def put_start(
        self,
        client_id: str,
        tenant: str,
        key: str,
        size: int,
        config: ReplicateConfig,
        attempt_id: int = 0,
    ) -> PutStartResult:
        """Reserve replicas for a new object; see :meth:`batch_put_start`."""
        return self._start_one(client_id, tenant, key, size, config, False, attempt_id)

    def batch_put_start(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        config: ReplicateConfig,
        attempt_id: int = 0,
    ) -> list[PutStartResult]:
        """Reserve replicas for each key; the object stays invisible until PutEnd.

        Per key: OK with PROCESSING replica descriptors; OBJECT_ALREADY_EXISTS when the key has
        a readable replica or a write younger than the discard timeout (first writer wins);
        NO_AVAILABLE_HANDLE when no segment can hold it even after evicting what may be
        evicted; INVALID_PARAMS for a bad key or size. A malformed request (length mismatch,
        ``group_ids`` not one per key, bad config, too many keys) fails every key with
        INVALID_PARAMS. A call repeated with the same non-zero ``attempt_id`` by the same
        client (its answer was lost) gets, per key, the write the first attempt started.

        Complexity: O(keys × placement), plus bounded eviction when memory is full.
        """
        return drive(
            self.batch_put_start_sliced(client_id, tenant, keys, sizes, config, attempt_id)
        )

    def batch_put_start_sliced(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        config: ReplicateConfig,
        attempt_id: int = 0,
    ) -> Steps[list[PutStartResult]]:
        """:meth:`batch_put_start` as a sliced operation (a large batch lets others in)."""
        return (
            yield from self._start_writes(client_id, tenant, keys, sizes, config, False, attempt_id)
        )

    def upsert_start(
        self,
        client_id: str,
        tenant: str,
        key: str,
        size: int,
        config: ReplicateConfig,
        attempt_id: int = 0,
    ) -> PutStartResult:
        """Reserve replicas to create or replace one object; see :meth:`batch_upsert_start`."""
        return self._start_one(client_id, tenant, key, size, config, True, attempt_id)

    def batch_upsert_start(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        config: ReplicateConfig,
        attempt_id: int = 0,
    ) -> list[PutStartResult]:
        """Create or replace each key (finish with PutEnd / PutRevoke, as for a put).

        Per key, beyond :meth:`batch_put_start`'s codes: INVALID_PARAMS when ``group_ids``
        would move an existing object to another group. Readers in flight finish on the old
        bytes (see :mod:`.writes`). An unfinished put or upsert of the key is preempted.
        """
        return drive(
            self.batch_upsert_start_sliced(client_id, tenant, keys, sizes, config, attempt_id)
        )

    def batch_upsert_start_sliced(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        config: ReplicateConfig,
        attempt_id: int = 0,
    ) -> Steps[list[PutStartResult]]:
        """:meth:`batch_upsert_start` as a sliced operation."""
        return (
            yield from self._start_writes(client_id, tenant, keys, sizes, config, True, attempt_id)
        )

    def _start_writes(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        config: ReplicateConfig,
        upsert: bool,
        attempt_id: int,
    ) -> Steps[list[PutStartResult]]:
        admitted = self._admit_writes(tenant, len(keys), len(sizes), config)
        if admitted is None:
            return [PutStartResult(ErrorCode.INVALID_PARAMS)] * len(keys)
        scope, pin = admitted
        if flat_start_applies(config, upsert):
            start_run = self._batch_start.start_run

            def run(first: int, stop: int, now: float) -> list[PutStartResult]:
                return start_run(
                    client_id, scope, keys, sizes, config, pin, attempt_id, first, stop, now
                )

            return (yield from map_runs_in_slices(self._lock, len(keys), self._begin_slice, run))
        groups, tags = config.group_ids, config.kv_sessions
        start = self._writes.start

        def step(i: int, key: str, now: float) -> PutStartResult:
            size = sizes[i]
            if not valid_key(key) or not 0 < size <= MAX_VALUE_BYTES:
                return PutStartResult(ErrorCode.INVALID_PARAMS)
            group = groups[i] if groups is not None else None
            key_tags = tags[i] if tags is not None else []
            return start(
                client_id, scope, key, size, config, group, key_tags, pin, now, upsert, attempt_id
            )

        return (yield from map_in_slices(self._lock, keys, self._begin_slice, step))

    def _start_one(
        self,
        client_id: str,
        tenant: str,
        key: str,
        size: int,
        config: ReplicateConfig,
        upsert: bool,
        attempt_id: int,
    ) -> PutStartResult:
        """:meth:`_start_writes` of one key, without the slicing machinery (the hot path of
        single puts: the same checks and the same answers as a batch of one)."""
        admitted = self._admit_writes(tenant, 1, 1, config)
        if admitted is None or not valid_key(key) or not 0 < size <= MAX_VALUE_BYTES:
            return PutStartResult(ErrorCode.INVALID_PARAMS)
        scope, pin = admitted
        groups, tags = config.group_ids, config.kv_sessions
        group = groups[0] if groups is not None else None
        key_tags = tags[0] if tags is not None else []
        with self._lock:
            now = self._begin_slice()
            return self._writes.start(
                client_id, scope, key, size, config, group, key_tags, pin, now, upsert, attempt_id
            )

    def _admit_writes(
        self, tenant: str, keys: int, sizes: int, config: ReplicateConfig
    ) -> tuple[str, PendingSoftPin] | None:
        """The resolved tenant and soft pin of a write call of ``keys`` keys and ``sizes``
        sizes, or None when the call as a whole is malformed (every key INVALID_PARAMS):
        counts that disagree, too many keys, ``group_ids`` or ``kv_sessions`` not one per
        key, a replica count out of range, an invalid soft pin. O(1)."""
        resolved = self._resolve_tenant(tenant)
        groups, tags = config.group_ids, config.kv_sessions
        if (
            resolved is None
            or keys != sizes
            or keys > self.config.max_batch_keys
            or (groups is not None and len(groups) != keys)
            or (tags is not None and len(tags) != keys)
            or not 1 <= config.replica_num <= MAX_REPLICA_NUM
        ):
            return None
        pin = self._writes.resolve_soft_pin(config)
        return None if pin is None else (resolved, pin)

    def put_end(self, client_id: str, tenant: str, key: str, write_id: int = 0) -> ErrorCode:
        """Make a written object visible; see :meth:`batch_put_end`."""
        return self._end_one(client_id, tenant, key, write_id, self._writes.end)

    def batch_put_end(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        write_ids: Sequence[int] = (),
    ) -> list[ErrorCode]:
        """Mark each key's in-flight replicas COMPLETE, atomically making the object readable.

        Args:
            write_ids: per key, the write id its start answered (empty, or 0 for a key: the
                client's write of that key in flight, whichever it is).

        Per key: OK (also when every replica is already COMPLETE, so a retry is harmless);
        OBJECT_NOT_FOUND; ILLEGAL_CLIENT when another client started the write; INVALID_WRITE
        when nothing is in flight or the write was preempted by a later one (its memory is
        then given back). Ends upserts too. Every key INVALID_PARAMS when ``write_ids`` is
        neither empty nor as long as ``keys``.
        """
        return drive(self.batch_put_end_sliced(client_id, tenant, keys, write_ids))

    def batch_put_end_sliced(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        write_ids: Sequence[int] = (),
    ) -> Steps[list[ErrorCode]]:
        """:meth:`batch_put_end` as a sliced operation."""
        if write_ids and len(write_ids) == len(keys):
            resolved = self._resolve_tenant(tenant)
            if resolved is not None and self._batch_size_ok(keys) and _ids_ok(write_ids):
                # The common end (every key names its write): runs of keys in one loop.
                scope: str = resolved
                end_run = self._writes.end_run

                def run(first: int, stop: int, now: float) -> list[ErrorCode]:
                    return end_run(client_id, scope, keys, write_ids, first, stop, now)

                return (
                    yield from map_runs_in_slices(self._lock, len(keys), self._begin_slice, run)
                )
        return (yield from self._per_write(client_id, tenant, keys, write_ids, self._writes.end))

    def put_revoke(self, client_id: str, tenant: str, key: str, write_id: int = 0) -> ErrorCode:
        """Abandon a write; see :meth:`batch_put_revoke`."""
        return self._end_one(client_id, tenant, key, write_id, self._writes.revoke)

    def batch_put_revoke(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        write_ids: Sequence[int] = (),
    ) -> list[ErrorCode]:
        """Free each key's in-flight replicas; an object left with none disappears.

        Per key: OK; OBJECT_NOT_FOUND; ILLEGAL_CLIENT; INVALID_WRITE when nothing is in flight
        or the write was preempted (its memory is given back). ``write_ids`` as for
        :meth:`batch_put_end`.
        """
        return drive(self.batch_put_revoke_sliced(client_id, tenant, keys, write_ids))

    def batch_put_revoke_sliced(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        write_ids: Sequence[int] = (),
    ) -> Steps[list[ErrorCode]]:
        """:meth:`batch_put_revoke` as a sliced operation."""
        revoke = self._writes.revoke
        return (yield from self._per_write(client_id, tenant, keys, write_ids, revoke))

    def _per_write(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        write_ids: Sequence[int],
        step: Callable[[str, str, str, float, int], ErrorCode],
    ) -> Steps[list[ErrorCode]]:
        if write_ids and len(write_ids) != len(keys):
            return [ErrorCode.INVALID_PARAMS] * len(keys)
        ids = list(write_ids) if write_ids else [0] * len(keys)
        if not _ids_ok(ids):
            return [ErrorCode.INVALID_PARAMS] * len(keys)
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not self._batch_size_ok(keys):
            return [ErrorCode.INVALID_PARAMS] * len(keys)
        scope: str = resolved  # narrowed for the closure

        # One call per key (the end or revoke itself): this runs for every key of a batch.
        def each(i: int, key: str, now: float) -> ErrorCode:
            if not valid_key(key):
                return ErrorCode.INVALID_PARAMS
            return step(client_id, scope, key, now, ids[i])

        return (yield from map_in_slices(self._lock, keys, self._begin_slice, each))

    def _end_one(
        self,
        client_id: str,
        tenant: str,
        key: str,
        write_id: int,
        step: Callable[[str, str, str, float, int], ErrorCode],
    ) -> ErrorCode:
        """:meth:`_per_write` of one key, without the slicing machinery (the same checks and
        answers as a batch of one)."""
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not isinstance(write_id, int) or write_id < 0:
            return ErrorCode.INVALID_PARAMS
        if not valid_key(key):
            return ErrorCode.INVALID_PARAMS
        with self._lock:
            return step(client_id, resolved, key, self._begin_slice(), write_id)

    # ------------------------------------------------------------------------------------------
    # Data-path helpers

    def _per_key(
        self,
        tenant: str,
        keys: Sequence[str],
        step: Callable[[str, int, str, float], ErrorCode],
    ) -> Steps[list[ErrorCode]]:
        """Run ``step(tenant, index, key, now)`` for each valid key, in slices (one hold of
        the lock each, expired read leases ended first)."""
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not self._batch_size_ok(keys):
            return [ErrorCode.INVALID_PARAMS] * len(keys)

        scope: str = resolved  # narrowed for the closure

        def each(i: int, key: str, now: float) -> ErrorCode:
            return step(scope, i, key, now) if valid_key(key) else ErrorCode.INVALID_PARAMS

        return (yield from map_in_slices(self._lock, keys, self._begin_slice, each))

    def _begin_slice(self) -> float:
        """The start of every data-path slice, the lock held: the time, leases expired."""
        now = self._clock()
        self._state.reads.expire_due(now)
        return now

    def _batch_size_ok(self, keys: Sequence[str]) -> bool:
        return len(keys) <= self.config.max_batch_keys


def _ids_ok(write_ids: Sequence[int]) -> bool:
    """Whether every write id is a non-negative int (an end or revoke names them). O(ids)."""
    return all(isinstance(w, int) and w >= 0 for w in write_ids)
