"""Every master RPC as one declarative entry, read by both ends.

An entry names:

- ``target``: the master callable that serves it, as a dotted path from the master's call
  pipeline (``service`` is the :class:`~mooncake_py.master.service.facade.MasterService`, so
  session RPCs read ``service.sessions.<method>`` and releases ``service.releases.<method>``;
  ``service_ready`` is the pipeline's own answer);
- ``args``: how the request's fields become the target's positional arguments, and back
  (:class:`Fields`, :class:`Tagged`);
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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mooncake_py._proto import master_pb2 as pb
from mooncake_py._proto.master_pb2_grpc import MasterServiceStub
from mooncake_py._wire import codec
from mooncake_py.errors import ErrorCode

SERVICE = pb.DESCRIPTOR.services_by_name["MasterService"]
SERVICE_NAME: str = SERVICE.full_name
INTERNAL = int(ErrorCode.INTERNAL_ERROR)


def new_stub(channel: Any) -> Any:
    """The generated gRPC stub on ``channel`` (one multicallable attribute per RPC)."""
    return MasterServiceStub(channel)


# -- argument specs --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    """A request field carrying messages: ``decode`` turns its value into the argument,
    ``encode`` the argument into its value (for a repeated field, the whole list)."""

    name: str
    decode: Callable[[Any], Any]
    encode: Callable[[Any], Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Const:
    """An argument the RPC itself implies (PinKvSession: ``pinned=True``); nothing travels,
    and the client's value for it is ignored."""

    value: Any


@dataclasses.dataclass(frozen=True, slots=True)
class ArgsCodec:
    """Compiled request <-> positional-arguments conversion for one request type.

    Attributes:
        decode: request message -> the target's positional arguments.
        encode: the client's positional arguments -> request message; raises TypeError or
            ValueError for a wrong number of arguments.
    """

    decode: Callable[[Any], Sequence[Any]]
    encode: Callable[..., Any]


class Fields:
    """Arguments taken from request fields, in the target's parameter order.

    Each spec is a field name, a :class:`Field` (message fields, which need a codec) or a
    :class:`Const`. How a named field converts follows the proto: a repeated field becomes a
    list, a field with presence (``optional``) becomes None when unset and is left unset for
    None, any other field passes as it is.
    """

    def __init__(self, *specs: str | Field | Const) -> None:
        self.specs = specs

    def compile(self, request_type: Any) -> ArgsCodec:
        """The codec for ``request_type``.

        Raises:
            KeyError: a named field does not exist.
            TypeError: a message field is named without a :class:`Field` codec.
        """
        fields = request_type.DESCRIPTOR.fields_by_name
        specs = self.specs
        names = [s for s in specs if isinstance(s, str)]
        for name in names:
            if fields[name].message_type is not None:
                raise TypeError(f"{request_type.__name__}.{name} needs a Field codec")
        if len(names) == len(specs) and not any(fields[n].has_presence for n in names):
            return ArgsCodec(_plain_getter(fields, names), _plain_builder(request_type, names))
        decoders = [_decoder(fields, spec) for spec in specs]
        encoders = [_encoder(spec) for spec in specs]

        def encode(*args: Any) -> Any:
            values = {}
            for (name, convert), value in zip(encoders, args, strict=True):
                if name is not None and value is not None:
                    values[name] = convert(value)
            return request_type(**values)

        return ArgsCodec(lambda request: [decode(request) for decode in decoders], encode)


def _plain_getter(
    fields: Mapping[str, Any], names: Sequence[str]
) -> Callable[[Any], Sequence[Any]]:
    if any(fields[n].is_repeated for n in names):
        getters = [_decoder(fields, n) for n in names]
        return lambda request: [get(request) for get in getters]
    if len(names) >= 2:
        # Fetches every field in C, in one call: the hot path of single-key calls.
        return operator.attrgetter(*names)
    if len(names) == 1:
        name = names[0]
        return lambda request: (getattr(request, name),)
    return lambda request: ()


def _plain_builder(request_type: Any, names: Sequence[str]) -> Callable[..., Any]:
    """Builds ``request_type`` from one positional argument per field of ``names``.

    Generated as ``def encode(_0, _1): return KeyRequest(tenant_id=_0, key=_1)``, so it costs
    what a hand-written call costs (building keyword arguments from ``zip`` at run time doubles
    the client's share of a single-key call), and a wrong argument count fails as any call
    does. ``names`` are proto field names, hence identifiers.
    """
    params = ", ".join(f"_{i}" for i in range(len(names)))
    fields = ", ".join(f"{name}=_{i}" for i, name in enumerate(names))
    namespace: dict[str, Any] = {"request_type": request_type}
    exec(f"def encode({params}):\n    return request_type({fields})\n", namespace)
    encode: Callable[..., Any] = namespace["encode"]
    return encode


def _decoder(fields: Mapping[str, Any], spec: str | Field | Const) -> Callable[[Any], Any]:
    if isinstance(spec, Const):
        value = spec.value
        return lambda request: value
    if isinstance(spec, Field):
        get = operator.attrgetter(spec.name)
        decode = spec.decode
        return lambda request: decode(get(request))
    field = fields[spec]
    get = operator.attrgetter(spec)
    if field.is_repeated:
        return lambda request: list(get(request))
    if field.has_presence:
        return lambda request: get(request) if request.HasField(spec) else None
    return get


def _identity(value: Any) -> Any:
    return value


def _encoder(spec: str | Field | Const) -> tuple[str | None, Callable[[Any], Any]]:
    """``(field name, or None to send nothing; conversion)``."""
    if isinstance(spec, Const):
        return None, _identity
    if isinstance(spec, Field):
        return spec.name, spec.encode
    return spec, _identity


class Tagged:
    """A tagged write: the untagged request under ``put`` plus KV session tags.

    The tags travel in ``kv_sessions`` (one ``KvSessionTags`` for a single write, one per key
    for a batch) and reach the target as the ``kv_sessions`` of its config argument, the last
    one. Encoding requires ``config.kv_sessions`` set (exactly one entry for a single write).
    """

    def __init__(self, put: Fields, batch: bool) -> None:
        self.put = put
        self.batch = batch

    def compile(self, request_type: Any) -> ArgsCodec:
        """The codec for ``request_type`` (a ``*WithKvSessionsRequest``)."""
        put_type = getattr(pb, request_type.DESCRIPTOR.fields_by_name["put"].message_type.name)
        put = self.put.compile(put_type)
        batch = self.batch

        def decode(request: Any) -> Sequence[Any]:
            args = put.decode(request.put)
            tags = request.kv_sessions
            args[-1].kv_sessions = (
                [list(t.session_ids) for t in tags] if batch else [list(tags.session_ids)]
            )
            return args

        def encode(*args: Any) -> Any:
            sessions = args[-1].kv_sessions
            tags: Any = (
                [pb.KvSessionTags(session_ids=ids) for ids in sessions]
                if batch
                else pb.KvSessionTags(session_ids=sessions[0])
            )
            return request_type(put=put.encode(*args), kv_sessions=tags)

        return ArgsCodec(decode, encode)


# -- results and entries ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """How a target's return value travels: ``encode`` on the master, ``decode`` on the
    client, for responses of ``response_type``."""

    response_type: Any
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


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
        self.args = args.compile(self.request_type)
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
            if len(response_fields) != 1 or not response_fields[0].is_repeated:
                raise TypeError(f"{name}: a batch answer must be one list")
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


STATUS = Result(pb.StatusResponse, codec.encode_status, codec.decode_status)
CODES = Result(pb.BatchStatusResponse, codec.encode_codes, codec.decode_codes)
PING = Result(pb.PingResponse, codec.encode_ping, codec.decode_ping)
READY = Result(pb.ServiceReadyResponse, codec.encode_ready, codec.decode_ready)
PUT_START = Result(pb.PutStartResponse, codec.encode_put_start, codec.decode_put_start)
PUT_STARTS = Result(pb.BatchPutStartResponse, codec.encode_put_starts, codec.decode_put_starts)
REPLICAS = Result(pb.GetReplicaListResponse, codec.encode_replica_list, codec.decode_replica_list)
BATCH_REPLICAS = Result(
    pb.BatchGetReplicaListResponse, codec.encode_replica_lists, codec.decode_replica_lists
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

CONFIG = Field("config", codec.decode_config, codec.encode_config)
PUT = Fields("client_id", "tenant_id", "key", "value_length", CONFIG)
BATCH_PUT = Fields("client_id", "tenant_id", "keys", "value_lengths", CONFIG)
SESSION_ID = Fields("tenant_id", "session_id")
WRITE = Fields("client_id", "tenant_id", "key", "write_id")
BATCH_WRITE = Fields("client_id", "tenant_id", "keys", "write_ids")
READER_KEY = Fields("tenant_id", "key", "client_id")
READER_KEYS = Fields("tenant_id", "keys", "client_id")

_ENTRIES = (
    # Segments and liveness.
    Rpc(
        "MountSegment",
        "service.mount_segment",
        Fields("client_id", Field("segment", codec.decode_segment, codec.encode_segment)),
        STATUS,
    ),
    Rpc(
        "ReMountSegment",
        "service.remount_segments",
        Fields("client_id", Field("segments", codec.decode_segments, codec.encode_segments)),
        STATUS,
    ),
    Rpc(
        "UnmountSegment",
        "service.unmount_segment_sliced",
        Fields("client_id", "segment_id"),
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
        PUT_STARTS,
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
        PUT_STARTS,
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
        SESSION_ID,
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
    Rpc("GetStats", "service.stats", Fields(), STATS),
    Rpc("ListSegments", "service.segment_usage", Fields(), SEGMENT_USAGE),
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
)


def _build() -> dict[str, Rpc]:
    by_name = {rpc.name: rpc for rpc in _ENTRIES}
    declared = [m.name for m in SERVICE.methods]
    if len(by_name) != len(_ENTRIES) or sorted(by_name) != sorted(declared):
        raise TypeError("the RPC table must hold exactly one entry per RPC of the proto")
    return {name: by_name[name] for name in declared}


RPCS: Mapping[str, Rpc] = _build()
"""Every RPC by name, in proto declaration order."""
