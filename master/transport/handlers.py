"""The gRPC servicer: protobuf in, typed calls on :class:`MasterService`, protobuf out.

This is the only master module that imports generated protobuf code. Each handler decodes its
request into plain types, calls the service, and encodes the answer; the service decides every
outcome, including validation. An unexpected exception in a handler is logged and answered with
INTERNAL_ERROR so one bad request never takes the master down.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from mooncake_py._proto import master_pb2 as pb
from mooncake_py.errors import ErrorCode
from mooncake_py.types import (
    KvSessionInfo,
    ObjectDataType,
    PutStartResult,
    ReleaseResult,
    ReplicaDescriptor,
    ReplicaListResult,
    ReplicateConfig,
    SegmentInfo,
    SoftPinAction,
)

from ..metrics import RpcCounters
from ..service.facade import SERVICE_VERSION, MasterService
from .auth import Denial, TokenAuthority, bind_tenant

log = logging.getLogger(__name__)


def _guarded(
    failure: Callable[[Any], Any],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Turn an unexpected exception into an INTERNAL_ERROR answer built by ``failure(request)``."""

    def decorate(handler: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(handler)
        def wrapper(self: MasterServicer, request: Any) -> Any:
            try:
                response = handler(self, request)
            except Exception:
                log.exception("%s failed", handler.__name__)
                self.rpc_counters.record(handler.__name__, True)
                return failure(request)
            self.rpc_counters.record(handler.__name__, getattr(response, "code", 0) != 0)
            return response

        return wrapper

    return decorate


_INTERNAL = int(ErrorCode.INTERNAL_ERROR)


def _status_failure(_: Any) -> pb.StatusResponse:
    return pb.StatusResponse(code=_INTERNAL)


def _batch_start_failure(request: Any) -> pb.BatchPutStartResponse:
    return pb.BatchPutStartResponse(
        results=[pb.PutStartResponse(code=_INTERNAL)] * len(request.keys)
    )


def _batch_failure(request: Any) -> pb.BatchStatusResponse:
    return pb.BatchStatusResponse(codes=[_INTERNAL] * len(request.keys))


def decode_config(config: pb.ReplicateConfig) -> ReplicateConfig:
    """Protobuf ReplicateConfig to the typed form; unknown enum values become invalid ones."""
    try:
        data_type = ObjectDataType(config.data_type)
    except ValueError:
        data_type = ObjectDataType.UNKNOWN
    try:
        action: SoftPinAction | int = SoftPinAction(config.soft_pin_action)
    except ValueError:
        action = config.soft_pin_action  # rejected by the service as INVALID_PARAMS
    return ReplicateConfig(
        replica_num=config.replica_num,
        with_hard_pin=config.with_hard_pin,
        preferred_segments=list(config.preferred_segments),
        preferred_segment=config.preferred_segment,
        prefer_alloc_in_same_node=config.prefer_alloc_in_same_node,
        data_type=data_type,
        host_id=config.host_id,
        group_ids=list(config.group_ids) if config.group_ids else None,
        soft_pin_action=action,  # type: ignore[arg-type]
        soft_pin_ttl_ms=config.soft_pin_ttl_ms if config.HasField("soft_pin_ttl_ms") else None,
    )


def decode_segment(segment: pb.Segment) -> SegmentInfo:
    """Protobuf Segment to :class:`SegmentInfo`."""
    return SegmentInfo(
        id=segment.id,
        name=segment.name,
        base=segment.base,
        size=segment.size,
        te_endpoint=segment.te_endpoint,
        protocol=segment.protocol,
        host_id=segment.host_id,
        shm_path=segment.shm_path,
    )


def encode_segment(info: SegmentInfo) -> pb.Segment:
    """:class:`SegmentInfo` to protobuf."""
    return pb.Segment(**dataclasses.asdict(info))


def encode_replica(replica: ReplicaDescriptor) -> pb.ReplicaDescriptor:
    """:class:`ReplicaDescriptor` to protobuf."""
    return pb.ReplicaDescriptor(
        id=replica.id,
        status=int(replica.status),
        segment_id=replica.segment_id,
        segment_name=replica.segment_name,
        offset=replica.offset,
        size=replica.size,
        te_endpoint=replica.te_endpoint,
        host_id=replica.host_id,
        shm_path=replica.shm_path,
    )


def encode_put_start(result: PutStartResult) -> pb.PutStartResponse:
    """A put-start result to protobuf."""
    return pb.PutStartResponse(
        code=int(result.code), replicas=[encode_replica(r) for r in result.replicas]
    )


def encode_replica_list(result: ReplicaListResult) -> pb.GetReplicaListResponse:
    """A replica-list result to protobuf."""
    return pb.GetReplicaListResponse(
        code=int(result.code),
        replicas=[encode_replica(r) for r in result.replicas],
        lease_ttl_ms=result.lease_ttl_ms,
        size=result.size,
    )


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


def encode_release(code: int, result: ReleaseResult) -> pb.ReleaseResponse:
    """A release outcome to protobuf."""
    return pb.ReleaseResponse(code=int(code), **dataclasses.asdict(result))


class MasterServicer:
    """Handlers for every RPC of ``proto/master.proto``: request message in, response out.

    Handlers are synchronous (the service never blocks), so both transports call them
    directly: gRPC through :func:`add_to_server`, the stream channel through
    :func:`method_table`.

    Attributes:
        fast_port: the stream channel's port, advertised by ServiceReady (0: none).
    """

    def __init__(self, service: MasterService) -> None:
        self._service = service
        self.fast_port = 0
        self.rpc_counters = RpcCounters()

    # -- segments and liveness -------------------------------------------------------------

    @_guarded(_status_failure)
    def MountSegment(self, request: pb.MountSegmentRequest) -> pb.StatusResponse:
        code = self._service.mount_segment(request.client_id, decode_segment(request.segment))
        return pb.StatusResponse(code=int(code))

    @_guarded(_status_failure)
    def ReMountSegment(self, request: pb.ReMountSegmentRequest) -> pb.StatusResponse:
        segments = [decode_segment(s) for s in request.segments]
        return pb.StatusResponse(
            code=int(self._service.remount_segments(request.client_id, segments))
        )

    @_guarded(_status_failure)
    def UnmountSegment(self, request: pb.UnmountSegmentRequest) -> pb.StatusResponse:
        code = self._service.unmount_segment(request.client_id, request.segment_id)
        return pb.StatusResponse(code=int(code))

    @_guarded(lambda _: pb.PingResponse(code=_INTERNAL))
    def Ping(self, request: pb.PingRequest) -> pb.PingResponse:
        result = self._service.ping(request.client_id)
        return pb.PingResponse(
            code=int(result.code),
            view_version=result.view_version,
            client_status=int(result.client_status),
        )

    @_guarded(lambda _: pb.ServiceReadyResponse(code=_INTERNAL))
    def ServiceReady(self, request: pb.ServiceReadyRequest) -> pb.ServiceReadyResponse:
        return pb.ServiceReadyResponse(code=0, version=SERVICE_VERSION, fast_port=self.fast_port)

    # -- write path ------------------------------------------------------------------------

    def _start(
        self, put: pb.PutStartRequest, tags: list[Any] | None, start: Any
    ) -> pb.PutStartResponse:
        """Any single-key put or upsert start; ``tags`` only for the tagged RPCs."""
        config = decode_config(put.config)
        if tags is not None:
            config.kv_sessions = [list(t.session_ids) for t in tags]
        return encode_put_start(
            start(put.client_id, put.tenant_id, put.key, put.value_length, config)
        )

    def _start_batch(
        self, put: pb.BatchPutStartRequest, tags: list[Any] | None, start: Any
    ) -> pb.BatchPutStartResponse:
        """Any batch put or upsert start; ``tags`` only for the tagged RPCs."""
        config = decode_config(put.config)
        if tags is not None:
            config.kv_sessions = [list(t.session_ids) for t in tags]
        results = start(
            put.client_id, put.tenant_id, list(put.keys), list(put.value_lengths), config
        )
        return pb.BatchPutStartResponse(results=[encode_put_start(r) for r in results])

    @_guarded(lambda _: pb.PutStartResponse(code=_INTERNAL))
    def PutStart(self, request: pb.PutStartRequest) -> pb.PutStartResponse:
        return self._start(request, None, self._service.put_start)

    @_guarded(_batch_start_failure)
    def BatchPutStart(self, request: pb.BatchPutStartRequest) -> pb.BatchPutStartResponse:
        return self._start_batch(request, None, self._service.batch_put_start)

    @_guarded(lambda _: pb.PutStartResponse(code=_INTERNAL))
    def UpsertStart(self, request: pb.PutStartRequest) -> pb.PutStartResponse:
        return self._start(request, None, self._service.upsert_start)

    @_guarded(_batch_start_failure)
    def BatchUpsertStart(self, request: pb.BatchPutStartRequest) -> pb.BatchPutStartResponse:
        return self._start_batch(request, None, self._service.batch_upsert_start)

    @_guarded(_status_failure)
    def PutEnd(self, request: pb.KeyRequest) -> pb.StatusResponse:
        code = self._service.put_end(request.client_id, request.tenant_id, request.key)
        return pb.StatusResponse(code=int(code))

    @_guarded(_batch_failure)
    def BatchPutEnd(self, request: pb.BatchKeysRequest) -> pb.BatchStatusResponse:
        codes = self._service.batch_put_end(
            request.client_id, request.tenant_id, list(request.keys)
        )
        return pb.BatchStatusResponse(codes=[int(c) for c in codes])

    @_guarded(_status_failure)
    def PutRevoke(self, request: pb.KeyRequest) -> pb.StatusResponse:
        code = self._service.put_revoke(request.client_id, request.tenant_id, request.key)
        return pb.StatusResponse(code=int(code))

    @_guarded(_batch_failure)
    def BatchPutRevoke(self, request: pb.BatchKeysRequest) -> pb.BatchStatusResponse:
        codes = self._service.batch_put_revoke(
            request.client_id, request.tenant_id, list(request.keys)
        )
        return pb.BatchStatusResponse(codes=[int(c) for c in codes])

    # -- tagged writes and sessions --------------------------------------------------------

    @_guarded(lambda _: pb.PutStartResponse(code=_INTERNAL))
    def PutStartWithKvSessions(
        self, request: pb.PutStartWithKvSessionsRequest
    ) -> pb.PutStartResponse:
        return self._start(request.put, [request.kv_sessions], self._service.put_start)

    @_guarded(lambda _: pb.PutStartResponse(code=_INTERNAL))
    def UpsertStartWithKvSessions(
        self, request: pb.PutStartWithKvSessionsRequest
    ) -> pb.PutStartResponse:
        return self._start(request.put, [request.kv_sessions], self._service.upsert_start)

    @_guarded(lambda r: _batch_start_failure(r.put))
    def BatchPutStartWithKvSessions(
        self, request: pb.BatchPutStartWithKvSessionsRequest
    ) -> pb.BatchPutStartResponse:
        tags = list(request.kv_sessions)
        return self._start_batch(request.put, tags, self._service.batch_put_start)

    @_guarded(lambda r: _batch_start_failure(r.put))
    def BatchUpsertStartWithKvSessions(
        self, request: pb.BatchPutStartWithKvSessionsRequest
    ) -> pb.BatchPutStartResponse:
        tags = list(request.kv_sessions)
        return self._start_batch(request.put, tags, self._service.batch_upsert_start)

    @_guarded(lambda r: pb.BatchStatusResponse(codes=[_INTERNAL] * len(r.keys)))
    def AttachKvSession(self, request: pb.AttachKvSessionRequest) -> pb.BatchStatusResponse:
        codes = self._service.attach_kv_session(
            request.tenant_id, request.session_id, list(request.keys)
        )
        return pb.BatchStatusResponse(codes=codes)

    @_guarded(_status_failure)
    def PinKvSession(self, request: pb.KvSessionRequest) -> pb.StatusResponse:
        code = self._service.set_kv_session_pin(request.tenant_id, request.session_id, True)
        return pb.StatusResponse(code=int(code))

    @_guarded(_status_failure)
    def UnpinKvSession(self, request: pb.KvSessionRequest) -> pb.StatusResponse:
        code = self._service.set_kv_session_pin(request.tenant_id, request.session_id, False)
        return pb.StatusResponse(code=int(code))

    @_guarded(_status_failure)
    def UpdateKvSession(self, request: pb.UpdateKvSessionRequest) -> pb.StatusResponse:
        code = self._service.update_kv_session(
            request.tenant_id, request.session_id, list(request.keep_keys)
        )
        return pb.StatusResponse(code=int(code))

    @_guarded(_status_failure)
    def CloseKvSession(self, request: pb.KvSessionRequest) -> pb.StatusResponse:
        code = self._service.close_kv_session(request.tenant_id, request.session_id)
        return pb.StatusResponse(code=int(code))

    @_guarded(lambda _: pb.KvSessionInfoResponse(code=_INTERNAL))
    def GetKvSession(self, request: pb.KvSessionRequest) -> pb.KvSessionInfoResponse:
        code, info = self._service.get_kv_session(request.tenant_id, request.session_id)
        if info is None:
            return pb.KvSessionInfoResponse(code=int(code))
        return pb.KvSessionInfoResponse(code=int(code), info=encode_session_info(info))

    @_guarded(lambda _: pb.KvSessionPageResponse(code=_INTERNAL))
    def ListKvSessionKeys(self, request: pb.ListKvSessionKeysRequest) -> pb.KvSessionPageResponse:
        code, page = self._service.list_kv_session_keys(
            request.tenant_id, request.session_id, request.cursor, request.limit
        )
        if page is None:
            return pb.KvSessionPageResponse(code=int(code))
        return pb.KvSessionPageResponse(
            code=int(code), keys=page.keys, next_cursor=page.next_cursor
        )

    @_guarded(lambda _: pb.ListKvSessionsResponse(code=_INTERNAL))
    def ListKvSessions(self, request: pb.ListKvSessionsRequest) -> pb.ListKvSessionsResponse:
        code, infos, cursor = self._service.list_kv_sessions(
            request.tenant_id,
            request.cursor,
            request.limit,
            request.pinned if request.HasField("pinned") else None,
            request.min_idle_ms,
        )
        return pb.ListKvSessionsResponse(
            code=int(code), sessions=[encode_session_info(i) for i in infos], next_cursor=cursor
        )

    @_guarded(lambda _: pb.ReleaseResponse(code=_INTERNAL))
    def ReleaseKvSession(self, request: pb.KvSessionRequest) -> pb.ReleaseResponse:
        return encode_release(
            *self._service.release_kv_session(request.tenant_id, request.session_id)
        )

    @_guarded(lambda _: pb.ReleaseResponse(code=_INTERNAL))
    def ReleaseStaleKvSessions(
        self, request: pb.ReleaseStaleKvSessionsRequest
    ) -> pb.ReleaseResponse:
        result = self._service.release_stale_kv_sessions(
            request.tenant_id, request.max_idle_ms, request.include_pinned
        )
        return encode_release(*result)

    @_guarded(lambda _: pb.ReleaseResponse(code=_INTERNAL))
    def ReleaseAllKvSessions(self, request: pb.ReleaseAllKvSessionsRequest) -> pb.ReleaseResponse:
        return encode_release(
            *self._service.release_all_kv_sessions(request.tenant_id, request.confirm)
        )

    @_guarded(lambda _: pb.ReleaseResponse(code=_INTERNAL))
    def ReleaseKvCache(self, request: pb.ReleaseKvCacheRequest) -> pb.ReleaseResponse:
        return encode_release(
            *self._service.release_kv_cache(request.tenant_id, request.keep_pinned)
        )

    @_guarded(lambda _: pb.StatsResponse(code=_INTERNAL))
    def GetStats(self, request: pb.StatsRequest) -> pb.StatsResponse:
        return pb.StatsResponse(code=0, values=self._service.stats())

    @_guarded(lambda _: pb.ListSegmentsResponse(code=_INTERNAL))
    def ListSegments(self, request: pb.ListSegmentsRequest) -> pb.ListSegmentsResponse:
        return pb.ListSegmentsResponse(
            code=0,
            segments=[
                pb.SegmentStatus(
                    segment=encode_segment(info),
                    client_id=client_id,
                    used_bytes=used,
                    allocations=allocations,
                )
                for info, client_id, used, allocations in self._service.segment_usage()
            ],
        )

    # -- read path -------------------------------------------------------------------------

    @_guarded(lambda _: pb.GetReplicaListResponse(code=_INTERNAL))
    def GetReplicaList(self, request: pb.KeyRequest) -> pb.GetReplicaListResponse:
        return encode_replica_list(self._service.get_replica_list(request.tenant_id, request.key))

    @_guarded(
        lambda r: pb.BatchGetReplicaListResponse(
            results=[pb.GetReplicaListResponse(code=_INTERNAL)] * len(r.keys)
        )
    )
    def BatchGetReplicaList(self, request: pb.BatchKeysRequest) -> pb.BatchGetReplicaListResponse:
        results = self._service.batch_get_replica_list(request.tenant_id, list(request.keys))
        return pb.BatchGetReplicaListResponse(results=[encode_replica_list(r) for r in results])

    @_guarded(lambda _: pb.ExistKeyResponse(code=_INTERNAL))
    def ExistKey(self, request: pb.KeyRequest) -> pb.ExistKeyResponse:
        result = self._service.exist_key(request.tenant_id, request.key)
        return pb.ExistKeyResponse(code=min(result, 0), exists=result == 1)

    @_guarded(lambda r: pb.BatchExistKeyResponse(results=[_INTERNAL] * len(r.keys)))
    def BatchExistKey(self, request: pb.BatchKeysRequest) -> pb.BatchExistKeyResponse:
        return pb.BatchExistKeyResponse(
            results=self._service.batch_exist_key(request.tenant_id, list(request.keys))
        )

    # -- remove family ---------------------------------------------------------------------

    @_guarded(_status_failure)
    def Remove(self, request: pb.RemoveRequest) -> pb.StatusResponse:
        code = self._service.remove(request.tenant_id, request.key, request.force)
        return pb.StatusResponse(code=int(code))

    @_guarded(_batch_failure)
    def BatchRemove(self, request: pb.BatchRemoveRequest) -> pb.BatchStatusResponse:
        codes = self._service.batch_remove(request.tenant_id, list(request.keys), request.force)
        return pb.BatchStatusResponse(codes=[int(c) for c in codes])

    @_guarded(lambda _: pb.CountResponse(code=_INTERNAL))
    def RemoveByRegex(self, request: pb.RemoveByRegexRequest) -> pb.CountResponse:
        code, count = self._service.remove_by_regex(
            request.tenant_id, request.pattern, request.force
        )
        return pb.CountResponse(code=int(code), count=count)

    @_guarded(lambda _: pb.CountResponse(code=_INTERNAL))
    def RemoveAll(self, request: pb.RemoveAllRequest) -> pb.CountResponse:
        count = self._service.remove_all(request.tenant_id, request.force)
        return pb.CountResponse(code=0, count=count)


class _Undecodable:
    """Stands in for a request whose bytes do not parse, so the handler can reject it cleanly."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def _lenient_parser(message_type: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            return _Undecodable(str(exc))

    return parse


_DENIAL_STATUS = {
    Denial.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Denial.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
}


def _grpc_handler(
    handler: Callable[[Any], Any], authority: TokenAuthority | None
) -> Callable[..., Awaitable[Any]]:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Undecodable):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"undecodable request: {request.error}"
            )
        if authority is not None:
            metadata = dict(context.invocation_metadata() or ())
            tenant = authority.tenant_of_header(metadata.get("authorization"))
            denial = Denial.UNAUTHENTICATED if tenant is None else bind_tenant(request, tenant)
            if denial is not None:
                await context.abort(_DENIAL_STATUS[denial], denial.value)
        return handler(request)

    return handle


@dataclasses.dataclass(frozen=True)
class Method:
    """One RPC: its name, message types and handler."""

    name: str
    request_type: Any
    response_type: Any
    handler: Callable[[Any], Any]


def method_table(servicer: MasterServicer) -> list[Method]:
    """Every RPC in proto declaration order (the stream channel numbers methods this way)."""
    descriptor = pb.DESCRIPTOR.services_by_name["MasterService"]
    return [
        Method(
            m.name,
            getattr(pb, m.input_type.name),
            getattr(pb, m.output_type.name),
            getattr(servicer, m.name),
        )
        for m in descriptor.methods
    ]


def add_to_server(
    service: MasterService, server: grpc.aio.Server, authority: TokenAuthority | None = None
) -> MasterServicer:
    """Register a servicer for ``service`` on ``server``; returns it.

    Requests that fail to parse (bad wire bytes, invalid UTF-8 in a string field) are answered
    with gRPC INVALID_ARGUMENT naming the parse error, instead of the generic UNKNOWN. With an
    ``authority``, calls without a valid token get UNAUTHENTICATED and calls naming another
    tenant than their token's PERMISSION_DENIED.
    """
    servicer = MasterServicer(service)
    handlers = {
        method.name: grpc.unary_unary_rpc_method_handler(
            _grpc_handler(method.handler, authority),
            request_deserializer=_lenient_parser(method.request_type),
            response_serializer=method.response_type.SerializeToString,
        )
        for method in method_table(servicer)
    }
    service_name = pb.DESCRIPTOR.services_by_name["MasterService"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service_name, handlers),))
    return servicer


def service_descriptor_methods() -> list[str]:
    """Names of every RPC declared in the proto (for the API-surface test)."""
    return [m.name for m in pb.DESCRIPTOR.services_by_name["MasterService"].methods]
