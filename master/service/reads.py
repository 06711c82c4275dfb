"""Read operations of the master: lookups that lease, existence checks, probes, ends of reads.

:class:`ReadService` is reached as ``MasterService.reads``; it depends only on the shared
:class:`~mooncake_py.master.service.context.ServiceContext`. The leases themselves live in
:mod:`mooncake_py.master.state.reads`:

- ``GetReplicaList`` starts a read lease held by the asking client and returns its id; the
  client ends it with ``EndReads`` when its copy is done, and the memory under it is then free
  to go. The TTL (``default_kv_lease_ttl``) only bounds a reader that never comes back.
- ``ExistKey`` (``is_exist``) keeps upstream's contract, "a key found now can still be read
  next", without pinning memory for a whole TTL: a found key gets an existence hold owned by
  the client, which the same client's next read of the key takes over (and that read's end
  gives back); an existence hold never retires memory, and eviction takes such objects after
  every unheld one. Unconsumed holds lapse at the TTL.
- ``ProbeKey`` / ``BatchProbeKey`` lease nothing (upstream's lease-free probes), unless a
  batch asks for ``LAST_HIT_ONLY``: then only the last complete candidate gets existence holds.

Thread-safety: every method takes the context's lock once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mooncake_py._wire.builders import frozen_builder
from mooncake_py.capability import MAP, READ
from mooncake_py.errors import ErrorCode
from mooncake_py.types import ProbeLeaseMode, ReplicaDescriptor, ReplicaListResult, SegmentInfo

from ..state.objects import ObjectMetadata, valid_key
from .context import ServiceContext
from .disk_moves import DiskMoves
from .slices import Steps, drive, map_runs_in_slices

# Every key found builds one of each (see frozen_builder: a third of the dataclass's __init__).
_build_found = frozen_builder(ReplicaListResult)
_build_descriptor = frozen_builder(ReplicaDescriptor)
_OK = ErrorCode.OK

END_READS_CHUNK = 4096
"""Read ids ended per slice of :meth:`ReadService.end_reads_sliced`."""


class ReadService:
    """The read calls.

    Args:
        context: the shared lock, state, clock and tenant rule.
        max_batch_keys: the most keys one batch may name.
    """

    def __init__(self, context: ServiceContext, max_batch_keys: int) -> None:
        self._lock = context.lock
        self._state = context.state
        self._clock = context.clock
        self._resolve_tenant = context.tenants.resolve
        self._max_batch = max_batch_keys
        # Promotes objects read from disk (set by the facade when it builds the disk tier).
        self.disk: DiskMoves | None = None

    # -- lookups that lease ----------------------------------------------------------------

    def get_replica_list(self, tenant: str, key: str, client_id: str = "") -> ReplicaListResult:
        """Readable replicas of one key; see :meth:`batch_get_replica_list` (the same answers,
        without the slicing machinery: one key is one short step)."""
        scope = self._resolve_tenant(tenant)
        if scope is None or self._max_batch < 1:
            return ReplicaListResult(ErrorCode.INVALID_PARAMS)
        with self._lock:
            return self._look_up(scope, key, client_id, self._clock())

    def batch_get_replica_list(
        self, tenant: str, keys: Sequence[str], client_id: str = ""
    ) -> list[ReplicaListResult]:
        """Where to read each key, starting a read lease held by ``client_id``.

        Per key: OK with the COMPLETE replicas, the lease TTL and the lease's ``read_id``;
        OBJECT_NOT_FOUND; REPLICA_IS_NOT_READY while the first write is in flight;
        INVALID_PARAMS for a bad key. Every key INVALID_PARAMS for a bad tenant or too many
        keys. Each key answered OK counts as a hit (``get_hits``), each OBJECT_NOT_FOUND as a
        miss (``get_misses``); the other answers as neither. Complexity: O(keys x replicas).
        """
        return drive(self.batch_get_replica_list_sliced(tenant, keys, client_id))

    def batch_get_replica_list_sliced(
        self, tenant: str, keys: Sequence[str], client_id: str = ""
    ) -> Steps[list[ReplicaListResult]]:
        """:meth:`batch_get_replica_list` as a sliced operation (a large batch lets others in;
        each key's lease starts when its slice runs)."""
        resolved = self._resolve_tenant(tenant)
        if resolved is None or len(keys) > self._max_batch:
            return [ReplicaListResult(ErrorCode.INVALID_PARAMS)] * len(keys)
        scope: str = resolved  # narrowed for the closure
        look_up_run = self._look_up_run

        def run(first: int, stop: int, now: float) -> list[ReplicaListResult]:
            return look_up_run(scope, keys, client_id, first, stop, now)

        return (yield from map_runs_in_slices(self._lock, len(keys), self._clock, run))

    def _look_up_run(
        self, scope: str, keys: Sequence[str], client_id: str, first: int, stop: int, now: float
    ) -> list[ReplicaListResult]:
        """:meth:`_look_up` of ``keys[first:stop]``, the lock held, in one loop: a key with one
        replica, readable, on a plain segment (the common read) is answered inline, with the
        segment's fields and signer looked up once per run; any other takes :meth:`_look_up`.
        The run's capabilities share one expiry, read at its start. O(stop - first)."""
        state = self._state
        look_up = self._look_up
        if state.draining or state.segments.has_disks:
            return [look_up(scope, keys[i], client_id, now) for i in range(first, stop)]
        get, touch, grant = state.objects.get, state.touch, state.reads.grant
        segment_of = state.segments.get
        deadline, ttl_ms = now + state.lease_ttl_s, state.config.default_kv_lease_ttl
        expires = state.segments.wall_ms() + state.read_grant_ms
        places: dict[str, tuple[SegmentInfo, Callable[[int, int, int, int], bytes], str]] = {}
        results: list[ReplicaListResult] = []
        append = results.append
        hits = 0
        for i in range(first, stop):
            key = keys[i]
            meta = get((scope, key)) if key.__class__ is str else None
            replica = None if meta is None or not meta.readable else meta.sole_replica
            place = None if replica is None else places.get(replica.segment_id)
            if place is None and replica is not None:
                segment = segment_of(replica.segment_id)
                if (
                    segment is not None
                    and segment.signer is not None
                    and not segment.info.shared
                    and not segment.info.disk
                ):
                    info = segment.info
                    place = places[info.id] = (info, segment.signer.mint, segment.tenant)
            if place is None or meta is None or replica is None:
                append(look_up(scope, key, client_id, now))
                continue
            # A readable object's sole replica is COMPLETE. What describe() mints for a
            # reader of the object's own tenant on an unshared segment.
            info, mint, owner = place
            hits += 1
            if meta.fresh_until <= now or meta.rare_fields is not None:
                touch(meta, now)
            read_id = grant(client_id, meta, (replica,), deadline)
            size = meta.size
            mode = READ | MAP if not owner or owner == meta.tenant else READ
            descriptor = _build_descriptor(
                id=replica.id,
                status=replica.status,
                segment_id=info.id,
                segment_name=info.name,
                offset=replica.offset,
                size=size,
                te_endpoint=info.te_endpoint,
                host_id=info.host_id,
                capability=mint(replica.offset, size, mode, expires),
                disk=False,
            )
            append(
                _build_found(
                    code=_OK,
                    replicas=(descriptor,),
                    lease_ttl_ms=ttl_ms,
                    size=size,
                    read_id=read_id,
                )
            )
        state.counters.get_hits += hits
        return results

    def _look_up(self, scope: str, key: str, client_id: str, now: float) -> ReplicaListResult:
        """One key of :meth:`batch_get_replica_list`, the lock held. O(replicas)."""
        state = self._state
        counters = state.counters
        meta = state.objects.get((scope, key))
        if meta is None:
            if not valid_key(key):
                return ReplicaListResult(ErrorCode.INVALID_PARAMS)
            counters.get_misses += 1
            return ReplicaListResult(ErrorCode.OBJECT_NOT_FOUND)
        readable = state.readable_replicas(meta)
        if not readable:
            if meta.readable:  # every replica on a segment being withdrawn
                counters.get_misses += 1
                return ReplicaListResult(ErrorCode.OBJECT_NOT_FOUND)
            return ReplicaListResult(ErrorCode.REPLICA_IS_NOT_READY)
        counters.get_hits += 1
        state.touch(meta, now)
        read_id = state.reads.grant(client_id, meta, readable, now + state.lease_ttl_s)
        described = tuple(state.describe(meta, r) for r in readable)
        if state.segments.has_disks and described[0].disk:
            counters.disk_hits += 1  # memory replicas come first: this one is on disk only
            if self.disk is not None:
                self.disk.after_read(meta, now)
        return _build_found(
            code=ErrorCode.OK,
            replicas=described,
            lease_ttl_ms=state.config.default_kv_lease_ttl,
            size=meta.size,
            read_id=read_id,
        )

    def end_reads(self, client_id: str, read_ids: Sequence[int]) -> list[ErrorCode]:
        """The reader's copies are done: end the read leases ``read_ids``.

        Returns:
            Per id: OK when the bytes stayed put for the whole copy (also for a copy that
            outlived its TTL when no writer may have touched the range since);
            LEASE_EXPIRED when they may have changed, or the id is unknown to this master.
            Every id INVALID_PARAMS for more than ``max_batch_keys`` ids.
        """
        return drive(self.end_reads_sliced(client_id, read_ids))

    def end_reads_sliced(self, client_id: str, read_ids: Sequence[int]) -> Steps[list[ErrorCode]]:
        """:meth:`end_reads` as a sliced operation, :data:`END_READS_CHUNK` ids per slice."""
        if len(read_ids) > self._max_batch:
            return [ErrorCode.INVALID_PARAMS] * len(read_ids)
        results: list[ErrorCode] = []
        for start in range(0, len(read_ids), END_READS_CHUNK):
            if start:
                yield
            with self._lock:
                self._state.reads.expire_due(self._clock())
                chunk = read_ids[start : start + END_READS_CHUNK]
                results.extend(self._state.reads.end(client_id, chunk))
        return results

    # -- existence -------------------------------------------------------------------------

    def exist_key(self, tenant: str, key: str, client_id: str = "") -> int:
        """1 when the key is readable (with an existence hold), 0 when not, negative on error."""
        return self.batch_exist_key(tenant, [key], client_id)[0]

    def batch_exist_key(self, tenant: str, keys: Sequence[str], client_id: str = "") -> list[int]:
        """Per key: 1 readable (the client gets an existence hold, see the module), 0 absent
        or not yet written, or INVALID_PARAMS. O(keys)."""
        return drive(self._exists(tenant, keys, client_id, hold=True))

    def batch_exist_key_sliced(
        self, tenant: str, keys: Sequence[str], client_id: str = ""
    ) -> Steps[list[int]]:
        """:meth:`batch_exist_key` as a sliced operation."""
        return (yield from self._exists(tenant, keys, client_id, hold=True))

    def probe_key(self, tenant: str, key: str) -> int:
        """1 when the key is readable, 0 when not, negative on error; leases nothing."""
        return drive(self._exists(tenant, [key], "", hold=False))[0]

    def batch_probe_key(
        self,
        tenant: str,
        keys: Sequence[str],
        client_id: str = "",
        mode: int = ProbeLeaseMode.NONE,
        candidate_size: int = 1,
    ) -> list[int]:
        """Per key 1 / 0 / negative as :meth:`probe_key`, leasing nothing (``NONE``).

        With ``LAST_HIT_ONLY`` the keys form candidates of ``candidate_size`` consecutive keys;
        only the last candidate whose every key is readable is selected: its keys get
        existence holds for ``client_id`` and answer 1, every other key answers 0 (not
        selected, not necessarily absent). Every key INVALID_PARAMS for an unknown mode, or
        for ``LAST_HIT_ONLY`` with a ``candidate_size`` that is not positive or does not divide
        the number of keys. O(keys).
        """
        return drive(self.batch_probe_key_sliced(tenant, keys, client_id, mode, candidate_size))

    def batch_probe_key_sliced(
        self,
        tenant: str,
        keys: Sequence[str],
        client_id: str = "",
        mode: int = ProbeLeaseMode.NONE,
        candidate_size: int = 1,
    ) -> Steps[list[int]]:
        """:meth:`batch_probe_key` as a sliced operation."""
        if mode == ProbeLeaseMode.NONE or not keys:
            return (yield from self._exists(tenant, keys, "", hold=False))
        if (
            mode != ProbeLeaseMode.LAST_HIT_ONLY
            or candidate_size <= 0
            or len(keys) % candidate_size
        ):
            return [int(ErrorCode.INVALID_PARAMS)] * len(keys)
        found = yield from self._exists(tenant, keys, "", hold=False)
        if any(code < 0 for code in found):
            return found
        mask = [0] * len(keys)
        for start in range(len(keys) - candidate_size, -1, -candidate_size):
            candidate = range(start, start + candidate_size)
            if all(found[i] == 1 for i in candidate):
                members = [keys[i] for i in candidate]
                if self._hold_if_all_readable(tenant, members, client_id):
                    for i in candidate:
                        mask[i] = 1
                    break
        return mask

    def _hold_if_all_readable(self, tenant: str, keys: Sequence[str], client_id: str) -> bool:
        """Existence holds on every key of a candidate, or on none when one stopped being
        readable since it was probed."""
        resolved = self._resolve_tenant(tenant)
        state = self._state
        with self._lock:
            now = self._clock()
            metas = [state.objects.get((resolved or "", k)) for k in keys]
            readable = [m for m in metas if m is not None and state.is_readable(m)]
            if len(readable) != len(metas):
                return False
            for meta in readable:
                state.touch(meta, now)
            state.reads.grant_exist(
                client_id, [m.object_id for m in readable], now + state.lease_ttl_s
            )
            return True

    def _exists(
        self, tenant: str, keys: Sequence[str], client_id: str, hold: bool
    ) -> Steps[list[int]]:
        resolved = self._resolve_tenant(tenant)
        invalid = int(ErrorCode.INVALID_PARAMS)
        if resolved is None or len(keys) > self._max_batch:
            return [invalid] * len(keys)
        scope: str = resolved  # narrowed for the closure
        state = self._state
        lookup = state.objects.get
        touch = state.touch

        def run(first: int, stop: int, now: float) -> list[int]:
            # One loop per run of keys (this is per key of every existence check).
            answers: list[int] = []
            append = answers.append
            found: list[tuple[str, str]] = []  # the run's hits, held at its end
            draining = state.draining
            for i in range(first, stop):
                key = keys[i]
                object_id = (scope, key)
                meta: ObjectMetadata | None = lookup(object_id)
                if meta is None or not meta.readable or (draining and not state.is_readable(meta)):
                    # Stored keys were valid when written; only misses need the check.
                    append(0 if valid_key(key) else invalid)
                    continue
                if hold:
                    if meta.fresh_until <= now or meta.rare_fields is not None:
                        touch(meta, now)
                    found.append(object_id)
                append(1)
            if found:
                state.reads.grant_exist(client_id, found, now + state.lease_ttl_s)
            return answers

        return (yield from map_runs_in_slices(self._lock, len(keys), self._clock, run))
