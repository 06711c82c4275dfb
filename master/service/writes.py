"""The write path: put and upsert start, end and revoke, and the sweep of stuck writes.

Every start gets its own write id (in its answer); PutEnd and PutRevoke name it, and complete
or revoke only that write's replicas, so no interleaving of starts and ends, by one client or
many, can make a reader see bytes not written for its key. (An end or revoke without a write
id, 0, acts on whatever write of that client is in flight.)

Put is first-writer-wins: a key with a readable replica, or with a write younger than
``put_start_discard_timeout_sec``, answers OBJECT_ALREADY_EXISTS; an older unfinished write is
preempted. Upsert replaces, and an unfinished put or upsert of its key is preempted at once. A
preempted write's memory is kept while its writer may still be copying into it, and given back
as soon as that writer is known to have stopped: its PutEnd or PutRevoke arrives (and answers
INVALID_WRITE), its client expires, or ``put_start_release_timeout_sec`` passes.

An upsert keeps readers in flight on the old bytes: a same-size object nobody is reading is
rewritten in place (its replicas go back to PROCESSING, so it is unreadable until the write
ends); otherwise the new value gets new replicas and the old ones are retired until their
readers are done (:mod:`..state.reads`). Either way hard pin and a live soft pin are kept.

A write tagged with KV sessions (``ReplicateConfig.kv_sessions``) is admitted against the
session limits before anything changes, and its object joins those sessions when the start
succeeds (:meth:`WritePath.start`).

Every method here is called by the service facade under its lock, with ``now`` already read.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from mooncake_py._wire.builders import frozen_builder
from mooncake_py.capability import WRITE
from mooncake_py.errors import ErrorCode
from mooncake_py.types import (
    PutStartResult,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
)

from ..state.objects import ObjectMetadata, PendingSoftPin, Replica, valid_key
from ..state.segments import Allocation, PlacementRequest
from ..state.store import StoreState
from .disk_moves import RETRY_AFTER_MS
from .eviction import Evictor
from .release import KV_CACHE_TYPES


def placement_request(size: int, config: ReplicateConfig, tenant: str) -> PlacementRequest:
    """What placement needs from a write's config, for an object of ``tenant`` (placed only
    in segments that tenant may use)."""
    preferred = (
        (config.preferred_segment,)
        if config.preferred_segment
        else tuple(config.preferred_segments)
    )
    return PlacementRequest(
        size=size,
        replica_num=config.replica_num,
        preferred_names=preferred,
        writer_host_id=config.host_id,
        local_first=config.prefer_alloc_in_same_node,
        tenant=tenant,
    )


_NO_ROOM = PutStartResult(ErrorCode.NO_AVAILABLE_HANDLE)
# Every key started builds one (see frozen_builder: a third of the dataclass's __init__).
_build_started = frozen_builder(PutStartResult)


class WritePath:
    """Put/upsert logic over a :class:`StoreState`."""

    def __init__(self, state: StoreState, evictor: Evictor) -> None:
        self._state = state
        self._evictor = evictor

    # -- validation ------------------------------------------------------------------------

    def resolve_soft_pin(self, config: ReplicateConfig) -> PendingSoftPin | None:
        """The soft-pin request of a write, or None when it is invalid (as upstream):
        PRESERVE or DISABLE with a TTL, an unknown action, or a TTL above the maximum."""
        try:
            action = SoftPinAction(config.soft_pin_action)
        except ValueError:
            return None
        ttl = config.soft_pin_ttl_ms
        if action != SoftPinAction.ENABLE:
            return None if ttl is not None else PendingSoftPin(action, 0)
        limits = self._state.config
        ttl = limits.default_kv_soft_pin_ttl if ttl is None else ttl
        if not 0 <= ttl <= limits.max_kv_soft_pin_ttl:
            return None
        return PendingSoftPin(action, ttl)

    # -- start -----------------------------------------------------------------------------

    def start(
        self,
        client_id: str,
        tenant: str,
        key: str,
        size: int,
        config: ReplicateConfig,
        group_id: str | None,
        tags: list[str],
        pin: PendingSoftPin,
        now: float,
        upsert: bool,
        attempt_id: int = 0,
    ) -> PutStartResult:
        """Start one put (or upsert, when ``upsert``) of a validated key and size.

        A non-zero ``attempt_id`` names the client's call: a repeat of it (same client, same
        id) while the write it started is in flight answers that write again (its replicas
        and write id) instead of OBJECT_ALREADY_EXISTS or preempting it, so a client may
        repeat a start whose answer it lost (a failover); PutEnd and PutRevoke name the
        write by its id, so they are safe to repeat as well.

        With ``tags`` (KV session ids), the write is admitted first: the memberships it would
        add must stay within the session limits, or it answers that code (INVALID_PARAMS for a
        bad id, SESSION_LIMIT_EXCEEDED) and changes nothing. An admitted write that answers OK,
        or OBJECT_ALREADY_EXISTS for a put of an existing key (which keeps its data), makes the
        object a member of every tagged session. The tagged sessions that already exist are
        held meanwhile, so eviction during the start cannot end them.

        Args:
            group_id: the key's group; None keeps an existing object's group on upsert and
                means no group otherwise.
            tags: session ids the object joins; empty for an untagged write.

        Returns:
            The put or upsert start result (see :meth:`put_start`, :meth:`upsert_start`), or
            the admission code. Complexity: that of the start, plus O(len(tags)).
        """
        # Each decoded request carries its own copies of these strings; the records keep the
        # interned ones, so a million objects of one writer share one client id and tenant.
        client_id, tenant = sys.intern(client_id), sys.intern(tenant)
        if group_id:
            group_id = sys.intern(group_id)
        if attempt_id:
            repeated = self._repeated_start(client_id, tenant, key, attempt_id)
            if repeated is not None:
                return repeated
        sessions = self._state.sessions
        if tags:
            existing = self._state.objects.get((tenant, key))
            if existing is not None and not upsert and self.is_stale(existing, now):
                existing = None  # this put preempts it: its memberships die with it
            code = sessions.check_admission(tenant, [(existing, key, tags)])
            if code != ErrorCode.OK:
                return PutStartResult(code)
        # An untagged write (the common one) holds no sessions and has none to release.
        held = sessions.hold(tenant, tags) if tags else None
        try:
            if upsert:
                result = self.upsert_start(client_id, tenant, key, size, config, group_id, pin, now)
            else:
                result = self.put_start(
                    client_id, tenant, key, size, config, group_id or "", pin, now
                )
            if tags and result.code in (ErrorCode.OK, ErrorCode.OBJECT_ALREADY_EXISTS):
                meta = self._state.objects.get((tenant, key))
                if meta is not None:
                    sessions.add(meta, tags, now)
        finally:
            if held is not None:
                sessions.release_hold(held)
        if attempt_id and result.code == ErrorCode.OK:
            started = self._state.objects.get((tenant, key))
            if started is not None:
                self._state.objects.set_attempt(started, attempt_id)
        return result

    def _repeated_start(
        self, client_id: str, tenant: str, key: str, attempt_id: int
    ) -> PutStartResult | None:
        """The answer to a repeat of the start call ``attempt_id`` of ``client_id`` whose write
        is still in flight, or None when this is no such repeat. O(replicas)."""
        objects = self._state.objects
        meta = objects.get((tenant, key))
        if (
            meta is None
            or meta.client_id != client_id
            or objects.attempt_of(meta.object_id) != attempt_id
            or not meta.is_writing()
        ):
            return None
        describe = self._state.describe
        replicas = tuple(describe(meta, r, WRITE) for r in meta.processing_replicas())
        return PutStartResult(ErrorCode.OK, replicas, meta.write_id)

    def put_start(
        self,
        client_id: str,
        tenant: str,
        key: str,
        size: int,
        config: ReplicateConfig,
        group_id: str,
        pin: PendingSoftPin,
        now: float,
    ) -> PutStartResult:
        """Reserve replicas for a new object (first writer wins)."""
        existing = self._state.objects.get((tenant, key))
        if existing is not None:
            if not self.is_stale(existing, now):
                return PutStartResult(ErrorCode.OBJECT_ALREADY_EXISTS)
            self._preempt(existing, now)
        return self._create(client_id, tenant, key, size, config, group_id, pin, now, None)

    def upsert_start(
        self,
        client_id: str,
        tenant: str,
        key: str,
        size: int,
        config: ReplicateConfig,
        group_id: str | None,
        pin: PendingSoftPin,
        now: float,
    ) -> PutStartResult:
        """Reserve replicas to create or replace an object.

        ``group_id`` None keeps the object's group; a different group than the existing
        object's is INVALID_PARAMS (membership is fixed while the object exists).
        """
        existing = self._state.objects.get((tenant, key))
        if existing is None:
            return self._create(
                client_id, tenant, key, size, config, group_id or "", pin, now, None
            )
        if group_id is not None and group_id != existing.group_id:
            return PutStartResult(ErrorCode.INVALID_PARAMS)
        if existing.is_writing():
            # An unfinished put or upsert loses at once; its writer may still be copying.
            stuck = existing.processing_replicas()
            self._state.objects.drop_replicas(existing, stuck)
            self._state.preempt(existing, stuck, now)
            existing.write_id = 0
            if not existing.replicas:
                # Upsert keeps session memberships: carry them over to the new object.
                memberships, existing.sessions = existing.sessions, None
                self._state.erase(existing.object_id)
                result = self._create(
                    client_id, tenant, key, size, config, existing.group_id, pin, now, existing
                )
                successor = self._state.objects.get(existing.object_id)
                self._state.sessions.adopt(successor, existing, memberships)
                return result
        disk_part = self._state.segments.has_disks and (
            self._state.disk.busy(existing.object_id) or self._state.disk_replicas(existing)
        )
        if existing.size == size and not disk_part and not self._state.reads.is_read(existing):
            result = self._rewrite_in_place(existing, client_id, pin, now)
        else:
            # A copy to or from disk may be running, and a file cannot be rewritten in place:
            # the new value gets new memory, and every old replica (its file too) goes.
            result = self._replace(existing, client_id, size, config, pin, now, bool(disk_part))
        current = self._state.objects.get(existing.object_id)
        if result.code == ErrorCode.OK and current is not None and config.with_hard_pin:
            # Only an admitted upsert changes the object: hard pin is ORed in, for good.
            current.hard_pinned = True
            self._state.policy.on_removed(current.object_id)
        return result

    def _no_room(self) -> PutStartResult:
        """NO_AVAILABLE_HANDLE, with how long to wait when spills in flight are freeing
        memory."""
        if self._evictor.room_coming:
            return PutStartResult(ErrorCode.NO_AVAILABLE_HANDLE, retry_after_ms=RETRY_AFTER_MS)
        return _NO_ROOM

    def is_stale(self, meta: ObjectMetadata, now: float) -> bool:
        """True for an unreadable object whose write is older than the discard timeout: the
        next put of its key preempts it."""
        deadline = meta.put_start_time + self._state.config.put_start_discard_timeout_sec
        return not meta.is_readable() and deadline < now

    def _rewrite_in_place(
        self, meta: ObjectMetadata, client_id: str, pin: PendingSoftPin, now: float
    ) -> PutStartResult:
        meta.client_id = client_id
        meta.put_start_time = now
        meta.pending_soft_pin = pin
        meta.write_id = self._state.next_write_id()
        # Readers whose hold expired mid-copy can no longer trust these bytes.
        self._state.reads.on_rewritten(meta.replicas)
        self._state.objects.mark_processing(meta)
        replicas = tuple(self._state.describe(meta, r, WRITE) for r in meta.replicas)
        return PutStartResult(ErrorCode.OK, replicas, meta.write_id)

    def _replace(
        self,
        meta: ObjectMetadata,
        client_id: str,
        size: int,
        config: ReplicateConfig,
        pin: PendingSoftPin,
        now: float,
        disk_part: bool = False,
    ) -> PutStartResult:
        # Allocate before letting go of the old bytes, with the object itself out of eviction's
        # reach: a rejected upsert changes nothing, and an admitted one keeps its memberships.
        with self._evictor.sparing(meta.object_id):
            allocations = self._evictor.allocate_evicting(
                placement_request(size, config, meta.tenant), now
            )
        if not allocations:
            return self._no_room()
        if disk_part:
            # Its disk task (if any) is dropped when it ends; it leaves its tier's LRU.
            self._state.disk.cancel(meta.object_id)
            self._state.disk.forget(meta.object_id)
        self._state.release_replicas(meta, list(meta.replicas), now, keep_object=True)
        meta.client_id = client_id
        meta.put_start_time = now
        meta.size = size
        meta.pending_soft_pin = pin
        meta.write_id = self._state.next_write_id()
        replicas = self._new_replicas(allocations, size)
        self._state.objects.add_replicas(meta, replicas)
        described = tuple(self._state.describe(meta, r, WRITE) for r in replicas)
        return PutStartResult(ErrorCode.OK, described, meta.write_id)

    def _create(
        self,
        client_id: str,
        tenant: str,
        key: str,
        size: int,
        config: ReplicateConfig,
        group_id: str,
        pin: PendingSoftPin,
        now: float,
        predecessor: ObjectMetadata | None,
    ) -> PutStartResult:
        """Insert a new object (tenant, key, group), written by ``client_id``.

        A replaced ``predecessor`` passes on its hard pin and its live soft pin.
        """
        allocations = self._evictor.allocate_evicting(placement_request(size, config, tenant), now)
        if not allocations:
            return self._no_room()
        meta = ObjectMetadata(
            tenant,
            key,
            size,
            client_id,
            now,
            self._new_replicas(allocations, size),
            data_type=int(config.data_type),
            write_id=self._state.next_write_id(),
            hard_pinned=config.with_hard_pin or bool(predecessor and predecessor.hard_pinned),
            pending_soft_pin=pin,
            group_id=group_id,
        )
        if predecessor is not None and predecessor.soft_pin_deadline > now:
            meta.soft_pin_deadline = predecessor.soft_pin_deadline
        self._state.objects.insert(meta)
        describe = self._state.describe
        replicas = meta.replicas
        if len(replicas) == 1:
            described: tuple[ReplicaDescriptor, ...] = (describe(meta, replicas[0], WRITE),)
        else:
            described = tuple(describe(meta, r, WRITE) for r in replicas)
        return _build_started(
            code=ErrorCode.OK, replicas=described, write_id=meta.write_id, retry_after_ms=0
        )

    def _new_replicas(self, allocations: list[Allocation], size: int) -> tuple[Replica, ...]:
        if len(allocations) == 1:  # the common write: one replica, no generator
            return (self._new_replica(allocations[0], size),)
        return tuple(self._new_replica(a, size) for a in allocations)

    def _new_replica(self, allocation: Allocation, size: int) -> Replica:
        """A PROCESSING replica of ``size`` bytes in ``allocation``, with a new replica id."""
        return Replica(
            self._state.next_replica_id(),
            allocation.segment.info.id,
            allocation.offset,
            size,
            ReplicaStatus.PROCESSING,
        )

    def _preempt(self, stale: ObjectMetadata, now: float) -> None:
        """Drop a stuck write; its memory waits for its writer to stop (see the module)."""
        replicas = list(stale.replicas)
        self._state.objects.drop_replicas(stale, replicas)
        self._state.preempt(stale, replicas, now)
        self._state.erase(stale.object_id)

    # -- end and revoke --------------------------------------------------------------------

    def _write_of(
        self, client_id: str, tenant: str, key: str, write_id: int
    ) -> ObjectMetadata | ErrorCode:
        """The object ``write_id`` (any write of ``client_id`` for 0) was written to, or the
        code that answers the end or revoke."""
        if write_id and self._state.stop_preempted(client_id, write_id):
            return ErrorCode.INVALID_WRITE  # replaced by a later write; its memory is back
        meta = self._state.objects.get((tenant, key))
        if meta is None:
            return ErrorCode.OBJECT_NOT_FOUND
        if meta.client_id != client_id:
            return ErrorCode.ILLEGAL_CLIENT
        if write_id and meta.write_id != write_id and meta.is_writing():
            return ErrorCode.INVALID_WRITE  # another write of the key is in flight
        # The write is in flight, or finished (the caller answers as for nothing in flight).
        return meta

    def end(
        self, client_id: str, tenant: str, key: str, now: float, write_id: int = 0
    ) -> ErrorCode:
        """Make the written replicas COMPLETE: the object becomes readable atomically.

        This is the one commit point of every put and upsert (PutEnd, BatchPutEnd): a
        committed KV-cache write (data type KVCACHE or UNKNOWN) wakes its tenant from the
        ``kv_cache_released`` sleep state (:mod:`.release`); O(1), a set lookup only while
        some tenant is released.

        Returns OK (also for a retry after success), OBJECT_NOT_FOUND, ILLEGAL_CLIENT (another
        client started the write) or INVALID_WRITE (nothing in flight, or ``write_id`` was
        preempted by a later write of the key).
        """
        found = self._write_of(client_id, tenant, key, write_id)
        if isinstance(found, ErrorCode):
            return found
        meta = found
        if not meta.is_writing():
            return ErrorCode.OK if meta.is_readable() else ErrorCode.INVALID_WRITE
        return self.commit(meta, now)

    def end_run(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        write_ids: Sequence[int],
        first: int,
        stop: int,
        now: float,
    ) -> list[ErrorCode]:
        """:meth:`end` of ``keys[first:stop]`` (``write_ids`` alike; INVALID_PARAMS for an
        invalid key), in one loop: a key whose named write is the one in flight (the common
        end) is committed at once, any other takes :meth:`end`. O(stop - first)."""
        get = self._state.objects.get
        commit, end = self.commit, self.end
        results: list[ErrorCode] = []
        append = results.append
        for i in range(first, stop):
            key, write_id = keys[i], write_ids[i]
            meta = get((tenant, key)) if key.__class__ is str else None
            if (
                meta is not None
                and write_id
                and meta.write_id == write_id
                and meta.client_id == client_id
                and meta.is_writing()
            ):
                # What end() finds for it: not preempted (a preempted write's id is never
                # an object's again), the caller's write, in flight.
                append(commit(meta, now))
            elif valid_key(key):
                append(end(client_id, tenant, key, now, write_id))
            else:
                append(ErrorCode.INVALID_PARAMS)
        return results

    def commit(self, meta: ObjectMetadata, now: float) -> ErrorCode:
        """The commit of :meth:`end`, for an object whose write is in flight: OK. O(1)."""
        self._state.mark_readable(meta)
        meta.write_id = 0
        released = self._state.kv_cache_released_tenants
        if released and meta.data_type in KV_CACHE_TYPES:
            released.discard(meta.tenant)
        if meta.pending_soft_pin is not None:
            _commit_soft_pin(meta, now)
        if meta.soft_pin_deadline > now:
            self._state.note_soft_pin(meta.soft_pin_deadline)
        return ErrorCode.OK

    def revoke(
        self, client_id: str, tenant: str, key: str, now: float, write_id: int = 0
    ) -> ErrorCode:
        """Free the in-flight replicas; an object left with none disappears.

        Returns OK, OBJECT_NOT_FOUND, ILLEGAL_CLIENT or INVALID_WRITE (nothing in flight, or
        ``write_id`` was preempted; its memory is given back either way).
        """
        found = self._write_of(client_id, tenant, key, write_id)
        if isinstance(found, ErrorCode):
            return found
        meta = found
        doomed = meta.processing_replicas()
        if not doomed:
            return ErrorCode.INVALID_WRITE
        meta.write_id = 0
        self._state.release_replicas(meta, doomed, now)
        return ErrorCode.OK

    def sweep_expired(self, now: float) -> int:
        """Free writes never ended within the release timeout, and preempted writes whose
        time has come; returns replicas freed."""
        freed = self._state.free_due_preempted(now)
        deadline = self._state.config.put_start_release_timeout_sec
        for object_id, started in self._state.objects.oldest_processing():
            if started + deadline > now:
                break
            meta = self._state.objects.get(object_id)
            if meta is not None:
                stale = meta.processing_replicas()
                meta.write_id = 0
                self._state.release_replicas(meta, stale, now)
                freed += len(stale)
        return freed


def _commit_soft_pin(meta: ObjectMetadata, now: float) -> None:
    """Apply the write's soft-pin action when it completes (never extended by reads)."""
    pending = meta.pending_soft_pin
    meta.pending_soft_pin = None
    if pending is None or pending.action == SoftPinAction.PRESERVE:
        return
    if pending.action == SoftPinAction.ENABLE and pending.ttl_ms > 0:
        meta.soft_pin_deadline = now + pending.ttl_ms / 1000.0
    else:
        meta.soft_pin_deadline = 0.0
