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
freed since its owner last asked).

Thread-safety: none; the service serializes every call under its lock.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Iterable

from mooncake_py.types import DiskTaskKind

from .objects import ObjectId, ObjectMetadata, Replica
from .segments import Allocation

DISK_TASK_TIMEOUT_S = 30.0
"""A disk task not finished this long after it was handed out (or created) fails."""
MAX_DELETES_PER_FETCH = 8192
"""File deletions one fetch hands out at most."""


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
        freed_memory: bytes of memory replicas the spill will free (for the used ratio).
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


class DiskTiers:
    """Disk tasks, deletions and per-tier LRUs (see the module docstring)."""

    def __init__(self) -> None:
        self._tasks: dict[int, DiskTaskRecord] = {}
        self._queued: dict[str, collections.deque[int]] = {}
        self._busy: dict[ObjectId, int] = {}
        self._deletes: dict[str, list[int]] = {}
        self._lru: dict[str, collections.OrderedDict[ObjectId, None]] = {}
        self._lru_of: dict[ObjectId, str] = {}
        self._ids = itertools.count(1)
        # Memory bytes the spills in flight will free, in all: the used ratio discounts them.
        self.spilling_bytes = 0
        self.spilling_count = 0
        # Disk tiers whose last spill failed, and until when they are passed over.
        self.failed_until: dict[str, float] = {}

    # -- tasks -----------------------------------------------------------------------------

    def start(
        self,
        kind: DiskTaskKind,
        meta: ObjectMetadata,
        source: Replica,
        target: Allocation,
        client_id: str,
        now: float,
        freed_memory: int = 0,
    ) -> DiskTaskRecord:
        """Record a new task for ``client_id`` to fetch. The caller checked the object has no
        task (:meth:`busy`). O(1)."""
        record = DiskTaskRecord(
            id=next(self._ids),
            kind=kind,
            meta=meta,
            source=source,
            target=target,
            client_id=client_id,
            deadline=now + DISK_TASK_TIMEOUT_S,
            freed_memory=freed_memory,
        )
        self._tasks[record.id] = record
        self._queued.setdefault(client_id, collections.deque()).append(record.id)
        self._busy[meta.object_id] = record.id
        if kind is DiskTaskKind.SPILL:
            self.spilling_bytes += freed_memory
            self.spilling_count += 1
        return record

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
        return record

    def cancel(self, object_id: ObjectId) -> None:
        """The object was removed or is being rewritten: its task's copy is to be dropped when
        it finishes (the owner may be copying right now, so the reservation stays). O(1)."""
        task_id = self._busy.pop(object_id, None)
        if task_id is not None:
            self._tasks[task_id].cancelled = True

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
        """The range at ``offset`` of disk tier ``segment_id`` was freed: its file goes."""
        self._deletes.setdefault(segment_id, []).append(offset)

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
            if rest:
                self._deletes[segment_id] = rest
            else:
                del self._deletes[segment_id]
            taken.append((segment_id, tuple(batch)))
        return taken

    def pending_deletes(self) -> int:
        """Files waiting to be deleted, over all tiers."""
        return sum(len(v) for v in self._deletes.values())

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
        """A disk tier went away: its LRU and pending deletions go with it (its files stay for
        a restarted owner to find). O(its LRU)."""
        for object_id in self._lru.pop(segment_id, {}):
            self._lru_of.pop(object_id, None)
        self._deletes.pop(segment_id, None)
        self.failed_until.pop(segment_id, None)

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
        indexed = {oid for lru in self._lru.values() for oid in lru}
        if indexed != set(self._lru_of):
            raise AssertionError("LRU entries disagree with their index")
        for object_id, segment_id in self._lru_of.items():
            if object_id not in self._lru.get(segment_id, ()):
                raise AssertionError(f"{object_id!r} indexed under the wrong tier")
