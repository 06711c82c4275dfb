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

from mooncake_py.types import ReplicaDescriptor, SegmentInfo

from ..config import MasterConfig
from .clients import ClientRegistry
from .lru import LeaseOrderedLRU
from .objects import ObjectId, ObjectMetadata, ObjectTable, Replica
from .segments import SegmentManager
from .session_registry import SessionLimits, SessionRegistry, pinned_by_session


@dataclasses.dataclass(order=True, slots=True)
class DiscardedBuffer:
    """Memory no object owns any more, freed only once nobody can still be touching it."""

    release_at: float
    segment_id: str = dataclasses.field(compare=False)
    offset: int = dataclasses.field(compare=False)


@dataclasses.dataclass(slots=True)
class Counters:
    """Monotonic event counts, for metrics and tests."""

    evicted_objects: int = 0
    evicted_bytes: int = 0
    evicted_soft_pinned: int = 0
    eviction_passes: int = 0
    sync_evictions: int = 0
    alloc_failures: int = 0
    released_objects: int = 0
    released_bytes: int = 0


_GONE_SEGMENT = SegmentInfo(id="", name="", base=1, size=1, te_endpoint="")


def is_soft_pinned(meta: ObjectMetadata, now: float) -> bool:
    """True while ``meta`` is effectively soft pinned: its own TTL pin has not expired, or a
    session holding it is pinned.

    This is the one test eviction uses; it costs O(sessions on the object) and reads the
    session flags through the object's references, not through the registry.
    """
    return meta.soft_pin_deadline > now or pinned_by_session(meta)


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
        self.objects = ObjectTable(on_reweigh=self.sessions.reweigh)
        self.segments = SegmentManager(config.allocation_strategy, rng)
        self.clients = ClientRegistry(config.client_ttl)
        self.policy = LeaseOrderedLRU()
        self.discarded: list[DiscardedBuffer] = []
        self.counters = Counters()
        self.lease_ttl_s = config.default_kv_lease_ttl / 1000.0
        # Bumped whenever objects may have stopped being soft pinned (an unpin, a member leaving
        # a pinned session, a TTL pin running out), so walks that skipped pinned candidates
        # know to look at them again. Deadlines of TTL pins wait in a heap until they pass.
        self.pin_epoch = 0
        self._pin_deadlines: list[float] = []
        self._replica_ids = itertools.count(1)

    def next_replica_id(self) -> int:
        """A fresh replica id."""
        return next(self._replica_ids)

    # -- object life cycle -----------------------------------------------------------------

    def mark_readable(self, meta: ObjectMetadata) -> None:
        """Its in-flight replicas are written: COMPLETE, and an eviction candidate."""
        self.objects.mark_complete(meta)
        if not meta.hard_pinned:
            self.policy.on_created(meta.object_id)

    def grant_lease(self, meta: ObjectMetadata, now: float) -> None:
        """A read: lease the object (its whole group when it has one) and count the access.

        An object whose lease still has more than half its TTL to run was accessed moments
        ago and cannot be evicted before the lease ends anyway, so its recency is not renewed
        again (as upstream skips group-wide refreshes): repeated probes of hot keys then cost a
        dict lookup, not a reordering. Its recency lags its last access by at most half a TTL.
        """
        ttl = self.lease_ttl_s
        fresh_after = now + ttl / 2
        if not meta.group_id:
            if meta.lease_timeout > fresh_after:
                meta.lease_timeout = max(meta.lease_timeout, now + ttl)
                return
            members = [meta]
        else:
            members = self.objects.group_members(meta.tenant, meta.group_id)
        for member in members:
            renew = member.lease_timeout <= fresh_after
            member.grant_lease(now, ttl)
            if renew and member.object_id in self.policy:
                self.policy.on_touched(member.object_id)

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
        meta = self.objects.erase(object_id)
        if meta is not None:
            self.sessions.on_object_removed(meta)
        return meta

    def release_replicas(
        self, meta: ObjectMetadata, doomed: list[Replica], now: float, keep_object: bool = False
    ) -> None:
        """Free ``doomed`` replicas; erase the object if nothing is left (unless ``keep_object``:
        the caller is about to give it new replicas).

        Memory under a live read lease is quarantined until the lease ends instead of being
        freed: a reader may still be copying out of it, and its transfer is only trusted while
        the lease holds, so the bytes it sees are never overwritten by a new writer first.
        """
        for replica in doomed:
            if meta.has_live_lease(now):
                self.discard(replica, meta.lease_timeout)
            else:
                self.segments.free(replica.segment_id, replica.offset)
        self.objects.drop_replicas(meta, doomed)
        if not meta.replicas and not keep_object:
            self.erase(meta.object_id)

    def discard(self, replica: Replica, release_at: float) -> None:
        """Free ``replica``'s memory at ``release_at`` rather than now."""
        heapq.heappush(
            self.discarded, DiscardedBuffer(release_at, replica.segment_id, replica.offset)
        )

    def free_due_discards(self, now: float) -> int:
        """Free every discarded buffer whose time has come; returns how many."""
        freed = 0
        while self.discarded and self.discarded[0].release_at <= now:
            buffer = heapq.heappop(self.discarded)
            self.segments.free(buffer.segment_id, buffer.offset)
            freed += 1
        return freed

    # -- segments --------------------------------------------------------------------------

    def unmount(self, segment_id: str) -> None:
        """Withdraw a segment: its replicas vanish, objects left with none are erased."""
        self.segments.unmount(segment_id)
        # Buffers waiting for release die with their segment; a remount of the same id starts
        # from an empty allocator that must not receive their frees.
        kept = [b for b in self.discarded if b.segment_id != segment_id]
        if len(kept) != len(self.discarded):
            heapq.heapify(kept)
            self.discarded = kept
        for object_id in self.objects.objects_on_segment(segment_id):
            meta = self.objects.get(object_id)
            if meta is None:
                continue
            lost = [r for r in meta.replicas if r.segment_id == segment_id]
            self.objects.drop_replicas(meta, lost)
            if not meta.replicas:
                self.erase(object_id)

    def describe(self, meta: ObjectMetadata, replica: Replica) -> ReplicaDescriptor:
        """Where a client finds ``replica``'s bytes."""
        segment = self.segments.get(replica.segment_id)
        info = segment.info if segment is not None else _GONE_SEGMENT
        return ReplicaDescriptor(
            id=replica.id,
            status=replica.status,
            segment_id=replica.segment_id,
            segment_name=info.name,
            offset=replica.offset,
            size=meta.size,
            te_endpoint=info.te_endpoint,
            host_id=info.host_id,
            shm_path=info.shm_path,
        )

    def used_ratio(self) -> float:
        """Allocated bytes over mounted capacity (0 with no segments)."""
        capacity = self.segments.capacity_bytes()
        return self.segments.used_bytes() / capacity if capacity else 0.0

    # -- invariants ------------------------------------------------------------------------

    def check(self) -> None:
        """Verify every part against the others. O(state).

        Raises:
            AssertionError: state is inconsistent.
        """
        self.objects.check()
        self.segments.check()
        self.sessions.check(self.objects)
        live: dict[str, int] = {}
        candidates: set[ObjectId] = set()
        for meta in self.objects:
            for replica in meta.replicas:
                if self.segments.get(replica.segment_id) is None:
                    raise AssertionError(f"{meta.object_id!r} has a replica on a gone segment")
                live[replica.segment_id] = live.get(replica.segment_id, 0) + 1
            if meta.object_id in self.policy:
                if meta.hard_pinned:
                    raise AssertionError(f"hard-pinned {meta.object_id!r} is an eviction candidate")
                candidates.add(meta.object_id)
            elif meta.is_readable() and not meta.hard_pinned:
                raise AssertionError(f"readable {meta.object_id!r} is not an eviction candidate")
        self.policy.check(candidates)
        discarded: dict[str, int] = {}
        for buffer in self.discarded:
            discarded[buffer.segment_id] = discarded.get(buffer.segment_id, 0) + 1
        for mounted in self.segments.all_segments():
            sid = mounted.info.id
            if mounted.allocator.allocation_count != live.get(sid, 0) + discarded.get(sid, 0):
                raise AssertionError(f"segment {sid}: allocations leak or double-free")
