"""Replica copy and move tasks of the master (upstream's CreateCopyTask / CreateMoveTask /
QueryTask, and the worker side: FetchTasks, StartTask, FinishTask).

:class:`TaskService` is reached as ``MasterService.tasks``; it depends only on the shared
:class:`~mooncake_py.master.service.context.ServiceContext`. See
:mod:`mooncake_py.master.state.tasks` for the life of a task. As upstream, a copy task picks a
source replica at random and is assigned to the client owning that replica's segment; a move
task is assigned to the client owning its source segment. The worker's copy is protected as
any read: StartTask grants it a read hold on the source replica, and FinishTask attaches the
new replicas only when that hold covered the whole copy and the object is still the one the
task started on (otherwise the reservation is freed and the task fails). A move retires its
source replica at the end (freed at once, or when the reads still copying from it end).

Codes, as upstream: INVALID_PARAMS for no targets, an unknown target segment, a move whose
source is its target or holds no replica of the object; OBJECT_NOT_FOUND; REPLICA_IS_NOT_READY
while the object's first write is in flight; OBJECT_HAS_REPLICATION_TASK when the object has an
unfinished task; TASK_PENDING_LIMIT_EXCEEDED; TASK_NOT_FOUND for an unknown task (or one of
another tenant).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from mooncake_py.capability import WRITE
from mooncake_py.errors import ErrorCode
from mooncake_py.types import (
    QueryTaskResponse,
    ReplicaStatus,
    StartTaskResult,
    TaskStatus,
    TaskType,
    task_id_halves,
)

from ..state.objects import ObjectMetadata, Replica, valid_key
from ..state.segments import Allocation
from ..state.tasks import Replication, Task, new_task_id
from .context import ServiceContext

MAX_FETCH = 64
"""Tasks one FetchTasks call hands out at most."""


class TaskService:
    """The replica task calls.

    Args:
        context: the shared lock, state, clock and tenant rule.

    Thread-safety: every method takes the context's lock once.
    """

    def __init__(self, context: ServiceContext) -> None:
        self._lock = context.lock
        self._state = context.state
        self._clock = context.clock
        self._resolve_tenant = context.tenants.resolve
        self._rng = random.Random()

    # -- creating and querying -------------------------------------------------------------

    def create_copy_task(
        self, tenant: str, key: str, targets: Sequence[str]
    ) -> tuple[ErrorCode, str]:
        """Copy the object to the segments named ``targets``; ``(code, task id or "")``."""
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not valid_key(key) or not targets:
            return ErrorCode.INVALID_PARAMS, ""
        with self._lock:
            meta, code = self._object(resolved, key)
            if meta is None:
                return code, ""
            # Targets are where the copy is placed: only segments the tenant may use.
            if not all(self._state.segments.has_name(t, resolved) for t in targets):
                return ErrorCode.INVALID_PARAMS, ""
            code = self._may_submit(meta)
            if code != ErrorCode.OK:
                return code, ""
            source = self._rng.choice(self._state.readable_replicas(meta))
            return self._submit(meta, TaskType.REPLICA_COPY, source, list(dict.fromkeys(targets)))

    def create_move_task(
        self, tenant: str, key: str, source: str, target: str
    ) -> tuple[ErrorCode, str]:
        """Move the object's replica on segment ``source`` to segment ``target``."""
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not valid_key(key) or not source or source == target:
            return ErrorCode.INVALID_PARAMS, ""
        with self._lock:
            meta, code = self._object(resolved, key)
            if meta is None:
                return code, ""
            if not self._state.segments.has_name(target, resolved):
                return ErrorCode.INVALID_PARAMS, ""
            on_source = [
                r for r in self._state.readable_replicas(meta) if self._name_of(r) == source
            ]
            if not on_source:
                return ErrorCode.INVALID_PARAMS, ""
            code = self._may_submit(meta)
            if code != ErrorCode.OK:
                return code, ""
            return self._submit(meta, TaskType.REPLICA_MOVE, on_source[0], [target])

    def query_task(self, tenant: str, task_id: str) -> tuple[ErrorCode, QueryTaskResponse | None]:
        """The task's state; TASK_NOT_FOUND for an unknown task or one of another tenant."""
        resolved = self._resolve_tenant(tenant)
        with self._lock:
            task = self._state.tasks.get(task_id)
            if task is None or resolved is None or task.object_id[0] != resolved:
                return ErrorCode.TASK_NOT_FOUND, None
            offset_ms = (time.time() - self._clock()) * 1000
            return ErrorCode.OK, QueryTaskResponse(
                id=task_id_halves(task.id),
                type=task.type,
                status=task.status,
                created_at_ms_epoch=int(task.created_at * 1000 + offset_ms),
                last_updated_at_ms_epoch=int(task.updated_at * 1000 + offset_ms),
                # Another tenant's client (an operator's segment host) stays anonymous.
                assigned_client=(
                    task.assigned_client
                    if self._state.clients.tenant_of(task.assigned_client) in (None, tenant)
                    else ""
                ),
                message=task.message,
            )

    # -- the worker side -------------------------------------------------------------------

    def fetch_tasks(self, client_id: str, batch_size: int) -> list[str]:
        """Up to ``batch_size`` (at most :data:`MAX_FETCH`) of the client's pending tasks,
        now PROCESSING. O(result)."""
        if not client_id or batch_size <= 0:
            return []
        with self._lock:
            tasks = self._state.tasks.pop_for(client_id, min(batch_size, MAX_FETCH), self._clock())
            return [t.id for t in tasks]

    def start_task(self, client_id: str, task_id: str) -> StartTaskResult:
        """Reserve the task's targets and start the read of its source.

        Returns:
            OK with the source and target descriptors (no targets: nothing left to copy);
            TASK_NOT_FOUND when the task is unknown, not the caller's or not processing;
            OBJECT_HAS_REPLICATION_TASK when it was started already; otherwise the reason it
            cannot run (OBJECT_NOT_FOUND, REPLICA_NOT_FOUND, NO_AVAILABLE_HANDLE), the task
            then being FAILED.
        """
        with self._lock:
            now = self._clock()
            task = self._state.tasks.get(task_id)
            if (
                task is None
                or task.assigned_client != client_id
                or task.status is not TaskStatus.PROCESSING
            ):
                return StartTaskResult(ErrorCode.TASK_NOT_FOUND)
            if task.replication is not None:
                return StartTaskResult(ErrorCode.OBJECT_HAS_REPLICATION_TASK)
            meta = self._state.objects.get(task.object_id)
            if meta is None:
                return self._fail(task, ErrorCode.OBJECT_NOT_FOUND, "the object is gone", now)
            sources = [
                r for r in self._state.readable_replicas(meta) if self._name_of(r) == task.source
            ]
            if not sources:
                return self._fail(task, ErrorCode.REPLICA_NOT_FOUND, "the source is gone", now)
            held = {self._name_of(r) for r in meta.replicas}
            allocations: list[Allocation] = []
            for name in task.targets:
                if name in held:
                    continue  # already holds a replica: nothing to copy there
                allocation = self._state.segments.allocate_in(name, meta.size, meta.tenant)
                if allocation is None:
                    for done in allocations:
                        self._state.segments.free(done.segment.info.id, done.offset)
                    return self._fail(
                        task, ErrorCode.NO_AVAILABLE_HANDLE, f"no room on {name}", now
                    )
                allocations.append(allocation)
            source = sources[0]
            read_id = self._state.reads.grant(
                client_id, meta, [source], now + self._state.lease_ttl_s
            )
            task.replication = Replication(meta, source, allocations, read_id, len(allocations))
            task.updated_at = now
            described = tuple(
                self._state.describe(
                    meta,
                    Replica(0, a.segment.info.id, a.offset, meta.size, ReplicaStatus.PROCESSING),
                    WRITE,
                    allow_map=False,
                )
                for a in allocations
            )
            # The worker may act for another tenant (an operator's segment host): its grants
            # cover exactly the ranges it copies, never a whole segment.
            source_grant = self._state.describe(meta, source, allow_map=False)
            return StartTaskResult(ErrorCode.OK, source_grant, described)

    def finish_task(
        self, client_id: str, task_id: str, succeeded: bool, message: str = ""
    ) -> ErrorCode:
        """The worker is done: attach the copies (a move also retires its source) when the
        copy succeeded and stayed protected, else free the reservation; the task ends
        SUCCESS or FAILED.

        Returns:
            OK (the task has ended either way); TASK_NOT_FOUND when it is unknown, not the
            caller's or not processing.
        """
        with self._lock:
            now = self._clock()
            task = self._state.tasks.get(task_id)
            if (
                task is None
                or task.assigned_client != client_id
                or task.status is not TaskStatus.PROCESSING
            ):
                return ErrorCode.TASK_NOT_FOUND
            replication = task.replication
            if replication is None:
                self._state.tasks.finish(
                    task, TaskStatus.SUCCESS if succeeded else TaskStatus.FAILED, message, now
                )
                return ErrorCode.OK
            self._state.reads.expire_due(now)
            protected = self._state.reads.end(client_id, [replication.read_id])[0]
            meta = self._state.objects.get(task.object_id)
            if not succeeded:
                reason = message or "the copy failed"
            elif protected != ErrorCode.OK:
                reason = "the source's bytes were not protected for the whole copy"
            elif meta is not replication.meta or replication.source not in meta.replicas:
                reason = "the object changed during the copy"
            elif len(replication.targets) != replication.reserved:
                reason = "a target segment went away during the copy"
            else:
                reason = ""
            if reason or meta is None:
                self._release(replication)
                self._state.tasks.finish(task, TaskStatus.FAILED, reason, now)
                return ErrorCode.OK
            self._attach(meta, replication, task.type, now)
            self._state.tasks.finish(task, TaskStatus.SUCCESS, "", now)
            return ErrorCode.OK

    # -- background ------------------------------------------------------------------------

    def sweep(self, now: float) -> int:
        """Fail tasks that overstayed (pending or processing too long), freeing what they
        reserved; returns how many. O(unfinished tasks)."""
        with self._lock:
            overdue = self._state.tasks.overdue(now)
            for task in overdue:
                self._abandon(task, "timed out", now)
            return len(overdue)

    def drop_client(self, client_id: str, now: float) -> None:
        """The client expired: its tasks fail and free what they reserved. Lock held."""
        for task in self._state.tasks.unfinished_of(client_id):
            self._abandon(task, "the assigned client expired", now)

    # -- helpers ---------------------------------------------------------------------------

    def _object(self, tenant: str, key: str) -> tuple[ObjectMetadata | None, ErrorCode]:
        meta = self._state.objects.get((tenant, key))
        if meta is None:
            return None, ErrorCode.OBJECT_NOT_FOUND
        if not self._state.readable_replicas(meta):
            return None, ErrorCode.REPLICA_IS_NOT_READY
        return meta, ErrorCode.OK

    def _may_submit(self, meta: ObjectMetadata) -> ErrorCode:
        if self._state.tasks.active_on(meta.object_id) is not None:
            return ErrorCode.OBJECT_HAS_REPLICATION_TASK
        if not self._state.tasks.can_submit():
            return ErrorCode.TASK_PENDING_LIMIT_EXCEEDED
        return ErrorCode.OK

    def _submit(
        self, meta: ObjectMetadata, kind: TaskType, source: Replica, targets: list[str]
    ) -> tuple[ErrorCode, str]:
        mounted = self._state.segments.get(source.segment_id)
        if mounted is None:
            return ErrorCode.REPLICA_NOT_FOUND, ""
        now = self._clock()
        task = Task(
            id=new_task_id(),
            type=kind,
            object_id=meta.object_id,
            source=mounted.info.name,
            targets=targets,
            assigned_client=mounted.client_id,
            created_at=now,
            updated_at=now,
        )
        self._state.tasks.submit(task)
        return ErrorCode.OK, task.id

    def _name_of(self, replica: Replica) -> str | None:
        mounted = self._state.segments.get(replica.segment_id)
        return None if mounted is None else mounted.info.name

    def _fail(self, task: Task, code: ErrorCode, message: str, now: float) -> StartTaskResult:
        self._state.tasks.finish(task, TaskStatus.FAILED, message, now)
        return StartTaskResult(code)

    def _release(self, replication: Replication) -> None:
        for allocation in replication.targets:
            self._state.segments.free(allocation.segment.info.id, allocation.offset)
        replication.targets = []

    def _abandon(self, task: Task, message: str, now: float) -> None:
        if task.replication is not None:
            self._state.reads.end(task.assigned_client, [task.replication.read_id])
            self._release(task.replication)
        self._state.tasks.finish(task, TaskStatus.FAILED, message, now)

    def _attach(
        self, meta: ObjectMetadata, replication: Replication, kind: TaskType, now: float
    ) -> None:
        state = self._state
        copies = [
            Replica(
                state.next_replica_id(),
                a.segment.info.id,
                a.offset,
                meta.size,
                ReplicaStatus.COMPLETE,
            )
            for a in replication.targets
        ]
        replication.targets = []
        state.objects.add_replicas(meta, copies)
        state.counters.replicated_objects += 1
        state.counters.replicated_bytes += meta.size * len(copies)
        if kind is TaskType.REPLICA_MOVE and copies:
            state.release_replicas(meta, [replication.source], now)
