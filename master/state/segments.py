"""Mounted segments, their allocators, and replica placement.

Each mounted segment gets its own :class:`OffsetAllocator`. Segments are grouped by name (the
owning client's hostname) because replicas of one object must land on distinct names, as
upstream places them.

Placement strategies (``--allocation_strategy``):

- ``random``: walk segment names from a random start;
- ``free_ratio_first``: sample a few names and try the emptiest first;
- ``local_first``: like random, but single-replica writes try the writer's host first.

Explicit preferences (``preferred_segment`` / ``preferred_segments``) are tried before the
strategy in every case.

Thread-safety: none. The master service serializes every call under its lock.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable

from mooncake_py import capability
from mooncake_py.types import SegmentInfo

from .allocator import OffsetAllocator

# Upper bound on the names a strategy walks for one object, as upstream's random strategy.
MAX_PLACEMENT_TRIES = 100


@dataclasses.dataclass(slots=True)
class MountedSegment:
    """A segment the master may allocate in, and the client that contributes it.

    Attributes:
        id_bytes: the segment id as UTF-8 (what capabilities sign), encoded once.
        proof_key: the segment's :func:`~mooncake_py.capability.proof_key`, computed once.
    """

    info: SegmentInfo
    client_id: str
    allocator: OffsetAllocator
    id_bytes: bytes = b""
    proof_key: bytes = b""


@dataclasses.dataclass(frozen=True, slots=True)
class Allocation:
    """``size`` bytes reserved at ``offset`` in ``segment``."""

    segment: MountedSegment
    offset: int
    size: int


@dataclasses.dataclass(frozen=True, slots=True)
class PlacementRequest:
    """What one object needs from placement.

    Attributes:
        size: bytes per replica.
        replica_num: replicas wanted (best effort; at least one is success).
        preferred_names: segment names to try first, in order.
        writer_host_id: the writer's host, used by local-first placement.
        local_first: put the writer's host segments right after the explicit preferences.
    """

    size: int
    replica_num: int
    preferred_names: tuple[str, ...] = ()
    writer_host_id: str = ""
    local_first: bool = False


class SegmentManager:
    """The mounted segments and allocation across them.

    Args:
        strategy: ``random``, ``free_ratio_first`` or ``local_first``.
        rng: random source (inject a seeded one for reproducible tests).
    """

    def __init__(self, strategy: str = "random", rng: random.Random | None = None) -> None:
        self._strategy = strategy
        self._rng = rng or random.Random()
        self._segments: dict[str, MountedSegment] = {}
        self._by_name: dict[str, list[MountedSegment]] = {}
        self._by_client: dict[str, dict[str, None]] = {}
        # Told of every range handed out (segment id, offset, size): read leases watch freed
        # ranges for reuse.
        self.on_allocated: Callable[[str, int, int], None] | None = None

    # -- mounting --------------------------------------------------------------------------

    def get(self, segment_id: str) -> MountedSegment | None:
        """The mounted segment with this id, or None."""
        return self._segments.get(segment_id)

    def segments_of(self, client_id: str) -> list[MountedSegment]:
        """Segments contributed by ``client_id``."""
        return [self._segments[s] for s in self._by_client.get(client_id, ())]

    def all_segments(self) -> list[MountedSegment]:
        """Every mounted segment."""
        return list(self._segments.values())

    def mount(self, client_id: str, info: SegmentInfo) -> MountedSegment:
        """Start allocating in ``info``. The caller has validated it and checked the id is free.

        Complexity: O(1).
        """
        id_bytes = info.id.encode()
        key = info.capability_key
        mounted = MountedSegment(
            info=info,
            client_id=client_id,
            allocator=OffsetAllocator(info.size),
            id_bytes=id_bytes,
            proof_key=capability.proof_key(key, id_bytes) if key else b"",
        )
        self._segments[info.id] = mounted
        self._by_name.setdefault(info.name, []).append(mounted)
        self._by_client.setdefault(client_id, {})[info.id] = None
        return mounted

    def unmount(self, segment_id: str) -> MountedSegment | None:
        """Forget a segment and its allocator; returns it, or None when it was not mounted.

        The caller drops the replicas that lived in it.
        """
        mounted = self._segments.pop(segment_id, None)
        if mounted is None:
            return None
        peers = self._by_name[mounted.info.name]
        peers.remove(mounted)
        if not peers:
            del self._by_name[mounted.info.name]
        owned = self._by_client[mounted.client_id]
        owned.pop(segment_id, None)
        if not owned:
            del self._by_client[mounted.client_id]
        return mounted

    # -- capacity --------------------------------------------------------------------------

    def capacity_bytes(self) -> int:
        """Total bytes of every mounted segment."""
        return sum(m.info.size for m in self._segments.values())

    def used_bytes(self) -> int:
        """Bytes currently allocated across every mounted segment."""
        return sum(m.allocator.used_bytes for m in self._segments.values())

    def free(self, segment_id: str, offset: int) -> None:
        """Return an allocation to its segment; a no-op when the segment is gone."""
        mounted = self._segments.get(segment_id)
        if mounted is not None:
            mounted.allocator.free(offset)

    # -- placement -------------------------------------------------------------------------

    def allocate(self, request: PlacementRequest) -> list[Allocation]:
        """Reserve up to ``replica_num`` replicas on distinct segment names.

        Returns:
            The allocations made, possibly fewer than asked (best effort) or none at all.

        Complexity: O(names tried × segments per name × log free ranges).
        """
        placed: list[Allocation] = []
        used_names: set[str] = set()
        for name in self._candidate_names(request):
            if len(placed) >= request.replica_num:
                break
            if name in used_names or name not in self._by_name:
                continue
            allocation = self._allocate_in_name(name, request.size)
            if allocation is not None:
                placed.append(allocation)
                used_names.add(name)
        return placed

    def _candidate_names(self, request: PlacementRequest) -> Iterable[str]:
        yield from request.preferred_names
        if (self._strategy == "local_first" or request.local_first) and request.replica_num == 1:
            yield from self._names_on_host(request.writer_host_id)
        names = list(self._by_name)
        if not names:
            return
        if self._strategy == "free_ratio_first":
            sample_size = min(len(names), 6 * request.replica_num)
            start = self._rng.randrange(len(names))
            sample = [names[(start + i) % len(names)] for i in range(sample_size)]
            yield from sorted(sample, key=self._free_ratio_of_name, reverse=True)
        start = self._rng.randrange(len(names))
        for i in range(min(len(names), MAX_PLACEMENT_TRIES)):
            yield names[(start + i) % len(names)]

    def _names_on_host(self, host_id: str) -> list[str]:
        if not host_id:
            return []
        return [
            n for n, segs in self._by_name.items() if any(s.info.host_id == host_id for s in segs)
        ]

    def _free_ratio_of_name(self, name: str) -> float:
        segments = self._by_name.get(name, [])
        capacity = sum(s.info.size for s in segments)
        free = sum(s.allocator.free_bytes for s in segments)
        return free / capacity if capacity else 0.0

    def has_name(self, name: str) -> bool:
        """Whether a mounted segment is named ``name``. O(1)."""
        return name in self._by_name

    def allocate_in(self, name: str, size: int) -> Allocation | None:
        """Reserve ``size`` bytes in a segment named ``name``; None when none has room (or
        no segment has the name). O(segments of the name × log free ranges)."""
        if name not in self._by_name:
            return None
        return self._allocate_in_name(name, size)

    def _allocate_in_name(self, name: str, size: int) -> Allocation | None:
        segments = self._by_name[name]
        start = self._rng.randrange(len(segments))
        for i in range(len(segments)):
            segment = segments[(start + i) % len(segments)]
            if size > segment.allocator.largest_free_block:
                continue
            offset = segment.allocator.allocate(size)
            if offset is not None:
                if self.on_allocated is not None:
                    self.on_allocated(segment.info.id, offset, size)
                return Allocation(segment=segment, offset=offset, size=size)
        return None

    def check(self) -> None:
        """Verify the name and client indexes and every allocator. O(segments + allocations).

        Raises:
            AssertionError: an index or allocator is inconsistent.
        """
        by_name_ids = {m.info.id for segs in self._by_name.values() for m in segs}
        by_client_ids = {s for owned in self._by_client.values() for s in owned}
        if by_name_ids != set(self._segments) or by_client_ids != set(self._segments):
            raise AssertionError("segment indexes disagree with mounted segments")
        for mounted in self._segments.values():
            if mounted.info.id not in self._by_client.get(mounted.client_id, {}):
                raise AssertionError(f"segment {mounted.info.id} not indexed under its client")
            mounted.allocator.check()
