"""Replica copy and move tasks: what the master asked a client to do, and what it holds for it.

A task is created for one object (copy it to more segments, or move its replica from one
segment to another) and assigned to the client that owns the source replica's segment, which
holds the bytes: that client fetches it, the master reserves the target ranges and hands it
the source and target descriptors (:meth:`TaskTable.start`), the client copies, and the master
then attaches the new replicas (and, for a move, retires the source) or frees the reservation
(:meth:`TaskTable.finish`). Until then the reserved ranges belong to the task, not to any
object: readers never see them, and a target segment that goes away takes its reservation with
it (:meth:`TaskTable.forget_segment`).

Limits as upstream's task manager: at most ``MAX_PENDING`` pending and ``MAX_PROCESSING``
processing tasks, the ``MAX_FINISHED`` most recent finished ones kept for queries, and a task
pending or processing for over ``TASK_TIMEOUT_S`` fails.

Thread-safety: none; the service serializes every call under its lock.
"""

from __future__ import annotations

import collections
import dataclasses
import uuid
from collections.abc import Iterator

from mooncake_py.types import TaskStatus, TaskType

from .objects import ObjectId, ObjectMetadata, Replica
from .segments import Allocation

MAX_PENDING = 10_000
MAX_PROCESSING = 10_000
MAX_FINISHED = 10_000
TASK_TIMEOUT_S = 300.0


@dataclasses.dataclass(slots=True)
class Replication:
    """A started task's reservation: the target ranges and the read of the source.

    Attributes:
        meta: the object as it was when the task started (a different object under the key
            at the end means it was replaced: the copy is dropped).
        source: the replica copied from.
        targets: reserved ranges, one per target segment.
        read_id: the read hold that keeps the source's bytes put while they are copied.
        reserved: how many targets were reserved (fewer left in ``targets`` means a target
            segment went away meanwhile).
    """

    meta: ObjectMetadata
    source: Replica
    targets: list[Allocation]
    read_id: int
    reserved: int = 0


@dataclasses.dataclass(slots=True)
class Task:
    """One copy or move task.

    Times are on the service clock (seconds). ``source`` and ``targets`` are segment names.
    """

    id: str
    type: TaskType
    object_id: ObjectId
    source: str
    targets: list[str]
    assigned_client: str
    created_at: float
    updated_at: float
    status: TaskStatus = TaskStatus.PENDING
    message: str = ""
    replication: Replication | None = None


def new_task_id() -> str:
    """A fresh task id (a UUID, in its canonical text form)."""
    return str(uuid.uuid4())


class TaskTable:
    """Every known task, the pending ones queued per assigned client.

    Complexity: O(1) per task operation unless stated.
    """

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self._pending: dict[str, collections.deque[str]] = {}
        self._pending_count = 0
        self._processing: dict[str, Task] = {}
        self._finished: collections.deque[str] = collections.deque()
        self._by_object: dict[ObjectId, str] = {}  # an object's unfinished task

    def __len__(self) -> int:
        return len(self._tasks)

    def get(self, task_id: str) -> Task | None:
        """The task, or None when unknown (or long finished)."""
        return self._tasks.get(task_id)

    def active_on(self, object_id: ObjectId) -> Task | None:
        """The object's pending or processing task, if any."""
        task_id = self._by_object.get(object_id)
        return None if task_id is None else self._tasks.get(task_id)

    def can_submit(self) -> bool:
        """Whether the pending queue has room."""
        return self._pending_count < MAX_PENDING

    def submit(self, task: Task) -> None:
        """Queue a new PENDING task for its assigned client (the caller checked room and
        that the object has no unfinished task)."""
        self._tasks[task.id] = task
        self._pending.setdefault(task.assigned_client, collections.deque()).append(task.id)
        self._pending_count += 1
        self._by_object[task.object_id] = task.id

    def pop_for(self, client_id: str, limit: int, now: float) -> list[Task]:
        """Up to ``limit`` of the client's pending tasks, now PROCESSING (fewer when the
        processing limit is reached). O(result)."""
        queue = self._pending.get(client_id)
        taken: list[Task] = []
        while queue and len(taken) < limit and len(self._processing) < MAX_PROCESSING:
            task = self._tasks.get(queue.popleft())
            if task is None or task.status is not TaskStatus.PENDING:
                continue  # finished while queued: counted out then
            self._pending_count -= 1
            task.status = TaskStatus.PROCESSING
            task.updated_at = now
            self._processing[task.id] = task
            taken.append(task)
        if queue is not None and not queue:
            del self._pending[client_id]
        return taken

    def finish(self, task: Task, status: TaskStatus, message: str, now: float) -> None:
        """End ``task`` with SUCCESS or FAILED (its replication, if any, is the caller's to
        settle first). Keeps the last ``MAX_FINISHED`` finished tasks."""
        if task.status is TaskStatus.PENDING:
            self._pending_count -= 1  # its queue entry is skipped when popped
        self._processing.pop(task.id, None)
        if self._by_object.get(task.object_id) == task.id:
            del self._by_object[task.object_id]
        task.status, task.message, task.updated_at = status, message, now
        task.replication = None
        self._finished.append(task.id)
        while len(self._finished) > MAX_FINISHED:
            self._tasks.pop(self._finished.popleft(), None)

    def overdue(self, now: float) -> list[Task]:
        """Unfinished tasks older than ``TASK_TIMEOUT_S`` since their last change.
        O(unfinished tasks)."""
        limit = now - TASK_TIMEOUT_S
        return [
            t
            for t in self._tasks.values()
            if t.status in (TaskStatus.PENDING, TaskStatus.PROCESSING) and t.updated_at < limit
        ]

    def unfinished_of(self, client_id: str) -> list[Task]:
        """The client's pending and processing tasks. O(unfinished tasks)."""
        return [
            t
            for t in self._tasks.values()
            if t.assigned_client == client_id
            and t.status in (TaskStatus.PENDING, TaskStatus.PROCESSING)
        ]

    def replications(self) -> Iterator[Replication]:
        """Every started task's reservation."""
        for task in self._processing.values():
            if task.replication is not None:
                yield task.replication

    def forget_segment(self, segment_id: str) -> None:
        """A segment went away: reservations on it are dropped without freeing (its allocator
        is gone; a remount of the id starts a new one). O(processing tasks)."""
        for replication in self.replications():
            replication.targets = [
                a for a in replication.targets if a.segment.info.id != segment_id
            ]

    def held_on(self, segment_id: str) -> int:
        """Allocations reserved by tasks in ``segment_id`` (for the accounting check)."""
        return sum(
            1 for r in self.replications() for a in r.targets if a.segment.info.id == segment_id
        )

    def check(self) -> None:
        """Verify the queues and indexes against the tasks.

        Raises:
            AssertionError: they disagree.
        """
        queued = sum(
            1
            for queue in self._pending.values()
            for task_id in queue
            if task_id in self._tasks and self._tasks[task_id].status is TaskStatus.PENDING
        )
        pending = [t for t in self._tasks.values() if t.status is TaskStatus.PENDING]
        if queued != len(pending) or self._pending_count != len(pending):
            raise AssertionError("pending tasks and queues disagree")
        for task in self._processing.values():
            if task.status is not TaskStatus.PROCESSING:
                raise AssertionError(f"task {task.id} is listed as processing but is not")
        for object_id, task_id in self._by_object.items():
            indexed = self._tasks.get(task_id)
            if indexed is None or indexed.object_id != object_id:
                raise AssertionError(f"object index of task {task_id} is stale")
            if indexed.status not in (TaskStatus.PENDING, TaskStatus.PROCESSING):
                raise AssertionError(f"finished task {task_id} still holds its object")
