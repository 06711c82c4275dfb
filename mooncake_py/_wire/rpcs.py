"""Every master RPC as one declarative entry, read by both ends.

An entry names:

- ``target``: the master callable that serves it, as a dotted path from the master's call
  pipeline (``service`` is the :class:`~mooncake_py.master.service.facade.MasterService`, so
  session RPCs read ``service.sessions.<method>`` and releases ``service.releases.<method>``;
  ``service_ready`` is the pipeline's own answer);
- ``args``: how the request's fields become the target's positional arguments, and back
  (:class:`~mooncake_py._wire.args.Fields`, :class:`~mooncake_py._wire.args.Tagged`);
- ``result``: how the target's return value becomes the response, and the response becomes
  what the client returns (:class:`Result`, built from :mod:`mooncake_py._wire.codec`);
- ``per_key``: for batch answers, the request's key list, so that the INTERNAL_ERROR answer
  (:meth:`Rpc.failure`) carries one failure per key;
- ``sliced``: the target is a sliced operation (a generator that yields between bounded
  slices of work, :mod:`mooncake_py.master.service.slices`); the master's transports run one
  slice per step of their event loop, so calls whose cost grows with the store never stall
  other callers.

The master decodes ``args``, calls ``target`` and encodes ``result``; the client encodes
``args`` from its method's arguments and decodes ``result``. Request and response types come
from the proto's service descriptor, and building the table checks that every RPC of the proto
has exactly one entry whose result matches its response type, so a table that disagrees with
the proto fails at import.

Thread-safety: the table and its codecs are immutable after import.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping
from typing import Any

from mooncake_py._proto import master_pb2 as pb
from mooncake_py._proto.master_pb2_grpc import MasterServiceStub
from mooncake_py._wire import codec, columns
from mooncake_py._wire.args import ArgsCodec, Const, Field, Fields, Tagged
from mooncake_py.errors import ErrorCode

__all__ = [
    "RPCS",
    "SERVICE",
    "SERVICE_NAME",
    "ArgsCodec",
    "Const",
    "Field",
    "Fields",
    "Result",
    "Rpc",
    "Tagged",
    "new_stub",
]

SERVICE = pb.DESCRIPTOR.services_by_name["MasterService"]
SERVICE_NAME: str = SERVICE.full_name
INTERNAL = int(ErrorCode.INTERNAL_ERROR)


def new_stub(channel: Any) -> Any:
    """The generated gRPC stub on ``channel`` (one multicallable attribute per RPC)."""
    return MasterServiceStub(channel)


# -- results and entries ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """How a target's return value travels: ``encode`` on the master, ``decode`` on the
    client, for responses of ``response_type``.

    ``compact``: for a batch answer that may travel in columns (:mod:`.columns`), its encoder.
    The client then always sets the request's ``compact`` field, the master encodes with
    ``compact`` the answers to requests that set it and that ``compact_applies`` to (called
    on the whole answer, or on each of its parts with one dict: see
    :func:`.columns.agree`), with ``encode`` the others (and those of clients that predate
    the field), and ``decode`` reads either form.
    """

    response_type: Any
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]
    compact: Callable[[Any], Any] | None = None
    compact_applies: Callable[[Any, dict[str, Any]], bool] = lambda _values, _seen: True


class Rpc:
    """One RPC of the table (see the module docstring); never modified once built.

    Args:
        name: the RPC's name in the proto.
        target: dotted path of the master callable, from the call pipeline.
        args: the argument spec, compiled here against the request type.
        result: how the answer travels; must be for the RPC's response type.
        per_key: for an answer that is one list (no ``code``), the request's key list.
        sliced: the target is a sliced operation (see the module docstring).

    Attributes:
        wire_name: ``name`` as the stream channel's frames carry it.
        path: the gRPC method path.
        request_type, response_type: the generated message classes.
        args: the compiled :class:`ArgsCodec`.
        answers_code: the response has a ``code`` field (a non-zero one counts as failed).
        batch_answer: the response is one list, one item per key (``per_key`` given); the
            serialized answer of a list is the concatenation of its parts' (protobuf merges
            repeated fields), so it may be encoded in parts.

    Raises:
        KeyError: ``name`` is not an RPC of the proto, or a field spec names no field.
        TypeError: ``result`` is for another response type, ``per_key`` is given for a coded
            answer or missing for a batch answer, or a batch answer is more than one list.
    """

    def __init__(
        self,
        name: str,
        target: str,
        args: Fields | Tagged,
        result: Result,
        per_key: str | None = None,
        sliced: bool = False,
    ) -> None:
        method = SERVICE.methods_by_name[name]
        self.name = name
        self.sliced = sliced
        self.wire_name = name.encode()
        self.path = f"/{SERVICE_NAME}/{name}"
        self.request_type: Any = getattr(pb, method.input_type.name)
        self.response_type: Any = getattr(pb, method.output_type.name)
        if result.response_type is not self.response_type:
            raise TypeError(f"{name}: its result encodes {result.response_type.__name__}")
        self.target = target
        self.args = _asking_compact(args.compile(self.request_type), result, self.request_type)
        self.result = result
        response_fields = self.response_type.DESCRIPTOR.fields
        self.answers_code = any(f.name == "code" for f in response_fields)
        if (per_key is None) != self.answers_code:
            raise TypeError(f"{name}: a batch answer needs per_key, a coded answer none")
        self.batch_answer = per_key is not None
        self._keys_of = operator.attrgetter(per_key) if per_key else None
        self._batch_field = ""
        self._failed_item: Any = INTERNAL
        if per_key is not None:
            # One list, beside its columns form (``columns``) when it has one.
            lists = [f for f in response_fields if f.name != "columns"]
            if len(lists) != 1 or not lists[0].is_repeated or lists[0] is not response_fields[0]:
                raise TypeError(f"{name}: a batch answer must be one list")
            if result.compact is not None and len(response_fields) != 2:
                raise TypeError(f"{name}: a compact answer needs the response's columns")
            self._batch_field = response_fields[0].name
            item = response_fields[0].message_type
            if item is not None:
                self._failed_item = getattr(pb, item.name)(code=INTERNAL)

    def failure(self, request: Any) -> Any:
        """The INTERNAL_ERROR answer to ``request``: one failure per key for batch answers.

        Complexity: O(keys in the request).
        """
        if self._keys_of is None:
            return self.response_type(code=INTERNAL)
        items = [self._failed_item] * len(self._keys_of(request))
        return self.response_type(**{self._batch_field: items})


def _asking_compact(codec_: ArgsCodec, result: Result, request_type: Any) -> ArgsCodec:
    """``codec_``, whose encoder sets the request's ``compact`` when ``result`` has a columns
    form (the master then answers in columns).

    Raises:
        KeyError: ``result`` has a columns form and the request no ``compact`` field.
    """
    if result.compact is None:
        return codec_
    request_type.DESCRIPTOR.fields_by_name["compact"]  # noqa: B018 - raises KeyError if absent
    base = codec_.encode

    def encode(*args: Any) -> Any:
        request = base(*args)
        request.compact = True
        return request

    return ArgsCodec(codec_.decode, encode)


STATUS = Result(pb.StatusResponse, codec.encode_status, codec.decode_status)
CODES = Result(pb.BatchStatusResponse, codec.encode_codes, codec.decode_codes)
PING = Result(pb.PingResponse, codec.encode_ping, codec.decode_ping)
READY = Result(pb.ServiceReadyResponse, codec.encode_ready, codec.decode_ready)
PUT_START = Result(pb.PutStartResponse, codec.encode_put_start, codec.decode_put_start)
PUT_STARTS = Result(pb.BatchPutStartResponse, codec.encode_put_starts, columns.decode_put_starts)
# BatchPutStart's answer may travel in columns (its tagged forms' requests have no flag).
PUT_STARTS_COMPACT = dataclasses.replace(
    PUT_STARTS, compact=columns.encode_put_starts, compact_applies=columns.agree
)
REPLICAS = Result(pb.GetReplicaListResponse, codec.encode_replica_list, codec.decode_replica_list)
BATCH_REPLICAS = Result(
    pb.BatchGetReplicaListResponse,
    codec.encode_replica_lists,
    columns.decode_replica_lists,
    compact=columns.encode_replica_lists,
    compact_applies=columns.agree,
)
EXISTS = Result(pb.ExistKeyResponse, codec.encode_exists, codec.decode_exists)
BATCH_EXISTS = Result(
    pb.BatchExistKeyResponse, codec.encode_exist_results, codec.decode_exist_results
)
SESSION = Result(pb.KvSessionInfoResponse, codec.encode_session_answer, codec.decode_session_answer)
SESSION_PAGE = Result(
    pb.KvSessionPageResponse, codec.encode_session_page, codec.decode_session_page
)
SESSION_LIST = Result(
    pb.ListKvSessionsResponse, codec.encode_session_list, codec.decode_session_list
)
RELEASE = Result(pb.ReleaseResponse, codec.encode_release, codec.decode_release)
STATS = Result(pb.StatsResponse, codec.encode_stats, codec.decode_stats)
SEGMENT_USAGE = Result(
    pb.ListSegmentsResponse, codec.encode_segment_usage, codec.decode_segment_usage
)
COUNT = Result(pb.CountResponse, codec.encode_count, codec.decode_count)
CODE_AND_COUNT = Result(pb.CountResponse, codec.encode_code_and_count, codec.decode_count)
KEY_LIST = Result(pb.KeyListResponse, codec.encode_key_list, codec.decode_key_list)
TASK_ID = Result(pb.TaskIdResponse, codec.encode_task_id, codec.decode_task_id)
TASK_STATE = Result(pb.QueryTaskResponse, codec.encode_query_task, codec.decode_query_task)
TASK_IDS = Result(pb.FetchTasksResponse, codec.encode_task_ids, codec.decode_task_ids)
TASK_START = Result(pb.StartTaskResponse, codec.encode_start_task, codec.decode_start_task)
DISK_TASKS = Result(pb.FetchDiskTasksResponse, codec.encode_disk_tasks, codec.decode_disk_tasks)
DISK_ENTRIES = Field("entries", codec.decode_disk_entries, codec.encode_disk_entries)

# Requests copy the config message they are given: the kept encodings are safe to place.
CONFIG = Field("config", codec.decode_config, codec.encode_config_kept)
PUT = Fields("client_id", "tenant_id", "key", "value_length", CONFIG, "attempt_id", defaults=(0,))
BATCH_PUT = Fields(
    "client_id", "tenant_id", "keys", "value_lengths", CONFIG, "attempt_id", defaults=(0,)
)
SESSION_ID = Fields("tenant_id", "session_id")
WRITE = Fields("client_id", "tenant_id", "key", "write_id")
BATCH_WRITE = Fields("client_id", "tenant_id", "keys", "write_ids")
READER_KEY = Fields("tenant_id", "key", "client_id")
READER_KEYS = Fields("tenant_id", "keys", "client_id")
SEGMENT = Field("segment", codec.decode_segment, codec.encode_segment)
SEGMENTS = Field("segments", codec.decode_segments, codec.encode_segments)
VIEW = Fields("tenant_id", "all_tenants", defaults=("", False))

_ENTRIES = (
    # Segments and liveness.
    Rpc(
        "MountSegment",
        "service.mount_segment",
        Fields("client_id", SEGMENT, "tenant_id", defaults=("",)),
        STATUS,
    ),
    Rpc(
        "ReMountSegment",
        "service.remount_segments",
        Fields("client_id", SEGMENTS, "tenant_id", defaults=("",)),
        STATUS,
    ),
    Rpc(
        "UnmountSegment",
        "service.unmount_segment_sliced",
        Fields("client_id", "segment_id", "tenant_id", defaults=("",)),
        STATUS,
        sliced=True,
    ),
    Rpc("Ping", "service.ping", Fields("client_id"), PING),
    Rpc("ServiceReady", "service_ready", Fields(), READY),
    # Write path.
    Rpc("PutStart", "service.put_start", PUT, PUT_START),
    Rpc(
        "BatchPutStart",
        "service.batch_put_start_sliced",
        BATCH_PUT,
        PUT_STARTS_COMPACT,
        per_key="keys",
        sliced=True,
    ),
    Rpc("PutEnd", "service.put_end", WRITE, STATUS),
    Rpc(
        "BatchPutEnd",
        "service.batch_put_end_sliced",
        BATCH_WRITE,
        CODES,
        per_key="keys",
        sliced=True,
    ),
    Rpc("PutRevoke", "service.put_revoke", WRITE, STATUS),
    Rpc(
        "BatchPutRevoke",
        "service.batch_put_revoke_sliced",
        BATCH_WRITE,
        CODES,
        per_key="keys",
        sliced=True,
    ),
    Rpc("UpsertStart", "service.upsert_start", PUT, PUT_START),
    Rpc(
        "BatchUpsertStart",
        "service.batch_upsert_start_sliced",
        BATCH_PUT,
        PUT_STARTS_COMPACT,
        per_key="keys",
        sliced=True,
    ),
    # Tagged writes: the untagged targets, with the tags in the config.
    Rpc("PutStartWithKvSessions", "service.put_start", Tagged(PUT, False), PUT_START),
    Rpc(
        "BatchPutStartWithKvSessions",
        "service.batch_put_start_sliced",
        Tagged(BATCH_PUT, True),
        PUT_STARTS,
        per_key="put.keys",
        sliced=True,
    ),
    Rpc("UpsertStartWithKvSessions", "service.upsert_start", Tagged(PUT, False), PUT_START),
    Rpc(
        "BatchUpsertStartWithKvSessions",
        "service.batch_upsert_start_sliced",
        Tagged(BATCH_PUT, True),
        PUT_STARTS,
        per_key="put.keys",
        sliced=True,
    ),
    # KV sessions.
    Rpc(
        "AttachKvSession",
        "service.sessions.attach_kv_session",
        Fields("tenant_id", "session_id", "keys"),
        CODES,
        per_key="keys",
    ),
    Rpc(
        "PinKvSession",
        "service.sessions.set_kv_session_pin",
        Fields("tenant_id", "session_id", Const(True)),
        STATUS,
    ),
    Rpc(
        "UnpinKvSession",
        "service.sessions.set_kv_session_pin",
        Fields("tenant_id", "session_id", Const(False)),
        STATUS,
    ),
    Rpc(
        "UpdateKvSession",
        "service.sessions.update_kv_session_sliced",
        Fields("tenant_id", "session_id", "keep_keys"),
        STATUS,
        sliced=True,
    ),
    Rpc(
        "CloseKvSession",
        "service.sessions.close_kv_session_sliced",
        SESSION_ID,
        STATUS,
        sliced=True,
    ),
    Rpc("GetKvSession", "service.sessions.get_kv_session", SESSION_ID, SESSION),
    Rpc(
        "ListKvSessionKeys",
        "service.sessions.list_kv_session_keys",
        Fields("tenant_id", "session_id", "cursor", "limit"),
        SESSION_PAGE,
    ),
    Rpc(
        "ListKvSessions",
        "service.sessions.list_kv_sessions_sliced",
        Fields("tenant_id", "cursor", "limit", "pinned", "min_idle_ms"),
        SESSION_LIST,
        sliced=True,
    ),
    # Releasing the memory sessions hold.
    Rpc(
        "ReleaseKvSession",
        "service.releases.release_kv_session_sliced",
        Fields("tenant_id", "session_id", "all_pages", defaults=(False,)),
        RELEASE,
        sliced=True,
    ),
    Rpc(
        "ReleaseStaleKvSessions",
        "service.releases.release_stale_kv_sessions_sliced",
        Fields("tenant_id", "max_idle_ms", "include_pinned"),
        RELEASE,
        sliced=True,
    ),
    Rpc(
        "ReleaseAllKvSessions",
        "service.releases.release_all_kv_sessions_sliced",
        Fields("tenant_id", "confirm"),
        RELEASE,
        sliced=True,
    ),
    Rpc(
        "ReleaseKvCache",
        "service.releases.release_kv_cache_sliced",
        Fields("tenant_id", "keep_pinned"),
        RELEASE,
        sliced=True,
    ),
    # Read and query path.
    Rpc("GetReplicaList", "service.reads.get_replica_list", READER_KEY, REPLICAS),
    Rpc(
        "BatchGetReplicaList",
        "service.reads.batch_get_replica_list_sliced",
        READER_KEYS,
        BATCH_REPLICAS,
        per_key="keys",
        sliced=True,
    ),
    Rpc(
        "EndReads",
        "service.reads.end_reads_sliced",
        Fields("client_id", "read_ids"),
        CODES,
        per_key="read_ids",
        sliced=True,
    ),
    Rpc("ExistKey", "service.reads.exist_key", READER_KEY, EXISTS),
    Rpc(
        "BatchExistKey",
        "service.reads.batch_exist_key_sliced",
        READER_KEYS,
        BATCH_EXISTS,
        per_key="keys",
        sliced=True,
    ),
    Rpc("ProbeKey", "service.reads.probe_key", Fields("tenant_id", "key"), EXISTS),
    Rpc(
        "BatchProbeKey",
        "service.reads.batch_probe_key_sliced",
        Fields("tenant_id", "keys", "client_id", "lease_mode", "candidate_size"),
        BATCH_EXISTS,
        per_key="keys",
        sliced=True,
    ),
    # Introspection.
    # The master's pipeline sets ``all_tenants`` from the token's role, whatever is sent.
    Rpc("GetStats", "service.stats", VIEW, STATS),
    Rpc("ListSegments", "service.segment_usage", VIEW, SEGMENT_USAGE),
    # Remove family.
    Rpc("Remove", "service.remove", Fields("tenant_id", "key", "force"), STATUS),
    Rpc(
        "BatchRemove",
        "service.batch_remove_sliced",
        Fields("tenant_id", "keys", "force"),
        CODES,
        per_key="keys",
        sliced=True,
    ),
    Rpc(
        "RemoveByRegex",
        "service.remove_by_regex_sliced",
        Fields("tenant_id", "pattern", "force"),
        CODE_AND_COUNT,
        sliced=True,
    ),
    Rpc("RemoveAll", "service.remove_all_sliced", Fields("tenant_id", "force"), COUNT, sliced=True),
    Rpc(
        "BatchReplicaClear",
        "service.replicas.batch_replica_clear_sliced",
        Fields("client_id", "tenant_id", "keys", "segment_name"),
        KEY_LIST,
        sliced=True,
    ),
    # Replica copy and move tasks.
    Rpc(
        "CreateCopyTask",
        "service.tasks.create_copy_task",
        Fields("tenant_id", "key", "targets"),
        TASK_ID,
    ),
    Rpc(
        "CreateMoveTask",
        "service.tasks.create_move_task",
        Fields("tenant_id", "key", "source", "target"),
        TASK_ID,
    ),
    Rpc("QueryTask", "service.tasks.query_task", Fields("tenant_id", "task_id"), TASK_STATE),
    Rpc(
        "FetchTasks",
        "service.tasks.fetch_tasks",
        Fields("client_id", "batch_size"),
        TASK_IDS,
    ),
    Rpc("StartTask", "service.tasks.start_task", Fields("client_id", "task_id"), TASK_START),
    Rpc(
        "FinishTask",
        "service.tasks.finish_task",
        Fields("client_id", "task_id", "succeeded", "message"),
        STATUS,
    ),
    # The disk tier, its owner's side.
    Rpc(
        "FetchDiskTasks",
        "service.disk.fetch_disk_tasks",
        Fields("client_id", "batch_size"),
        DISK_TASKS,
    ),
    Rpc(
        "FinishDiskTasks",
        "service.disk.finish_disk_tasks",
        Fields("client_id", "task_ids", "codes"),
        CODES,
        per_key="task_ids",
    ),
    Rpc(
        "RegisterDiskReplicas",
        "service.disk.register_disk_replicas",
        Fields("client_id", "disk_segment_id", DISK_ENTRIES),
        CODES,
        per_key="entries",
    ),
    Rpc(
        "DemoteObjects",
        "service.disk.demote_objects_sliced",
        Fields("tenant_id", "keys"),
        CODES,
        per_key="keys",
        sliced=True,
    ),
    Rpc(
        "DropDiskReplicas",
        "service.disk.drop_disk_replicas",
        Fields("client_id", "disk_segment_id", DISK_ENTRIES),
        CODES,
        per_key="entries",
    ),
)


def _build() -> dict[str, Rpc]:
    by_name = {rpc.name: rpc for rpc in _ENTRIES}
    declared = [m.name for m in SERVICE.methods]
    if len(by_name) != len(_ENTRIES) or sorted(by_name) != sorted(declared):
        raise TypeError("the RPC table must hold exactly one entry per RPC of the proto")
    return {name: by_name[name] for name in declared}


RPCS: Mapping[str, Rpc] = _build()
"""Every RPC by name, in proto declaration order."""
