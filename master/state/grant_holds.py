"""Ranges of shared segments held back from reuse until the capabilities minted for them expire.

A capability stays valid until it expires, whatever happens to the object it was minted for
(the segment's owner cannot know). In a segment that is not shared that is harmless: only the
same tenant's objects ever live there. In a shared segment the next object placed in a freed
range may be another tenant's, and a holder of the old grant could read or overwrite it. So a
freed range of a shared segment whose latest grant has not expired is *held*: it stays
allocated until that expiry, then goes back to the allocator (:meth:`GrantHolds.due`, run by the
master's sweeper). Ranges of unshared segments are never held.

Thread-safety: none; the master service serializes every call under its lock.
"""

from __future__ import annotations

import heapq


class GrantHolds:
    """The latest grant expiry of every live range of a shared segment, and the freed ranges
    held until theirs passes.

    Memory: one entry per allocation of a shared segment that a grant was minted for.
    """

    def __init__(self) -> None:
        # Until this wall-clock ms every freed range is held, shared segment or not: a master
        # restored from the log cannot know which readers and writers of the old leader may
        # still touch a range (see :func:`mooncake_py.master.ha.restore.restore_sliced`).
        self.floor_ms = 0
        self._expiry: dict[tuple[str, int], int] = {}
        self._held: list[tuple[int, str, int]] = []  # heap of (expires_ms, segment id, offset)
        self._held_by_segment: dict[str, int] = {}

    def granted(self, segment_id: str, offset: int, expires_ms: int) -> None:
        """A grant for the range at ``offset`` of shared segment ``segment_id`` was minted,
        valid until ``expires_ms``. O(1)."""
        key = (segment_id, offset)
        if self._expiry.get(key, 0) < expires_ms:
            self._expiry[key] = expires_ms

    def hold_on_free(self, segment_id: str, offset: int, now_ms: int) -> bool:
        """The range is being freed: True when it must be held (a grant for it is still valid
        at ``now_ms``), False when it may go back to the allocator now. O(log held)."""
        expires = max(self._expiry.pop((segment_id, offset), 0), self.floor_ms)
        if expires <= now_ms:
            return False
        self.hold(segment_id, offset, expires)
        return True

    def hold(self, segment_id: str, offset: int, until_ms: int) -> None:
        """Hold the allocated range at ``offset`` until ``until_ms`` (wall clock), then let
        :meth:`due` hand it back. O(log held)."""
        heapq.heappush(self._held, (until_ms, segment_id, offset))
        self._held_by_segment[segment_id] = self._held_by_segment.get(segment_id, 0) + 1

    def due(self, now_ms: int) -> list[tuple[str, int]]:
        """The held ranges whose grants have all expired by ``now_ms``, no longer held (the
        caller frees them). O(due × log held)."""
        released: list[tuple[str, int]] = []
        while self._held and self._held[0][0] <= now_ms:
            _, segment_id, offset = heapq.heappop(self._held)
            count = self._held_by_segment[segment_id]  # drop_segment took a gone one's out
            if count == 1:
                del self._held_by_segment[segment_id]
            else:
                self._held_by_segment[segment_id] = count - 1
            released.append((segment_id, offset))
        return released

    def drop_segment(self, segment_id: str) -> None:
        """``segment_id`` is unmounted: forget its ranges (held ones go with its allocator).
        O(entries)."""
        self._held_by_segment.pop(segment_id, None)
        self._held = [entry for entry in self._held if entry[1] != segment_id]
        heapq.heapify(self._held)
        for key in [k for k in self._expiry if k[0] == segment_id]:
            del self._expiry[key]

    def held_on(self, segment_id: str) -> int:
        """Ranges of ``segment_id`` held now. O(1)."""
        return self._held_by_segment.get(segment_id, 0)

    def held_count(self) -> int:
        """Ranges held now, every segment. O(1)."""
        return sum(self._held_by_segment.values())

    def check(self) -> None:
        """Verify the per-segment counts against the heap. O(held).

        Raises:
            AssertionError: they disagree.
        """
        counted: dict[str, int] = {}
        for _, segment_id, _ in self._held:
            counted[segment_id] = counted.get(segment_id, 0) + 1
        if counted != self._held_by_segment:
            raise AssertionError("held grant ranges disagree with their counts")
