"""What the master holds for its disk tiers: tasks in flight, file deletions, each tier's LRU.

A disk tier is a segment mounted with ``disk=True`` (:mod:`.disk_space`): its owner keeps each
disk replica in a file. The master moves bytes between an owner's memory segment and its disk
tier through *disk tasks* the owner fetches and runs (:mod:`~..service.disk_moves` decides
them):

- a **spill** copies an object's memory replica into a fresh disk range reserved for it; the
  memory stays allocated (and readable) until the owner reports the file complete, then the disk
  replica joins the object and the memory goes;
- a **promotion** copies a disk replica into a memory range reserved in the owner's segment;
  when done the memory replica joins the object, which keeps its disk replica.

Until a task finishes its reservation belongs to the task, not to any object (readers never see
it), exactly as replica tasks hold theirs (:mod:`.tasks`). An object has at most one disk task.

Each tier also keeps an LRU of the objects with a disk replica on it (oldest access first),
which frees its quota when a spill needs room, and the offsets of the files to delete (ranges
freed since its owner last asked). While a mounted tier's file waits to be deleted its range
stays allocated, doomed (:meth:`~.disk_space.DiskSpace.doom`: out of the quota, but a
replicated row, so a restored master deletes the file too and nobody registers it again); it
is freed when the deletion is handed out. A tier whose owner is away keeps its pending
deletions under its id until it is mounted again.

Thread-safety: none; the service serializes every call under its lock.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable, Iterable

from mooncake_py.types import DiskTaskKind

from .objects import ObjectId, ObjectMetadata, Replica
from .segments import Allocation

DISK_TASK_TIMEOUT_S = 30.0
"""A disk task not finished this long after it was handed out (or created) fails."""
MAX_DELETES_PER_FETCH = 8192
"""File deletions one fetch hands out at most."""
MAX_PENDING_DELETES = 1 << 20
"""File deletions kept in all, for mounted tiers and for tiers whose owner is away (a tier
mounted again under its id gets them); past it the oldest away tier's are dropped."""
SPILL_FRESH_S = 10.0
"""A spill started this recently counts as memory on its way (writers are told to retry);
older ones in flight mean a slow or hung owner (writers fail at once instead)."""
FAILED_TIER_PAUSE_S = 5.0
"""How long a disk tier is passed over after a spill failed or expired; doubled for each
failure in a row, up to :data:`MAX_TIER_PAUSE_S`, and reset by a spill that completes."""
MAX_TIER_PAUSE_S = 300.0


@dataclasses.dataclass(slots=True)
class DiskTaskRecord:
    """One spill or promotion in flight.

    Attributes:
        meta: the object as it was when the task started (another object under its id at the
            end means it was removed or replaced: the result is dropped).
        source: the replica copied from (a memory replica for a spill, the disk replica for a
            promotion), on ``meta``.
        target: the range reserved for the copy (disk for a spill, memory for a promotion).
        client_id: the owner who runs it.
        deadline: when it fails if not finished (service clock).
        sent: handed out to the owner.
        cancelled: the object was removed or rewritten meanwhile: the copy is dropped.
        freed_memory: bytes of memory replicas the spill will free (for the used ratio),
            and on which segments (``freed_on``).
        started_at: when the task was created.
    """

    id: int
    kind: DiskTaskKind
    meta: ObjectMetadata
    source: Replica
    target: Allocation
    client_id: str
    deadline: float
    sent: bool = False
    cancelled: bool = False
    freed_memory: int = 0
    freed_on: tuple[tuple[str, int], ...] = ()
    started_at: float = 0.0


class DiskTiers:
    """Disk tasks, deletions and per-tier LRUs (see the module docstring)."""

    def __init__(self) -> None:
        self._tasks: dict[int, DiskTaskRecord] = {}
        self._queued: dict[str, collections.deque[int]] = {}
        self._busy: dict[ObjectId, int] = {}
        # Offsets of files to delete, per tier (mounted or away), oldest tier first; and the
        # same as sets, so a restarted owner cannot register a file that is to go.
        self._deletes: collections.OrderedDict[str, list[int]] = collections.OrderedDict()
        self._doomed: dict[str, set[int]] = {}
        # Tiers whose owner is away; and what frees a handed-out deletion's range when its
        # tier's space still holds it doomed (a mounted tier's).
        self._away: set[str] = set()
        self.release: Callable[[str, int], None] | None = None
        self._lru: dict[str, collections.OrderedDict[ObjectId, None]] = {}
        self._lru_of: dict[ObjectId, str] = {}
        self._ids = itertools.count(1)
        self._pending = 0
        # Memory bytes the spills in flight will free, in all (the used ratio discounts them)
        # and per memory segment.
        self.spilling_bytes = 0
        self.spilling_count = 0
        self._spilling_on: dict[str, int] = {}
        # Disk tiers whose last spills failed: until when they are passed over, and how many
        # failed in a row.
        self.failed_until: dict[str, float] = {}
        self._failures: dict[str, int] = {}

    # -- tasks -----------------------------------------------------------------------------

    def start(
        self,
        kind: DiskTaskKind,
        meta: ObjectMetadata,
        source: Replica,
        target: Allocation,
        client_id: str,
        now: float,
        freed_on: tuple[tuple[str, int], ...] = (),
    ) -> DiskTaskRecord:
        """Record a new task for ``client_id`` to fetch (a spill names the memory it will free,
        as (segment id, bytes) pairs). The caller checked the object has no task
        (:meth:`busy`). O(1)."""
        record = DiskTaskRecord(
            id=next(self._ids),
            kind=kind,
            meta=meta,
            source=source,
            target=target,
            client_id=client_id,
            deadline=now + DISK_TASK_TIMEOUT_S,
            freed_memory=sum(size for _, size in freed_on),
            freed_on=freed_on,
            started_at=now,
        )
        self._tasks[record.id] = record
        self._queued.setdefault(client_id, collections.deque()).append(record.id)
        self._busy[meta.object_id] = record.id
        if kind is DiskTaskKind.SPILL:
            self.spilling_bytes += record.freed_memory
            self.spilling_count += 1
            for segment_id, size in freed_on:
                self._spilling_on[segment_id] = self._spilling_on.get(segment_id, 0) + size
        return record

    def spilling_on(self, segment_ids: Iterable[str], now: float) -> int:
        """Memory bytes that spills started within :data:`SPILL_FRESH_S` will free on
        ``segment_ids`` (those of slower spills are not counted: their owner may be hung).
        O(segments + spills in flight) when a spill is stale, O(segments) otherwise."""
        if not self.spilling_count:
            return 0
        wanted = set(segment_ids)
        total = sum(self._spilling_on.get(s, 0) for s in wanted)
        stale = now - SPILL_FRESH_S
        if total and self._oldest_spill() < stale:
            total = sum(
                size
                for t in self._tasks.values()
                if t.kind is DiskTaskKind.SPILL and t.started_at >= stale
                for segment_id, size in t.freed_on
                if segment_id in wanted
            )
        return total

    def _oldest_spill(self) -> float:
        return min(
            (t.started_at for t in self._tasks.values() if t.kind is DiskTaskKind.SPILL),
            default=float("inf"),
        )

    def spill_failed(self, tier_id: str, now: float) -> None:
        """A spill to ``tier_id`` failed or expired: pass the tier over for a while (longer
        after each failure in a row). O(1)."""
        if self.failed_until.get(tier_id, 0.0) > now:
            return  # paused already: the same bout of failures (a batch that timed out)
        failures = self._failures.get(tier_id, 0) + 1
        self._failures[tier_id] = failures
        pause = min(FAILED_TIER_PAUSE_S * 2 ** (failures - 1), MAX_TIER_PAUSE_S)
        self.failed_until[tier_id] = now + pause

    def spill_done(self, tier_id: str) -> None:
        """A spill to ``tier_id`` completed: the tier works, its failures in a row and any
        pause are over. O(1)."""
        self._failures.pop(tier_id, None)
        self.failed_until.pop(tier_id, None)

    def busy(self, object_id: ObjectId) -> bool:
        """Whether the object has a disk task in flight. O(1)."""
        return object_id in self._busy

    def take_for(self, client_id: str, limit: int, now: float) -> list[DiskTaskRecord]:
        """Hand out up to ``limit`` of the client's queued tasks (their deadlines restart).
        O(result)."""
        queue = self._queued.get(client_id)
        taken: list[DiskTaskRecord] = []
        while queue and len(taken) < limit:
            record = self._tasks.get(queue.popleft())
            if record is None:
                continue
            record.sent = True
            record.deadline = now + DISK_TASK_TIMEOUT_S
            taken.append(record)
        if queue is not None and not queue:
            del self._queued[client_id]
        return taken

    def get(self, task_id: int) -> DiskTaskRecord | None:
        """The task in flight with this id, or None."""
        return self._tasks.get(task_id)

    def finish(self, task_id: int) -> DiskTaskRecord | None:
        """Forget a task (done, failed or expired); returns it, or None if unknown. O(1)
        (a queued task's queue entry is skipped when reached)."""
        record = self._tasks.pop(task_id, None)
        if record is None:
            return None
        if self._busy.get(record.meta.object_id) == task_id:
            del self._busy[record.meta.object_id]
        if record.kind is DiskTaskKind.SPILL:
            self.spilling_bytes -= record.freed_memory
            self.spilling_count -= 1
            for segment_id, size in record.freed_on:
                left = self._spilling_on[segment_id] - size
                if left:
                    self._spilling_on[segment_id] = left
                else:
                    del self._spilling_on[segment_id]
        return record

    def cancel(self, object_id: ObjectId) -> None:
        """The object was removed or is being rewritten: its task's copy is to be dropped when
        it finishes (the owner may be copying right now, so the reservation stays). O(1)."""
        task_id = self._busy.get(object_id)
        if task_id is not None:
            self.cancel_task(task_id)

    def cancel_task(self, task_id: int) -> None:
        """As :meth:`cancel`, for one task by its id (its object may have a newer one). O(1)."""
        record = self._tasks.get(task_id)
        if record is None or record.cancelled:
            return
        record.cancelled = True
        if self._busy.get(record.meta.object_id) == task_id:
            del self._busy[record.meta.object_id]

    def expired(self, now: float) -> list[int]:
        """Ids of the tasks whose deadline passed. O(tasks)."""
        return [t.id for t in self._tasks.values() if t.deadline <= now]

    def tasks_on(self, segment_id: str) -> list[int]:
        """Ids of the tasks whose source or target is on ``segment_id``. O(tasks)."""
        return [
            t.id
            for t in self._tasks.values()
            if t.target.segment.info.id == segment_id or t.source.segment_id == segment_id
        ]

    def held_on(self, segment_id: str) -> int:
        """Ranges tasks hold on ``segment_id`` (for the allocation audit). O(tasks)."""
        return sum(1 for t in self._tasks.values() if t.target.segment.info.id == segment_id)

    def __len__(self) -> int:
        return len(self._tasks)

    # -- deletions -------------------------------------------------------------------------

    def delete_later(self, segment_id: str, offset: int) -> None:
        """The range at ``offset`` of disk tier ``segment_id`` was freed: its file goes. O(1)
        (amortized; past :data:`MAX_PENDING_DELETES` the oldest away tier's are dropped)."""
        self._deletes.setdefault(segment_id, []).append(offset)
        self._doomed.setdefault(segment_id, set()).add(offset)
        self._pending += 1
        while self._pending > MAX_PENDING_DELETES:
            # Only an away tier's are ever dropped: a mounted tier's owner is told soon.
            away = next((s for s in self._deletes if s in self._away), None)
            if away is None:
                break
            self._pending -= len(self._deletes.pop(away))
            self._doomed.pop(away, None)

    def is_doomed(self, segment_id: str, offset: int) -> bool:
        """Whether the file at ``offset`` of ``segment_id`` is waiting to be deleted. O(1)."""
        doomed = self._doomed.get(segment_id)
        return doomed is not None and offset in doomed

    def take_deletes(self, segment_ids: Iterable[str]) -> list[tuple[str, tuple[int, ...]]]:
        """Hand out the pending deletions of these tiers (at most
        :data:`MAX_DELETES_PER_FETCH` in all). O(result)."""
        taken: list[tuple[str, tuple[int, ...]]] = []
        budget = MAX_DELETES_PER_FETCH
        for segment_id in segment_ids:
            pending = self._deletes.get(segment_id)
            if not pending or budget <= 0:
                continue
            batch, rest = pending[:budget], pending[budget:]
            budget -= len(batch)
            self._pending -= len(batch)
            doomed = self._doomed[segment_id]
            doomed.difference_update(batch)
            if self.release is not None:
                for offset in batch:
                    self.release(segment_id, offset)
            if rest:
                self._deletes[segment_id] = rest
            else:
                del self._deletes[segment_id]
                del self._doomed[segment_id]
            taken.append((segment_id, tuple(batch)))
        return taken

    def pending_deletes(self) -> int:
        """Files waiting to be deleted, over all tiers (mounted or away)."""
        return self._pending

    def mounted_again(self, segment_id: str) -> None:
        """A tier is mounted (again): its pending deletions are no longer an away tier's."""
        self._away.discard(segment_id)

    # -- per-tier LRU ----------------------------------------------------------------------

    def on_disk(self, segment_id: str, object_id: ObjectId) -> None:
        """The object has (or just got) a disk replica on ``segment_id``, or was read: it is the
        newest of that tier's LRU. O(1)."""
        lru = self._lru.get(segment_id)
        if lru is None:
            lru = self._lru[segment_id] = collections.OrderedDict()
        if object_id in lru:
            lru.move_to_end(object_id)
        else:
            lru[object_id] = None
            previous = self._lru_of.get(object_id)
            if previous is not None and previous != segment_id:
                self._lru[previous].pop(object_id, None)
            self._lru_of[object_id] = segment_id

    def touched(self, object_id: ObjectId) -> None:
        """The object was read: newest in its tier's LRU, if it is in one. O(1)."""
        segment_id = self._lru_of.get(object_id)
        if segment_id is not None:
            self._lru[segment_id].move_to_end(object_id)

    def oldest(self, segment_id: str, limit: int) -> list[ObjectId]:
        """Up to ``limit`` objects of the tier's LRU, oldest first. O(limit)."""
        lru = self._lru.get(segment_id)
        if not lru:
            return []
        return list(itertools.islice(lru, limit))

    def to_newest(self, segment_id: str, object_id: ObjectId) -> None:
        """Move a protected candidate behind the others. O(1)."""
        lru = self._lru.get(segment_id)
        if lru is not None and object_id in lru:
            lru.move_to_end(object_id)

    def forget(self, object_id: ObjectId) -> None:
        """The object left its tier (gone, or its disk replica dropped). O(1)."""
        segment_id = self._lru_of.pop(object_id, None)
        if segment_id is not None:
            lru = self._lru.get(segment_id)
            if lru is not None:
                lru.pop(object_id, None)

    def in_lru(self, segment_id: str, object_id: ObjectId) -> bool:
        """Whether the object is in ``segment_id``'s LRU. O(1)."""
        return self._lru_of.get(object_id) == segment_id

    def lru_size(self, segment_id: str) -> int:
        """Objects in the tier's LRU."""
        return len(self._lru.get(segment_id, ()))

    def forget_segment(self, segment_id: str) -> None:
        """A disk tier went away: its LRU goes with it. Its files stay for a restarted owner to
        find, and so do its pending deletions: a tier mounted again under its id is handed
        them, and cannot register those files meanwhile. O(its LRU)."""
        for object_id in self._lru.pop(segment_id, {}):
            self._lru_of.pop(object_id, None)
        self.failed_until.pop(segment_id, None)
        self._failures.pop(segment_id, None)
        self._away.add(segment_id)

    # -- invariants ------------------------------------------------------------------------

    def check(self) -> None:
        """Verify the indexes against each other. O(tasks + LRU entries).

        Raises:
            AssertionError: an index disagrees with the tasks or LRUs.
        """
        for object_id, task_id in self._busy.items():
            record = self._tasks.get(task_id)
            if record is None or record.meta.object_id != object_id or record.cancelled:
                raise AssertionError(f"busy object {object_id!r} has no live task")
        spills = [t for t in self._tasks.values() if t.kind is DiskTaskKind.SPILL]
        if self.spilling_count != len(spills):
            raise AssertionError("spilling count disagrees with the spill tasks")
        if self.spilling_bytes != sum(t.freed_memory for t in spills):
            raise AssertionError("spilling bytes disagree with the spill tasks")
        per_segment: dict[str, int] = {}
        for t in spills:
            for segment_id, size in t.freed_on:
                per_segment[segment_id] = per_segment.get(segment_id, 0) + size
        if per_segment != self._spilling_on:
            raise AssertionError("spilling bytes per segment disagree with the spill tasks")
        if self._pending != sum(map(len, self._deletes.values())):
            raise AssertionError("pending deletion count disagrees with the lists")
        if {s: set(v) for s, v in self._deletes.items()} != self._doomed:
            raise AssertionError("pending deletion sets disagree with the lists")

        indexed = {oid for lru in self._lru.values() for oid in lru}
        if indexed != set(self._lru_of):
            raise AssertionError("LRU entries disagree with their index")
        for object_id, segment_id in self._lru_of.items():
            if object_id not in self._lru.get(segment_id, ()):
                raise AssertionError(f"{object_id!r} indexed under the wrong tier")
