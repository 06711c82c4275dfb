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

**Ownership.** A segment mounted with tokens required belongs to its mounter's tenant
(:attr:`MountedSegment.tenant`); one mounted without belongs to nobody (""). A tenant's
objects are placed only in segments it may use (:meth:`MountedSegment.usable_by`): its own,
shared ones and unowned ones, whatever the strategy or the preferences name.

Thread-safety: none. The master service serializes every call under its lock.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from mooncake_py import capability
from mooncake_py.types import SegmentInfo

from .allocator import OffsetAllocator
from .disk_space import DiskSpace
from .grant_holds import GrantHolds

if TYPE_CHECKING:
    from ..ha.journal import Journal

# Upper bound on the names a strategy walks for one object, as upstream's random strategy.
MAX_PLACEMENT_TRIES = 100


@dataclasses.dataclass(slots=True)
class MountedSegment:
    """A segment the master may allocate in, and the client that contributes it.

    Attributes:
        signer: mints the segment's capabilities (its key and id prepared once); None for a
            segment mounted without a key (it gets none).
        tenant: the tenant it belongs to; "" for nobody's (mounted without tokens).
    """

    info: SegmentInfo
    client_id: str
    allocator: OffsetAllocator | DiskSpace
    signer: capability.SegmentSigner | None = None
    tenant: str = ""

    def usable_by(self, tenant: str) -> bool:
        """Whether ``tenant``'s objects may be placed here: it is the tenant's own, shared,
        or nobody's. O(1)."""
        return not self.tenant or self.tenant == tenant or self.info.shared

    @property
    def is_disk(self) -> bool:
        """A disk tier (:mod:`.disk_space`), not memory."""
        return self.info.disk


@dataclasses.dataclass(frozen=True, slots=True)
class Allocation:
    """``size`` bytes reserved at ``offset`` in ``segment``."""

    segment: MountedSegment
    offset: int
    size: int


@dataclasses.dataclass(frozen=True, slots=True)
class PlacedRun:
    """Values ``first``, ``first + 1``, ... of a batch (one per entry of ``offsets``),
    placed side by side in ``segment`` at ``offsets`` (:meth:`SegmentManager.place_batch`)."""

    first: int
    segment: MountedSegment
    offsets: list[int]


@dataclasses.dataclass(frozen=True, slots=True)
class PlacementRequest:
    """What one object needs from placement.

    Attributes:
        size: bytes per replica.
        replica_num: replicas wanted (best effort; at least one is success).
        preferred_names: segment names to try first, in order.
        writer_host_id: the writer's host, used by local-first placement.
        local_first: put the writer's host segments right after the explicit preferences.
        tenant: whose object it is: only segments it may use are candidates.
    """

    size: int
    replica_num: int
    preferred_names: tuple[str, ...] = ()
    writer_host_id: str = ""
    local_first: bool = False
    tenant: str = ""


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
        # Disk tiers, by segment id: mounted like memory segments (ids, owners, tenants,
        # capabilities) but never placement candidates nor counted as memory.
        self._disks: dict[str, MountedSegment] = {}
        # Told of every disk range freed (segment id, offset): its file is to be deleted.
        self.on_disk_freed: Callable[[str, int], None] | None = None
        # Segments that belong to a tenant and are not shared: while there are none, every
        # segment is everyone's and placement skips the usability filter.
        self._restricted = 0
        # Told of every range handed out (segment id, offset, size): read leases watch freed
        # ranges for reuse.
        self.on_allocated: Callable[[str, int, int], None] | None = None
        # Freed ranges of shared segments wait here until their capabilities expire; the
        # wall clock capabilities expire by (ms; tests inject their own).
        self.grant_holds = GrantHolds()
        self.wall_ms: Callable[[], int] = capability.now_ms
        # Told of every mount, withdrawal, allocation and free, when the metadata is
        # replicated.
        self.journal: Journal | None = None

    # -- mounting --------------------------------------------------------------------------

    def get(self, segment_id: str) -> MountedSegment | None:
        """The mounted segment with this id, or None."""
        return self._segments.get(segment_id)

    def allocator_of(self, segment_id: str) -> OffsetAllocator | DiskSpace | None:
        """The allocator of the mounted segment ``segment_id``, or None. O(1)."""
        mounted = self._segments.get(segment_id)
        return None if mounted is None else mounted.allocator

    def segments_of(self, client_id: str) -> list[MountedSegment]:
        """Segments contributed by ``client_id``."""
        return [self._segments[s] for s in self._by_client.get(client_id, ())]

    def all_segments(self) -> list[MountedSegment]:
        """Every mounted segment, disk tiers included."""
        return list(self._segments.values())

    def memory_segments(self) -> list[MountedSegment]:
        """Every mounted memory segment. O(segments)."""
        if not self._disks:
            return list(self._segments.values())
        return [m for m in self._segments.values() if not m.info.disk]

    @property
    def has_disks(self) -> bool:
        """Whether any disk tier is mounted. O(1)."""
        return bool(self._disks)

    def disk_segments(self) -> list[MountedSegment]:
        """Every mounted disk tier."""
        return list(self._disks.values())

    def disk_of(self, client_id: str) -> MountedSegment | None:
        """``client_id``'s disk tier (the first it mounted), or None. O(its segments)."""
        if not self._disks:
            return None
        for segment_id in self._by_client.get(client_id, ()):
            mounted = self._disks.get(segment_id)
            if mounted is not None:
                return mounted
        return None

    def usable_by(self, tenant: str) -> list[MountedSegment]:
        """Every mounted memory segment ``tenant``'s objects may be placed in.
        O(segments)."""
        return [m for m in self._segments.values() if m.usable_by(tenant) and not m.info.disk]

    def mount(self, client_id: str, info: SegmentInfo, tenant: str = "") -> MountedSegment:
        """Start allocating in ``info``. The caller has validated it and checked the id is free.

        Args:
            tenant: the tenant it belongs to ("" for nobody's).

        Complexity: O(1).
        """
        key = info.capability_key
        mounted = MountedSegment(
            info=info,
            client_id=client_id,
            allocator=DiskSpace(info.size) if info.disk else OffsetAllocator(info.size),
            signer=capability.SegmentSigner(key, info.id.encode()) if key else None,
            tenant=tenant,
        )
        self._segments[info.id] = mounted
        if info.disk:
            self._disks[info.id] = mounted
        else:
            self._restricted += _restricted(mounted)
            self._by_name.setdefault(info.name, []).append(mounted)
        self._by_client.setdefault(client_id, {})[info.id] = None
        if self.journal is not None:
            self.journal.segment(info.id)
        return mounted

    def unmount(self, segment_id: str) -> MountedSegment | None:
        """Forget a segment and its allocator; returns it, or None when it was not mounted.

        The caller drops the replicas that lived in it.
        """
        mounted = self._segments.pop(segment_id, None)
        if mounted is None:
            return None
        if self.journal is not None:
            self.journal.unmounted(segment_id)
        self.grant_holds.drop_segment(segment_id)
        if mounted.info.disk:
            del self._disks[segment_id]
        else:
            self._restricted -= _restricted(mounted)
            peers = self._by_name[mounted.info.name]
            peers.remove(mounted)
            if not peers:
                del self._by_name[mounted.info.name]
        owned = self._by_client[mounted.client_id]
        owned.pop(segment_id, None)
        if not owned:
            del self._by_client[mounted.client_id]
        return mounted

    def rebind(self, segment_id: str, client_id: str, info: SegmentInfo) -> MountedSegment:
        """Hand a mounted disk tier to another client (its owner restarted on it) under its
        new description (endpoint, name); its allocations and objects stay. O(1).

        Raises:
            KeyError: the segment is not mounted.
        """
        mounted = self._segments[segment_id]
        owned = self._by_client[mounted.client_id]
        owned.pop(segment_id, None)
        if not owned:
            del self._by_client[mounted.client_id]
        mounted.client_id = client_id
        mounted.info = info
        self._by_client.setdefault(client_id, {})[segment_id] = None
        if self.journal is not None:
            self.journal.segment(segment_id)
        return mounted

    # -- capacity --------------------------------------------------------------------------

    def capacity_bytes(self) -> int:
        """Total bytes of every mounted memory segment."""
        return sum(m.info.size for m in self._segments.values() if not m.info.disk)

    def used_bytes(self) -> int:
        """Bytes currently allocated across every mounted memory segment."""
        return sum(m.allocator.used_bytes for m in self._segments.values() if not m.info.disk)

    def disk_capacity_bytes(self) -> int:
        """Total quota of every mounted disk tier."""
        return sum(m.info.size for m in self._disks.values())

    def disk_used_bytes(self) -> int:
        """Bytes held in every mounted disk tier."""
        return sum(m.allocator.used_bytes for m in self._disks.values())

    def free(self, segment_id: str, offset: int) -> None:
        """Return an allocation to its segment; a no-op when the segment is gone. In a shared
        segment, a range a capability still covers is held until that expires instead
        (:mod:`.grant_holds`)."""
        mounted = self._segments.get(segment_id)
        if mounted is None:
            return
        if mounted.info.disk:
            # Its file is to go: the range stays allocated (a replicated row, so a restored
            # master knows the file is to be deleted, and the owner cannot register it again)
            # until the owner is told (release_disk). Disk offsets are never handed out
            # again, so no capability can reach another object through it meanwhile.
            space = mounted.allocator
            if isinstance(space, DiskSpace):
                space.doom(offset)
                if self.on_disk_freed is not None:
                    self.on_disk_freed(segment_id, offset)
                else:  # nobody to tell: the range goes at once
                    self.release_disk(segment_id, offset)
            return
        holds = self.grant_holds
        if (mounted.info.shared or holds.floor_ms) and holds.hold_on_free(
            segment_id, offset, self.wall_ms()
        ):
            return
        mounted.allocator.free(offset)
        if self.journal is not None:
            self.journal.freed(segment_id, offset)

    def free_many(self, segment_id: str, offsets: Sequence[int]) -> None:
        """:meth:`free` of each of ``offsets`` in one segment, the memory of a plain segment
        (unshared, no grant floor, not a disk tier) given back in one allocator step
        (:meth:`~.allocator.OffsetAllocator.free_many`); a no-op when the segment is gone.
        O(k log k) for k offsets."""
        mounted = self._segments.get(segment_id)
        if mounted is None:
            return
        allocator = mounted.allocator
        if mounted.info.disk or mounted.info.shared or self.grant_holds.floor_ms:
            for offset in offsets:
                self.free(segment_id, offset)
            return
        allocator.free_many(offsets)  # type: ignore[union-attr]
        if self.journal is not None:
            for offset in offsets:
                self.journal.freed(segment_id, offset)

    def release_held_grants(self) -> int:
        """Free the held ranges whose capabilities have all expired; returns how many.
        O(released × log held)."""
        released = self.grant_holds.due(self.wall_ms())
        for segment_id, offset in released:
            mounted = self._segments.get(segment_id)
            if mounted is not None:
                mounted.allocator.free(offset)
                if self.journal is not None:
                    self.journal.freed(segment_id, offset)
        return len(released)

    # -- disk tiers ------------------------------------------------------------------------

    def release_disk(self, segment_id: str, offset: int) -> None:
        """Free a doomed disk range whose file's deletion its owner has been told of; a no-op
        when the tier is gone or the range is not a doomed one of its space (a tier mounted
        afresh never held it). O(1)."""
        mounted = self._segments.get(segment_id)
        if mounted is None or not mounted.info.disk:
            return
        space = mounted.allocator
        if isinstance(space, DiskSpace) and space.is_doomed(offset):
            space.free(offset)
            if self.journal is not None:
                self.journal.freed(segment_id, offset)

    def allocate_disk(self, mounted: MountedSegment, size: int) -> Allocation | None:
        """Reserve ``size`` bytes of the disk tier ``mounted`` at a fresh offset; None when its
        quota has no room. O(1)."""
        offset = mounted.allocator.allocate(size)
        if offset is None:
            return None
        if self.journal is not None:
            self.journal.allocated(mounted.info.id, offset, size)
            self.journal.segment(mounted.info.id)  # its next offset moved
        return Allocation(segment=mounted, offset=offset, size=size)

    def allocate_on(self, mounted: MountedSegment, size: int) -> Allocation | None:
        """Reserve ``size`` bytes in the memory segment ``mounted`` itself; None when it has no
        room. O(log free ranges)."""
        if mounted.info.disk or size > mounted.allocator.largest_free_block:
            return None
        offset = mounted.allocator.allocate(size)
        if offset is None:
            return None
        if self.on_allocated is not None:
            self.on_allocated(mounted.info.id, offset, size)
        if self.journal is not None:
            self.journal.allocated(mounted.info.id, offset, mounted.allocator.size_of(offset))
        return Allocation(segment=mounted, offset=offset, size=size)

    def claim_disk(self, mounted: MountedSegment, offset: int, size: int) -> bool:
        """Hold a range a restarted owner found a complete file for
        (:meth:`.disk_space.DiskSpace.claim`). O(1)."""
        space = mounted.allocator
        if not isinstance(space, DiskSpace) or not space.claim(offset, size):
            return False
        if self.journal is not None:
            self.journal.allocated(mounted.info.id, offset, size)
            self.journal.segment(mounted.info.id)  # its next offset may have moved
        return True

    # -- placement -------------------------------------------------------------------------

    def allocate(self, request: PlacementRequest) -> list[Allocation]:
        """Reserve up to ``replica_num`` replicas on distinct segment names.

        Returns:
            The allocations made, possibly fewer than asked (best effort) or none at all.

        Complexity: O(names tried × segments per name × log free ranges).
        """
        if (
            self._strategy == "random"
            and not request.preferred_names
            and not request.local_first
            and not self._restricted
        ):
            return self._allocate_random(request)
        placed: list[Allocation] = []
        used_names: set[str] = set()
        for name in self._candidate_names(request):
            if len(placed) >= request.replica_num:
                break
            if name in used_names or name not in self._by_name:
                continue
            allocation = self._allocate_in_name(name, request.size, request.tenant)
            if allocation is not None:
                placed.append(allocation)
                used_names.add(name)
        return placed

    def _allocate_random(self, request: PlacementRequest) -> list[Allocation]:
        """:meth:`allocate` for the common request (random strategy, no preferences, every
        segment everyone's): the same walk over names from one random start, with the same
        draws from the random source, without the candidate generator and the name set
        (names are distinct keys already). It runs once per key written."""
        names = list(self._by_name)
        count = len(names)
        if not count:
            return []
        start = self._rng.randrange(count)
        placed: list[Allocation] = []
        for i in range(min(count, MAX_PLACEMENT_TRIES)):
            allocation = self._allocate_in_name(
                names[(start + i) % count], request.size, request.tenant
            )
            if allocation is not None:
                placed.append(allocation)
                if len(placed) >= request.replica_num:
                    break
        return placed

    @property
    def spreads_batches(self) -> bool:
        """Whether :meth:`place_batch` may place a batch: the random strategy, and every
        segment everyone's (the common request's conditions in :meth:`allocate`)."""
        return self._strategy == "random" and not self._restricted

    def place_batch(self, sizes: Sequence[int]) -> list[PlacedRun]:
        """One replica for each of ``sizes`` (a batch of one-replica writes with no
        preferences, when :attr:`spreads_batches`), in runs, or none at all: the batch is cut
        into as many contiguous parts as there are segment names (at most
        :data:`MAX_PLACEMENT_TRIES`), part ``r`` going to the ``r``-th name from a random
        start, each part side by side in one segment of its name
        (:meth:`~.allocator.OffsetAllocator.allocate_run`). A part no segment of its name
        holds whole is halved until the pieces fit. When a single value fits nowhere in its
        name, every range reserved for the batch is given back and nothing is placed: the
        caller places the values one by one (:meth:`allocate`, which walks the other names
        and may evict), so which values find room when memory is short is decided in their
        order, as for single writes.

        So a batch spreads over the names as evenly as its size allows (upstream's random
        placement spreads it in expectation), at about one allocator step per name instead
        of one per value.

        Returns:
            The runs made, in the order of ``sizes``, covering every value; [] when they do
            not all fit (nothing reserved: the ranges taken meanwhile go straight back to
            their allocators, as nothing was ever minted for them or told of them, so no
            grant hold keeps them and no late reader is disturbed). ``on_allocated`` and the
            journal hear of each run once every value is placed.

        Complexity: O(len(sizes) + names × log free ranges); O(len(sizes) × log free ranges)
        when segments are full.
        """
        names = list(self._by_name)
        count, total = len(names), len(sizes)
        if not count or not total:
            return []
        parts = min(count, total, MAX_PLACEMENT_TRIES)
        start = self._rng.randrange(count)
        placed: list[PlacedRun] = []
        for part in range(parts):
            whole = self._place_run(
                names[(start + part) % count],
                sizes,
                part * total // parts,
                (part + 1) * total // parts,
                placed,
            )
            if not whole:
                for run in placed:  # memory is short: the values go one by one, in order
                    run.segment.allocator.free_many(run.offsets)  # type: ignore[union-attr]
                return []
        for run in placed:
            segment_id, offsets, allocator = run.segment.info.id, run.offsets, run.segment.allocator
            if self.on_allocated is not None:
                end = offsets[-1] + allocator.size_of(offsets[-1])
                self.on_allocated(segment_id, offsets[0], end - offsets[0])
            if self.journal is not None:
                for offset in offsets:
                    self.journal.allocated(segment_id, offset, allocator.size_of(offset))
        return placed

    def _place_run(
        self, name: str, sizes: Sequence[int], low: int, high: int, placed: list[PlacedRun]
    ) -> bool:
        """Place ``sizes[low:high]`` side by side in one segment of ``name`` (halving the part
        when none holds it whole) and append the runs made to ``placed``; False (at the first
        value that fits nowhere in the name) when they cannot all be placed."""
        segments = self._by_name[name]
        part = sizes[low:high]
        least = sum(part)  # the rounded run is at least as long
        first = self._rng.randrange(len(segments)) if len(segments) > 1 else 0
        for i in range(len(segments)):
            segment = segments[(first + i) % len(segments)]
            allocator = segment.allocator
            if least > allocator.largest_free_block:
                continue
            offsets = allocator.allocate_run(part)  # type: ignore[union-attr]
            if offsets is None:
                continue
            placed.append(PlacedRun(low, segment, offsets))
            return True
        if high - low == 1:
            return False
        middle = (low + high) // 2
        return self._place_run(name, sizes, low, middle, placed) and self._place_run(
            name, sizes, middle, high, placed
        )

    def _candidate_names(self, request: PlacementRequest) -> Iterable[str]:
        yield from request.preferred_names
        if (self._strategy == "local_first" or request.local_first) and request.replica_num == 1:
            yield from self._names_on_host(request.writer_host_id)
        names = list(self._by_name)
        if self._restricted:
            # Other tenants' names would only use up the tries.
            tenant = request.tenant
            names = [n for n in names if any(m.usable_by(tenant) for m in self._by_name[n])]
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

    def has_name(self, name: str, tenant: str | None = None) -> bool:
        """Whether a mounted segment is named ``name`` (and, given ``tenant``, one that
        tenant may use). O(segments of the name)."""
        segments = self._by_name.get(name)
        if not segments:
            return False
        return tenant is None or any(m.usable_by(tenant) for m in segments)

    def allocate_in(self, name: str, size: int, tenant: str = "") -> Allocation | None:
        """Reserve ``size`` bytes for ``tenant`` in a segment named ``name`` it may use; None
        when none has room (or no such segment has the name).
        O(segments of the name × log free ranges)."""
        if name not in self._by_name:
            return None
        return self._allocate_in_name(name, size, tenant)

    def _allocate_in_name(self, name: str, size: int, tenant: str) -> Allocation | None:
        segments = self._by_name[name]
        start = self._rng.randrange(len(segments))
        for i in range(len(segments)):
            segment = segments[(start + i) % len(segments)]
            if size > segment.allocator.largest_free_block or not segment.usable_by(tenant):
                continue
            offset = segment.allocator.allocate(size)
            if offset is not None:
                if self.on_allocated is not None:
                    self.on_allocated(segment.info.id, offset, size)
                if self.journal is not None:
                    self.journal.allocated(
                        segment.info.id, offset, segment.allocator.size_of(offset)
                    )
                return Allocation(segment=segment, offset=offset, size=size)
        return None

    def check(self) -> None:
        """Verify the name and client indexes and every allocator. O(segments + allocations).

        Raises:
            AssertionError: an index or allocator is inconsistent.
        """
        by_name_ids = {m.info.id for segs in self._by_name.values() for m in segs}
        by_client_ids = {s for owned in self._by_client.values() for s in owned}
        if by_name_ids | set(self._disks) != set(self._segments) or by_client_ids != set(
            self._segments
        ):
            raise AssertionError("segment indexes disagree with mounted segments")
        if by_name_ids & set(self._disks) or any(
            not m.info.disk or not isinstance(m.allocator, DiskSpace) for m in self._disks.values()
        ):
            raise AssertionError("a disk tier is indexed as memory, or memory as a disk tier")
        for mounted in self._segments.values():
            if mounted.info.id not in self._by_client.get(mounted.client_id, {}):
                raise AssertionError(f"segment {mounted.info.id} not indexed under its client")
            mounted.allocator.check()
        if self._restricted != sum(
            _restricted(m) for m in self._segments.values() if not m.info.disk
        ):
            raise AssertionError("restricted segment count disagrees with mounted segments")
        self.grant_holds.check()


def _restricted(mounted: MountedSegment) -> int:
    """1 when only its tenant may use ``mounted``, else 0."""
    return int(bool(mounted.tenant) and not mounted.info.shared)
