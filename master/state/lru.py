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

**Memory.** The stamp lives on the candidate's own record (its ``lru_stamp`` slot, -1 while
it is no candidate), and the order is one sorted list of those records keyed by the slot: a
candidate costs a reference in that list and one in its key list (about 16 bytes) plus its
stamp, instead of an entry in an id-to-stamp dict and another in a stamp-to-id map. The
policy reaches a record from an object id through ``records`` (the object table's lookup);
without one it keeps small records of its own, for callers that track plain ids. A caller
holding the record already (the write path, reads) passes it itself
(:meth:`LeaseOrderedLRU.on_record_created`, :meth:`LeaseOrderedLRU.on_record_touched`): no
id is built and nothing is looked up.

Complexity: events O(log n); a selection O(limit · log n).

Thread-safety: none; the service calls it under its lock.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import operator
from collections.abc import Callable, Collection, Hashable
from typing import Any, Protocol

from sortedcontainers import SortedKeyList


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


NOT_A_CANDIDATE = -1
"""The ``lru_stamp`` of a record that is no candidate (stamps count from 0)."""


class _Candidate:
    """The record the policy keeps for an id when it was given no ``records`` lookup."""

    __slots__ = ("object_id", "lru_stamp")

    def __init__(self, object_id: Hashable) -> None:
        self.object_id = object_id
        self.lru_stamp = NOT_A_CANDIDATE


_stamp_of = operator.attrgetter("lru_stamp")


class LeaseOrderedLRU:
    """Least-recently-accessed first; see the module docstring.

    Args:
        records: the record of an object id, or None when there is none. A record has an
            ``object_id`` (the id it answers to) and a writable ``lru_stamp`` that only this
            policy changes (-1, :data:`NOT_A_CANDIDATE`, when it is created); it must stay
            resolvable until :meth:`on_removed` was called for it. Without ``records`` the
            policy keeps one small record per candidate id itself.
    """

    def __init__(self, records: Callable[[Any], Any] | None = None) -> None:
        # Candidate records in stamp order (the key is the record's own slot).
        self._order: SortedKeyList = SortedKeyList(key=_stamp_of)
        self._clock = itertools.count()
        self._own: dict[Hashable, _Candidate] | None = None if records is not None else {}
        self._records: Callable[[Any], Any] = records if records is not None else self._own_record

    def _own_record(self, object_id: Hashable) -> _Candidate | None:
        assert self._own is not None
        return self._own.get(object_id)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, object_id: Hashable) -> bool:
        record = self._records(object_id)
        return record is not None and record.lru_stamp >= 0

    def on_created(self, object_id: Hashable) -> None:
        """O(log n).

        Raises:
            KeyError: ``records`` knows no record for ``object_id``.
        """
        record = self._records(object_id)
        if record is None:
            if self._own is None:
                raise KeyError(f"no record for eviction candidate {object_id!r}")
            record = self._own[object_id] = _Candidate(object_id)
        self.on_record_created(record)

    def on_record_created(self, record: Any) -> None:
        """:meth:`on_created` given the record ``records`` resolves the object's id to (no
        lookup: the write path has it at hand). O(log n)."""
        if record.lru_stamp >= 0:
            # Removed under its old stamp (the list finds it by its key), then re-stamped.
            self._order.remove(record)
        record.lru_stamp = next(self._clock)
        self._order.add(record)

    def on_touched(self, object_id: Hashable) -> None:
        """O(log n); ignored for objects that are not candidates (e.g. hard pinned)."""
        record = self._records(object_id)
        if record is not None:
            self.on_record_touched(record)

    def on_record_touched(self, record: Any) -> None:
        """:meth:`on_touched` given the record ``records`` resolves the object's id to.
        O(log n); ignored for a record that is no candidate."""
        if record.lru_stamp >= 0:
            self._order.remove(record)
            record.lru_stamp = next(self._clock)
            self._order.add(record)

    def on_removed(self, object_id: Hashable) -> None:
        """O(log n); ignored for objects that are not candidates."""
        record = self._records(object_id)
        if record is None or record.lru_stamp < 0:
            return
        self._order.remove(record)
        record.lru_stamp = NOT_A_CANDIDATE
        if self._own is not None:
            del self._own[object_id]

    def on_record_removed(self, record: Any) -> None:
        """:meth:`on_removed` given the record ``records`` resolves the object's id to (a
        policy built with ``records``). O(log n); ignored for a record that is no
        candidate."""
        if record.lru_stamp >= 0:
            self._order.remove(record)
            record.lru_stamp = NOT_A_CANDIDATE

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
        Stops after ``want`` victims or ``limit`` judged candidates. ``judge`` must not
        change the policy.
        """
        victims: list[Hashable] = []
        cursor = after
        examined = 0
        for record in self._order.irange_key(min_key=after, inclusive=(False, True)):
            if examined >= limit or len(victims) >= want:
                return Selection(victims, cursor, False, examined)
            object_id = record.object_id
            cursor = record.lru_stamp
            examined += 1
            verdict = judge(object_id)
            if verdict is Verdict.EVICT or (verdict is Verdict.PINNED and include_pinned):
                victims.append(object_id)
        return Selection(victims, cursor, True, examined)

    def check(self, expected: Collection[Hashable]) -> None:
        """Verify the policy tracks exactly ``expected``, each candidate once, in strictly
        increasing stamp order, each resolvable by its id to itself. O(n).

        Raises:
            AssertionError: an object is missing or extra, or the order is broken.
        """
        previous = NOT_A_CANDIDATE
        tracked: set[Hashable] = set()
        for record in self._order:
            stamp = record.lru_stamp
            if stamp <= previous:
                raise AssertionError(f"eviction policy order broken at {record.object_id!r}")
            previous = stamp
            if self._records(record.object_id) is not record:
                raise AssertionError(f"eviction candidate {record.object_id!r} is a stale record")
            tracked.add(record.object_id)
        if len(tracked) != len(self._order):
            raise AssertionError("an eviction candidate is tracked twice")
        if self._own is not None and set(self._own) != tracked:
            raise AssertionError("eviction policy records disagree with its order")
        if tracked != set(expected):
            missing, extra = set(expected) - tracked, tracked - set(expected)
            raise AssertionError(
                f"eviction policy out of sync: missing {len(missing)}, extra {len(extra)}"
            )
