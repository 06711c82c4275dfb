"""Eviction policy: which objects to drop when memory runs short. It decides; the service acts.

The policy sees object life-cycle events (``on_created`` when a write completes,
``on_touched`` when a read leases the object, ``on_removed`` whatever the path) and, when
asked, proposes victims in order, oldest access first. It never mutates the store: the
service checks each proposal against the rules it alone knows (leases, pins, writes in flight,
groups) through the ``eligible`` callback and removes what it accepts.

:class:`LeaseOrderedLRU` is the policy the master runs. Access order is the order of read-lease
grants (a write counts as an access), as upstream orders by lease timeout. Candidates that the
service refuses only because they are soft pinned are moved aside, in the order they were met,
to a second queue; the fallback pass takes them from there, so neither pass rescans the same
pinned objects again and again.

Complexity: events are O(1); ``propose`` is O(examined) and examines at most ``budget``
entries per call, which is what bounds a pass.

Thread-safety: none; the service calls it under its lock.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable, Collection, Generator, Hashable
from typing import Protocol


class Verdict(enum.Enum):
    """The service's answer about one proposed victim."""

    EVICT = "evict"
    """Evictable now."""
    PINNED = "pinned"
    """Soft pinned: only the fallback pass may take it."""
    SKIP = "skip"
    """Not now (leased, being written, group member leased): leave it in place."""


class EvictionPolicy(Protocol):
    """What the service needs from a policy."""

    def on_created(self, object_id: Hashable) -> None:
        """A write completed: the object becomes a candidate, most recent."""

    def on_touched(self, object_id: Hashable) -> None:
        """The object was read (leased): most recent again."""

    def on_removed(self, object_id: Hashable) -> None:
        """The object is gone (any path)."""

    def propose(
        self, verdict: Callable[[Hashable], Verdict], budget: int, include_pinned: bool
    ) -> Generator[Hashable, None, None]:
        """Yield victims the service accepted (``verdict`` said EVICT), oldest first."""
        ...

    def __len__(self) -> int: ...


class LeaseOrderedLRU:
    """Oldest-access-first eviction with a side queue for soft-pinned objects."""

    def __init__(self) -> None:
        self._order: OrderedDict[Hashable, None] = OrderedDict()
        self._pinned: OrderedDict[Hashable, None] = OrderedDict()
        # Entries taken off the front during a walk; put back when the walk ends.
        self._parked: dict[Hashable, None] = {}

    def __len__(self) -> int:
        return len(self._order) + len(self._pinned) + len(self._parked)

    def __contains__(self, object_id: Hashable) -> bool:
        return object_id in self._order or object_id in self._pinned or object_id in self._parked

    def on_created(self, object_id: Hashable) -> None:
        """O(1)."""
        self._pinned.pop(object_id, None)
        self._parked.pop(object_id, None)
        self._order[object_id] = None
        self._order.move_to_end(object_id)

    def on_touched(self, object_id: Hashable) -> None:
        """O(1)."""
        self.on_created(object_id)

    def on_removed(self, object_id: Hashable) -> None:
        """O(1)."""
        self._order.pop(object_id, None)
        self._pinned.pop(object_id, None)
        self._parked.pop(object_id, None)

    def propose(
        self, verdict: Callable[[Hashable], Verdict], budget: int, include_pinned: bool
    ) -> Generator[Hashable, None, None]:
        """Yield accepted victims, oldest first, examining at most ``budget`` entries.

        Pass 1 walks the main queue: EVICT is yielded, PINNED moves to the side queue, SKIP
        stays where it is. Then objects in the side queue that are no longer pinned are
        yielded, and with ``include_pinned`` the pinned ones too (the fallback pass). The caller
        removes a yielded object (:meth:`on_removed`) before resuming, or declines it by not
        removing it; a declined object keeps its place.
        """
        examined = 0
        try:
            while self._order and examined < budget:
                object_id, _ = self._order.popitem(last=False)
                examined += 1
                answer = verdict(object_id)
                if answer is Verdict.PINNED:
                    self._pinned[object_id] = None
                    continue
                self._parked[object_id] = None
                if answer is Verdict.EVICT:
                    yield object_id
        finally:
            for object_id in reversed(list(self._parked)):
                self._order[object_id] = None
                self._order.move_to_end(object_id, last=False)
            self._parked.clear()
        for object_id in list(self._pinned):
            if examined >= budget:
                return
            if object_id not in self._pinned:
                continue
            examined += 1
            answer = verdict(object_id)
            if answer is Verdict.EVICT or (answer is Verdict.PINNED and include_pinned):
                yield object_id

    def check(self, expected: Collection[Hashable]) -> None:
        """Verify the policy tracks exactly ``expected``.

        Raises:
            AssertionError: an object is missing, extra, or in both queues.
        """
        if set(self._order) & set(self._pinned) or self._parked:
            raise AssertionError("an object is in both eviction queues, or a walk did not end")
        tracked = set(self._order) | set(self._pinned)
        expected = set(expected)
        if tracked != expected:
            missing, extra = expected - tracked, tracked - expected
            raise AssertionError(
                f"eviction policy out of sync: missing {len(missing)}, extra {len(extra)}"
            )
