"""The master's RPCs as named, typed methods, mixed into :class:`~.master_rpc.MasterClient`.

Each method is :meth:`MasterClient.call` with its RPC chosen (and, for writes, the tagged form
when the config carries KV sessions); answers are decoded as :mod:`mooncake_py._wire.rpcs`
says. Errors and retries are the call's (see :mod:`mooncake_py.client.master_rpc` and
:mod:`mooncake_py.client.leader_follow`).

Thread-safety: as the client's (every method is one call).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mooncake_py.errors import ErrorCode
from mooncake_py.types import (
    ClientStatus,
    DiskReplicaEntry,
    DiskTaskBatch,
    KvSessionInfo,
    KvSessionPage,
    ProbeLeaseMode,
    PutStartResult,
    QueryTaskResponse,
    ReleaseResult,
    ReplicaListResult,
    ReplicateConfig,
    SegmentInfo,
    StartTaskResult,
)


def new_attempt_id() -> int:
    """A fresh id for one write-starting call (never 0): every retry of the call carries it,
    so the master answers a repeat with the write the first attempt started (see
    :mod:`.leader_follow`). 63 random bits: ids of different calls do not meet."""
    return secrets.randbits(63) | 1


if TYPE_CHECKING:

    class _Caller:
        """What the methods need of the client they are mixed into."""

        def call(self, name: str, *args: Any) -> Any: ...

        def call_with_request(self, name: str, request: Any) -> Any: ...

        def send_one_way(self, name: str, *args: Any) -> None: ...

else:
    _Caller = object


class MasterCalls(_Caller):
    """One method per master RPC (see the module docstring)."""

    # -- segments and liveness -------------------------------------------------------------

    def mount_segment(self, client_id: str, segment: SegmentInfo, tenant: str = "") -> int:
        """MountSegment; returns a code. With tokens the segment belongs to the token's
        tenant (``tenant`` may be "" or must name it)."""
        return self.call("MountSegment", client_id, segment, tenant)

    def remount_segments(
        self, client_id: str, segments: Sequence[SegmentInfo], tenant: str = ""
    ) -> int:
        """ReMountSegment; returns a code (``tenant`` as for :meth:`mount_segment`)."""
        return self.call("ReMountSegment", client_id, segments, tenant)

    def unmount_segment(self, client_id: str, segment_id: str, tenant: str = "") -> int:
        """UnmountSegment; returns a code (``tenant`` as for :meth:`mount_segment`)."""
        return self.call("UnmountSegment", client_id, segment_id, tenant)

    def ping(self, client_id: str) -> tuple[int, ClientStatus, int]:
        """Ping; returns (code, client status, view version)."""
        return self.call("Ping", client_id)

    def service_ready(self) -> str:
        """ServiceReady; returns the master's version string."""
        version: str = self.call("ServiceReady")[0]
        return version

    # -- write path ------------------------------------------------------------------------

    def put_start(
        self, client_id: str, tenant: str, key: str, size: int, config: ReplicateConfig
    ) -> PutStartResult:
        """PutStart for one key (PutStartWithKvSessions when ``config.kv_sessions`` is set)."""
        return self._start_one("PutStart", client_id, tenant, key, size, config)

    def batch_put_start(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        config: ReplicateConfig,
    ) -> list[PutStartResult]:
        """BatchPutStart (or its tagged form): one result per key, in order."""
        return self._start_batch("BatchPutStart", client_id, tenant, keys, sizes, config)

    def upsert_start(
        self, client_id: str, tenant: str, key: str, size: int, config: ReplicateConfig
    ) -> PutStartResult:
        """UpsertStart for one key (finish with put_end / put_revoke)."""
        return self._start_one("UpsertStart", client_id, tenant, key, size, config)

    def batch_upsert_start(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        config: ReplicateConfig,
    ) -> list[PutStartResult]:
        """BatchUpsertStart (or its tagged form): one result per key, in order."""
        return self._start_batch("BatchUpsertStart", client_id, tenant, keys, sizes, config)

    def _start_one(
        self, method: str, client_id: str, tenant: str, key: str, size: int, config: ReplicateConfig
    ) -> PutStartResult:
        attempt = new_attempt_id()
        if config.kv_sessions is None:
            return self.call(method, client_id, tenant, key, size, config, attempt)
        if len(config.kv_sessions) != 1:
            return PutStartResult(int(ErrorCode.INVALID_PARAMS))
        return self.call(f"{method}WithKvSessions", client_id, tenant, key, size, config, attempt)

    def _start_batch(
        self,
        method: str,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        config: ReplicateConfig,
    ) -> list[PutStartResult]:
        if config.kv_sessions is not None:
            method += "WithKvSessions"
        return self.call(method, client_id, tenant, keys, sizes, config, new_attempt_id())

    def put_end(self, client_id: str, tenant: str, key: str, write_id: int) -> int:
        """PutEnd of the write ``write_id`` (what its start answered); returns a code
        (INVALID_WRITE when another write of the key preempted it)."""
        return self.call("PutEnd", client_id, tenant, key, write_id)

    def batch_put_end(
        self, client_id: str, tenant: str, keys: Sequence[str], write_ids: Sequence[int]
    ) -> list[int]:
        """BatchPutEnd: one write id per key, one code per key."""
        return self.call("BatchPutEnd", client_id, tenant, keys, write_ids)

    def put_revoke(self, client_id: str, tenant: str, key: str, write_id: int) -> int:
        """PutRevoke of the write ``write_id``; returns a code."""
        return self.call("PutRevoke", client_id, tenant, key, write_id)

    def batch_put_revoke(
        self, client_id: str, tenant: str, keys: Sequence[str], write_ids: Sequence[int]
    ) -> list[int]:
        """BatchPutRevoke: one write id per key, one code per key."""
        return self.call("BatchPutRevoke", client_id, tenant, keys, write_ids)

    # -- read path -------------------------------------------------------------------------

    def get_replica_list(self, tenant: str, key: str, client_id: str) -> ReplicaListResult:
        """GetReplicaList for one key: starts a read lease held by ``client_id`` (its
        ``read_id``), which the client ends with :meth:`end_reads`."""
        return self.call("GetReplicaList", tenant, key, client_id)

    def batch_get_replica_list(
        self, tenant: str, keys: Sequence[str], client_id: str
    ) -> list[ReplicaListResult]:
        """BatchGetReplicaList: one result per key (a read lease per OK result)."""
        return self.call("BatchGetReplicaList", tenant, keys, client_id)

    def end_reads(self, client_id: str, read_ids: Sequence[int]) -> list[int]:
        """EndReads, waiting for the answer: per id 0, or LEASE_EXPIRED when the bytes may
        have changed under a copy that outlived its lease (or the id is unknown)."""
        return self.call("EndReads", client_id, read_ids)

    def end_reads_one_way(self, client_id: str, read_ids: Sequence[int]) -> None:
        """EndReads without waiting (see :meth:`send_one_way`)."""
        self.send_one_way("EndReads", client_id, read_ids)

    def exist_key(self, tenant: str, key: str, client_id: str) -> int:
        """ExistKey: 1 (``client_id`` gets an existence hold), 0, or a negative code."""
        return self.call("ExistKey", tenant, key, client_id)

    def batch_exist_key(self, tenant: str, keys: Sequence[str], client_id: str) -> list[int]:
        """BatchExistKey: per key 1 (with an existence hold), 0, or a negative code."""
        return self.call("BatchExistKey", tenant, keys, client_id)

    def probe_key(self, tenant: str, key: str) -> int:
        """ProbeKey: 1, 0, or a negative code; leases nothing."""
        return self.call("ProbeKey", tenant, key)

    def batch_probe_key(
        self,
        tenant: str,
        keys: Sequence[str],
        client_id: str,
        lease_mode: ProbeLeaseMode = ProbeLeaseMode.NONE,
        candidate_size: int = 1,
    ) -> list[int]:
        """BatchProbeKey: per key 1, 0, or a negative code. ``NONE`` leases nothing;
        ``LAST_HIT_ONLY`` answers 1 only for the last complete candidate of
        ``candidate_size`` consecutive keys, which gets existence holds for ``client_id``."""
        return self.call("BatchProbeKey", tenant, keys, client_id, int(lease_mode), candidate_size)

    # -- KV sessions -----------------------------------------------------------------------

    def attach_kv_session(self, tenant: str, session_id: str, keys: Sequence[str]) -> list[int]:
        """AttachKvSession: per key 0 or a negative code."""
        return self.call("AttachKvSession", tenant, session_id, keys)

    def set_kv_session_pin(self, tenant: str, session_id: str, pinned: bool) -> int:
        """PinKvSession / UnpinKvSession; returns a code."""
        name = "PinKvSession" if pinned else "UnpinKvSession"
        return self.call(name, tenant, session_id, pinned)

    def update_kv_session(self, tenant: str, session_id: str, keep_keys: Sequence[str]) -> int:
        """UpdateKvSession; returns a code."""
        return self.call("UpdateKvSession", tenant, session_id, keep_keys)

    def close_kv_session(self, tenant: str, session_id: str) -> int:
        """CloseKvSession; returns a code."""
        return self.call("CloseKvSession", tenant, session_id)

    def get_kv_session(self, tenant: str, session_id: str) -> tuple[int, KvSessionInfo | None]:
        """GetKvSession: (code, info or None)."""
        return self.call("GetKvSession", tenant, session_id)

    def list_kv_session_keys(
        self, tenant: str, session_id: str, cursor: str, limit: int
    ) -> tuple[int, KvSessionPage | None]:
        """ListKvSessionKeys: (code, page or None)."""
        return self.call("ListKvSessionKeys", tenant, session_id, cursor, limit)

    def list_kv_sessions(
        self, tenant: str, cursor: str, limit: int, pinned: bool | None, min_idle_ms: int
    ) -> tuple[int, list[KvSessionInfo], str]:
        """ListKvSessions: (code, infos, next cursor)."""
        return self.call("ListKvSessions", tenant, cursor, limit, pinned, min_idle_ms)

    def release(self, method: str, request: Any) -> tuple[int, ReleaseResult]:
        """Any Release* RPC with its request message already built: (code, result)."""
        return self.call_with_request(method, request)

    def release_kv_session(
        self, tenant: str, session_id: str, all_pages: bool = False
    ) -> tuple[int, ReleaseResult]:
        """ReleaseKvSession."""
        return self.call("ReleaseKvSession", tenant, session_id, all_pages)

    def release_stale_kv_sessions(
        self, tenant: str, max_idle_ms: int, include_pinned: bool
    ) -> tuple[int, ReleaseResult]:
        """ReleaseStaleKvSessions."""
        return self.call("ReleaseStaleKvSessions", tenant, max_idle_ms, include_pinned)

    def release_all_kv_sessions(self, tenant: str, confirm: bool) -> tuple[int, ReleaseResult]:
        """ReleaseAllKvSessions."""
        return self.call("ReleaseAllKvSessions", tenant, confirm)

    def release_kv_cache(self, tenant: str, keep_pinned: bool) -> tuple[int, ReleaseResult]:
        """ReleaseKvCache."""
        return self.call("ReleaseKvCache", tenant, keep_pinned)

    # -- introspection ---------------------------------------------------------------------

    def get_stats(self, tenant: str = "") -> dict[str, int]:
        """GetStats: store-wide counts and bytes for an admin token (or a master without
        tokens), else the token's tenant's figures (the master decides, from the token)."""
        return self.call("GetStats", tenant, False)

    def list_segments(self, tenant: str = "") -> list[tuple[SegmentInfo, str, int, int]]:
        """ListSegments: (segment, owning client, used bytes, allocations) per segment; every
        segment for an admin token (or a master without tokens), else the segments the
        token's tenant may use (the master decides, from the token)."""
        return self.call("ListSegments", tenant, False)

    # -- remove family ---------------------------------------------------------------------

    def remove(self, tenant: str, key: str, force: bool) -> int:
        """Remove; returns a code."""
        return self.call("Remove", tenant, key, force)

    def batch_remove(self, tenant: str, keys: Sequence[str], force: bool) -> list[int]:
        """BatchRemove: one code per key."""
        return self.call("BatchRemove", tenant, keys, force)

    def remove_by_regex(self, tenant: str, pattern: str, force: bool) -> int:
        """RemoveByRegex: the count removed, or a negative code."""
        return self.call("RemoveByRegex", tenant, pattern, force)

    def remove_all(self, tenant: str, force: bool) -> int:
        """RemoveAll: the count removed."""
        return self.call("RemoveAll", tenant, force)

    def create_copy_task(self, tenant: str, key: str, targets: Sequence[str]) -> tuple[int, str]:
        """CreateCopyTask: ``(code, task id)``."""
        return self.call("CreateCopyTask", tenant, key, targets)

    def create_move_task(self, tenant: str, key: str, source: str, target: str) -> tuple[int, str]:
        """CreateMoveTask: ``(code, task id)``."""
        return self.call("CreateMoveTask", tenant, key, source, target)

    def query_task(self, tenant: str, task_id: str) -> tuple[int, QueryTaskResponse | None]:
        """QueryTask: ``(code, state or None)``."""
        return self.call("QueryTask", tenant, task_id)

    def fetch_tasks(self, client_id: str, batch_size: int) -> list[str]:
        """FetchTasks: the ids of tasks assigned to this client, now processing."""
        return self.call("FetchTasks", client_id, batch_size)

    def start_task(self, client_id: str, task_id: str) -> StartTaskResult:
        """StartTask: the reserved targets and the source to copy."""
        return self.call("StartTask", client_id, task_id)

    def finish_task(self, client_id: str, task_id: str, succeeded: bool, message: str) -> int:
        """FinishTask: the copy's outcome; 0 or TASK_NOT_FOUND."""
        return self.call("FinishTask", client_id, task_id, succeeded, message)

    def fetch_disk_tasks(self, client_id: str, batch_size: int) -> DiskTaskBatch:
        """FetchDiskTasks: this client's disk tasks and the files its tiers are to delete."""
        return self.call("FetchDiskTasks", client_id, batch_size)

    def finish_disk_tasks(
        self, client_id: str, task_ids: Sequence[int], codes: Sequence[int]
    ) -> list[int]:
        """FinishDiskTasks: each task's outcome; per task 0 or TASK_NOT_FOUND."""
        return self.call("FinishDiskTasks", client_id, task_ids, codes)

    def register_disk_replicas(
        self, client_id: str, segment_id: str, entries: Sequence[DiskReplicaEntry]
    ) -> list[int]:
        """RegisterDiskReplicas: per file found in a disk tier, 0 or why the master refused it."""
        return self.call("RegisterDiskReplicas", client_id, segment_id, entries)

    def demote_objects(self, tenant: str, keys: Sequence[str]) -> list[int]:
        """DemoteObjects: per key, 0 (on its way to disk, or there) or why not."""
        return self.call("DemoteObjects", tenant, keys)

    def drop_disk_replicas(
        self, client_id: str, segment_id: str, entries: Sequence[DiskReplicaEntry]
    ) -> list[int]:
        """DropDiskReplicas: per damaged file, 0 or OBJECT_NOT_FOUND (nothing to drop)."""
        return self.call("DropDiskReplicas", client_id, segment_id, entries)

    def batch_replica_clear(
        self, client_id: str, tenant: str, keys: Sequence[str], segment_name: str
    ) -> tuple[int, list[str]]:
        """BatchReplicaClear: ``(code, keys cleared)``."""
        return self.call("BatchReplicaClear", client_id, tenant, keys, segment_name)
