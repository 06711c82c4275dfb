"""Protobuf <-> typed conversions for every message the master and the client exchange.

Each ``encode_*`` takes what the master's service returns (or what the client sends) and builds
the protobuf message; the matching ``decode_*`` turns that message back into what the client's
methods return. Where the two forms are the same, ``decode(encode(x)) == x``; where they differ
(a ping, a regex removal's count, a lookup that failed) the docstring says how.

Every function is pure, thread-safe and O(size of the message). Hot paths (replicas, session
listings) name their fields instead of going through :func:`dataclasses.asdict`, which copies
recursively and costs several times as much. Batch answers, one entry per key, are built with
the repeated field's ``add`` (half the time of constructing each entry and handing over
the list) and decoded with :func:`~mooncake_py._wire.builders.frozen_builder` (a third of the
cost of the dataclasses' frozen ``__init__``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mooncake_py._proto import master_pb2 as pb
from mooncake_py._wire.builders import frozen_builder
from mooncake_py.errors import ErrorCode, InvalidParamsError
from mooncake_py.types import (
    ClientStatus,
    DiskReplicaEntry,
    DiskTask,
    DiskTaskBatch,
    DiskTaskKind,
    KvSessionInfo,
    KvSessionPage,
    ObjectDataType,
    PutStartResult,
    QueryTaskResponse,
    ReleaseResult,
    ReplicaDescriptor,
    ReplicaListResult,
    ReplicaStatus,
    ReplicateConfig,
    SegmentInfo,
    SoftPinAction,
    StartTaskResult,
    TaskStatus,
    TaskType,
    task_id_halves,
    task_id_text,
)

_RELEASE_FIELDS = tuple(f.name for f in dataclasses.fields(ReleaseResult))
_SEGMENT_FIELDS = tuple(f.name for f in dataclasses.fields(SegmentInfo))

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# Decoders build one of these per replica (and per key) of every batch answer.
_build_replica = frozen_builder(ReplicaDescriptor)
_build_put_start = frozen_builder(PutStartResult)
_build_replica_list = frozen_builder(ReplicaListResult)
# Looked up per replica: a dict lookup costs a fifth of calling the enum.
_REPLICA_STATUSES = {int(status): status for status in ReplicaStatus}

# -- shared types ----------------------------------------------------------------------------


ENCODED_CONFIGS_KEPT = 256
"""Distinct configs whose encoding :func:`encode_config_kept` keeps (a writer uses a few)."""

_encoded_configs: dict[tuple[Any, ...], pb.ReplicateConfig] = {}


def encode_config_kept(config: ReplicateConfig) -> pb.ReplicateConfig:
    """:func:`encode_config`, for a caller that only places the message in a request (which
    copies it) and never changes it: the message of a config without group ids and with few
    preferred segments is kept (up to :data:`ENCODED_CONFIGS_KEPT` distinct ones, by value) and
    returned again, since building it costs several times the lookup, on every write call.

    Raises:
        InvalidParamsError: as :func:`encode_config`.

    Thread-safety: any thread (the kept messages are only read; a lost insert costs a rebuild).
    """
    if config.group_ids or len(config.preferred_segments) > 4:
        return encode_config(config)
    key = (
        config.replica_num,
        config.with_hard_pin,
        *config.preferred_segments,
        config.preferred_segment,
        config.prefer_alloc_in_same_node,
        config.data_type,
        config.host_id,
        config.soft_pin_action,
        config.soft_pin_ttl_ms,
        len(config.preferred_segments),
    )
    message = _encoded_configs.get(key)
    if message is None:
        message = encode_config(config)
        if len(_encoded_configs) >= ENCODED_CONFIGS_KEPT:
            _encoded_configs.clear()
        _encoded_configs[key] = message
    return message


def encode_config(config: ReplicateConfig) -> pb.ReplicateConfig:
    """A typed :class:`ReplicateConfig` to protobuf (a new message).

    ``kv_sessions`` is not part of the message: tagged writes carry it in their own request
    fields (see :mod:`mooncake_py._wire.rpcs`). ``group_ids=None`` and ``[]`` both encode as no
    entries; ``soft_pin_ttl_ms=None`` leaves the optional field unset.

    Raises:
        InvalidParamsError: ``data_type`` or ``soft_pin_action`` does not fit the message's
            32-bit field (protobuf would raise a bare ValueError mid-call instead).
    """
    data_type, soft_pin_action = int(config.data_type), int(config.soft_pin_action)
    if not (_INT32_MIN <= data_type <= _INT32_MAX and _INT32_MIN <= soft_pin_action <= _INT32_MAX):
        raise InvalidParamsError(
            ErrorCode.INVALID_PARAMS,
            f"ReplicateConfig data_type {data_type} / soft_pin_action {soft_pin_action}: "
            "out of the 32-bit range",
        )
    message = pb.ReplicateConfig(
        # The field is 32-bit; anything larger is as invalid to the master as 2**32 - 1.
        replica_num=min(config.replica_num, 0xFFFFFFFF),
        with_hard_pin=config.with_hard_pin,
        preferred_segments=config.preferred_segments,
        preferred_segment=config.preferred_segment,
        prefer_alloc_in_same_node=config.prefer_alloc_in_same_node,
        data_type=data_type,
        host_id=config.host_id,
        group_ids=config.group_ids or (),
        soft_pin_action=soft_pin_action,
    )
    if config.soft_pin_ttl_ms is not None:
        message.soft_pin_ttl_ms = config.soft_pin_ttl_ms
    return message


def decode_config(message: pb.ReplicateConfig) -> ReplicateConfig:
    """Protobuf to a typed :class:`ReplicateConfig` (``kv_sessions`` stays None).

    An unknown ``data_type`` becomes ``ObjectDataType.UNKNOWN``; an unknown
    ``soft_pin_action`` stays a plain int, which the service rejects as INVALID_PARAMS. No
    group ids decode as None; an unset ``soft_pin_ttl_ms`` as None.
    """
    try:
        data_type = ObjectDataType(message.data_type)
    except ValueError:
        data_type = ObjectDataType.UNKNOWN
    try:
        action: SoftPinAction | int = SoftPinAction(message.soft_pin_action)
    except ValueError:
        action = message.soft_pin_action
    # Protobuf guarantees the field types: the constructor's checks would only cost time.
    return ReplicateConfig.from_checked(
        replica_num=message.replica_num,
        with_hard_pin=message.with_hard_pin,
        preferred_segments=list(message.preferred_segments),
        preferred_segment=message.preferred_segment,
        prefer_alloc_in_same_node=message.prefer_alloc_in_same_node,
        data_type=data_type,
        host_id=message.host_id,
        group_ids=list(message.group_ids) if message.group_ids else None,
        soft_pin_action=action,  # type: ignore[arg-type]
        soft_pin_ttl_ms=message.soft_pin_ttl_ms if message.HasField("soft_pin_ttl_ms") else None,
    )


def encode_segment(segment: SegmentInfo) -> pb.Segment:
    """:class:`SegmentInfo` to protobuf."""
    return pb.Segment(**{name: getattr(segment, name) for name in _SEGMENT_FIELDS})


def decode_segment(message: pb.Segment) -> SegmentInfo:
    """Protobuf to :class:`SegmentInfo`."""
    return SegmentInfo(**{name: getattr(message, name) for name in _SEGMENT_FIELDS})


def encode_segments(segments: Iterable[SegmentInfo]) -> list[pb.Segment]:
    """Several segments to protobuf, in order."""
    return [encode_segment(s) for s in segments]


def decode_segments(messages: Iterable[pb.Segment]) -> list[SegmentInfo]:
    """Several protobuf segments to :class:`SegmentInfo`, in order."""
    return [decode_segment(m) for m in messages]


def encode_replica(replica: ReplicaDescriptor) -> pb.ReplicaDescriptor:
    """:class:`ReplicaDescriptor` to protobuf (the status as its number)."""
    return pb.ReplicaDescriptor(
        id=replica.id,
        status=int(replica.status),
        segment_id=replica.segment_id,
        segment_name=replica.segment_name,
        offset=replica.offset,
        size=replica.size,
        te_endpoint=replica.te_endpoint,
        host_id=replica.host_id,
        capability=replica.capability,
        disk=replica.disk,
    )


def _add_replicas(field: Any, replicas: Iterable[ReplicaDescriptor]) -> None:
    """Append each of ``replicas`` to the repeated ReplicaDescriptor ``field``."""
    add = field.add
    for r in replicas:
        # IntEnum statuses are ints: protobuf takes them as they are.
        add(
            id=r.id,
            status=r.status,
            segment_id=r.segment_id,
            segment_name=r.segment_name,
            offset=r.offset,
            size=r.size,
            te_endpoint=r.te_endpoint,
            host_id=r.host_id,
            capability=r.capability,
            disk=r.disk,
        )


def decode_replica(m: pb.ReplicaDescriptor) -> ReplicaDescriptor:
    """Protobuf to :class:`ReplicaDescriptor`.

    Raises:
        ValueError: the status is not a :class:`ReplicaStatus`.
    """
    status = _REPLICA_STATUSES.get(m.status)
    if status is None:
        raise ValueError(f"{m.status} is not a valid ReplicaStatus")
    return _build_replica(
        id=m.id,
        status=status,
        segment_id=m.segment_id,
        segment_name=m.segment_name,
        offset=m.offset,
        size=m.size,
        te_endpoint=m.te_endpoint,
        host_id=m.host_id,
        capability=m.capability,
        disk=m.disk,
    )


# -- plain answers ---------------------------------------------------------------------------


def encode_status(code: int) -> pb.StatusResponse:
    """One code (an ``ErrorCode`` or int) to a StatusResponse."""
    return pb.StatusResponse(code=int(code))


def decode_status(message: pb.StatusResponse) -> int:
    """A StatusResponse to its code."""
    return int(message.code)


def encode_codes(codes: Iterable[int]) -> pb.BatchStatusResponse:
    """One code per key to a BatchStatusResponse (``ErrorCode`` members are ints: they go as
    they are)."""
    return pb.BatchStatusResponse(codes=codes)


def decode_codes(message: pb.BatchStatusResponse) -> list[int]:
    """A BatchStatusResponse to its codes, in key order."""
    return list(message.codes)


def encode_ping(result: Any) -> pb.PingResponse:
    """A ping result (anything with ``code``, ``view_version`` and ``client_status``)."""
    return pb.PingResponse(
        code=int(result.code),
        view_version=result.view_version,
        client_status=int(result.client_status),
    )


def decode_ping(message: pb.PingResponse) -> tuple[int, ClientStatus, int]:
    """A PingResponse to ``(code, client status, view version)``.

    Raises:
        ValueError: the client status is not a :class:`ClientStatus`.
    """
    return int(message.code), ClientStatus(message.client_status), int(message.view_version)


def encode_ready(ready: tuple[str, int]) -> pb.ServiceReadyResponse:
    """``(version, stream-channel port or 0)`` to a successful ServiceReadyResponse."""
    version, fast_port = ready
    return pb.ServiceReadyResponse(code=0, version=version, fast_port=fast_port)


def decode_ready(message: pb.ServiceReadyResponse) -> tuple[str, int]:
    """A ServiceReadyResponse to ``(version, stream-channel port or 0)``."""
    return str(message.version), int(message.fast_port)


def encode_count(count: int) -> pb.CountResponse:
    """A count that cannot fail (RemoveAll) to a successful CountResponse."""
    return pb.CountResponse(code=0, count=count)


def encode_code_and_count(answer: tuple[int, int]) -> pb.CountResponse:
    """``(code, count)`` (RemoveByRegex) to a CountResponse."""
    code, count = answer
    return pb.CountResponse(code=int(code), count=count)


def encode_key_list(answer: tuple[int, Sequence[str]]) -> pb.KeyListResponse:
    """``(code, keys)`` (BatchReplicaClear) to a KeyListResponse."""
    code, keys = answer
    return pb.KeyListResponse(code=int(code), keys=keys)


def decode_key_list(message: pb.KeyListResponse) -> tuple[int, list[str]]:
    """A KeyListResponse to ``(code, keys)``."""
    return int(message.code), list(message.keys)


def decode_count(message: pb.CountResponse) -> int:
    """A CountResponse to the count, or to the negative code when there is one."""
    return int(message.code) if message.code else int(message.count)


# -- write and read path ---------------------------------------------------------------------


def encode_put_start(result: PutStartResult) -> pb.PutStartResponse:
    """One key's :class:`PutStartResult` to protobuf."""
    message = pb.PutStartResponse(
        code=result.code, write_id=result.write_id, retry_after_ms=result.retry_after_ms
    )
    _add_replicas(message.replicas, result.replicas)
    return message


def decode_put_start(message: pb.PutStartResponse) -> PutStartResult:
    """A PutStartResponse to :class:`PutStartResult`.

    Raises:
        ValueError: a replica's status is not a :class:`ReplicaStatus`.
    """
    return _build_put_start(
        code=message.code,
        replicas=tuple(map(decode_replica, message.replicas)),
        write_id=message.write_id,
        retry_after_ms=message.retry_after_ms,
    )


def encode_put_starts(results: Iterable[PutStartResult]) -> pb.BatchPutStartResponse:
    """One :class:`PutStartResult` per key to a BatchPutStartResponse."""
    message = pb.BatchPutStartResponse()
    add = message.results.add
    for result in results:
        entry = add(code=result.code, write_id=result.write_id)
        if result.retry_after_ms:
            entry.retry_after_ms = result.retry_after_ms
        _add_replicas(entry.replicas, result.replicas)
    return message


def decode_put_starts(message: pb.BatchPutStartResponse) -> list[PutStartResult]:
    """A BatchPutStartResponse to one :class:`PutStartResult` per key."""
    return list(map(decode_put_start, message.results))


def encode_replica_list(result: ReplicaListResult) -> pb.GetReplicaListResponse:
    """One key's :class:`ReplicaListResult` to protobuf."""
    message = pb.GetReplicaListResponse(
        code=result.code,
        lease_ttl_ms=result.lease_ttl_ms,
        size=result.size,
        read_id=result.read_id,
    )
    _add_replicas(message.replicas, result.replicas)
    return message


def decode_replica_list(message: pb.GetReplicaListResponse) -> ReplicaListResult:
    """A GetReplicaListResponse to :class:`ReplicaListResult`.

    Raises:
        ValueError: a replica's status is not a :class:`ReplicaStatus`.
    """
    return _build_replica_list(
        code=message.code,
        replicas=tuple(map(decode_replica, message.replicas)),
        lease_ttl_ms=message.lease_ttl_ms,
        size=message.size,
        read_id=message.read_id,
    )


def encode_replica_lists(results: Iterable[ReplicaListResult]) -> pb.BatchGetReplicaListResponse:
    """One :class:`ReplicaListResult` per key to a BatchGetReplicaListResponse."""
    message = pb.BatchGetReplicaListResponse()
    add = message.results.add
    for result in results:
        entry = add(
            code=result.code,
            lease_ttl_ms=result.lease_ttl_ms,
            size=result.size,
            read_id=result.read_id,
        )
        _add_replicas(entry.replicas, result.replicas)
    return message


def decode_replica_lists(message: pb.BatchGetReplicaListResponse) -> list[ReplicaListResult]:
    """A BatchGetReplicaListResponse to one :class:`ReplicaListResult` per key."""
    return list(map(decode_replica_list, message.results))


def encode_exists(result: int) -> pb.ExistKeyResponse:
    """One key's existence (1, 0, or a negative code) to an ExistKeyResponse."""
    return pb.ExistKeyResponse(code=min(result, 0), exists=result == 1)


def decode_exists(message: pb.ExistKeyResponse) -> int:
    """An ExistKeyResponse to 1, 0, or the negative code."""
    return int(message.code) if message.code else int(message.exists)


def encode_exist_results(results: Sequence[int]) -> pb.BatchExistKeyResponse:
    """Per key 1, 0, or a negative code to a BatchExistKeyResponse."""
    return pb.BatchExistKeyResponse(results=results)


def decode_exist_results(message: pb.BatchExistKeyResponse) -> list[int]:
    """A BatchExistKeyResponse to per key 1, 0, or a negative code."""
    return list(message.results)


# -- KV sessions and releases ----------------------------------------------------------------


def encode_session_info(info: KvSessionInfo) -> pb.KvSessionInfo:
    """:class:`KvSessionInfo` to protobuf (fields named: listings encode 100,000s of these)."""
    return pb.KvSessionInfo(
        session_id=info.session_id,
        pinned=info.pinned,
        member_count=info.member_count,
        created_at=info.created_at,
        last_active_at=info.last_active_at,
        bytes=info.bytes,
        exclusive_bytes=info.exclusive_bytes,
        idle_ms=info.idle_ms,
    )


def decode_session_info(m: pb.KvSessionInfo) -> KvSessionInfo:
    """Protobuf to :class:`KvSessionInfo`."""
    return KvSessionInfo(
        m.session_id,
        m.pinned,
        m.member_count,
        m.created_at,
        m.last_active_at,
        m.bytes,
        m.exclusive_bytes,
        m.idle_ms,
    )


def encode_session_answer(answer: tuple[int, KvSessionInfo | None]) -> pb.KvSessionInfoResponse:
    """GetKvSession's ``(code, info or None)`` to protobuf."""
    code, info = answer
    if info is None:
        return pb.KvSessionInfoResponse(code=int(code))
    return pb.KvSessionInfoResponse(code=int(code), info=encode_session_info(info))


def decode_session_answer(message: pb.KvSessionInfoResponse) -> tuple[int, KvSessionInfo | None]:
    """A KvSessionInfoResponse to ``(0, info)``, or ``(code, None)`` for a non-zero code."""
    if message.code:
        return int(message.code), None
    return 0, decode_session_info(message.info)


def encode_session_page(answer: tuple[int, KvSessionPage | None]) -> pb.KvSessionPageResponse:
    """ListKvSessionKeys' ``(code, page or None)`` to protobuf."""
    code, page = answer
    if page is None:
        return pb.KvSessionPageResponse(code=int(code))
    return pb.KvSessionPageResponse(code=int(code), keys=page.keys, next_cursor=page.next_cursor)


def decode_session_page(message: pb.KvSessionPageResponse) -> tuple[int, KvSessionPage | None]:
    """A KvSessionPageResponse to ``(0, page)``, or ``(code, None)`` for a non-zero code."""
    if message.code:
        return int(message.code), None
    return 0, KvSessionPage(list(message.keys), message.next_cursor)


def encode_session_list(
    answer: tuple[int, Iterable[KvSessionInfo], str],
) -> pb.ListKvSessionsResponse:
    """ListKvSessions' ``(code, infos, next cursor)`` to protobuf."""
    code, infos, cursor = answer
    return pb.ListKvSessionsResponse(
        code=int(code), sessions=[encode_session_info(i) for i in infos], next_cursor=cursor
    )


def decode_session_list(
    message: pb.ListKvSessionsResponse,
) -> tuple[int, list[KvSessionInfo], str]:
    """A ListKvSessionsResponse to ``(code, infos, next cursor)``."""
    infos = [decode_session_info(i) for i in message.sessions]
    return int(message.code), infos, message.next_cursor


def encode_release(answer: tuple[int, ReleaseResult]) -> pb.ReleaseResponse:
    """Any release's ``(code, result)`` to a ReleaseResponse."""
    code, result = answer
    return pb.ReleaseResponse(
        code=int(code), **{name: getattr(result, name) for name in _RELEASE_FIELDS}
    )


def decode_release(message: pb.ReleaseResponse) -> tuple[int, ReleaseResult]:
    """A ReleaseResponse to ``(code, result)``."""
    fields = {name: getattr(message, name) for name in _RELEASE_FIELDS}
    return int(message.code), ReleaseResult(**fields)


# -- introspection ---------------------------------------------------------------------------


def encode_stats(values: Mapping[str, int]) -> pb.StatsResponse:
    """Store-wide counts and bytes to a successful StatsResponse.

    The values are int64 on the wire; a sum beyond (segments whose sizes add up past 2**63)
    saturates at the int64 bounds instead of failing the whole answer.
    """
    return pb.StatsResponse(
        code=0, values={k: min(max(v, _INT64_MIN), _INT64_MAX) for k, v in values.items()}
    )


def decode_stats(message: pb.StatsResponse) -> dict[str, int]:
    """A StatsResponse to its counts and bytes."""
    return dict(message.values)


SegmentUsage = tuple[SegmentInfo, str, int, int]


def encode_segment_usage(usage: Iterable[SegmentUsage]) -> pb.ListSegmentsResponse:
    """``(segment, owning client, used bytes, allocations)`` per segment to protobuf."""
    return pb.ListSegmentsResponse(
        code=0,
        segments=[
            pb.SegmentStatus(
                segment=encode_segment(dataclasses.replace(info, capability_key=b"")),
                client_id=client_id,
                used_bytes=used,
                allocations=allocations,
            )
            for info, client_id, used, allocations in usage
        ],
    )


def decode_segment_usage(message: pb.ListSegmentsResponse) -> list[SegmentUsage]:
    """A ListSegmentsResponse to ``(segment, owning client, used bytes, allocations)`` each."""
    return [
        (decode_segment(s.segment), s.client_id, s.used_bytes, s.allocations)
        for s in message.segments
    ]


# -- replica tasks -----------------------------------------------------------------------------


def encode_task_id(answer: tuple[int, str]) -> pb.TaskIdResponse:
    """``(code, task id)`` (CreateCopyTask, CreateMoveTask) to a TaskIdResponse."""
    code, task_id = answer
    return pb.TaskIdResponse(code=int(code), task_id=task_id)


def decode_task_id(message: pb.TaskIdResponse) -> tuple[int, str]:
    """A TaskIdResponse to ``(code, task id or "")``."""
    return int(message.code), message.task_id


def encode_query_task(answer: tuple[int, QueryTaskResponse | None]) -> pb.QueryTaskResponse:
    """``(code, state or None)`` (QueryTask) to a QueryTaskResponse."""
    code, info = answer
    if info is None:
        return pb.QueryTaskResponse(code=int(code))
    return pb.QueryTaskResponse(
        code=int(code),
        task_id=task_id_text(info.id),
        type=int(info.type),
        status=int(info.status),
        created_at_ms_epoch=info.created_at_ms_epoch,
        last_updated_at_ms_epoch=info.last_updated_at_ms_epoch,
        assigned_client=info.assigned_client,
        message=info.message,
    )


def decode_query_task(message: pb.QueryTaskResponse) -> tuple[int, QueryTaskResponse | None]:
    """A QueryTaskResponse to ``(code, state or None)``."""
    if message.code:
        return int(message.code), None
    return 0, QueryTaskResponse(
        id=task_id_halves(message.task_id),
        type=TaskType(message.type),
        status=TaskStatus(message.status),
        created_at_ms_epoch=int(message.created_at_ms_epoch),
        last_updated_at_ms_epoch=int(message.last_updated_at_ms_epoch),
        assigned_client=message.assigned_client,
        message=message.message,
    )


def encode_task_ids(task_ids: Sequence[str]) -> pb.FetchTasksResponse:
    """The task ids FetchTasks hands out (it cannot fail)."""
    return pb.FetchTasksResponse(code=0, task_ids=task_ids)


def decode_task_ids(message: pb.FetchTasksResponse) -> list[str]:
    """A FetchTasksResponse to its task ids (none when the master answered an error)."""
    return [] if message.code else list(message.task_ids)


def encode_start_task(result: StartTaskResult) -> pb.StartTaskResponse:
    """A StartTaskResult to a StartTaskResponse."""
    message = pb.StartTaskResponse(
        code=int(result.code), targets=[encode_replica(r) for r in result.targets]
    )
    if result.source is not None:
        message.source.CopyFrom(encode_replica(result.source))
    return message


def decode_start_task(message: pb.StartTaskResponse) -> StartTaskResult:
    """A StartTaskResponse to a StartTaskResult."""
    source = decode_replica(message.source) if message.HasField("source") else None
    targets = tuple(decode_replica(r) for r in message.targets)
    return StartTaskResult(int(message.code), source, targets)


# -- the disk tier ---------------------------------------------------------------------------


def encode_disk_tasks(batch: DiskTaskBatch) -> pb.FetchDiskTasksResponse:
    """What FetchDiskTasks hands out (it cannot fail)."""
    message = pb.FetchDiskTasksResponse(code=0)
    add_task = message.tasks.add
    for task in batch.tasks:
        add_task(
            task_id=task.task_id,
            kind=int(task.kind),
            tenant_id=task.tenant,
            key=task.key,
            size=task.size,
            memory_segment_id=task.memory_segment_id,
            memory_offset=task.memory_offset,
            disk_segment_id=task.disk_segment_id,
            disk_offset=task.disk_offset,
        )
    add_deletes = message.deletes.add
    for segment_id, offsets in batch.deletes:
        add_deletes(disk_segment_id=segment_id, offsets=offsets)
    return message


def decode_disk_tasks(message: pb.FetchDiskTasksResponse) -> DiskTaskBatch:
    """A FetchDiskTasksResponse to a :class:`DiskTaskBatch`; tasks of a kind this client does
    not know are left out (nothing when the master answered an error)."""
    if message.code:
        return DiskTaskBatch()
    kinds = {int(k): k for k in DiskTaskKind}
    tasks = tuple(
        DiskTask(
            task_id=t.task_id,
            kind=kinds[t.kind],
            tenant=t.tenant_id,
            key=t.key,
            size=t.size,
            memory_segment_id=t.memory_segment_id,
            memory_offset=t.memory_offset,
            disk_segment_id=t.disk_segment_id,
            disk_offset=t.disk_offset,
        )
        for t in message.tasks
        if t.kind in kinds
    )
    deletes = tuple((d.disk_segment_id, tuple(d.offsets)) for d in message.deletes)
    return DiskTaskBatch(tasks, deletes)


def encode_disk_entries(entries: Iterable[DiskReplicaEntry]) -> list[pb.DiskReplicaEntry]:
    """Re-registered files to protobuf, in order."""
    return [
        pb.DiskReplicaEntry(tenant_id=e.tenant, key=e.key, offset=e.offset, size=e.size)
        for e in entries
    ]


def decode_disk_entries(messages: Iterable[pb.DiskReplicaEntry]) -> list[DiskReplicaEntry]:
    """Protobuf re-registered files to :class:`DiskReplicaEntry`, in order."""
    return [DiskReplicaEntry(m.tenant_id, m.key, m.offset, m.size) for m in messages]
