"""Eviction: the store's rules for what may go, applied to the policy's proposals.

Two entry points, both synchronous and driven by an explicit ``now``:

- watermark passes (:meth:`Evictor.plan` then :meth:`Evictor.run_slice` until done): when used
  memory crosses ``eviction_high_watermark_ratio`` (or a write failed for lack of space), free
  about ``eviction_ratio`` of the candidates, oldest access first; soft-pinned objects only in a
  fallback pass when the others cannot reach the lower bound, and never when
  ``allow_evict_soft_pinned_objects`` is false. A pass works in slices of bounded size so the
  caller can let other requests in between.
- :meth:`Evictor.allocate_evicting`: a write that finds no free space evicts (bounded work) and
  retries before failing with NO_AVAILABLE_HANDLE.

Never evicted: hard-pinned objects (not candidates at all), objects with a live read lease,
objects being written (which covers every replica with a transfer in flight), and groups with
any such member (groups go all together or not at all).

Thread-safety: none; the service calls it under its lock.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable

from mooncake_py.master.eviction import Verdict
from mooncake_py.master.metadata import ObjectMetadata
from mooncake_py.master.segments import Allocation, PlacementRequest
from mooncake_py.master.state import StoreState, is_soft_pinned

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


class Evictor:
    """Applies eviction to a :class:`StoreState`."""

    def __init__(self, state: StoreState) -> None:
        self._state = state
        self.allocation_failed = False  # set by a failed write: evict even below the watermark

    # -- rules -----------------------------------------------------------------------------

    def verdict(self, object_id: Hashable, now: float) -> Verdict:
        """May this candidate go now? O(group size)."""
        meta = self._state.objects.get(object_id)  # type: ignore[arg-type]
        if meta is None or meta.hard_pinned:
            return Verdict.SKIP
        members = self._victims_with(meta)
        if any(m.is_writing() or m.has_live_lease(now) or not m.is_readable() for m in members):
            return Verdict.SKIP
        if any(is_soft_pinned(m, now) for m in members):
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
            pinned = is_soft_pinned(victim, now)
            counters.evicted_objects += 1
            counters.evicted_soft_pinned += int(pinned)
            counters.evicted_bytes += victim.size * len(victim.replicas)
            self._state.release_replicas(victim, list(victim.replicas), now)
            removed += 1
        return removed

    # -- watermark passes ------------------------------------------------------------------

    def plan(self) -> EvictionPass | None:
        """Start a pass if memory use calls for one, else None. O(segments)."""
        config = self._state.config
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
        lower_bound = math.ceil(base * max(ratio * 0.5, over))
        self._state.counters.eviction_passes += 1
        return EvictionPass(target=target, lower_bound=min(lower_bound, target))

    def run_slice(self, work: EvictionPass, now: float, budget: int = SLICE_BUDGET) -> EvictionPass:
        """Advance a pass by at most ``budget`` examined candidates; sets ``work.done``."""
        if work.done:
            return work
        goal = work.lower_bound if work.fallback else work.target
        examined = 0

        def judge(object_id: Hashable) -> Verdict:
            nonlocal examined
            examined += 1
            return self.verdict(object_id, now)

        proposals = self._state.policy.propose(judge, budget, include_pinned=work.fallback)
        for object_id in proposals:
            work.evicted += self._evict(object_id, now)
            if work.evicted >= goal:
                proposals.close()
                break
        if work.evicted >= goal or examined < budget:
            self._finish_stage(work)
        return work

    def _finish_stage(self, work: EvictionPass) -> None:
        allow_pinned = self._state.config.allow_evict_soft_pinned_objects
        if not work.fallback and work.evicted < work.lower_bound and allow_pinned:
            work.fallback = True
        else:
            work.done = True

    def evict_once(self, now: float) -> EvictionPass | None:
        """A whole watermark pass in one call (tests and tools); None if none was needed."""
        work = self.plan()
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
            background pass then runs even below the watermark).
        """
        allocations = self._state.segments.allocate(request)
        if allocations:
            return allocations
        if request.size > self._state.segments.largest_segment_bytes():
            return []  # could never fit: evicting would only lose data
        stages = [False, True] if self._state.config.allow_evict_soft_pinned_objects else [False]
        for include_pinned in stages:
            freed = 0
            proposals = self._state.policy.propose(
                lambda oid: self.verdict(oid, now), SYNC_EVICTION_BUDGET, include_pinned
            )
            for object_id in proposals:
                meta = self._state.objects.get(object_id)  # type: ignore[arg-type]
                freed += meta.size if meta is not None else 0
                self._evict(object_id, now)
                self._state.counters.sync_evictions += 1
                if freed < request.size:
                    continue
                freed = 0
                allocations = self._state.segments.allocate(request)
                if allocations:
                    proposals.close()
                    return allocations
            allocations = self._state.segments.allocate(request)
            if allocations:
                return allocations
        self._state.counters.alloc_failures += 1
        self.allocation_failed = True
        return []
