"""Typed client of the master's RPCs, over the stream channel or gRPC.

Every RPC is an entry of :mod:`mooncake_py._wire.rpcs`: :meth:`MasterClient.call` encodes a
method's typed arguments with it, sends the request over the stream channel when the master
offers one (gRPC otherwise), and decodes the answer into the types of :mod:`mooncake_py.types`.
The named methods below are that call with the RPC chosen. Transport failures raise
:class:`MasterUnavailableError` with RPC_FAIL or RPC_TIMEOUT, refused tokens
:class:`AuthenticationError` or :class:`PermissionDeniedError`; store-level outcomes come back
as codes.

:meth:`MasterClient.send_one_way` sends a call whose answer the caller does not need (the end
of reads that finished within their lease) without waiting: a one-way frame on the stream
channel (the same thread's next call runs after it on the master, see
:mod:`mooncake_py.client.stream_client`), a gRPC call nobody waits for otherwise (no ordering).
A one-way send that fails is dropped and logged at debug level: the master's lease TTL bounds
what it would have ended.

Thread-safety: safe to share between threads (gRPC channels and the stream pool are).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import grpc

from mooncake_py import tls as tls_setup
from mooncake_py._wire.frames import STATUS_PERMISSION_DENIED, STATUS_UNAUTHENTICATED
from mooncake_py._wire.rpcs import RPCS, Rpc, new_stub
from mooncake_py.errors import (
    AuthenticationError,
    ErrorCode,
    InvalidParamsError,
    MasterUnavailableError,
    PermissionDeniedError,
)
from mooncake_py.tls import TlsConfig
from mooncake_py.types import (
    ClientStatus,
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

from .stream_client import ChannelClient, ChannelError

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024


class MasterClient:
    """Calls the master at ``address`` (``host:port``).

    Args:
        address: the master's address.
        timeout_s: deadline of every call.
        use_stream: allow :meth:`connect_stream` (False: gRPC only).
        token: presented on every call ("" when the master requires none).
        tls: talk TLS only, on the gRPC channel and the stream channel alike (None:
            plaintext); a master that does not speak TLS then cannot be reached
            (:class:`~mooncake_py.errors.MasterUnavailableError`).

    Raises:
        ConfigError: a TLS file that is not valid PEM (the files are read once, here).
    """

    def __init__(
        self,
        address: str,
        timeout_s: float = 10.0,
        use_stream: bool = True,
        token: str = "",
        tls: TlsConfig | None = None,
    ) -> None:
        self.address = address
        self._tls = tls
        self._grpc_credentials = tls_setup.grpc_channel_credentials(tls) if tls else None
        self.timeout_s = timeout_s
        self._token = token
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self.use_stream = use_stream
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._grpc_calls: dict[str, Any] | None = None
        self._stream: ChannelClient | None = None
        # gRPC calls sent one-way, kept referenced until done (a collected future cancels).
        self._one_way_pending: set[Any] = set()
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
        ready = RPCS["ServiceReady"]
        try:
            _, fast_port = ready.result.decode(self._send_grpc(ready, ready.args.encode()))
        except MasterUnavailableError:
            return False
        if not fast_port:
            return False
        host = self.address.rsplit(":", 1)[0].strip("[]")
        stream = ChannelClient(host, fast_port, self.timeout_s, self._token, tls=self._tls)
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
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.enable_retries", 1),
        ]
        if self._tls is None or self._grpc_credentials is None:
            channel = grpc.insecure_channel(self.address, options=options)
        else:
            options += tls_setup.grpc_channel_options(self._tls)
            channel = grpc.secure_channel(self.address, self._grpc_credentials, options=options)
        stub = new_stub(channel)
        with self._lock:
            old, self._channel = self._channel, channel
            self._grpc_calls = {name: getattr(stub, name) for name in RPCS}
        if old is not None:
            old.close()
        stream = self._stream
        if stream is not None:
            self._drop_stream(stream)

    def close(self) -> None:
        """Close both channels."""
        with self._lock:
            channel, self._channel = self._channel, None
            self._grpc_calls = None
            stream, self._stream = self._stream, None
        if channel is not None:
            channel.close()
        if stream is not None:
            stream.close()

    def call(self, name: str, *args: Any) -> Any:
        """Call the RPC ``name`` of :data:`mooncake_py._wire.rpcs.RPCS`.

        Args:
            name: the RPC's name in the proto.
            args: its target's arguments, in order (for tagged writes the config must carry
                ``kv_sessions``).

        Returns:
            The decoded answer (see the RPC's result in the table).

        Raises:
            KeyError: no such RPC.
            TypeError: the wrong number of arguments.
            InvalidParamsError: an argument the request cannot carry (a string that is not
                valid UTF-8, such as one with a lone surrogate; an int beyond its field).
            AuthenticationError, PermissionDeniedError: the master refused the token.
            MasterUnavailableError: the call failed in transport (RPC_FAIL, RPC_TIMEOUT).
        """
        rpc = RPCS[name]
        return rpc.result.decode(self._send(rpc, _encode(rpc, args)))

    def send_one_way(self, name: str, *args: Any) -> None:
        """Send the RPC ``name`` without waiting for (or ever reading) its answer.

        Over the stream channel: a one-way frame; the master runs it before the next call this
        thread makes. Over gRPC (also when the stream fails): a call whose answer nobody waits
        for (no ordering). Never raises for transport failures: the call is dropped and logged
        at debug level.

        Raises:
            KeyError: no such RPC.
            TypeError, ValueError: the wrong number of arguments.
        """
        rpc = RPCS[name]
        request = _encode(rpc, args)
        stream = self._stream
        if stream is not None:
            try:
                stream.send_one_way(rpc.wire_name, request.SerializeToString())
                return
            except OSError as exc:
                # As for a failed call: later calls use gRPC until the heartbeat reconnects,
                # and so does this one.
                self._drop_stream(stream)
                log.debug("one-way %s to %s (stream) failed: %s", name, self.address, exc)
            except ChannelError as exc:  # a new connection's token was refused
                log.debug("one-way %s to %s (stream) refused: %s", name, self.address, exc)
                return
        calls = self._grpc_calls
        if calls is None:
            log.debug("one-way %s dropped: client is closed", name)
            return
        try:
            future = calls[name].future(request, timeout=self.timeout_s, metadata=self._metadata)
        except (grpc.RpcError, ValueError) as exc:  # ValueError: the channel was closed
            log.debug("one-way %s to %s dropped: %s", name, self.address, exc)
            return
        pending = self._one_way_pending
        with self._lock:
            pending.add(future)
        future.add_done_callback(self._one_way_done)

    def _one_way_done(self, future: Any) -> None:
        with self._lock:
            self._one_way_pending.discard(future)
        if future.cancelled():
            log.debug("one-way call to %s cancelled", self.address)
            return
        exc = future.exception()
        if exc is not None:
            log.debug("one-way call to %s failed: %s", self.address, exc)

    def _send(self, rpc: Rpc, request: Any) -> Any:
        stream = self._stream
        if stream is None:
            return self._send_grpc(rpc, request)
        try:
            body = stream.call(rpc.wire_name, request.SerializeToString())
        except ChannelError as exc:
            if exc.status == STATUS_UNAUTHENTICATED:
                raise AuthenticationError(ErrorCode.RPC_FAIL, f"UNAUTHENTICATED: {exc}") from exc
            if exc.status == STATUS_PERMISSION_DENIED:
                raise PermissionDeniedError(
                    ErrorCode.RPC_FAIL, f"PERMISSION_DENIED: {exc}"
                ) from exc
            self._drop_stream(stream)
            raise MasterUnavailableError(
                ErrorCode.RPC_FAIL, f"{rpc.name} to {self.address} (stream): {exc}"
            ) from exc
        except OSError as exc:
            # Not retried: the master may have run the call. Later calls use gRPC until the
            # heartbeat reconnects the stream.
            self._drop_stream(stream)
            raise MasterUnavailableError(
                ErrorCode.RPC_FAIL, f"{rpc.name} to {self.address} (stream): {exc}"
            ) from exc
        return rpc.response_type.FromString(body)

    def _send_grpc(self, rpc: Rpc, request: Any) -> Any:
        calls = self._grpc_calls
        if calls is None:
            raise MasterUnavailableError(ErrorCode.RPC_FAIL, "client is closed")
        try:
            return calls[rpc.name](request, timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            status = exc.code() if isinstance(exc, grpc.Call) else None
            detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            # The master's text says why (which client id, which rule), as on the stream channel.
            if status == grpc.StatusCode.UNAUTHENTICATED:
                raise AuthenticationError(ErrorCode.RPC_FAIL, f"UNAUTHENTICATED: {detail}") from exc
            if status == grpc.StatusCode.PERMISSION_DENIED:
                raise PermissionDeniedError(
                    ErrorCode.RPC_FAIL, f"PERMISSION_DENIED: {detail}"
                ) from exc
            code = (
                ErrorCode.RPC_TIMEOUT
                if status == grpc.StatusCode.DEADLINE_EXCEEDED
                else ErrorCode.RPC_FAIL
            )
            raise MasterUnavailableError(
                code, f"{rpc.name} to {self.address}: {status} {detail}"
            ) from exc

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
        if config.kv_sessions is None:
            return self.call(method, client_id, tenant, key, size, config)
        if len(config.kv_sessions) != 1:
            return PutStartResult(int(ErrorCode.INVALID_PARAMS))
        return self.call(f"{method}WithKvSessions", client_id, tenant, key, size, config)

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
        return self.call(method, client_id, tenant, keys, sizes, config)

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
        rpc = RPCS[method]
        return rpc.result.decode(self._send(rpc, request))

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

    def batch_replica_clear(
        self, client_id: str, tenant: str, keys: Sequence[str], segment_name: str
    ) -> tuple[int, list[str]]:
        """BatchReplicaClear: ``(code, keys cleared)``."""
        return self.call("BatchReplicaClear", client_id, tenant, keys, segment_name)


def _encode(rpc: Rpc, args: Sequence[Any]) -> Any:
    """The request message of ``rpc`` for ``args``.

    Raises:
        TypeError: the wrong number of arguments.
        InvalidParamsError: a value protobuf cannot carry (invalid UTF-8, an int beyond its
            field's range), which protobuf reports as a bare ValueError.
    """
    try:
        return rpc.args.encode(*args)
    except UnicodeEncodeError as exc:
        raise InvalidParamsError(ErrorCode.INVALID_PARAMS, f"{rpc.name}: {exc}") from exc
    except ValueError as exc:
        if isinstance(exc, InvalidParamsError):
            raise
        raise InvalidParamsError(ErrorCode.INVALID_PARAMS, f"{rpc.name}: {exc}") from exc
