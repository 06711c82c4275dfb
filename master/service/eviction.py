"""Eviction: the store's rules for what may go, applied to the policy's proposals.

Two entry points, both synchronous and driven by an explicit ``now``:

- watermark passes (:meth:`Evictor.plan` then :meth:`Evictor.run_slice` until done): when used
  memory crosses ``eviction_high_watermark_ratio`` (or a write failed for lack of space), free
  about ``eviction_ratio`` of the candidates, oldest access first; soft-pinned objects only in a
  fallback pass when the others cannot reach the lower bound, and never when
  ``allow_evict_soft_pinned_objects`` is false. A pass works in slices of bounded size so the
  caller can let other requests in between.
- :meth:`Evictor.allocate_evicting`: a write that finds no free space evicts (bounded work) and
  retries before failing with NO_AVAILABLE_HANDLE. It frees only objects whose every replica
  lies in segments the writer's tenant may use (its own, shared and unowned ones), so one
  tenant filling its segments never evicts another tenant's objects from theirs.

Never evicted: hard-pinned objects (not candidates at all), objects a reader is copying from
(a live read lease), objects being written (which covers every replica with a transfer in
flight), and groups with any such member (groups go all together or not at all). Objects an
existence check found, and that its client has not read yet, go in the fallback stage with the
soft-pinned ones (those only when ``allow_evict_soft_pinned_objects``).

Thread-safety: none; the service calls it under its lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING

from ..state.lru import Verdict
from ..state.objects import ObjectMetadata
from ..state.segments import Allocation, PlacementRequest
from ..state.store import StoreState, is_soft_pinned

if TYPE_CHECKING:
    from .disk_moves import DiskMoves

# Candidates examined per slice: bounds how long one slice holds the service lock.
SLICE_BUDGET = 512
# Candidates a single write may examine while evicting to make room for itself.
SYNC_EVICTION_BUDGET = 4096


@dataclasses.dataclass(slots=True)
class EvictionPass:
    """One watermark pass in progress.

    Attributes:
        target: objects to evict in the ordinary pass.
        lower_bound: objects that must go, falling back to soft-pinned ones if allowed.
        evicted: objects evicted so far.
        fallback: True once the pass has moved on to soft-pinned objects.
        done: True when the pass is finished.
    """

    target: int
    lower_bound: int
    evicted: int = 0
    fallback: bool = False
    done: bool = False
    cursor: int = -1
    resumed: bool = False


class Evictor:
    """Applies eviction to a :class:`StoreState`."""

    def __init__(self, state: StoreState, disk: DiskMoves | None = None) -> None:
        self._state = state
        # Where victims go instead of away when their owner has a disk tier.
        self._disk = disk
        self.allocation_failed = False  # set by a failed write: evict even below the watermark
        self.room_coming = False  # see allocate_evicting
        self._spared: set[Hashable] = set()
        # Where the last pass's ordinary stage stopped, valid while no pin has ended.
        self._pass_cursor = -1
        self._pass_epoch = -1
        # Where the last write's walk stopped, and what it assumed: protected candidates it
        # passed stay behind the cursor only while no pin ended and the same segments count.
        self._sync_cursor = -1
        self._sync_epoch = -1
        self._sync_useful: frozenset[str] = frozenset()

    # -- rules -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def sparing(self, object_id: Hashable) -> Iterator[None]:
        """Keep one object out of eviction's reach meanwhile, without moving it in LRU order
        (an upsert allocating the new value of the very object it replaces)."""
        self._spared.add(object_id)
        try:
            yield
        finally:
            self._spared.discard(object_id)

    def verdict(self, object_id: Hashable, now: float) -> Verdict:
        """May this candidate go now? O(group size)."""
        meta = self._state.objects.get(object_id)  # type: ignore[arg-type]
        if meta is None or meta.hard_pinned:
            return Verdict.SKIP
        members = self._victims_with(meta)
        if self._spared and any(m.object_id in self._spared for m in members):
            return Verdict.SKIP  # evicting any member takes the spared one with it
        reads = self._state.reads
        if any(m.is_writing() or reads.is_read(m) or not m.is_readable() for m in members):
            return Verdict.SKIP
        if any(is_soft_pinned(m, now) for m in members):
            allowed = self._state.config.allow_evict_soft_pinned_objects
            return Verdict.PINNED if allowed else Verdict.SKIP
        if any(reads.is_checked(m.object_id) for m in members):
            # Found by an existence check its client has not read yet: after everything else.
            return Verdict.PINNED
        return Verdict.EVICT

    def _victims_with(self, meta: ObjectMetadata) -> list[ObjectMetadata]:
        if not meta.group_id:
            return [meta]
        members = self._state.objects.group_members(meta.tenant, meta.group_id)
        return [m for m in members if not m.hard_pinned]

    def _evict(self, object_id: Hashable, now: float) -> int:
        """Evict a candidate (with its group); returns the number of objects removed."""
        meta = self._state.objects.get(object_id)  # type: ignore[arg-type]
        if meta is None:
            return 0
        removed = 0
        counters = self._state.counters
        for victim in self._victims_with(meta):
            if self._disk is not None and self._disk.demote(victim, now, self._spared):
                removed += 1  # kept on disk (or on its way there)
                continue
            pinned = is_soft_pinned(victim, now)
            counters.evicted_objects += 1
            counters.evicted_soft_pinned += int(pinned)
            counters.evicted_bytes += victim.size * len(victim.replicas)
            self._state.release_replicas(victim, list(victim.replicas), now)
            removed += 1
        return removed

    def _evict_and_retry(
        self, object_id: Hashable, request: PlacementRequest, now: float
    ) -> list[Allocation]:
        meta = self._state.objects.get(object_id)  # type: ignore[arg-type]
        if meta is None:
            return []
        touched = {r.segment_id for r in meta.replicas}
        self._evict(object_id, now)
        self._state.counters.sync_evictions += 1
        # Retry as soon as one freed segment has a free block big enough.
        if any(self._fits(segment_id, request.size) for segment_id in touched):
            return self._state.segments.allocate(request)
        return []

    def _fits(self, segment_id: str, size: int) -> bool:
        mounted = self._state.segments.get(segment_id)
        return mounted is not None and mounted.allocator.largest_free_block >= size

    # -- watermark passes ------------------------------------------------------------------

    def plan(self, now: float | None = None) -> EvictionPass | None:
        """Start a pass if memory use calls for one, else None. O(segments).

        Given ``now``, the ordinary stage resumes where the last pass's stopped when no pin
        has ended since: everything older was evicted or protected then and still is, so a
        store whose oldest objects are pinned is not walked from its oldest end every pass.
        """
        config = self._state.config
        if now is not None:
            self._state.reads.expire_due(now)
        used = self._state.used_ratio()
        over = used - config.eviction_high_watermark_ratio
        if over <= 0 and not self.allocation_failed:
            return None
        self.allocation_failed = False
        base = len(self._state.policy)
        if base == 0:
            return None
        ratio = max(config.eviction_ratio, over + config.eviction_ratio)
        target = math.ceil(base * ratio)
        if target == 0:
            return None
        lower_bound = math.ceil(base * max(ratio * 0.5, over))
        self._state.counters.eviction_passes += 1
        work = EvictionPass(target=target, lower_bound=min(lower_bound, target))
        if now is not None and self._state.current_pin_epoch(now) == self._pass_epoch:
            work.cursor, work.resumed = self._pass_cursor, self._pass_cursor >= 0
        return work

    def run_slice(self, work: EvictionPass, now: float, budget: int = SLICE_BUDGET) -> EvictionPass:
        """Advance a pass by at most ``budget`` judged candidates; sets ``work.done``.

        Each stage walks the candidates once, from the oldest access on, so a pass ends after
        at most two walks however many candidates are protected.
        """
        if work.done:
            return work
        self._state.reads.expire_due(now)
        goal = work.lower_bound if work.fallback else work.target
        if work.evicted < goal:
            selection = self._state.policy.select(
                lambda oid: self.verdict(oid, now),
                want=goal - work.evicted,
                limit=budget,
                after=work.cursor,
                include_pinned=work.fallback,
            )
            for object_id in selection.victims:
                work.evicted += self._evict(object_id, now)
            work.cursor = selection.cursor
            if not selection.exhausted and work.evicted < goal:
                return work
            if work.evicted < goal and work.resumed and not work.fallback:
                work.cursor, work.resumed = -1, False  # the newest end: go round once
                return work
        self._finish_stage(work, now)
        return work

    def _finish_stage(self, work: EvictionPass, now: float) -> None:
        if not work.fallback:
            self._pass_cursor = work.cursor
            self._pass_epoch = self._state.current_pin_epoch(now)
        if not work.fallback and work.evicted < work.lower_bound:
            work.fallback = True
            work.cursor = -1
        else:
            work.done = True

    def evict_once(self, now: float) -> EvictionPass | None:
        """A whole watermark pass in one call (tests and tools); None if none was needed."""
        work = self.plan(now)
        while work is not None and not work.done:
            self.run_slice(work, now)
        return work

    # -- eviction on the write path --------------------------------------------------------

    def allocate_evicting(self, request: PlacementRequest, now: float) -> list[Allocation]:
        """Allocate, evicting oldest candidates (bounded work) when there is no room.

        Soft-pinned candidates are taken only after the others could not make room, and never
        when ``allow_evict_soft_pinned_objects`` is false.

        Returns:
            The allocations, or [] when no evictable object could make room (the next
            background pass then runs even below the watermark). After [], :attr:`room_coming`
            says whether spills in flight are freeing memory the value could fit in (the
            writer may retry soon) rather than none being able to.
        """
        self.room_coming = False
        segments = self._state.segments
        allocations = segments.allocate(request)
        if allocations:
            return allocations
        # Holds of readers that died or hung may be all that stands in the way.
        if self._state.reads.expire_due(now):
            allocations = segments.allocate(request)
            if allocations:
                return allocations
        # Only memory in segments large enough for the value, and that the writer's tenant
        # may use, can ever make room for it.
        usable = segments.usable_by(request.tenant)
        usable_ids = frozenset(m.info.id for m in usable)
        if segments.has_disks:
            # A disk replica frees no memory: it neither helps nor forbids evicting its object.
            usable_ids |= frozenset(
                d.info.id for d in segments.disk_segments() if d.usable_by(request.tenant)
            )
        useful = frozenset(m.info.id for m in usable if m.allocator.usable_capacity >= request.size)
        if not useful:
            return []  # could never fit: evicting would only lose data
        epoch = self._state.current_pin_epoch(now)
        if epoch != self._sync_epoch or useful != self._sync_useful:
            self._sync_cursor, self._sync_epoch, self._sync_useful = -1, epoch, useful

        def judge(object_id: Hashable) -> Verdict:
            meta = self._state.objects.get(object_id)  # type: ignore[arg-type]
            if meta is None or not any(r.segment_id in useful for r in meta.replicas):
                return Verdict.SKIP
            if not all(r.segment_id in usable_ids for r in meta.replicas):
                return Verdict.SKIP  # would free memory of segments the writer may not use
            return self.verdict(object_id, now)

        for include_pinned in (False, True):
            # Ordinary candidates resume where the last write stopped, so the protected ones
            # met then are not judged again on every write; the fallback walks from the start.
            cursor = -1 if include_pinned else self._sync_cursor
            wrapped = cursor == -1
            budget = SYNC_EVICTION_BUDGET
            while budget > 0:
                selection = self._state.policy.select(
                    judge, want=1, limit=budget, after=cursor, include_pinned=include_pinned
                )
                budget -= max(selection.examined, 1)
                cursor = selection.cursor
                for object_id in selection.victims:
                    allocations = self._evict_and_retry(object_id, request, now)
                    if allocations:
                        if not include_pinned:
                            self._sync_cursor = cursor
                        return allocations
                if self._state.disk.spilling_on(useful, now) >= request.size:
                    # Enough memory is on its way to disk: the write retries once it is free
                    # (the caller says when) rather than have more objects spilled (or lost)
                    # for it now.
                    self._state.counters.alloc_failures += 1
                    self.allocation_failed = True
                    self.room_coming = True
                    return []
                if selection.exhausted:
                    if wrapped:
                        break
                    wrapped, cursor = True, -1
            if not include_pinned:
                self._sync_cursor = -1
            if len(usable) < len(segments.memory_segments()):
                # Other tenants' candidates may have used up the budget: the writer's own
                # segments' objects decide, so a tenant never fails while they hold
                # evictable objects of its own.
                allocations = self._evict_on_segments(useful, judge, request, now, include_pinned)
                if allocations:
                    return allocations
        self._state.counters.alloc_failures += 1
        self.allocation_failed = True
        self.room_coming = self._state.disk.spilling_on(useful, now) > 0
        return []

    def _evict_on_segments(
        self,
        segment_ids: frozenset[str],
        judge: Callable[[Hashable], Verdict],
        request: PlacementRequest,
        now: float,
        include_pinned: bool,
    ) -> list[Allocation]:
        """Evict candidates with a replica on ``segment_ids`` (in no particular order) until
        ``request`` fits. O(objects on those segments)."""
        objects = self._state.objects
        for segment_id in sorted(segment_ids):
            for object_id in objects.objects_on_segment(segment_id):
                if object_id not in self._state.policy:
                    continue
                verdict = judge(object_id)
                if verdict is Verdict.EVICT or (verdict is Verdict.PINNED and include_pinned):
                    allocations = self._evict_and_retry(object_id, request, now)
                    if allocations:
                        return allocations
        return []
