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

**The order.** A new stamp is always the largest, so the order only ever grows at its end: it
is a list of blocks of (record, stamp) entries, appended to and never sorted. An access
appends the record again under its new stamp and leaves the old entry behind, stale (an entry
is live while its record's stamp is the entry's); a removal only marks the record. Each block
counts its live entries: a block left empty goes, and one whose live entries fall below a
quarter of its length is compacted (and merged with the block before it when both fit in
one), so stale entries never outnumber live ones by more than three to one and a walk skips
them at bounded cost. Every event is O(1) amortized, C-level list operations and one bisect
over the blocks' first stamps, instead of a sorted list's remove and insert (a few
microseconds each, on every first read, completed write and removal).

**Memory.** The stamp lives on the candidate's own record (its ``lru_stamp`` slot, -1 while
it is no candidate), and the order holds a reference to the record and one to its stamp per
live entry (about 16 bytes; the stamp's int is the record's own), instead of an entry in an
id-to-stamp dict and another in a stamp-to-id map. The
policy reaches a record from an object id through ``records`` (the object table's lookup);
without one it keeps small records of its own, for callers that track plain ids. A caller
holding the record already (the write path, reads) passes it itself
(:meth:`LeaseOrderedLRU.on_record_created`, :meth:`LeaseOrderedLRU.on_record_touched`): no
id is built and nothing is looked up.

Complexity: events O(1) amortized (O(log blocks) for the bisect); a selection O(log blocks +
limit), stale entries skipped on the way counting at most three per live one.

Thread-safety: none; the service calls it under its lock.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from bisect import bisect_right
from collections.abc import Callable, Collection, Hashable
from typing import Any, Protocol


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


BLOCK_ENTRIES = 1024
"""Entries of one block of the order (see the module): a block is compacted in O(this)."""

_COMPACT_FROM = 64
"""A block shorter than this is never compacted (its stale entries are few in any case)."""


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
        # The order (see the module): per block its records, their stamps, the block's first
        # stamp (a lower bound of its stamps, above every stamp of the blocks before) and its
        # live entries.
        self._blocks: list[list[Any]] = []
        self._stamps: list[list[int]] = []
        self._firsts: list[int] = []
        self._live: list[int] = []
        self._count = 0
        self._clock = itertools.count()
        self._own: dict[Hashable, _Candidate] | None = None if records is not None else {}
        self._records: Callable[[Any], Any] = records if records is not None else self._own_record

    def _own_record(self, object_id: Hashable) -> _Candidate | None:
        assert self._own is not None
        return self._own.get(object_id)

    def __len__(self) -> int:
        return self._count

    def records(self) -> list[Any]:
        """The candidates' records, oldest access first. O(entries)."""
        return [
            record
            for block, stamps in zip(self._blocks, self._stamps, strict=True)
            for record, stamp in zip(block, stamps, strict=True)
            if record.lru_stamp == stamp
        ]

    def _append(self, record: Any) -> None:
        """Give ``record`` the next stamp and put it at the end of the order. O(1)."""
        stamp = next(self._clock)
        record.lru_stamp = stamp
        blocks = self._blocks
        if blocks and len(blocks[-1]) < BLOCK_ENTRIES:
            blocks[-1].append(record)
            self._stamps[-1].append(stamp)
            self._live[-1] += 1
        else:
            blocks.append([record])
            self._stamps.append([stamp])
            self._firsts.append(stamp)
            self._live.append(1)
        self._count += 1

    def _retire(self, stamp: int) -> None:
        """The entry under ``stamp`` went stale (its record was stamped again or removed):
        count it out of its block, drop the block if it is left empty, compact it if its
        live entries fell below a quarter. O(1) amortized."""
        i = bisect_right(self._firsts, stamp) - 1
        live = self._live[i] - 1
        self._live[i] = live
        self._count -= 1
        if not live:
            del self._blocks[i], self._stamps[i], self._firsts[i], self._live[i]
        elif live * 4 < len(self._blocks[i]) and len(self._blocks[i]) >= _COMPACT_FROM:
            self._compact(i)

    def _compact(self, i: int) -> None:
        """Keep only block ``i``'s live entries, and merge it into the block before when both
        fit in one. O(block)."""
        block, stamps = self._blocks[i], self._stamps[i]
        keep = [j for j, (r, s) in enumerate(zip(block, stamps, strict=True)) if r.lru_stamp == s]
        block[:] = [block[j] for j in keep]
        stamps[:] = [stamps[j] for j in keep]
        if i and len(self._blocks[i - 1]) + len(block) <= BLOCK_ENTRIES:
            self._blocks[i - 1] += block
            self._stamps[i - 1] += stamps
            self._live[i - 1] += self._live[i]
            del self._blocks[i], self._stamps[i], self._firsts[i], self._live[i]

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
        lookup: the write path has it at hand). O(1) amortized."""
        old = record.lru_stamp
        self._append(record)
        if old >= 0:  # a candidate already: its old entry goes stale
            self._retire(old)

    def on_touched(self, object_id: Hashable) -> None:
        """O(log n); ignored for objects that are not candidates (e.g. hard pinned)."""
        record = self._records(object_id)
        if record is not None:
            self.on_record_touched(record)

    def on_record_touched(self, record: Any) -> None:
        """:meth:`on_touched` given the record ``records`` resolves the object's id to.
        O(1) amortized; ignored for a record that is no candidate."""
        old = record.lru_stamp
        if old >= 0:
            self._append(record)
            self._retire(old)

    def on_removed(self, object_id: Hashable) -> None:
        """O(1) amortized; ignored for objects that are not candidates."""
        record = self._records(object_id)
        if record is None or record.lru_stamp < 0:
            return
        self.on_record_removed(record)
        if self._own is not None:
            del self._own[object_id]

    def on_record_removed(self, record: Any) -> None:
        """:meth:`on_removed` given the record ``records`` resolves the object's id to (for
        a policy built with ``records``). O(1) amortized; ignored for a record that is no
        candidate."""
        old = record.lru_stamp
        if old >= 0:
            record.lru_stamp = NOT_A_CANDIDATE
            self._retire(old)

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
        blocks, stamps_of = self._blocks, self._stamps
        i = max(bisect_right(self._firsts, after) - 1, 0)
        start = bisect_right(stamps_of[i], after) if i < len(blocks) else 0
        while i < len(blocks):
            block, stamps = blocks[i], stamps_of[i]
            for j in range(start, len(block)):
                record, stamp = block[j], stamps[j]
                if record.lru_stamp != stamp:
                    continue  # stale: the record is later in the order, or gone
                if examined >= limit or len(victims) >= want:
                    return Selection(victims, cursor, False, examined)
                object_id = record.object_id
                cursor = stamp
                examined += 1
                verdict = judge(object_id)
                if verdict is Verdict.EVICT or (verdict is Verdict.PINNED and include_pinned):
                    victims.append(object_id)
            i += 1
            start = 0
        return Selection(victims, cursor, True, examined)

    def check(self, expected: Collection[Hashable]) -> None:
        """Verify the policy tracks exactly ``expected``, each candidate once, in strictly
        increasing stamp order, each resolvable by its id to itself. O(n).

        Raises:
            AssertionError: an object is missing or extra, or the order is broken.
        """
        previous = NOT_A_CANDIDATE
        tracked: set[Hashable] = set()
        lists = (self._blocks, self._stamps, self._firsts, self._live)
        if len({len(part) for part in lists}) != 1:
            raise AssertionError("eviction policy block lists disagree in length")
        live_total = 0
        for block, stamps, first, live in zip(*lists, strict=True):
            if not block or len(block) != len(stamps) or len(block) > BLOCK_ENTRIES:
                raise AssertionError("an eviction policy block is empty, ragged or too long")
            if first > stamps[0] or first <= previous:
                raise AssertionError("an eviction policy block's first stamp is misplaced")
            counted = 0
            for record, stamp in zip(block, stamps, strict=True):
                if stamp <= previous:
                    raise AssertionError(f"eviction policy order broken at {stamp}")
                previous = stamp
                if record.lru_stamp != stamp:
                    continue
                counted += 1
                if self._records(record.object_id) is not record:
                    raise AssertionError(
                        f"eviction candidate {record.object_id!r} is a stale record"
                    )
                tracked.add(record.object_id)
            if counted != live or not live:
                raise AssertionError(f"eviction policy block counts {live} live, holds {counted}")
            live_total += counted
        if len(tracked) != live_total or live_total != self._count:
            raise AssertionError("an eviction candidate is tracked twice, or miscounted")
        if self._own is not None and set(self._own) != tracked:
            raise AssertionError("eviction policy records disagree with its order")
        if tracked != set(expected):
            missing, extra = set(expected) - tracked, tracked - set(expected)
            raise AssertionError(
                f"eviction policy out of sync: missing {len(missing)}, extra {len(extra)}"
            )
