"""The space of one disk tier: a quota of bytes and a virtual address space that never reuses.

A disk tier (a segment mounted with ``disk=True``) keeps each object's bytes in a file of its
own on its owner's host. The master still names every disk replica by ``(segment, offset,
size)``, like a memory replica, so the object table, the segment index, the capabilities and
the replicated rows treat both alike. Here ``offset`` is a virtual address: each allocation
takes the next ``size`` bytes after every earlier one, so ranges never overlap and an offset
is never handed out twice. The offset therefore names the file for the tier's whole life, and a
reader holding an old descriptor can never be served another object's bytes under it.

:class:`DiskSpace` has the interface of :class:`~.allocator.OffsetAllocator` that the rest of
the master uses (used and free bytes against the quota, allocate, free, restore, check); there
is no fragmentation: ``largest_free_block`` is the free quota. An allocation whose file is to
be deleted can be *doomed* first: it leaves the quota at once but stays held until freed.

Thread-safety: none; the master service serializes every call under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class DiskSpace:
    """Allocations of one disk tier against its quota.

    Args:
        capacity: the quota in bytes (> 0).

    Raises:
        ValueError: ``capacity <= 0``.
    """

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self._capacity = capacity
        # offset -> size, or the record that holds the allocation (see tag()).
        self._allocations: dict[int, Any] = {}
        # Allocations whose file is to be deleted: still held (so the range is known, and no
        # file is registered there again) but no longer counted against the quota.
        self._doomed: set[int] = set()
        self._used = 0
        self._next = 0

    @property
    def capacity(self) -> int:
        """The quota in bytes."""
        return self._capacity

    @property
    def alignment(self) -> int:
        """1: sizes are held exactly."""
        return 1

    @property
    def usable_capacity(self) -> int:
        """The quota."""
        return self._capacity

    @property
    def used_bytes(self) -> int:
        """Bytes held by live allocations."""
        return self._used

    @property
    def free_bytes(self) -> int:
        """Quota not in use."""
        return self._capacity - self._used

    @property
    def largest_free_block(self) -> int:
        """The free quota: there is no fragmentation. O(1)."""
        return self._capacity - self._used

    @property
    def allocation_count(self) -> int:
        """Number of live allocations."""
        return len(self._allocations)

    @property
    def next_offset(self) -> int:
        """Where the next allocation starts (every offset below it was handed out once)."""
        return self._next

    def allocate(self, size: int) -> int | None:
        """Reserve ``size`` bytes at a fresh offset; None when the quota has no room. O(1).

        Raises:
            ValueError: ``size <= 0``.
        """
        if size <= 0:
            raise ValueError(f"size must be positive, got {size}")
        if size > self._capacity - self._used:
            return None
        offset = self._next
        self._next = offset + size
        self._allocations[offset] = size
        self._used += size
        return offset

    def claim(self, offset: int, size: int) -> bool:
        """Hold ``[offset, offset + size)``, a range handed out before (a file a restarted owner
        found): False when it is malformed, overlaps a live allocation's start, or the quota
        has no room. Later allocations start past it. O(1).

        A range that only overlaps the inside of another cannot be told apart in O(1); the
        owner's files never do (their offsets came from one such space), and a forged claim
        can only name the claimant's own files.
        """
        if offset < 0 or size <= 0 or offset in self._allocations:
            return False
        if size > self._capacity - self._used:
            return False
        self._allocations[offset] = size
        self._used += size
        self._next = max(self._next, offset + size)
        return True

    def holds(self, offset: int) -> bool:
        """Whether an allocation (doomed or not) starts at ``offset``. O(1)."""
        return offset in self._allocations

    def is_doomed(self, offset: int) -> bool:
        """Whether the allocation at ``offset`` is doomed. O(1)."""
        return offset in self._doomed

    @property
    def doomed_count(self) -> int:
        """Doomed allocations (held until freed)."""
        return len(self._doomed)

    def doomed(self) -> frozenset[int]:
        """Their offsets. O(doomed)."""
        return frozenset(self._doomed)

    def doom(self, offset: int) -> int:
        """The file at ``offset`` is to be deleted: its bytes stop counting against the quota
        at once; the range stays held until :meth:`free`. Returns its size. O(1).

        Raises:
            KeyError: no live allocation starts at ``offset``.
        """
        size = self.size_of(offset)
        if offset not in self._doomed:
            self._doomed.add(offset)
            self._used -= size
        return size

    def resize(self, capacity: int) -> bool:
        """Change the quota (its owner restarted with another one); False, and nothing
        changed, when the allocations already exceed ``capacity``. O(1)."""
        if capacity <= 0 or capacity < self._used:
            return False
        self._capacity = capacity
        return True

    def free(self, offset: int) -> int:
        """Release the allocation at ``offset``; returns its size. O(1).

        Raises:
            KeyError: no live allocation starts at ``offset``.
        """
        held = self._allocations.pop(offset)
        size = held if held.__class__ is int else held.size
        if offset in self._doomed:
            self._doomed.discard(offset)
        else:
            self._used -= size
        return size

    def restore_allocations(self, allocations: Iterable[tuple[int, int]]) -> None:
        """Hold exactly ``allocations`` (offset, size) in this fresh space, as another master's
        space of the same tier held them; later allocations start past the last. O(n log n).

        Raises:
            ValueError: the space is not fresh, or a range is empty or overlaps another.
        """
        if self._allocations:
            raise ValueError("restore_allocations needs a fresh space")
        # (Ranges come back live; those no restored object claims are doomed again.)
        cursor = 0
        for offset, size in sorted(allocations):
            if size <= 0 or offset < cursor:
                raise ValueError(f"range ({offset}, {size}) is empty or overlaps")
            self._allocations[offset] = size
            self._used += size
            cursor = offset + size
        self._next = cursor

    def advance_to(self, offset: int) -> None:
        """Hand out nothing below ``offset`` from now on (a restored master continues where
        the old one's space stood). O(1)."""
        self._next = max(self._next, offset)

    def rounded(self, size: int) -> int:
        """``size``: disk allocations are not rounded."""
        return size

    def allocations(self) -> list[tuple[int, int]]:
        """Every live allocation as (offset, size). O(allocations)."""
        return [
            (offset, held if held.__class__ is int else held.size)
            for offset, held in self._allocations.items()
        ]

    def tag(self, offset: int, owner: Any) -> bool:
        """Record ``owner`` as the holder of the allocation at ``offset``, in place of its
        size, as :meth:`.allocator.OffsetAllocator.tag` does (``owner.size`` must equal the
        allocation's size while tagged). Returns False, nothing changed, when no allocation
        starts there or the sizes differ. O(1)."""
        allocations = self._allocations
        held = allocations.get(offset)
        if held is None or owner.size != (held if held.__class__ is int else held.size):
            return False
        allocations[offset] = owner
        return True

    def untag(self, offset: int, owner: Any) -> None:
        """The allocation at ``offset`` is no longer held by ``owner`` (a no-op when it is
        not tagged with it). O(1)."""
        allocations = self._allocations
        held = allocations.get(offset)
        if held is not None and held is owner:
            allocations[offset] = owner.size

    def owners(self) -> list[Any]:
        """The records tagged on live allocations, in allocation order. O(allocations)."""
        return [held for held in self._allocations.values() if held.__class__ is not int]

    def owner_of(self, offset: int) -> Any | None:
        """The record tagged on the allocation at ``offset``, or None. O(1)."""
        held = self._allocations.get(offset)
        return None if held is None or held.__class__ is int else held

    def size_of(self, offset: int) -> int:
        """The size of the allocation at ``offset``. O(1).

        Raises:
            KeyError: no live allocation starts at ``offset``.
        """
        held = self._allocations.get(offset)
        if held is None:
            raise KeyError(f"no allocation at offset {offset}")
        return held if held.__class__ is int else held.size

    def check(self) -> None:
        """Verify the invariants. O(n log n).

        Raises:
            AssertionError: ``used_bytes`` is stale, the quota is exceeded, ranges overlap, or
                one lies at or past the next offset.
        """
        if not self._doomed <= set(self._allocations):
            raise AssertionError("a doomed range is not allocated")
        sizes = dict(self.allocations())
        live = sum(s for o, s in sizes.items() if o not in self._doomed)
        if live != self._used:
            raise AssertionError("used_bytes disagrees with the allocations")
        if self._used > self._capacity:
            raise AssertionError(f"{self._used} bytes used past the quota {self._capacity}")
        cursor = 0
        for offset, size in sorted(sizes.items()):
            if size <= 0 or offset < cursor:
                raise AssertionError(f"range ({offset}, {size}) is empty or overlaps")
            cursor = offset + size
        if cursor > self._next:
            raise AssertionError(f"a range ends at {cursor}, past the next offset {self._next}")
