"""Eviction policy: which objects to drop when memory runs short. It selects; the service acts.

The policy sees object life-cycle events (``on_created`` when a write completes,
``on_touched`` when a read leases the object, ``on_removed`` whatever the path) and, when
asked, selects victims in recency order among the candidates the service finds eligible. It
never mutates the store: the service judges each candidate through a callback (leases, pins,
writes in flight and groups are its rules) and removes what was selected.

:class:`LeaseOrderedLRU` is the policy the master runs. Every candidate carries a stamp, taken
from a counter at each access (a completed write counts as one), so stamp order is access
order, as upstream orders by lease timeout. Candidates are kept sorted by stamp. A selection
starts after a cursor (the stamp where the previous one stopped) and examines at most
``limit`` candidates, so a caller can walk the whole queue in bounded steps without meeting
the same protected candidates again and again; soft-pinned candidates keep their place and
become ordinary the moment their pin ends, whatever ended it.

Complexity: events O(log n); a selection O(limit · log n).

Thread-safety: none; the service calls it under its lock.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Callable, Collection, Hashable
from typing import Protocol

from sortedcontainers import SortedDict


class Verdict(enum.Enum):
    """The service's judgement of one candidate."""

    EVICT = "evict"
    """Evictable now."""
    PINNED = "pinned"
    """Soft pinned: only a fallback selection may take it."""
    SKIP = "skip"
    """Not now (leased, being written, group member leased)."""


@dataclasses.dataclass(slots=True)
class Selection:
    """What one :meth:`EvictionPolicy.select` call found.

    Attributes:
        victims: selected candidates, oldest access first.
        cursor: stamp of the last candidate examined; pass it as ``after`` to continue.
        exhausted: True when the walk reached the newest candidate.
        examined: candidates judged.
    """

    victims: list[Hashable]
    cursor: int
    exhausted: bool
    examined: int


class EvictionPolicy(Protocol):
    """What the service needs from a policy."""

    def on_created(self, object_id: Hashable) -> None:
        """A write completed: the object becomes a candidate, most recent."""

    def on_touched(self, object_id: Hashable) -> None:
        """The object was read (leased): most recent again."""

    def on_removed(self, object_id: Hashable) -> None:
        """The object is gone (any path)."""

    def select(
        self,
        judge: Callable[[Hashable], Verdict],
        want: int,
        limit: int,
        after: int = -1,
        include_pinned: bool = False,
    ) -> Selection:
        """Select up to ``want`` victims, oldest first, judging at most ``limit`` candidates."""
        ...

    def __len__(self) -> int: ...

    def __contains__(self, object_id: Hashable) -> bool: ...


class LeaseOrderedLRU:
    """Least-recently-accessed first; see the module docstring."""

    def __init__(self) -> None:
        self._by_stamp: SortedDict = SortedDict()
        self._stamp_of: dict[Hashable, int] = {}
        self._clock = itertools.count()

    def __len__(self) -> int:
        return len(self._stamp_of)

    def __contains__(self, object_id: Hashable) -> bool:
        return object_id in self._stamp_of

    def on_created(self, object_id: Hashable) -> None:
        """O(log n)."""
        old = self._stamp_of.get(object_id)
        if old is not None:
            del self._by_stamp[old]
        stamp = next(self._clock)
        self._stamp_of[object_id] = stamp
        self._by_stamp[stamp] = object_id

    def on_touched(self, object_id: Hashable) -> None:
        """O(log n); ignored for objects that are not candidates (e.g. hard pinned)."""
        if object_id in self._stamp_of:
            self.on_created(object_id)

    def on_removed(self, object_id: Hashable) -> None:
        """O(log n)."""
        stamp = self._stamp_of.pop(object_id, None)
        if stamp is not None:
            del self._by_stamp[stamp]

    def select(
        self,
        judge: Callable[[Hashable], Verdict],
        want: int,
        limit: int,
        after: int = -1,
        include_pinned: bool = False,
    ) -> Selection:
        """Walk candidates with a stamp greater than ``after`` in access order.

        A candidate is selected when ``judge`` says EVICT, or PINNED with ``include_pinned``.
        Stops after ``want`` victims or ``limit`` judged candidates.
        """
        victims: list[Hashable] = []
        cursor = after
        examined = 0
        keys = self._by_stamp.irange(minimum=after, inclusive=(False, True))
        for stamp in keys:
            if examined >= limit or len(victims) >= want:
                return Selection(victims, cursor, False, examined)
            object_id = self._by_stamp[stamp]
            cursor = stamp
            examined += 1
            verdict = judge(object_id)
            if verdict is Verdict.EVICT or (verdict is Verdict.PINNED and include_pinned):
                victims.append(object_id)
        return Selection(victims, cursor, True, examined)

    def check(self, expected: Collection[Hashable]) -> None:
        """Verify the policy tracks exactly ``expected`` and its two indexes agree.

        Raises:
            AssertionError: an object is missing or extra, or the indexes disagree.
        """
        if len(self._by_stamp) != len(self._stamp_of):
            raise AssertionError("eviction policy indexes differ in size")
        for object_id, stamp in self._stamp_of.items():
            if self._by_stamp.get(stamp) != object_id:
                raise AssertionError(f"eviction policy index broken at {object_id!r}")
        if set(self._stamp_of) != set(expected):
            tracked = set(self._stamp_of)
            missing, extra = set(expected) - tracked, tracked - set(expected)
            raise AssertionError(
                f"eviction policy out of sync: missing {len(missing)}, extra {len(extra)}"
            )
