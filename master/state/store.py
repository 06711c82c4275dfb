"""The master's state and the primitive mutations that keep its parts consistent.

:class:`StoreState` owns the object table, the segments and their allocators, the client
registry, the eviction policy, and the queue of buffers waiting to be freed. Every change that
touches more than one of them (an object becomes readable, is read, loses replicas, disappears;
a segment goes away) is one method here, so the write path, the evictor and the service facade
cannot leave them out of step. :meth:`StoreState.check` verifies them against each other.

Thread-safety: none; the service facade serializes every call under its lock.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from mooncake_py import capability
from mooncake_py._wire.builders import frozen_builder
from mooncake_py.types import ReplicaDescriptor, SegmentInfo

from ..config import MasterConfig
from .clients import ClientRegistry
from .disk_space import DiskSpace
from .disk_tier import DiskTiers
from .lru import LeaseOrderedLRU
from .objects import ObjectId, ObjectMetadata, ObjectTable, Replica
from .reads import ReadLeases
from .segments import MountedSegment, SegmentManager
from .session_registry import SessionLimits, SessionRegistry, pinned_by_session
from .tasks import TaskTable

if TYPE_CHECKING:
    from ..ha.journal import Journal


@dataclasses.dataclass(slots=True)
class PreemptedWrite:
    """An unfinished write another write of its key replaced.

    Its writer may still be copying into its replicas, so their memory is kept until that
    writer is known to have stopped (its PutEnd or PutRevoke arrives, or its client expires)
    or until ``release_at`` (``put_start_release_timeout_sec`` after it started).
    """

    write_id: int
    client_id: str
    replicas: list[Replica]
    release_at: float


@dataclasses.dataclass(slots=True)
class Counters:
    """Monotonic event counts, for metrics and tests.

    Every dataclass field is an ``int`` that only grows (``dataclasses.asdict`` of the counters
    is part of ``MasterService.stats()``). Per release kind (``session``: release_kv_session,
    ``stale``: release_stale_kv_sessions, ``all``: release_all_kv_sessions, ``kv_cache``:
    release_kv_cache) there are ``<kind>_releases`` (calls answered OK),
    ``<kind>_released_objects`` and ``<kind>_released_bytes`` (the allocators' freed bytes);
    over the kinds they add up to ``released_objects`` / ``released_bytes``. ``get_hits`` and
    ``get_misses`` count GetReplicaList keys answered OK and OBJECT_NOT_FOUND. The disk tier's
    (:mod:`~..service.disk_moves`): ``spills_started`` / ``spilled_objects`` /
    ``spilled_bytes`` / ``spill_failures`` (memory to disk), ``demoted_objects`` (memory
    dropped because a disk copy existed), ``promotions_started`` / ``promoted_objects`` /
    ``promotion_failures`` (disk to memory), ``disk_evicted_objects`` (objects a full tier
    dropped) and ``disk_evicted_bytes`` (disk replicas a full tier dropped), ``disk_hits``
    (keys read while only on disk), ``operator_demotions`` (DemoteObjects keys answered OK).

    Thread-safety: none; changed and read under the service lock.
    """

    evicted_objects: int = 0
    evicted_bytes: int = 0
    evicted_soft_pinned: int = 0
    eviction_passes: int = 0
    sync_evictions: int = 0
    alloc_failures: int = 0
    released_objects: int = 0
    released_bytes: int = 0
    replicated_objects: int = 0
    replicated_bytes: int = 0
    session_releases: int = 0
    session_released_objects: int = 0
    session_released_bytes: int = 0
    stale_releases: int = 0
    stale_released_objects: int = 0
    stale_released_bytes: int = 0
    all_releases: int = 0
    all_released_objects: int = 0
    all_released_bytes: int = 0
    kv_cache_releases: int = 0
    kv_cache_released_objects: int = 0
    kv_cache_released_bytes: int = 0
    get_hits: int = 0
    get_misses: int = 0
    spills_started: int = 0
    spilled_objects: int = 0
    spilled_bytes: int = 0
    spill_failures: int = 0
    demoted_objects: int = 0
    promotions_started: int = 0
    promoted_objects: int = 0
    promotion_failures: int = 0
    disk_evicted_objects: int = 0
    disk_evicted_bytes: int = 0
    disk_hits: int = 0
    operator_demotions: int = 0


_GONE_SEGMENT = SegmentInfo(id="", name="", base=1, size=1, te_endpoint="")

DRAIN_CHECK_EVERY = 64
"""Objects dropped between two looks at the slice's time while draining a segment."""


@dataclasses.dataclass(slots=True)
class SegmentDrain:
    """An unmounted segment whose objects are still being dropped, slice by slice.

    Attributes:
        segment_id: the segment.
        pending: ids of the objects that had a replica on it when it was unmounted.
        position: how many of ``pending`` were handled.
    """

    segment_id: str
    pending: list[ObjectId]
    position: int = 0

    @property
    def done(self) -> bool:
        """Whether every pending object was handled."""
        return self.position >= len(self.pending)


def is_soft_pinned(meta: ObjectMetadata, now: float) -> bool:
    """True while ``meta`` is effectively soft pinned: its own TTL pin has not expired, or a
    session holding it is pinned.

    This is the one test eviction uses; it costs O(sessions on the object) and reads the
    session flags through the object's references, not through the registry. An object
    without a side record of rare fields (:class:`.objects.RareFields`) has neither: one test.
    """
    rare = meta._rare  # noqa: SLF001 - the record's fields without a property call each
    return rare is not None and (rare.soft_pin_deadline > now or pinned_by_session(meta))


_build_descriptor = frozen_builder(ReplicaDescriptor)


class StoreState:
    """Everything the master holds, with consistent multi-part mutations.

    Args:
        config: validated configuration.
        rng: random source for placement.
    """

    def __init__(self, config: MasterConfig, rng: random.Random | None = None) -> None:
        self.config = config
        self.sessions = SessionRegistry(
            SessionLimits(
                max_sessions=config.kv_session_max_sessions,
                max_members=config.kv_session_max_members,
                max_per_object=config.kv_session_max_per_object,
                max_batch=config.kv_session_max_batch,
            ),
            on_unpinned=self.note_unpinned,
        )
        self.segments = SegmentManager(config.allocation_strategy, rng)
        self.objects = ObjectTable(
            on_reweigh=self.sessions.reweigh, allocator_of=self.segments.allocator_of
        )
        self.clients = ClientRegistry(config.client_ttl)
        self.policy = LeaseOrderedLRU(self.objects.get)
        self.reads = ReadLeases(free=self._free_replica)
        self.segments.on_allocated = self.reads.on_allocated
        # Preempted writes by write id, and their release deadlines (oldest first).
        self.preempted: dict[int, PreemptedWrite] = {}
        # Unmounted segments whose objects are still being dropped, by segment id.
        self.draining: dict[str, SegmentDrain] = {}
        # Replica copy and move tasks, and the target ranges they reserved.
        self.tasks = TaskTable()
        # Disk tier spills and promotions in flight, file deletions, per-tier LRUs.
        self.disk = DiskTiers()
        self.segments.on_disk_freed = self.disk.delete_later
        self.disk.release = self.segments.release_disk
        self._preempted_deadlines: list[tuple[float, int]] = []
        self.counters = Counters()
        # Tenants whose KV cache a release_kv_cache released (it removed at least one of their
        # objects) and that have committed no KV-cache write since; the write path looks it
        # up only when it is not empty.
        self.kv_cache_released_tenants: set[str] = set()
        self.lease_ttl_s = config.default_kv_lease_ttl / 1000.0
        # A grant for an unshared segment lasts at least as long as what it serves may: a read
        # lease, a write's reservation (ranged sessions keep their descriptors that long). In a
        # shared segment a freed range waits for its grants to expire before it is reused
        # (grant_holds), so there grants last only capability_ttl_sec.
        self._shared_grant_ms = int(config.capability_ttl_sec * 1000)
        self.read_grant_ms = int(max(config.capability_ttl_sec * 1000, config.default_kv_lease_ttl))
        self.write_grant_ms = int(
            max(config.capability_ttl_sec, config.put_start_release_timeout_sec) * 1000
        )
        # Bumped whenever objects may have stopped being soft pinned (an unpin, a member leaving
        # a pinned session, a TTL pin running out), so walks that skipped pinned candidates
        # know to look at them again. Deadlines of TTL pins wait in a heap until they pass.
        self.pin_epoch = 0
        self._pin_deadlines: list[float] = []
        self._replica_ids = itertools.count(1)
        self._write_ids = itertools.count(1)
        # Where replicated changes are marked (:meth:`attach_journal`); None: not replicated.
        self.journal: Journal | None = None

    def attach_journal(self, journal: Journal) -> None:
        """Mark every replicated change in ``journal`` from now on (:mod:`..ha.journal`)."""
        self.journal = journal
        self.objects.journal = journal
        self.sessions.journal = journal
        self.segments.journal = journal
        self.clients.journal = journal

    def peek_next_ids(self) -> tuple[int, int]:
        """The next write id and replica id, without taking them."""
        write_id, replica_id = next(self._write_ids), next(self._replica_ids)
        self._write_ids = itertools.count(write_id)
        self._replica_ids = itertools.count(replica_id)
        return write_id, replica_id

    def restore_next_ids(self, write_id: int, replica_id: int) -> None:
        """Continue the id counters at (at least) these values, as a restored master must:
        ids a client may still hold are never handed out again."""
        current_write, current_replica = self.peek_next_ids()
        self._write_ids = itertools.count(max(write_id, current_write))
        self._replica_ids = itertools.count(max(replica_id, current_replica))

    def next_replica_id(self) -> int:
        """A fresh replica id."""
        return next(self._replica_ids)

    def next_write_id(self) -> int:
        """A fresh write id: every put or upsert start gets its own."""
        return next(self._write_ids)

    # -- object life cycle -----------------------------------------------------------------

    def mark_readable(self, meta: ObjectMetadata) -> None:
        """Its in-flight replicas are written: COMPLETE, and an eviction candidate."""
        self.objects.mark_complete(meta)
        rare = meta._rare  # noqa: SLF001 - hard_pinned without a property call per write
        if rare is None or not rare.hard_pinned:
            # The record itself: the table resolves the object's id to it (no id built).
            self.policy.on_record_created(meta)

    def touch(self, meta: ObjectMetadata, now: float) -> None:
        """A read or existence check: count the access (for its whole group when it has one).

        An object read within the last half lease TTL was accessed moments ago, so its
        recency is not renewed again (as upstream skips group-wide refreshes): repeated probes
        of hot keys then cost a dict lookup, not a reordering. Its recency lags its last
        access by at most half a TTL.
        """
        if meta.fresh_until > now and (meta._rare is None or not meta.group_id):  # noqa: SLF001
            return
        fresh = now + self.lease_ttl_s / 2
        members = (
            self.objects.group_members(meta.tenant, meta.group_id) if meta.group_id else [meta]
        )
        disks = self.segments.has_disks
        for member in members:
            # A member's stamp is the policy's (-1: no candidate): no id built, no lookup.
            if member.fresh_until <= now and member.lru_stamp >= 0:
                self.policy.on_record_touched(member)
            if disks:
                self.disk.touched(member.object_id)
            member.fresh_until = max(member.fresh_until, fresh)

    def is_leased(self, meta: ObjectMetadata) -> bool:
        """True while a reader may be copying ``meta``'s bytes (a live read hold) or an
        existence check holds it: it may not be removed without force. O(replicas)."""
        return self.reads.is_read(meta) or self.reads.is_checked(meta.object_id)

    def note_soft_pin(self, deadline: float) -> None:
        """A TTL soft pin was committed; its end will bump :attr:`pin_epoch`."""
        heapq.heappush(self._pin_deadlines, deadline)

    def note_unpinned(self) -> None:
        """Some objects may have lost their pin."""
        self.pin_epoch += 1

    def current_pin_epoch(self, now: float) -> int:
        """:attr:`pin_epoch`, after counting the TTL pins that ended by ``now``."""
        deadlines = self._pin_deadlines
        if deadlines and deadlines[0] <= now:
            while deadlines and deadlines[0] <= now:
                heapq.heappop(deadlines)
            self.pin_epoch += 1
        return self.pin_epoch

    def erase(self, object_id: ObjectId) -> ObjectMetadata | None:
        """Forget an object everywhere, its session memberships included (its memory is the
        caller's business)."""
        self.policy.on_removed(object_id)
        self.reads.drop_checks(object_id)
        if self.segments.has_disks or len(self.disk):
            self.disk.cancel(object_id)
            self.disk.forget(object_id)
        meta = self.objects.erase(object_id)
        if meta is not None:
            self.sessions.on_object_removed(meta)
        return meta

    def release_replicas(
        self, meta: ObjectMetadata, doomed: list[Replica], now: float, keep_object: bool = False
    ) -> int:
        """Take ``doomed`` replicas from ``meta``; erase the object if nothing is left (unless
        ``keep_object``: the caller is about to give it new replicas).

        The memory of a replica no reader is copying from goes back to its allocator now; a
        replica some reader is still copying from is retired, and its memory goes back the
        moment that reader ends its read (or its hold expires), so the bytes a reader sees are
        never overwritten by a new writer first.

        Returns:
            The bytes kept for readers still copying (0 when everything was freed now).
        """
        retire = self.reads.retire_or_free
        pending = sum(r.size for r in doomed if retire(r))
        self.objects.drop_replicas(meta, doomed)
        if not meta.replicas and not keep_object:
            self.erase(meta.object_id)
        return pending

    def _free_replica(self, replica: Replica) -> None:
        self.segments.free(replica.segment_id, replica.offset)

    # -- preempted writes ------------------------------------------------------------------

    def preempt(self, meta: ObjectMetadata, replicas: list[Replica], now: float) -> None:
        """Another write replaces ``meta``'s write in flight: keep ``replicas`` (its
        PROCESSING ones, already taken off the object) for its writer until it stops."""
        if not replicas:
            return
        write_id = meta.write_id or self.next_write_id()
        release_at = meta.put_start_time + self.config.put_start_release_timeout_sec
        self.preempted[write_id] = PreemptedWrite(write_id, meta.client_id, replicas, release_at)
        heapq.heappush(self._preempted_deadlines, (release_at, write_id))

    def stop_preempted(self, client_id: str, write_id: int) -> bool:
        """The writer of preempted write ``write_id`` stopped (its end or revoke arrived):
        its memory goes back now. Returns whether such a write of ``client_id`` existed."""
        preempted = self.preempted.get(write_id)
        if preempted is None or preempted.client_id != client_id:
            return False
        self._free_preempted(write_id)
        return True

    def _free_preempted(self, write_id: int) -> int:
        preempted = self.preempted.pop(write_id)
        for replica in preempted.replicas:
            self._free_replica(replica)
        return len(preempted.replicas)

    def free_due_preempted(self, now: float) -> int:
        """Free the preempted writes whose release time has come; returns replicas freed."""
        freed = 0
        deadlines = self._preempted_deadlines
        while deadlines and deadlines[0][0] <= now:
            _, write_id = heapq.heappop(deadlines)
            if write_id in self.preempted:
                freed += self._free_preempted(write_id)
        return freed

    def drop_client_writes(self, client_id: str) -> int:
        """``client_id`` expired: its preempted writes can no longer be copying.
        O(preempted writes). Returns replicas freed."""
        mine = [w for w, p in self.preempted.items() if p.client_id == client_id]
        return sum(self._free_preempted(w) for w in mine)

    def preempted_count(self) -> int:
        """Replicas held for preempted writes."""
        return sum(len(p.replicas) for p in self.preempted.values())

    # -- segments --------------------------------------------------------------------------

    def unmount(self, segment_id: str) -> None:
        """Withdraw a segment: its replicas vanish, objects left with none are erased.

        Complexity: O(objects on the segment), at once; :meth:`start_unmount` and
        :meth:`drain` do the same in slices.
        """
        self.drain(self.start_unmount(segment_id))

    def start_unmount(self, segment_id: str) -> SegmentDrain:
        """Withdraw a segment now (nothing is placed on it and no read is granted on it from
        here on) and return the drain that drops its objects' replicas.

        Until the drain is done, objects may still list replicas on the segment: readers
        never get them (:meth:`readable_replicas`, :meth:`is_readable`), and mounting the
        same id again first finishes the drain (:meth:`finish_drain`), so a new allocator
        never meets old replicas.

        Complexity: O(allocations in the segment), to list its objects.
        """
        self.finish_drain(segment_id)
        # Listed before the segment goes: the segment index lives in its allocator.
        pending = self.objects.objects_on_segment(segment_id)
        mounted = self.segments.unmount(segment_id)
        self.tasks.forget_segment(segment_id)
        self._forget_disk_tasks(segment_id)
        if mounted is not None and mounted.info.disk:
            self.disk.forget_segment(segment_id)
        # Buffers waiting for readers or writers die with their segment; a remount of the same
        # id starts from an empty allocator that must not receive their frees.
        self.reads.drop_segment(segment_id)
        for preempted in self.preempted.values():
            preempted.replicas = [r for r in preempted.replicas if r.segment_id != segment_id]
        for write_id in [w for w, p in self.preempted.items() if not p.replicas]:
            del self.preempted[write_id]
        drain = SegmentDrain(segment_id, pending)
        self.draining[segment_id] = drain
        return drain

    def drain(self, drain: SegmentDrain, spent: Callable[[], bool] | None = None) -> bool:
        """Drop the drained segment's replicas from pending objects, erasing objects left with
        none, until ``spent()`` says the slice is over (checked every
        :data:`DRAIN_CHECK_EVERY` objects; None: to the end).

        Returns:
            True when the drain is done (then the segment is no longer draining).
        """
        segment_id = drain.segment_id
        pending = drain.pending
        while drain.position < len(pending):
            object_id = pending[drain.position]
            drain.position += 1
            meta = self.objects.get(object_id)
            if meta is not None:
                lost = [r for r in meta.replicas if r.segment_id == segment_id]
                if lost:
                    self.reads.forget_replicas(lost)
                    self.objects.drop_replicas(meta, lost)
                    if not meta.replicas:
                        self.erase(object_id)
            if spent is not None and not drain.position % DRAIN_CHECK_EVERY and spent():
                break
        if not drain.done:
            return False
        if self.draining.get(segment_id) is drain:
            del self.draining[segment_id]
        return True

    def finish_drain(self, segment_id: str) -> None:
        """Finish at once the drain of ``segment_id`` if one runs (before the id is mounted
        again). Complexity: O(objects it still has to drop)."""
        drain = self.draining.get(segment_id)
        if drain is not None:
            self.drain(drain)

    def _forget_disk_tasks(self, segment_id: str) -> None:
        """A segment went away: disk tasks reserving on it end now (their range died with its
        allocator, which a remount of the id must not receive frees for), their objects
        ordinary candidates again; those copying from it are cancelled (their reservation is
        freed when they end)."""
        disk = self.disk
        if not len(disk):
            return
        for task_id in disk.tasks_on(segment_id):
            record = disk.get(task_id)
            if record is None:
                continue
            if record.target.segment.info.id == segment_id:
                disk.finish(task_id)
                self.restore_candidate(record.meta.object_id)
            else:
                disk.cancel_task(task_id)

    def resume_disk_tier(self, mounted: MountedSegment, high_water: int) -> None:
        """A disk tier was mounted (again, perhaps: its owner restarted on its directory):
        hand out no offset below the owner's ``high_water`` (its files' ends). O(1)."""
        self.disk.mounted_again(mounted.info.id)
        space = mounted.allocator
        if isinstance(space, DiskSpace) and high_water > space.next_offset:
            space.advance_to(high_water)
            if self.journal is not None:
                self.journal.segment(mounted.info.id)

    def take_over_disk_tier(self, segment_id: str, client_id: str, info: SegmentInfo) -> bool:
        """The disk tier ``segment_id`` passes to ``client_id`` (its owner restarted on the
        tier's directory before its old self expired): its objects stay readable, the old
        owner's tasks on it end (their reservations freed, their objects candidates again),
        its pending deletions go to the new owner, its quota becomes ``info.size``.

        Returns:
            False (nothing changed) when the tier already holds more than the new quota.
        Complexity: O(tasks).
        """
        current = self.segments.get(segment_id)
        space = None if current is None else current.allocator
        if not isinstance(space, DiskSpace) or not space.resize(info.size):
            return False
        mounted = self.segments.rebind(segment_id, client_id, info)
        disk = self.disk
        for task_id in disk.tasks_on(segment_id):
            record = disk.finish(task_id)
            if record is None:
                continue
            self.segments.free(record.target.segment.info.id, record.target.offset)
            self.restore_candidate(record.meta.object_id)
        self.resume_disk_tier(mounted, info.base)
        return True

    def restore_candidate(self, object_id: ObjectId) -> None:
        """A disk task of the object ended without moving it: if it is still there, in
        memory, not pinned hard and not being rewritten (a write makes it a candidate when it
        completes), it is an ordinary eviction candidate again. O(replicas)."""
        meta = self.objects.get(object_id)
        if meta is None or meta.hard_pinned or meta.is_writing() or not meta.is_readable():
            return
        if object_id in self.policy or self.disk.busy(object_id):
            return
        if self.memory_replicas(meta):
            self.policy.on_created(object_id)

    def readable_replicas(self, meta: ObjectMetadata) -> list[Replica]:
        """The COMPLETE replicas a reader may be given: none on a segment being drained;
        memory replicas before disk ones. O(replicas)."""
        replicas = meta.complete_replicas()
        if self.draining:
            replicas = [r for r in replicas if r.segment_id not in self.draining]
        if len(replicas) > 1 and self.segments.has_disks:
            replicas.sort(key=self.on_disk)
        return replicas

    def on_disk(self, replica: Replica) -> bool:
        """Whether ``replica`` lies on a disk tier. O(1)."""
        mounted = self.segments.get(replica.segment_id)
        return mounted is not None and mounted.info.disk

    def memory_replicas(self, meta: ObjectMetadata) -> list[Replica]:
        """``meta``'s COMPLETE replicas in memory. O(replicas)."""
        if not self.segments.has_disks:
            return meta.complete_replicas()
        return [r for r in meta.complete_replicas() if not self.on_disk(r)]

    def disk_replicas(self, meta: ObjectMetadata) -> list[Replica]:
        """``meta``'s COMPLETE replicas on disk tiers. O(replicas)."""
        if not self.segments.has_disks:
            return []
        return [r for r in meta.complete_replicas() if self.on_disk(r)]

    def is_readable(self, meta: ObjectMetadata) -> bool:
        """Whether a reader would be given a replica of ``meta`` now. O(1) unless a segment
        is being drained."""
        return meta.readable and (not self.draining or bool(self.readable_replicas(meta)))

    @property
    def wall_ms(self) -> Callable[[], int]:
        """The wall clock capabilities expire by (ms); assign another to drive it in tests."""
        return self.segments.wall_ms

    @wall_ms.setter
    def wall_ms(self, clock: Callable[[], int]) -> None:
        self.segments.wall_ms = clock

    def describe(
        self,
        meta: ObjectMetadata,
        replica: Replica,
        mode: int = capability.READ,
        allow_map: bool = True,
    ) -> ReplicaDescriptor:
        """Where a client finds ``replica``'s bytes, with a capability for them.

        Args:
            mode: the access the holder needs (:data:`~mooncake_py.capability.READ` or
                :data:`~mooncake_py.capability.WRITE`).
            allow_map: the holder acts for ``meta``'s tenant (a reader or writer of it, not a
                replica-task worker of another tenant). Then the grant adds
                :data:`~mooncake_py.capability.MAP` when the segment is not shared and belongs
                to nobody or to that tenant (all its objects are the tenant's, as placement
                keeps them), so a same-host holder may map the segment instead of going through
                its owner's socket.

        The capability expires ``capability_ttl_sec`` after now (:attr:`wall_ms`); for an
        unshared segment not before the longest read lease (``default_kv_lease_ttl``) or
        write reservation (``put_start_release_timeout_sec``) it serves could end. A grant
        for a shared segment is recorded, so the range is not reused before it expires. A
        replica whose segment is gone, or was mounted without a key, gets none.
        Complexity: O(1), one keyed hash.
        """
        segment = self.segments.get(replica.segment_id)
        if segment is None or segment.signer is None:
            info, grant = (_GONE_SEGMENT if segment is None else segment.info), b""
        else:
            info = segment.info
            if info.disk:
                # Read through the owner only (never mapped), for as long as a read may last;
                # its offsets are never reused, so nothing needs holding back.
                expires = self.segments.wall_ms() + self.read_grant_ms
            elif info.shared:
                expires = self.segments.wall_ms() + self._shared_grant_ms
                self.segments.grant_holds.granted(replica.segment_id, replica.offset, expires)
            else:
                write = mode & capability.WRITE
                lifetime = self.write_grant_ms if write else self.read_grant_ms
                expires = self.segments.wall_ms() + lifetime
                if allow_map and (not segment.tenant or segment.tenant == meta.tenant):
                    mode |= capability.MAP
            grant = segment.signer.mint(replica.offset, meta.size, mode, expires)
        # One per replica of every key a write or read answers: built without the frozen
        # dataclass's field-by-field __init__ (see frozen_builder).
        return _build_descriptor(
            id=replica.id,
            status=replica.status,
            segment_id=replica.segment_id,
            segment_name=info.name,
            offset=replica.offset,
            size=meta.size,
            te_endpoint=info.te_endpoint,
            host_id=info.host_id,
            capability=grant,
            disk=info.disk,
        )

    def used_ratio(self) -> float:
        """Allocated memory over mounted memory capacity (0 with no segments), not counting
        the memory that spills in flight are about to free."""
        capacity = self.segments.capacity_bytes()
        used = self.segments.used_bytes() - self.disk.spilling_bytes
        return max(used, 0) / capacity if capacity else 0.0

    # -- invariants ------------------------------------------------------------------------

    def check(self) -> None:
        """Verify every part against the others. O(state). The object table's and the session
        registry's own checks recount the per-tenant figures (objects, bytes, bytes per
        segment, sessions, pinned sessions) from scratch.

        Raises:
            AssertionError: state is inconsistent.
        """
        self.objects.check({m.info.id: m.allocator for m in self.segments.all_segments()})
        self.segments.check()
        self.clients.check()
        self.sessions.check(self.objects)
        for segment_id, drain in self.draining.items():
            if drain.done or self.segments.get(segment_id) is not None:
                raise AssertionError(f"segment {segment_id} drains but is done or mounted")
        live: dict[str, int] = {}
        candidates: set[ObjectId] = set()
        for meta in self.objects:
            for replica in meta.replicas:
                if replica.segment_id in self.draining:
                    continue  # dropped when the drain reaches it
                mounted = self.segments.get(replica.segment_id)
                if mounted is None:
                    raise AssertionError(f"{meta.object_id!r} has a replica on a gone segment")
                if not mounted.usable_by(meta.tenant):
                    raise AssertionError(
                        f"{meta.object_id!r} has a replica on {mounted.tenant!r}'s segment"
                    )
                live[replica.segment_id] = live.get(replica.segment_id, 0) + 1
                if mounted.info.disk and not self.disk.in_lru(replica.segment_id, meta.object_id):
                    raise AssertionError(f"{meta.object_id!r} is on disk but not in its LRU")
            if meta.object_id in self.policy:
                if meta.hard_pinned:
                    raise AssertionError(f"hard-pinned {meta.object_id!r} is an eviction candidate")
                candidates.add(meta.object_id)
            elif (
                meta.is_readable()
                and not meta.hard_pinned
                and not self.disk.busy(meta.object_id)
                and self.memory_replicas(meta)
            ):
                raise AssertionError(f"readable {meta.object_id!r} is not an eviction candidate")
        self.policy.check(candidates)
        self.reads.check()
        self.tasks.check()
        self.disk.check()
        for object_id in self.reads.checked_objects():
            if self.objects.get(object_id) is None:
                raise AssertionError(f"existence hold on gone object {object_id!r}")
        held: dict[str, int] = {}
        for preempted in self.preempted.values():
            for replica in preempted.replicas:
                held[replica.segment_id] = held.get(replica.segment_id, 0) + 1
        for mounted in self.segments.all_segments():
            sid = mounted.info.id
            doomed = 0
            if isinstance(mounted.allocator, DiskSpace):
                doomed = mounted.allocator.doomed_count
                for offset in mounted.allocator.doomed():
                    if not self.disk.is_doomed(sid, offset):
                        raise AssertionError(f"disk range {offset} of {sid} held for no deletion")
            expected = (
                live.get(sid, 0)
                + held.get(sid, 0)
                + self.reads.retired_on(sid)
                + self.tasks.held_on(sid)
                + self.disk.held_on(sid)
                + doomed
                + self.segments.grant_holds.held_on(sid)
            )
            if mounted.allocator.allocation_count != expected:
                raise AssertionError(f"segment {sid}: allocations leak or double-free")
