"""The gRPC servicer: protobuf in, typed calls on :class:`MasterService`, protobuf out.

This is the only master module that imports generated protobuf code. Each handler decodes its
request into plain types, calls the service, and encodes the answer; the service decides every
outcome, including validation. An unexpected exception in a handler is logged and answered with
INTERNAL_ERROR so one bad request never takes the master down.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from mooncake_py._proto import master_pb2 as pb
from mooncake_py._proto import master_pb2_grpc as pb_grpc
from mooncake_py.errors import ErrorCode
from mooncake_py.master.service import SERVICE_VERSION, MasterService
from mooncake_py.types import (
    ObjectDataType,
    PutStartResult,
    ReplicaDescriptor,
    ReplicaListResult,
    ReplicateConfig,
    SegmentInfo,
    SoftPinAction,
)

log = logging.getLogger(__name__)


def _guarded(
    failure: Callable[[Any], Any],
) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Turn an unexpected exception into an INTERNAL_ERROR answer built by ``failure(request)``."""

    def decorate(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(handler)
        async def wrapper(
            self: MasterServicer, request: Any, context: grpc.aio.ServicerContext
        ) -> Any:
            try:
                return await handler(self, request, context)
            except Exception:
                log.exception("%s failed", handler.__name__)
                return failure(request)

        return wrapper

    return decorate


_INTERNAL = int(ErrorCode.INTERNAL_ERROR)


def _status_failure(_: Any) -> pb.StatusResponse:
    return pb.StatusResponse(code=_INTERNAL)


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


class MasterServicer(pb_grpc.MasterServiceServicer):
    """gRPC handlers for every RPC of ``proto/master.proto``."""

    def __init__(self, service: MasterService) -> None:
        self._service = service

    # -- segments and liveness -------------------------------------------------------------

    @_guarded(_status_failure)
    async def MountSegment(
        self, request: pb.MountSegmentRequest, context: Any
    ) -> pb.StatusResponse:
        code = self._service.mount_segment(request.client_id, decode_segment(request.segment))
        return pb.StatusResponse(code=int(code))

    @_guarded(_status_failure)
    async def ReMountSegment(
        self, request: pb.ReMountSegmentRequest, context: Any
    ) -> pb.StatusResponse:
        segments = [decode_segment(s) for s in request.segments]
        return pb.StatusResponse(
            code=int(self._service.remount_segments(request.client_id, segments))
        )

    @_guarded(_status_failure)
    async def UnmountSegment(
        self, request: pb.UnmountSegmentRequest, context: Any
    ) -> pb.StatusResponse:
        code = self._service.unmount_segment(request.client_id, request.segment_id)
        return pb.StatusResponse(code=int(code))

    @_guarded(lambda _: pb.PingResponse(code=_INTERNAL))
    async def Ping(self, request: pb.PingRequest, context: Any) -> pb.PingResponse:
        result = self._service.ping(request.client_id)
        return pb.PingResponse(
            code=int(result.code),
            view_version=result.view_version,
            client_status=int(result.client_status),
        )

    @_guarded(lambda _: pb.ServiceReadyResponse(code=_INTERNAL))
    async def ServiceReady(
        self, request: pb.ServiceReadyRequest, context: Any
    ) -> pb.ServiceReadyResponse:
        return pb.ServiceReadyResponse(code=0, version=SERVICE_VERSION)

    # -- write path ------------------------------------------------------------------------

    @_guarded(lambda _: pb.PutStartResponse(code=_INTERNAL))
    async def PutStart(self, request: pb.PutStartRequest, context: Any) -> pb.PutStartResponse:
        result = self._service.put_start(
            request.client_id,
            request.tenant_id,
            request.key,
            request.value_length,
            decode_config(request.config),
        )
        return encode_put_start(result)

    @_guarded(
        lambda r: pb.BatchPutStartResponse(
            results=[pb.PutStartResponse(code=_INTERNAL)] * len(r.keys)
        )
    )
    async def BatchPutStart(
        self, request: pb.BatchPutStartRequest, context: Any
    ) -> pb.BatchPutStartResponse:
        results = self._service.batch_put_start(
            request.client_id,
            request.tenant_id,
            list(request.keys),
            list(request.value_lengths),
            decode_config(request.config),
        )
        return pb.BatchPutStartResponse(results=[encode_put_start(r) for r in results])

    @_guarded(lambda _: pb.PutStartResponse(code=_INTERNAL))
    async def UpsertStart(self, request: pb.PutStartRequest, context: Any) -> pb.PutStartResponse:
        result = self._service.upsert_start(
            request.client_id,
            request.tenant_id,
            request.key,
            request.value_length,
            decode_config(request.config),
        )
        return encode_put_start(result)

    @_guarded(
        lambda r: pb.BatchPutStartResponse(
            results=[pb.PutStartResponse(code=_INTERNAL)] * len(r.keys)
        )
    )
    async def BatchUpsertStart(
        self, request: pb.BatchPutStartRequest, context: Any
    ) -> pb.BatchPutStartResponse:
        results = self._service.batch_upsert_start(
            request.client_id,
            request.tenant_id,
            list(request.keys),
            list(request.value_lengths),
            decode_config(request.config),
        )
        return pb.BatchPutStartResponse(results=[encode_put_start(r) for r in results])

    @_guarded(_status_failure)
    async def PutEnd(self, request: pb.KeyRequest, context: Any) -> pb.StatusResponse:
        code = self._service.put_end(request.client_id, request.tenant_id, request.key)
        return pb.StatusResponse(code=int(code))

    @_guarded(_batch_failure)
    async def BatchPutEnd(
        self, request: pb.BatchKeysRequest, context: Any
    ) -> pb.BatchStatusResponse:
        codes = self._service.batch_put_end(
            request.client_id, request.tenant_id, list(request.keys)
        )
        return pb.BatchStatusResponse(codes=[int(c) for c in codes])

    @_guarded(_status_failure)
    async def PutRevoke(self, request: pb.KeyRequest, context: Any) -> pb.StatusResponse:
        code = self._service.put_revoke(request.client_id, request.tenant_id, request.key)
        return pb.StatusResponse(code=int(code))

    @_guarded(_batch_failure)
    async def BatchPutRevoke(
        self, request: pb.BatchKeysRequest, context: Any
    ) -> pb.BatchStatusResponse:
        codes = self._service.batch_put_revoke(
            request.client_id, request.tenant_id, list(request.keys)
        )
        return pb.BatchStatusResponse(codes=[int(c) for c in codes])

    # -- read path -------------------------------------------------------------------------

    @_guarded(lambda _: pb.GetReplicaListResponse(code=_INTERNAL))
    async def GetReplicaList(
        self, request: pb.KeyRequest, context: Any
    ) -> pb.GetReplicaListResponse:
        return encode_replica_list(self._service.get_replica_list(request.tenant_id, request.key))

    @_guarded(
        lambda r: pb.BatchGetReplicaListResponse(
            results=[pb.GetReplicaListResponse(code=_INTERNAL)] * len(r.keys)
        )
    )
    async def BatchGetReplicaList(
        self, request: pb.BatchKeysRequest, context: Any
    ) -> pb.BatchGetReplicaListResponse:
        results = self._service.batch_get_replica_list(request.tenant_id, list(request.keys))
        return pb.BatchGetReplicaListResponse(results=[encode_replica_list(r) for r in results])

    @_guarded(lambda _: pb.ExistKeyResponse(code=_INTERNAL))
    async def ExistKey(self, request: pb.KeyRequest, context: Any) -> pb.ExistKeyResponse:
        result = self._service.exist_key(request.tenant_id, request.key)
        return pb.ExistKeyResponse(code=min(result, 0), exists=result == 1)

    @_guarded(lambda r: pb.BatchExistKeyResponse(results=[_INTERNAL] * len(r.keys)))
    async def BatchExistKey(
        self, request: pb.BatchKeysRequest, context: Any
    ) -> pb.BatchExistKeyResponse:
        return pb.BatchExistKeyResponse(
            results=self._service.batch_exist_key(request.tenant_id, list(request.keys))
        )

    # -- remove family ---------------------------------------------------------------------

    @_guarded(_status_failure)
    async def Remove(self, request: pb.RemoveRequest, context: Any) -> pb.StatusResponse:
        code = self._service.remove(request.tenant_id, request.key, request.force)
        return pb.StatusResponse(code=int(code))

    @_guarded(_batch_failure)
    async def BatchRemove(
        self, request: pb.BatchRemoveRequest, context: Any
    ) -> pb.BatchStatusResponse:
        codes = self._service.batch_remove(request.tenant_id, list(request.keys), request.force)
        return pb.BatchStatusResponse(codes=[int(c) for c in codes])

    @_guarded(lambda _: pb.CountResponse(code=_INTERNAL))
    async def RemoveByRegex(
        self, request: pb.RemoveByRegexRequest, context: Any
    ) -> pb.CountResponse:
        code, count = self._service.remove_by_regex(
            request.tenant_id, request.pattern, request.force
        )
        return pb.CountResponse(code=int(code), count=count)

    @_guarded(lambda _: pb.CountResponse(code=_INTERNAL))
    async def RemoveAll(self, request: pb.RemoveAllRequest, context: Any) -> pb.CountResponse:
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


def _rejecting_undecodable(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Undecodable):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"undecodable request: {request.error}"
            )
        return await handler(request, context)

    return checked


def add_to_server(service: MasterService, server: grpc.aio.Server) -> MasterServicer:
    """Register a servicer for ``service`` on ``server``; returns it.

    Requests that fail to parse (bad wire bytes, invalid UTF-8 in a string field) are answered
    with gRPC INVALID_ARGUMENT naming the parse error, instead of the generic UNKNOWN.
    """
    servicer = MasterServicer(service)
    descriptor = pb.DESCRIPTOR.services_by_name["MasterService"]
    handlers = {
        method.name: grpc.unary_unary_rpc_method_handler(
            _rejecting_undecodable(getattr(servicer, method.name)),
            request_deserializer=_lenient_parser(getattr(pb, method.input_type.name)),
            response_serializer=getattr(pb, method.output_type.name).SerializeToString,
        )
        for method in descriptor.methods
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(descriptor.full_name, handlers),)
    )
    return servicer


def service_descriptor_methods() -> list[str]:
    """Names of every RPC declared in the proto (for the API-surface test)."""
    return [m.name for m in pb.DESCRIPTOR.services_by_name["MasterService"].methods]
