"""The disk tier owner's calls: fetch disk tasks, report them, re-register files found at start.

An owner that mounted a disk tier polls :meth:`DiskTierService.fetch_disk_tasks`, runs the
spills and promotions it is handed (and deletes the files it is told to), and reports each
outcome with :meth:`DiskTierService.finish_disk_tasks`; what the outcomes change is
:class:`~.disk_moves.DiskMoves`'. A restarted owner finds the complete files of its tier
directory and registers them with :meth:`DiskTierService.register_disk_replicas`, so the objects
come back readable from disk (with HA they survive a failover like any replica).

Thread-safety: every method takes the context's lock.
"""

from __future__ import annotations

from collections.abc import Sequence

from mooncake_py.errors import ErrorCode
from mooncake_py.types import (
    DiskReplicaEntry,
    DiskTask,
    DiskTaskBatch,
    DiskTaskKind,
    ReplicaStatus,
)

from ..state.disk_tier import DiskTaskRecord
from ..state.objects import ObjectMetadata, Replica, valid_key
from ..state.segments import MountedSegment
from .context import ServiceContext
from .disk_moves import DiskMoves
from .slices import Steps, drive, map_in_slices

MAX_DISK_TASK_FETCH = 256
"""Tasks one FetchDiskTasks call hands out at most."""
MAX_DISK_ENTRIES = 4096
"""Files one RegisterDiskReplicas call may register (more: INVALID_PARAMS for every entry)."""


class DiskTierService:
    """The owner's side of the disk tier (see the module docstring).

    Args:
        context: the lock, state, clock and tenant rule the services share.
        moves: the disk tier's rules.
    """

    def __init__(self, context: ServiceContext, moves: DiskMoves) -> None:
        self._lock = context.lock
        self._state = context.state
        self._clock = context.clock
        self._resolve_tenant = context.tenants.resolve
        self._moves = moves

    def fetch_disk_tasks(self, client_id: str, batch_size: int) -> DiskTaskBatch:
        """Up to ``batch_size`` (at most :data:`MAX_DISK_TASK_FETCH`) of the caller's queued
        disk tasks, and the files its tiers are to delete. An unknown client gets nothing.
        O(result)."""
        if not client_id:
            return DiskTaskBatch()
        with self._lock:
            now = self._clock()
            state = self._state
            limit = max(0, min(batch_size, MAX_DISK_TASK_FETCH))
            records = state.disk.take_for(client_id, limit, now) if limit else []
            tiers = [m.info.id for m in state.segments.segments_of(client_id) if m.info.disk]
            deletes = state.disk.take_deletes(tiers) if tiers else []
            return DiskTaskBatch(tuple(_task_of(r) for r in records), tuple(deletes))

    def finish_disk_tasks(
        self, client_id: str, task_ids: Sequence[int], codes: Sequence[int]
    ) -> list[int]:
        """Apply the outcome of each task (``codes[i]`` 0: its copy is complete).

        Returns:
            Per task: OK, or TASK_NOT_FOUND for a task that is unknown, not the caller's, not
            handed out, or already over (it expired). INVALID_PARAMS for every task when the
            lists differ in length or name more than :data:`MAX_DISK_ENTRIES` tasks.
        Complexity: O(tasks × replicas).
        """
        if len(task_ids) != len(codes) or len(task_ids) > MAX_DISK_ENTRIES:
            return [int(ErrorCode.INVALID_PARAMS)] * len(task_ids)
        with self._lock:
            now = self._clock()
            disk = self._state.disk
            results: list[int] = []
            for task_id, code in zip(task_ids, codes, strict=True):
                record = disk.get(task_id)
                if record is None or record.client_id != client_id or not record.sent:
                    results.append(int(ErrorCode.TASK_NOT_FOUND))
                    continue
                disk.finish(task_id)
                self._moves.finished(record, int(code), now)
                results.append(int(ErrorCode.OK))
            return results

    def register_disk_replicas(
        self, client_id: str, segment_id: str, entries: Sequence[DiskReplicaEntry]
    ) -> list[int]:
        """Make the complete files a restarted owner found readable again, as objects with a
        disk replica at each file's range (in its tier's LRU, newest last).

        Returns:
            Per entry: OK (also when this file already backs the object: registering again
            changes nothing); OBJECT_ALREADY_EXISTS when the key has another object (the file
            is an old value: the owner deletes it); OBJECT_NOT_FOUND for a file whose object
            was removed while the owner was away (it is to be deleted); INVALID_PARAMS for a
            malformed entry or a range the tier cannot hold (overlap, quota); SEGMENT_NOT_FOUND
            for every entry when the tier is not (or no longer) the caller's disk tier;
            ILLEGAL_CLIENT for a tenant whose objects the tier may not hold. More than
            :data:`MAX_DISK_ENTRIES` entries: INVALID_PARAMS for each.
        Complexity: O(entries).
        """
        invalid = int(ErrorCode.INVALID_PARAMS)
        if len(entries) > MAX_DISK_ENTRIES:
            return [invalid] * len(entries)
        with self._lock:
            now = self._clock()
            state = self._state
            tier = self._callers_tier(client_id, segment_id)
            if tier is None:
                # Not the caller's tier (now): the files are not its to give up.
                return [int(ErrorCode.SEGMENT_NOT_FOUND)] * len(entries)
            results: list[int] = []
            for entry in entries:
                tenant = self._resolve_tenant(entry.tenant)
                if tenant is None or not valid_key(entry.key) or entry.size <= 0:
                    results.append(invalid)
                    continue
                if not tier.usable_by(tenant):
                    results.append(int(ErrorCode.ILLEGAL_CLIENT))
                    continue
                existing = state.objects.get((tenant, entry.key))
                if existing is not None:
                    # This very file already backs the object (a remount of a tier the master
                    # kept): registered. Any other object under the key is newer than the file.
                    same = any(
                        r.segment_id == segment_id and r.offset == entry.offset
                        for r in existing.replicas
                    )
                    results.append(int(ErrorCode.OK if same else ErrorCode.OBJECT_ALREADY_EXISTS))
                    continue
                if state.disk.is_doomed(segment_id, entry.offset):
                    # Its object was removed while the owner was away: the file goes.
                    results.append(int(ErrorCode.OBJECT_NOT_FOUND))
                    continue
                if not state.segments.claim_disk(tier, entry.offset, entry.size):
                    results.append(invalid)
                    continue
                replica = Replica(
                    state.next_replica_id(),
                    segment_id,
                    entry.offset,
                    entry.size,
                    ReplicaStatus.PROCESSING,
                )
                meta = ObjectMetadata(tenant, entry.key, entry.size, client_id, now, (replica,))
                state.objects.insert(meta)
                # Readable at once, but a candidate of its tier's LRU only: it holds no memory.
                state.objects.mark_complete(meta)
                state.disk.on_disk(segment_id, meta.object_id)
                results.append(int(ErrorCode.OK))
            return results

    def drop_disk_replicas(
        self, client_id: str, segment_id: str, entries: Sequence[DiskReplicaEntry]
    ) -> list[int]:
        """Drop the disk replicas whose files the owner found damaged: each object loses its
        replica at the entry's offset of the caller's tier, and goes if nothing is left.

        Returns:
            Per entry: OK; OBJECT_NOT_FOUND when no object has that replica (a repeat, or it
            went another way); INVALID_PARAMS for a tier that is not the caller's disk tier or
            a bad tenant; more than :data:`MAX_DISK_ENTRIES` entries: INVALID_PARAMS for each.
        Complexity: O(entries × replicas).
        """
        invalid = int(ErrorCode.INVALID_PARAMS)
        if len(entries) > MAX_DISK_ENTRIES:
            return [invalid] * len(entries)
        with self._lock:
            now = self._clock()
            state = self._state
            if self._callers_tier(client_id, segment_id) is None:
                return [invalid] * len(entries)
            results: list[int] = []
            for entry in entries:
                tenant = self._resolve_tenant(entry.tenant)
                meta = None if tenant is None else state.objects.get((tenant, entry.key))
                doomed = (
                    []
                    if meta is None
                    else [
                        r
                        for r in meta.replicas
                        if r.segment_id == segment_id and r.offset == entry.offset
                    ]
                )
                if meta is None or not doomed:
                    results.append(invalid if tenant is None else int(ErrorCode.OBJECT_NOT_FOUND))
                    continue
                state.disk.forget(meta.object_id)
                state.release_replicas(meta, doomed, now)
                results.append(int(ErrorCode.OK))
            return results

    def demote_objects(self, tenant: str, keys: Sequence[str]) -> list[int]:
        """See :meth:`demote_objects_sliced`; all slices back to back."""
        return drive(self.demote_objects_sliced(tenant, keys))

    def demote_objects_sliced(self, tenant: str, keys: Sequence[str]) -> Steps[list[int]]:
        """An operator's demotion of ``tenant``'s ``keys``: each goes from memory to its
        owner's disk tier now, as if eviction had picked it (a spill starts, or its memory is
        dropped at once when it has a disk copy already); its bytes stay readable throughout.

        Returns:
            Per key: OK (on disk, or on its way); OBJECT_NOT_FOUND; REPLICA_IS_NOT_READY
            while it is being written; OBJECT_HAS_LEASE while a reader copies it;
            OBJECT_REPLICA_BUSY for a hard-pinned object (pinned to memory);
            UNABLE_OFFLOAD when no disk tier may hold it (none on its memory's owner, not
            usable by its tenant, full of objects that cannot go, or paused after a failed
            spill); every key INVALID_PARAMS for a bad tenant or over ``max_batch_keys``.
        Complexity: O(keys × replicas), plus a full tier's bounded eviction, in slices.
        """
        resolved = self._resolve_tenant(tenant)
        if resolved is None or len(keys) > self._state.config.max_batch_keys:
            return [int(ErrorCode.INVALID_PARAMS)] * len(keys)
        scope: str = resolved
        state = self._state
        moves = self._moves

        def step(_: int, key: str, now: float) -> int:
            meta = state.objects.get((scope, key))
            if meta is None:
                return int(
                    ErrorCode.INVALID_PARAMS if not valid_key(key) else ErrorCode.OBJECT_NOT_FOUND
                )
            if meta.is_writing() or not meta.is_readable():
                return int(ErrorCode.REPLICA_IS_NOT_READY)
            if meta.hard_pinned:
                return int(ErrorCode.OBJECT_REPLICA_BUSY)  # pinned to memory
            if state.reads.is_read(meta):
                return int(ErrorCode.OBJECT_HAS_LEASE)
            if not state.memory_replicas(meta) or moves.demote(meta, now):
                state.counters.operator_demotions += 1
                return int(ErrorCode.OK)
            return int(ErrorCode.UNABLE_OFFLOAD)

        return (yield from map_in_slices(self._lock, keys, self._clock, step))

    def _callers_tier(self, client_id: str, segment_id: str) -> MountedSegment | None:
        """The disk tier ``segment_id`` if ``client_id`` holds it, else None. O(1)."""
        tier = self._state.segments.get(segment_id)
        if tier is None or not tier.info.disk or tier.client_id != client_id:
            return None
        return tier

    def expire_disk_tasks(self, now: float) -> int:
        """Fail the disk tasks whose deadline passed (a background step); returns how many."""
        with self._lock:
            return self._moves.expire(now)


def _task_of(record: DiskTaskRecord) -> DiskTask:
    """What the owner needs to run ``record``."""
    meta = record.meta
    if record.kind is DiskTaskKind.SPILL:
        memory_segment, memory_offset = record.source.segment_id, record.source.offset
        disk_segment, disk_offset = record.target.segment.info.id, record.target.offset
    else:
        memory_segment, memory_offset = record.target.segment.info.id, record.target.offset
        disk_segment, disk_offset = record.source.segment_id, record.source.offset
    return DiskTask(
        task_id=record.id,
        kind=record.kind,
        tenant=meta.tenant,
        key=meta.key,
        size=meta.size,
        memory_segment_id=memory_segment,
        memory_offset=memory_offset,
        disk_segment_id=disk_segment,
        disk_offset=disk_offset,
    )
