"""Typed client of the master's gRPC service.

This is the only client module that imports generated protobuf code: it encodes typed
arguments, calls the stub with a deadline, and decodes answers into the dataclasses of
:mod:`mooncake_py.types`. Transport failures raise :class:`MasterUnavailableError` with
RPC_FAIL or RPC_TIMEOUT; store-level outcomes come back as codes.

Thread-safety: safe to share between threads (gRPC channels are).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import grpc

from mooncake_py._proto import master_pb2 as pb
from mooncake_py._proto import master_pb2_grpc as pb_grpc
from mooncake_py.errors import (
    AuthenticationError,
    ErrorCode,
    MasterUnavailableError,
    PermissionDeniedError,
)
from mooncake_py.types import (
    ClientStatus,
    KvSessionInfo,
    KvSessionPage,
    PutStartResult,
    ReleaseResult,
    ReplicaDescriptor,
    ReplicaListResult,
    ReplicaStatus,
    ReplicateConfig,
    SegmentInfo,
)

from .stream_client import (
    STATUS_PERMISSION_DENIED,
    STATUS_UNAUTHENTICATED,
    ChannelClient,
    ChannelError,
)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024

_RESPONSE_TYPES = {
    m.name: getattr(pb, m.output_type.name)
    for m in pb.DESCRIPTOR.services_by_name["MasterService"].methods
}


def encode_config(config: ReplicateConfig) -> pb.ReplicateConfig:
    """Typed ReplicateConfig to protobuf."""
    message = pb.ReplicateConfig(
        replica_num=config.replica_num,
        with_hard_pin=config.with_hard_pin,
        preferred_segments=list(config.preferred_segments),
        preferred_segment=config.preferred_segment,
        prefer_alloc_in_same_node=config.prefer_alloc_in_same_node,
        data_type=int(config.data_type),
        host_id=config.host_id,
        group_ids=list(config.group_ids or ()),
        soft_pin_action=int(config.soft_pin_action),
    )
    if config.soft_pin_ttl_ms is not None:
        message.soft_pin_ttl_ms = config.soft_pin_ttl_ms
    return message


def encode_segment(segment: SegmentInfo) -> pb.Segment:
    """SegmentInfo to protobuf."""
    return pb.Segment(
        id=segment.id,
        name=segment.name,
        base=segment.base,
        size=segment.size,
        te_endpoint=segment.te_endpoint,
        protocol=segment.protocol,
        host_id=segment.host_id,
        shm_path=segment.shm_path,
    )


def decode_segment(message: pb.Segment) -> SegmentInfo:
    """Protobuf Segment to :class:`SegmentInfo`."""
    return SegmentInfo(
        id=message.id,
        name=message.name,
        base=message.base,
        size=message.size,
        te_endpoint=message.te_endpoint,
        protocol=message.protocol,
        host_id=message.host_id,
        shm_path=message.shm_path,
    )


def decode_replica(message: pb.ReplicaDescriptor) -> ReplicaDescriptor:
    """Protobuf replica descriptor to the typed form."""
    return ReplicaDescriptor(
        id=message.id,
        status=ReplicaStatus(message.status),
        segment_id=message.segment_id,
        segment_name=message.segment_name,
        offset=message.offset,
        size=message.size,
        te_endpoint=message.te_endpoint,
        host_id=message.host_id,
        shm_path=message.shm_path,
    )


def decode_session_info(message: pb.KvSessionInfo) -> KvSessionInfo:
    """Protobuf session info to :class:`KvSessionInfo`."""
    return KvSessionInfo(
        session_id=message.session_id,
        pinned=message.pinned,
        member_count=message.member_count,
        created_at=message.created_at,
        last_active_at=message.last_active_at,
        bytes=message.bytes,
        exclusive_bytes=message.exclusive_bytes,
        idle_ms=message.idle_ms,
    )


def _decode_put_start(message: pb.PutStartResponse) -> PutStartResult:
    return PutStartResult(message.code, tuple(decode_replica(r) for r in message.replicas))


def _decode_replica_list(message: pb.GetReplicaListResponse) -> ReplicaListResult:
    return ReplicaListResult(
        message.code,
        tuple(decode_replica(r) for r in message.replicas),
        message.lease_ttl_ms,
        message.size,
    )


class MasterClient:
    """Calls the master at ``address`` (``host:port``).

    Args:
        address: the master's address.
        timeout_s: deadline of every call.
    """

    def __init__(
        self, address: str, timeout_s: float = 10.0, use_stream: bool = True, token: str = ""
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._token = token
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self.use_stream = use_stream
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._stream: ChannelClient | None = None
        self.reconnect()

    @property
    def stream_connected(self) -> bool:
        """True while calls go over the master's stream channel."""
        return self._stream is not None

    def connect_stream(self) -> bool:
        """Ask the master for its stream channel and use it for later calls.

        Returns:
            True when calls now go over the channel; False when the master offers none, the
            client is set to gRPC only, or the master cannot be reached.
        """
        if not self.use_stream:
            return False
        try:
            answer = self._call_grpc("ServiceReady", pb.ServiceReadyRequest())
        except MasterUnavailableError:
            return False
        if not answer.fast_port:
            return False
        host = self.address.rsplit(":", 1)[0].strip("[]")
        stream = ChannelClient(host, answer.fast_port, self.timeout_s, self._token)
        with self._lock:
            old, self._stream = self._stream, stream
        if old is not None:
            old.close()
        return True

    def _drop_stream(self, stream: ChannelClient) -> None:
        with self._lock:
            if self._stream is stream:
                self._stream = None
        stream.close()

    def reconnect(self) -> None:
        """Replace the gRPC channel (after repeated failures, or once the master restarted)
        and drop the stream channel; :meth:`connect_stream` makes a new one."""
        channel = grpc.insecure_channel(
            self.address,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.enable_retries", 1),
            ],
        )
        with self._lock:
            old, self._channel = self._channel, channel
            self._stub = pb_grpc.MasterServiceStub(channel)  # type: ignore[no-untyped-call]
        if old is not None:
            old.close()
        stream = self._stream
        if stream is not None:
            self._drop_stream(stream)

    def close(self) -> None:
        """Close both channels."""
        with self._lock:
            channel, self._channel = self._channel, None
            stream, self._stream = self._stream, None
        if channel is not None:
            channel.close()
        if stream is not None:
            stream.close()

    def _call(self, method: str, request: Any) -> Any:
        stream = self._stream
        if stream is None:
            return self._call_grpc(method, request)
        try:
            body = stream.call(method.encode(), request.SerializeToString())
        except ChannelError as exc:
            if exc.status == STATUS_UNAUTHENTICATED:
                raise AuthenticationError(ErrorCode.RPC_FAIL, f"UNAUTHENTICATED: {exc}") from exc
            if exc.status == STATUS_PERMISSION_DENIED:
                raise PermissionDeniedError(
                    ErrorCode.RPC_FAIL, f"PERMISSION_DENIED: {exc}"
                ) from exc
            self._drop_stream(stream)
            raise MasterUnavailableError(
                ErrorCode.RPC_FAIL, f"{method} to {self.address} (stream): {exc}"
            ) from exc
        except OSError as exc:
            # Not retried: the master may have run the call. Later calls use gRPC until the
            # heartbeat reconnects the stream.
            self._drop_stream(stream)
            raise MasterUnavailableError(
                ErrorCode.RPC_FAIL, f"{method} to {self.address} (stream): {exc}"
            ) from exc
        return _RESPONSE_TYPES[method].FromString(body)

    def _call_grpc(self, method: str, request: Any) -> Any:
        stub = self._stub
        if stub is None:
            raise MasterUnavailableError(ErrorCode.RPC_FAIL, "client is closed")
        try:
            return getattr(stub, method)(request, timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            status = exc.code() if isinstance(exc, grpc.Call) else None
            if status == grpc.StatusCode.UNAUTHENTICATED:
                raise AuthenticationError(ErrorCode.RPC_FAIL, "UNAUTHENTICATED") from exc
            if status == grpc.StatusCode.PERMISSION_DENIED:
                raise PermissionDeniedError(ErrorCode.RPC_FAIL, "PERMISSION_DENIED") from exc
            code = (
                ErrorCode.RPC_TIMEOUT
                if status == grpc.StatusCode.DEADLINE_EXCEEDED
                else ErrorCode.RPC_FAIL
            )
            detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise MasterUnavailableError(
                code, f"{method} to {self.address}: {status} {detail}"
            ) from exc

    # -- segments and liveness -------------------------------------------------------------

    def mount_segment(self, client_id: str, segment: SegmentInfo) -> int:
        """MountSegment; returns a code."""
        request = pb.MountSegmentRequest(client_id=client_id, segment=encode_segment(segment))
        return int(self._call("MountSegment", request).code)

    def remount_segments(self, client_id: str, segments: Sequence[SegmentInfo]) -> int:
        """ReMountSegment; returns a code."""
        request = pb.ReMountSegmentRequest(
            client_id=client_id, segments=[encode_segment(s) for s in segments]
        )
        return int(self._call("ReMountSegment", request).code)

    def unmount_segment(self, client_id: str, segment_id: str) -> int:
        """UnmountSegment; returns a code."""
        request = pb.UnmountSegmentRequest(client_id=client_id, segment_id=segment_id)
        return int(self._call("UnmountSegment", request).code)

    def ping(self, client_id: str) -> tuple[int, ClientStatus, int]:
        """Ping; returns (code, client status, view version)."""
        answer = self._call("Ping", pb.PingRequest(client_id=client_id))
        return int(answer.code), ClientStatus(answer.client_status), int(answer.view_version)

    def service_ready(self) -> str:
        """ServiceReady; returns the master's version string."""
        return str(self._call("ServiceReady", pb.ServiceReadyRequest()).version)

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
        request = pb.PutStartRequest(
            client_id=client_id,
            key=key,
            value_length=size,
            config=encode_config(config),
            tenant_id=tenant,
        )
        if config.kv_sessions is None:
            return _decode_put_start(self._call(method, request))
        if len(config.kv_sessions) != 1:
            return PutStartResult(int(ErrorCode.INVALID_PARAMS))
        tagged = pb.PutStartWithKvSessionsRequest(
            put=request, kv_sessions=pb.KvSessionTags(session_ids=config.kv_sessions[0])
        )
        return _decode_put_start(self._call(f"{method}WithKvSessions", tagged))

    def _start_batch(
        self,
        method: str,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        config: ReplicateConfig,
    ) -> list[PutStartResult]:
        request = pb.BatchPutStartRequest(
            client_id=client_id,
            keys=keys,
            value_lengths=sizes,
            config=encode_config(config),
            tenant_id=tenant,
        )
        if config.kv_sessions is None:
            answer = self._call(method, request)
        else:
            tags = [pb.KvSessionTags(session_ids=ids) for ids in config.kv_sessions]
            tagged = pb.BatchPutStartWithKvSessionsRequest(put=request, kv_sessions=tags)
            answer = self._call(f"{method}WithKvSessions", tagged)
        return [_decode_put_start(r) for r in answer.results]

    def put_end(self, client_id: str, tenant: str, key: str) -> int:
        """PutEnd for one key; returns a code."""
        return int(
            self._call("PutEnd", pb.KeyRequest(client_id=client_id, key=key, tenant_id=tenant)).code
        )

    def batch_put_end(self, client_id: str, tenant: str, keys: Sequence[str]) -> list[int]:
        """BatchPutEnd: one code per key."""
        return self._batch_codes("BatchPutEnd", client_id, tenant, keys)

    def put_revoke(self, client_id: str, tenant: str, key: str) -> int:
        """PutRevoke for one key; returns a code."""
        return int(
            self._call(
                "PutRevoke", pb.KeyRequest(client_id=client_id, key=key, tenant_id=tenant)
            ).code
        )

    def batch_put_revoke(self, client_id: str, tenant: str, keys: Sequence[str]) -> list[int]:
        """BatchPutRevoke: one code per key."""
        return self._batch_codes("BatchPutRevoke", client_id, tenant, keys)

    def _batch_codes(
        self, method: str, client_id: str, tenant: str, keys: Sequence[str]
    ) -> list[int]:
        request = pb.BatchKeysRequest(client_id=client_id, keys=keys, tenant_id=tenant)
        return list(self._call(method, request).codes)

    # -- read path -------------------------------------------------------------------------

    def get_replica_list(self, tenant: str, key: str) -> ReplicaListResult:
        """GetReplicaList for one key (grants a read lease)."""
        return _decode_replica_list(
            self._call("GetReplicaList", pb.KeyRequest(key=key, tenant_id=tenant))
        )

    def batch_get_replica_list(self, tenant: str, keys: Sequence[str]) -> list[ReplicaListResult]:
        """BatchGetReplicaList: one result per key."""
        answer = self._call("BatchGetReplicaList", pb.BatchKeysRequest(keys=keys, tenant_id=tenant))
        return [_decode_replica_list(r) for r in answer.results]

    def exist_key(self, tenant: str, key: str) -> int:
        """ExistKey: 1, 0, or a negative code."""
        answer = self._call("ExistKey", pb.KeyRequest(key=key, tenant_id=tenant))
        return int(answer.code) if answer.code else int(answer.exists)

    def batch_exist_key(self, tenant: str, keys: Sequence[str]) -> list[int]:
        """BatchExistKey: per key 1, 0, or a negative code."""
        return list(
            self._call("BatchExistKey", pb.BatchKeysRequest(keys=keys, tenant_id=tenant)).results
        )

    # -- KV sessions -----------------------------------------------------------------------

    def attach_kv_session(self, tenant: str, session_id: str, keys: Sequence[str]) -> list[int]:
        """AttachKvSession: per key 0 or a negative code."""
        request = pb.AttachKvSessionRequest(session_id=session_id, keys=keys, tenant_id=tenant)
        return list(self._call("AttachKvSession", request).codes)

    def set_kv_session_pin(self, tenant: str, session_id: str, pinned: bool) -> int:
        """PinKvSession / UnpinKvSession; returns a code."""
        request = pb.KvSessionRequest(session_id=session_id, tenant_id=tenant)
        return int(self._call("PinKvSession" if pinned else "UnpinKvSession", request).code)

    def update_kv_session(self, tenant: str, session_id: str, keep_keys: Sequence[str]) -> int:
        """UpdateKvSession; returns a code."""
        request = pb.UpdateKvSessionRequest(
            session_id=session_id, keep_keys=keep_keys, tenant_id=tenant
        )
        return int(self._call("UpdateKvSession", request).code)

    def close_kv_session(self, tenant: str, session_id: str) -> int:
        """CloseKvSession; returns a code."""
        request = pb.KvSessionRequest(session_id=session_id, tenant_id=tenant)
        return int(self._call("CloseKvSession", request).code)

    def get_kv_session(self, tenant: str, session_id: str) -> tuple[int, KvSessionInfo | None]:
        """GetKvSession: (code, info or None)."""
        answer = self._call(
            "GetKvSession", pb.KvSessionRequest(session_id=session_id, tenant_id=tenant)
        )
        if answer.code:
            return int(answer.code), None
        return 0, decode_session_info(answer.info)

    def list_kv_session_keys(
        self, tenant: str, session_id: str, cursor: str, limit: int
    ) -> tuple[int, KvSessionPage | None]:
        """ListKvSessionKeys: (code, page or None)."""
        request = pb.ListKvSessionKeysRequest(
            session_id=session_id, cursor=cursor, limit=limit, tenant_id=tenant
        )
        answer = self._call("ListKvSessionKeys", request)
        if answer.code:
            return int(answer.code), None
        return 0, KvSessionPage(list(answer.keys), answer.next_cursor)

    def list_kv_sessions(
        self, tenant: str, cursor: str, limit: int, pinned: bool | None, min_idle_ms: int
    ) -> tuple[int, list[KvSessionInfo], str]:
        """ListKvSessions: (code, infos, next cursor)."""
        request = pb.ListKvSessionsRequest(
            cursor=cursor, limit=limit, min_idle_ms=min_idle_ms, tenant_id=tenant
        )
        if pinned is not None:
            request.pinned = pinned
        answer = self._call("ListKvSessions", request)
        return (
            int(answer.code),
            [decode_session_info(i) for i in answer.sessions],
            answer.next_cursor,
        )

    def release(self, method: str, request: Any) -> tuple[int, ReleaseResult]:
        """Any Release* RPC: (code, result)."""
        answer = self._call(method, request)
        fields = {f.name: getattr(answer, f.name) for f in dataclasses.fields(ReleaseResult)}
        return int(answer.code), ReleaseResult(**fields)

    def release_kv_session(self, tenant: str, session_id: str) -> tuple[int, ReleaseResult]:
        """ReleaseKvSession."""
        request = pb.KvSessionRequest(session_id=session_id, tenant_id=tenant)
        return self.release("ReleaseKvSession", request)

    def release_stale_kv_sessions(
        self, tenant: str, max_idle_ms: int, include_pinned: bool
    ) -> tuple[int, ReleaseResult]:
        """ReleaseStaleKvSessions."""
        request = pb.ReleaseStaleKvSessionsRequest(
            max_idle_ms=max_idle_ms, include_pinned=include_pinned, tenant_id=tenant
        )
        return self.release("ReleaseStaleKvSessions", request)

    def release_all_kv_sessions(self, tenant: str, confirm: bool) -> tuple[int, ReleaseResult]:
        """ReleaseAllKvSessions."""
        request = pb.ReleaseAllKvSessionsRequest(confirm=confirm, tenant_id=tenant)
        return self.release("ReleaseAllKvSessions", request)

    def release_kv_cache(self, tenant: str, keep_pinned: bool) -> tuple[int, ReleaseResult]:
        """ReleaseKvCache."""
        request = pb.ReleaseKvCacheRequest(keep_pinned=keep_pinned, tenant_id=tenant)
        return self.release("ReleaseKvCache", request)

    # -- introspection ---------------------------------------------------------------------

    def get_stats(self) -> dict[str, int]:
        """GetStats: store-wide counts and bytes."""
        return dict(self._call("GetStats", pb.StatsRequest()).values)

    def list_segments(self) -> list[tuple[SegmentInfo, str, int, int]]:
        """ListSegments: (segment, owning client, used bytes, allocations) per segment."""
        answer = self._call("ListSegments", pb.ListSegmentsRequest())
        return [
            (decode_segment(s.segment), s.client_id, s.used_bytes, s.allocations)
            for s in answer.segments
        ]

    # -- remove family ---------------------------------------------------------------------

    def remove(self, tenant: str, key: str, force: bool) -> int:
        """Remove; returns a code."""
        return int(
            self._call("Remove", pb.RemoveRequest(key=key, force=force, tenant_id=tenant)).code
        )

    def batch_remove(self, tenant: str, keys: Sequence[str], force: bool) -> list[int]:
        """BatchRemove: one code per key."""
        return list(
            self._call(
                "BatchRemove", pb.BatchRemoveRequest(keys=keys, force=force, tenant_id=tenant)
            ).codes
        )

    def remove_by_regex(self, tenant: str, pattern: str, force: bool) -> int:
        """RemoveByRegex: the count removed, or a negative code."""
        answer = self._call(
            "RemoveByRegex", pb.RemoveByRegexRequest(pattern=pattern, force=force, tenant_id=tenant)
        )
        return int(answer.code) if answer.code else int(answer.count)

    def remove_all(self, tenant: str, force: bool) -> int:
        """RemoveAll: the count removed."""
        answer = self._call("RemoveAll", pb.RemoveAllRequest(force=force, tenant_id=tenant))
        return int(answer.code) if answer.code else int(answer.count)
