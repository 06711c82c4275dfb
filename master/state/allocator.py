"""Best-fit offset allocator for a single contiguous memory segment."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import accumulate
from typing import Any

from sortedcontainers import SortedList


class OffsetAllocator:
    """Hands out aligned byte ranges inside one segment of ``capacity`` bytes.

    Free space is indexed three times: a ``SortedList`` of ``(length, offset)`` answers
    best-fit queries, and two dicts, ``offset -> length`` and ``end -> offset``, find a
    freed range's neighbours in O(1) so it coalesces immediately (no sorted index by
    address is needed for that). Every free range starts and ends on an alignment
    boundary.

    An allocation may be *tagged* with the record that holds it (:meth:`tag`): the record
    takes the place of the size in the allocation map (the size is read from the record's
    ``size``), so the map doubles as the index of the records living in the segment
    (:meth:`owners`) at no extra memory per allocation.

    Only the aligned-down prefix ``[0, usable_capacity)`` is managed. When
    ``capacity`` is not a multiple of ``alignment`` the trailing
    ``capacity - usable_capacity`` bytes could never hold an aligned allocation, so
    they are excluded: they count toward neither ``used_bytes`` nor ``free_bytes``.

    Not thread-safe: callers must serialize access to an instance.

    Args:
        capacity: Size of the segment in bytes.
        alignment: Granularity of offsets and sizes; must be a power of two.

    Raises:
        ValueError: If ``capacity <= 0`` or ``alignment`` is not a power of two.
    """

    def __init__(self, capacity: int, alignment: int = 64) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        self._capacity = capacity
        self._alignment = alignment
        self._usable = capacity & ~(alignment - 1)
        self._free_by_size: SortedList = SortedList()
        # Every free range by its start and by its end (exclusive).
        self._free_at: dict[int, int] = {}
        self._free_ending: dict[int, int] = {}
        # offset -> rounded size, or the record that holds the allocation (see tag()).
        self._allocations: dict[int, Any] = {}
        self._used = 0
        if self._usable:
            self._insert_free(0, self._usable)

    @property
    def capacity(self) -> int:
        """Segment size in bytes, as passed to the constructor."""
        return self._capacity

    @property
    def alignment(self) -> int:
        """Offset and size granularity in bytes."""
        return self._alignment

    @property
    def usable_capacity(self) -> int:
        """``capacity`` rounded down to ``alignment``; the allocatable extent."""
        return self._usable

    @property
    def used_bytes(self) -> int:
        """Bytes held by live allocations (rounded sizes)."""
        return self._used

    @property
    def free_bytes(self) -> int:
        """Allocatable bytes not currently in use (excludes the unaligned tail)."""
        return self._usable - self._used

    @property
    def largest_free_block(self) -> int:
        """Length of the largest contiguous free range, 0 if none. O(1)."""
        return self._free_by_size[-1][0] if self._free_by_size else 0

    @property
    def allocation_count(self) -> int:
        """Number of live allocations."""
        return len(self._allocations)

    def allocate(self, size: int) -> int | None:
        """Reserves ``size`` bytes, rounded up to the alignment.

        Picks the smallest free range that fits, preferring the lowest offset among
        equally sized ranges, and carves the allocation from its start.
        O(log n) in the number of free ranges.

        Args:
            size: Requested number of bytes.

        Returns:
            The offset of the allocation, or None if no free range is large enough.

        Raises:
            ValueError: If ``size <= 0``.
        """
        if size <= 0:
            raise ValueError(f"size must be positive, got {size}")
        rounded = self._round_up(size)
        offset = self._take_best_fit(rounded)
        if offset is None:
            return None
        self._allocations[offset] = rounded
        return offset

    def allocate_run(self, sizes: Sequence[int]) -> list[int] | None:
        """Reserves one allocation per entry of ``sizes`` (each rounded up to the alignment),
        side by side in a single free range: what :meth:`allocate` of each would hold, at
        the cost of one.

        The range is picked as :meth:`allocate` picks one for the run's total (best fit,
        lowest offset among equals), and the allocations are carved from its start in
        order. Each is an allocation of its own (freed, tagged and sized as any other).

        Args:
            sizes: Requested bytes of each allocation, every one positive.

        Returns:
            The offsets, in the order of ``sizes``; None (nothing reserved) when no free
            range holds the whole run, or ``sizes`` is empty.

        Raises:
            ValueError: If a size is not positive.

        Complexity: O(log n + len(sizes)) in the number of free ranges.
        """
        if not sizes:
            return None
        if min(sizes) <= 0:
            raise ValueError(f"sizes must be positive, got {min(sizes)}")
        round_up = self._round_up
        rounded = list(map(round_up, sizes))
        start = self._take_best_fit(sum(rounded))
        if start is None:
            return None
        # Each allocation starts where the previous one ends (C-level running sums).
        offsets = list(accumulate(rounded[:-1], initial=start))
        self._allocations.update(zip(offsets, rounded, strict=True))
        return offsets

    def _take_best_fit(self, rounded: int) -> int | None:
        """Take ``rounded`` bytes (aligned) from the start of the smallest free range that
        holds them (the lowest offset among equals) and count them used; returns their
        offset, or None when no range is large enough. O(log n)."""
        # (rounded, -1) sorts before every real (rounded, offset) entry.
        idx = self._free_by_size.bisect_left((rounded, -1))
        if idx == len(self._free_by_size):
            return None
        length, offset = self._free_by_size[idx]
        self._remove_free(offset, length)
        if length > rounded:
            self._insert_free(offset + rounded, length - rounded)
        self._used += rounded
        return offset

    def tag_run(self, offsets: Sequence[int], owners: Sequence[Any]) -> None:
        """:meth:`tag` of each allocation of a run :meth:`allocate_run` has just returned,
        with the owner at the same position (whose ``size`` is the size asked for it there).
        The caller vouches for both (nothing is checked). O(len(offsets)), C-level."""
        self._allocations.update(zip(offsets, owners, strict=True))

    def free(self, offset: int) -> int:
        """Releases the allocation starting at ``offset``.

        The released range is merged with any adjacent free ranges.
        O(log n) in the number of free ranges.

        Args:
            offset: Offset previously returned by :meth:`allocate`.

        Returns:
            The number of bytes released (the rounded allocation size).

        Raises:
            KeyError: If no live allocation starts at ``offset``.
        """
        held = self._allocations.pop(offset, None)
        if held is None:
            raise KeyError(f"no allocation at offset {offset}")
        size = held if held.__class__ is int else self._round_up(held.size)
        self._used -= size
        self._release_range(offset, offset + size)
        return size

    def free_many(self, offsets: Iterable[int]) -> int:
        """:meth:`free` of each allocation starting at one of ``offsets`` (distinct): the
        same free ranges in the end, with allocations side by side given back as one range
        (one index update per such run instead of one per allocation).

        Returns:
            The bytes released.

        Raises:
            KeyError: If no live allocation starts at one of ``offsets`` (the allocations
                before it in address order are freed, the others are not).

        Complexity: O(k log k + runs × log n) for k offsets forming ``runs`` adjacent runs.
        """
        allocations = self._allocations
        round_up = self._round_up
        released = 0
        run_start = run_end = -1
        for offset in sorted(offsets):
            held = allocations.pop(offset, None)
            if held is None:
                if run_start >= 0:
                    self._release_range(run_start, run_end)
                raise KeyError(f"no allocation at offset {offset}")
            size = held if held.__class__ is int else round_up(held.size)
            released += size
            self._used -= size
            if offset == run_end:
                run_end += size
                continue
            if run_start >= 0:
                self._release_range(run_start, run_end)
            run_start, run_end = offset, offset + size
        if run_start >= 0:
            self._release_range(run_start, run_end)
        return released

    def _release_range(self, start: int, end: int) -> None:
        """Make ``[start, end)`` (no longer allocated) free, merged with its free
        neighbours. O(log n)."""
        prev_off = self._free_ending.get(start)
        if prev_off is not None:
            self._remove_free(prev_off, start - prev_off)
            start = prev_off
        nxt_len = self._free_at.get(end)
        if nxt_len is not None:
            self._remove_free(end, nxt_len)
            end += nxt_len
        self._insert_free(start, end - start)

    def free_ranges(self) -> list[tuple[int, int]]:
        """Every free range as (offset, length), in address order. O(n log n)."""
        return sorted(self._free_at.items())

    def restore_allocations(self, allocations: Iterable[tuple[int, int]]) -> None:
        """Hold exactly ``allocations`` (offset, rounded size) in this fresh allocator: what
        another master's allocator of the same segment held. O(n log n).

        Raises:
            ValueError: the allocator is not fresh, or a range is misaligned, overlaps
                another or lies outside the segment.
        """
        if self._allocations:
            raise ValueError("restore_allocations needs a fresh allocator")
        ranges = sorted(allocations)
        align = self._alignment
        cursor = 0
        for offset, size in ranges:
            if offset % align or size <= 0 or size % align or offset < cursor:
                raise ValueError(f"range ({offset}, {size}) is misaligned or overlaps")
            cursor = offset + size
        if cursor > self._usable:
            raise ValueError(f"a range ends at {cursor}, past the segment ({self._usable})")
        self._free_by_size.clear()
        self._free_at.clear()
        self._free_ending.clear()
        cursor = 0
        for offset, size in ranges:
            if offset > cursor:
                self._insert_free(cursor, offset - cursor)
            self._allocations[offset] = size
            self._used += size
            cursor = offset + size
        if cursor < self._usable:
            self._insert_free(cursor, self._usable - cursor)

    def rounded(self, size: int) -> int:
        """``size`` rounded up to the alignment: what an allocation of it holds. O(1)."""
        return self._round_up(size)

    def allocations(self) -> list[tuple[int, int]]:
        """Every live allocation as (offset, rounded size). O(allocations)."""
        round_up = self._round_up
        return [
            (offset, held if held.__class__ is int else round_up(held.size))
            for offset, held in self._allocations.items()
        ]

    def tag(self, offset: int, owner: Any) -> bool:
        """Record ``owner`` as the holder of the allocation at ``offset``, in place of its
        size. While tagged, ``owner.size`` must round to the allocation's size (it is where
        the size is read from); :meth:`untag` before it changes.

        Returns:
            True when tagged; False (nothing changed) when no allocation starts at
            ``offset`` or ``owner.size`` does not round to its size.

        Complexity: O(1).
        """
        allocations = self._allocations
        held = allocations.get(offset)
        if held is None:
            return False
        size = held if held.__class__ is int else self._round_up(held.size)
        if self._round_up(owner.size) != size:
            return False
        allocations[offset] = owner
        return True

    def untag(self, offset: int, owner: Any) -> None:
        """The allocation at ``offset`` is no longer held by ``owner`` (a no-op when it is
        not tagged with ``owner``): it keeps its size as a plain allocation. O(1)."""
        allocations = self._allocations
        held = allocations.get(offset)
        if held is not None and held is owner:
            allocations[offset] = self._round_up(owner.size)

    def owners(self) -> list[Any]:
        """The records tagged on live allocations, in allocation order. O(allocations)."""
        return [held for held in self._allocations.values() if held.__class__ is not int]

    def owner_of(self, offset: int) -> Any | None:
        """The record tagged on the allocation at ``offset``, or None. O(1)."""
        held = self._allocations.get(offset)
        return None if held is None or held.__class__ is int else held

    def size_of(self, offset: int) -> int:
        """Returns the rounded size of the allocation at ``offset``. O(1).

        Args:
            offset: Offset previously returned by :meth:`allocate`.

        Returns:
            The allocation size in bytes, a multiple of the alignment.

        Raises:
            KeyError: If no live allocation starts at ``offset``.
        """
        held = self._allocations.get(offset)
        if held is None:
            raise KeyError(f"no allocation at offset {offset}")
        return held if held.__class__ is int else self._round_up(held.size)

    def check(self) -> None:
        """Verifies internal invariants. O(n) in ranges; intended for tests.

        Raises:
            AssertionError: If the free indexes disagree, ranges overlap, free ranges
                are left uncoalesced, ranges are misaligned, the ranges do not tile
                ``[0, usable_capacity)`` exactly, or ``used_bytes`` is stale.
        """
        align = self._alignment
        if self._usable % align or not 0 <= self._capacity - self._usable < align:
            raise AssertionError(f"usable {self._usable} is not capacity aligned down")
        sizes = dict(self.allocations())
        recount = sum(sizes.values())
        if recount != self._used:
            raise AssertionError(f"used_bytes {self._used} != recount {recount}")
        if len(self._free_by_size) != len(self._free_at):
            raise AssertionError("free-by-size and free-by-offset sizes differ")
        prev_entry: tuple[int, int] | None = None
        for entry in self._free_by_size:
            # Strictly increasing entries plus equal lengths make the mapping a bijection.
            if entry == prev_entry or self._free_at.get(entry[1]) != entry[0]:
                raise AssertionError(f"free-by-size entry {entry} not in free-by-offset")
            prev_entry = entry
        if self._free_ending != {off + length: off for off, length in self._free_at.items()}:
            raise AssertionError("free-by-end index disagrees with free-by-offset")
        for off, length in sizes.items():
            if length <= 0 or off % align or length % align:
                raise AssertionError(f"bad allocation at {off} (length {length})")
        # Walk [0, usable) in address order: free ranges come from the sorted index and
        # each gap before a free range must be tiled exactly by a chain of allocations.
        cursor = 0
        visited = 0
        prev_free_end = -1
        stops: list[tuple[int, int | None]] = [*self.free_ranges(), (self._usable, None)]
        for free_off, free_len in stops:
            while cursor < free_off:
                size = sizes.get(cursor)
                if size is None:
                    raise AssertionError(f"offset {cursor} is neither free nor allocated")
                cursor += size
                visited += 1
            if cursor > free_off:
                raise AssertionError(f"range ending at {cursor} overlaps offset {free_off}")
            if free_len is None:
                break
            if free_len <= 0 or free_off % align or free_len % align:
                raise AssertionError(f"bad free range at {free_off} (length {free_len})")
            if prev_free_end == free_off:
                raise AssertionError(f"adjacent free ranges not coalesced at {free_off}")
            cursor = prev_free_end = free_off + free_len
        if visited != len(self._allocations):
            raise AssertionError("some allocations overlap other ranges")

    def _round_up(self, size: int) -> int:
        # An aligned size is kept as the very int object given: the allocation record then
        # shares it with the object's metadata instead of holding a 32-byte copy per range.
        if not size & (self._alignment - 1):
            return size
        return (size + self._alignment - 1) & ~(self._alignment - 1)

    def _insert_free(self, offset: int, length: int) -> None:
        self._free_at[offset] = length
        self._free_ending[offset + length] = offset
        self._free_by_size.add((length, offset))

    def _remove_free(self, offset: int, length: int) -> None:
        del self._free_at[offset]
        del self._free_ending[offset + length]
        self._free_by_size.remove((length, offset))
