"""The disk tier's rules: when objects go to disk, come back to memory, and leave the disk.

An owner that mounts a disk tier (a segment with ``disk=True``, :mod:`..state.disk_space`)
next to its memory segment gets, from here, the tasks it runs (:mod:`..state.disk_tier`):

- **Demotion instead of loss.** When eviction picks an object (:meth:`DiskMoves.demote`, called
  by the evictor for every victim) and the object already has a disk replica, its memory
  replicas are simply dropped: it stays readable from disk. Otherwise, when a memory replica's
  owner has a disk tier the object's tenant may use, a range of that tier is reserved and a
  *spill* task asks the owner to write the file; the memory stays allocated and readable until
  the owner reports the file complete (:meth:`DiskMoves.finished`), then the disk replica joins
  the object and the memory goes. Objects that cannot spill are evicted as before.
- **Room on disk.** A spill that finds its tier's quota full first frees the oldest objects of
  that tier's own LRU: an object also in memory only loses its disk replica; one only on disk
  goes (never hard-pinned, read, written or busy objects, nor soft-pinned ones when
  ``allow_evict_soft_pinned_objects`` is false).
- **Promotion.** A read of an object that is only on disk answers with its disk replica and, with
  ``promotion_on_hit`` and memory below the eviction watermark, reserves a range in the owner's
  own memory segment and asks the owner to copy the file there (:meth:`DiskMoves.after_read`);
  the object then has both replicas, so evicting it again costs nothing.
- **Failures.** A spill that fails or times out leaves the object in memory as an ordinary
  candidate, and that tier is passed over for a while (longer after each failure in a row,
  :meth:`~..state.disk_tier.DiskTiers.spill_failed`), so a broken or hung disk degrades to
  plain eviction rather than to a stall. A failed promotion frees its reservation; one that
  timed out holds it for :data:`LATE_PROMOTION_HOLD_S` first (its owner may still be copying).

Thread-safety: none; every method runs under the service lock.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable

from mooncake_py.errors import ErrorCode
from mooncake_py.types import DiskTaskKind, ReplicaStatus

from ..state.disk_tier import DiskTaskRecord
from ..state.objects import ObjectMetadata, Replica
from ..state.segments import Allocation, MountedSegment
from ..state.store import StoreState, is_soft_pinned

LATE_PROMOTION_HOLD_S = 120.0
"""How long the memory of a promotion that timed out is held before it is reused: a late copy
of its owner must land in memory nobody else owns."""
DISK_EVICTION_BUDGET = 256
"""Objects of a tier's LRU one reservation may examine to make room."""
RETRY_AFTER_MS = 10
"""What a write that found no room while spills are in flight is told to wait before retrying."""


class DiskMoves:
    """Applies the disk tier's rules to a :class:`StoreState` (see the module docstring)."""

    def __init__(self, state: StoreState) -> None:
        self._state = state

    # -- eviction: demote rather than lose -------------------------------------------------

    def demote(self, meta: ObjectMetadata, now: float, spared: Collection[Hashable] = ()) -> bool:
        """Eviction picked ``meta``: keep it on disk if the tier allows. Making room on a full
        tier never takes ``meta`` or an object in ``spared`` (the evictor's: an upsert is
        replacing it).

        Returns:
            True when the object stays (its memory was dropped because a disk replica exists,
            or a spill started); False when it is to be evicted as before.
        Complexity: O(replicas), plus the disk eviction a full tier needs (bounded).
        """
        state = self._state
        if not state.segments.has_disks or not state.config.enable_offload:
            return False
        object_id = meta.object_id
        if state.disk.busy(object_id):
            return True  # its spill is under way; its memory goes when it is done
        memory = state.memory_replicas(meta)
        if not memory:
            state.policy.on_removed(object_id)
            return True
        if state.disk_replicas(meta):
            state.policy.on_removed(object_id)
            state.release_replicas(meta, memory, now, keep_object=True)
            state.counters.demoted_objects += 1
            return True
        for source in memory:
            tier = self._tier_for(source, meta.tenant, now)
            if tier is None:
                continue
            target = self.reserve_disk(tier, meta.size, now, spared=(meta.object_id, spared))
            if target is None:
                continue
            freed_on = tuple((r.segment_id, r.size) for r in memory)
            state.disk.start(
                DiskTaskKind.SPILL, meta, source, target, tier.client_id, now, freed_on
            )
            state.policy.on_removed(object_id)
            state.counters.spills_started += 1
            return True
        return False

    def _tier_for(self, source: Replica, tenant: str, now: float) -> MountedSegment | None:
        """The disk tier of ``source``'s segment owner, if ``tenant`` may use it and it is not
        paused after a failure."""
        segments = self._state.segments
        memory = segments.get(source.segment_id)
        if memory is None or memory.info.disk:
            return None
        tier = segments.disk_of(memory.client_id)
        if tier is None or not tier.usable_by(tenant):
            return None
        paused = self._state.disk.failed_until.get(tier.info.id)
        if paused is not None and paused > now:
            return None
        return tier

    def reserve_disk(
        self,
        tier: MountedSegment,
        size: int,
        now: float,
        spared: tuple[Hashable, Collection[Hashable]] | None = None,
    ) -> Allocation | None:
        """A fresh range of ``size`` bytes on ``tier``, freeing the oldest objects of its LRU
        when the quota is full (never the object ``spared[0]`` nor those in ``spared[1]``);
        None when no room can be made.
        Complexity: O(1), or O(:data:`DISK_EVICTION_BUDGET`) when the quota is full."""
        state = self._state
        segments = state.segments
        if size > tier.allocator.capacity:
            return None
        reserved = segments.allocate_disk(tier, size)
        if reserved is not None:
            return reserved
        segment_id = tier.info.id
        for object_id in state.disk.oldest(segment_id, DISK_EVICTION_BUDGET):
            victim = state.objects.get(object_id)
            replica = None if victim is None else self._replica_on(victim, segment_id)
            if victim is None or replica is None:
                state.disk.forget(object_id)  # a stale entry: the replica went another way
                continue
            keep = spared is not None and (object_id == spared[0] or object_id in spared[1])
            if keep or not self._may_leave_disk(victim, now):
                state.disk.to_newest(segment_id, object_id)
                continue
            state.disk.forget(object_id)
            if state.memory_replicas(victim):
                state.release_replicas(victim, [replica], now, keep_object=True)
            else:
                state.release_replicas(victim, list(victim.replicas), now)
                state.counters.disk_evicted_objects += 1
            state.counters.disk_evicted_bytes += replica.size
            reserved = segments.allocate_disk(tier, size)
            if reserved is not None:
                return reserved
        return None

    def _may_leave_disk(self, meta: ObjectMetadata, now: float) -> bool:
        state = self._state
        if meta.hard_pinned or meta.is_writing() or state.disk.busy(meta.object_id):
            return False
        if state.reads.is_read(meta):
            return False
        allowed = state.config.allow_evict_soft_pinned_objects
        return allowed or not is_soft_pinned(meta, now)

    def _replica_on(self, meta: ObjectMetadata, segment_id: str) -> Replica | None:
        for replica in meta.replicas:
            if replica.segment_id == segment_id and replica.status is ReplicaStatus.COMPLETE:
                return replica
        return None

    # -- reads: promotion ------------------------------------------------------------------

    def after_read(self, meta: ObjectMetadata, now: float) -> None:
        """A reader was given ``meta``'s replicas: if they are all on disk, promote it when
        its owner's memory has room (see the module docstring). O(replicas + segments of the
        owner)."""
        state = self._state
        config = state.config
        if not config.promotion_on_hit or state.disk.busy(meta.object_id):
            return
        if meta.is_writing() or state.memory_replicas(meta):
            return
        disk = state.disk_replicas(meta)
        if not disk or state.used_ratio() >= config.eviction_high_watermark_ratio:
            return
        source = disk[0]
        tier = state.segments.get(source.segment_id)
        if tier is None:
            return
        for memory in state.segments.segments_of(tier.client_id):
            if memory.info.disk or not memory.usable_by(meta.tenant):
                continue
            target = state.segments.allocate_on(memory, meta.size)
            if target is not None:
                state.disk.start(DiskTaskKind.PROMOTE, meta, source, target, tier.client_id, now)
                state.counters.promotions_started += 1
                return

    # -- the owner's reports ---------------------------------------------------------------

    def finished(self, record: DiskTaskRecord, code: int, now: float, late: bool = False) -> None:
        """The owner ran ``record`` (``code`` 0: the copy is complete), or it failed (``code``
        < 0; ``late``: it timed out, and the owner may still be copying). Applies the outcome;
        the caller already took it out of the table. O(replicas)."""
        state = self._state
        meta = state.objects.get(record.meta.object_id)
        current = (
            not record.cancelled
            and meta is record.meta
            and record.source in meta.replicas
            and record.source.status is ReplicaStatus.COMPLETE
        )
        if record.kind is DiskTaskKind.SPILL:
            self._spill_finished(record, meta if current else None, code, now)
        else:
            self._promotion_finished(record, meta if current else None, code, late)

    def _spill_finished(
        self, record: DiskTaskRecord, meta: ObjectMetadata | None, code: int, now: float
    ) -> None:
        state = self._state
        target = record.target
        if meta is None or code != 0:
            state.segments.free(target.segment.info.id, target.offset)
            if code != 0:
                state.counters.spill_failures += 1
                state.disk.spill_failed(target.segment.info.id, now)
            state.restore_candidate(record.meta.object_id)
            return
        state.disk.spill_done(target.segment.info.id)
        self._attach(meta, target)
        state.disk.on_disk(target.segment.info.id, meta.object_id)
        state.counters.spilled_objects += 1
        state.counters.spilled_bytes += meta.size
        if meta.hard_pinned:
            return  # pinned meanwhile: it stays in memory too
        if is_soft_pinned(meta, now):
            state.policy.on_created(meta.object_id)  # still a candidate, now a cheap one
            return
        state.release_replicas(meta, state.memory_replicas(meta), now, keep_object=True)

    def _promotion_finished(
        self, record: DiskTaskRecord, meta: ObjectMetadata | None, code: int, late: bool
    ) -> None:
        state = self._state
        target = record.target
        if meta is None or code != 0:
            segments = state.segments
            if late and record.sent:
                until = segments.wall_ms() + round(LATE_PROMOTION_HOLD_S * 1000)
                segments.grant_holds.hold(target.segment.info.id, target.offset, until)
            else:
                segments.free(target.segment.info.id, target.offset)
            if code != 0:
                state.counters.promotion_failures += 1
            return
        self._attach(meta, target)
        state.counters.promoted_objects += 1
        if not meta.hard_pinned:
            state.policy.on_created(meta.object_id)

    def _attach(self, meta: ObjectMetadata, target: Allocation) -> None:
        """Give ``meta`` the range a finished copy filled, as a COMPLETE replica."""
        state = self._state
        replica = Replica(
            state.next_replica_id(),
            target.segment.info.id,
            target.offset,
            target.size,
            ReplicaStatus.COMPLETE,
        )
        state.objects.add_replicas(meta, [replica])

    def expire(self, now: float) -> int:
        """Fail the tasks whose deadline passed; returns how many. O(tasks)."""
        state = self._state
        expired = state.disk.expired(now)
        for task_id in expired:
            record = state.disk.finish(task_id)
            if record is not None:
                self.finished(record, int(ErrorCode.TASK_NOT_FOUND), now, late=True)
        return len(expired)
