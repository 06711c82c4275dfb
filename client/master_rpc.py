"""Client of the master's RPCs, over the stream channel or gRPC, following the leader in HA.

Every RPC is an entry of :mod:`mooncake_py._wire.rpcs`: :meth:`MasterClient.call` encodes a
method's typed arguments with it, sends the request over the stream channel when the master
offers one (gRPC otherwise), and decodes the answer into the types of :mod:`mooncake_py.types`.
The named methods (:mod:`mooncake_py.client.master_calls`) are that call with the RPC chosen.
Transport failures raise :class:`MasterUnavailableError` with RPC_FAIL or RPC_TIMEOUT
(:class:`~.leader_follow.MasterNotReachedError` when no connection could be made), refused
tokens :class:`AuthenticationError` or :class:`PermissionDeniedError`; store-level outcomes
come back as codes.

**Masters behind etcd.** An address ``etcd://h1:2379;h2:2379`` makes the client look the
leader up (:mod:`mooncake_py.client.leader_discovery`) and call it. Setup waits for a leader up
to the call deadline. A call that fails in transport is retried against whichever master is
the leader by then, within a retry deadline, when the RPC is idempotent or provably never
reached a master (the rules and the per-RPC table: :mod:`mooncake_py.client.leader_follow`);
the stream channel follows (a switch reconnects it to the new leader's fast port). A plain
``host:port`` address takes none of these paths: no etcd, no retries, one attribute test per
call.

:meth:`MasterClient.send_one_way` sends a call whose answer the caller does not need (the end
of reads that finished within their lease) without waiting: a one-way frame on the stream
channel (the same thread's next call runs after it on the master, see
:mod:`mooncake_py.client.stream_client`), a gRPC call nobody waits for otherwise (no ordering).
A one-way send that fails is dropped and logged at debug level: the master's lease TTL bounds
what it would have ended.

Thread-safety: safe to share between threads (gRPC channels and the stream pool are; leader
switches are serialized by the follower).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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
from mooncake_py.ha_names import is_etcd_address
from mooncake_py.tls import TlsConfig

from .leader_follow import (
    FAST_RECONNECT_OPTIONS,
    MasterNotReachedError,
    closed_channel,
    grpc_never_reached,
    retried_on_any_failure,
)
from .master_calls import MasterCalls
from .stream_client import ChannelClient, ChannelError

if TYPE_CHECKING:
    from .leader_follow import LeaderFollower

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024


def stream_closed_before_send(exc: OSError) -> bool:
    """Whether the stream channel refused a call because it was closed before the call took a
    connection (:meth:`ChannelClient.close` ran: nothing was written)."""
    return type(exc) is ConnectionError and str(exc) == "stream channel is closed"


class MasterClient(MasterCalls):
    """Calls the master at ``address``: a ``host:port``, or ``etcd://...`` for the leader of
    an HA cluster.

    Args:
        address: the master's ``host:port``, or ``etcd://HOST:PORT[;HOST:PORT...]``.
        timeout_s: deadline of every call (and, for ``etcd://``, of waiting for a leader here).
        use_stream: allow :meth:`connect_stream` (False: gRPC only).
        token: presented on every call ("" when the master requires none).
        tls: talk TLS only, on the gRPC channel and the stream channel alike (None:
            plaintext); a master that does not speak TLS then cannot be reached
            (:class:`~mooncake_py.errors.MasterUnavailableError`). Etcd is read in plaintext.
        cluster_id: with ``etcd://``, the cluster whose leader to find (None: env
            ``MC_STORE_CLUSTER_ID``, else ``mooncake_cluster``).
        retry_deadline_s: with ``etcd://``, how long after a call's first failure it may be
            retried (None: env ``MOONCAKE_PY_MASTER_RETRY_DEADLINE_S``, else 12 s).

    Attributes:
        address: the ``host:port`` called now (the current leader's, for ``etcd://``).
        master_spec: ``address`` as given.

    Raises:
        ConfigError: a TLS file that is not valid PEM (the files are read once, here).
        InvalidParamsError: an ``etcd://`` address without a valid endpoint.
        UnavailableError: ``etcd://`` and no leader within ``timeout_s``:
            UNAVAILABLE_IN_CURRENT_STATUS (etcd answered, no master leads) or
            ETCD_OPERATION_ERROR (no etcd endpoint answered).
        ValueError: a negative retry deadline.
    """

    def __init__(
        self,
        address: str,
        timeout_s: float = 10.0,
        use_stream: bool = True,
        token: str = "",
        tls: TlsConfig | None = None,
        cluster_id: str | None = None,
        retry_deadline_s: float | None = None,
    ) -> None:
        self.master_spec = address
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
        self._follower: LeaderFollower | None = None
        self._closed = False
        self.retry_deadline_s = 0.0
        if is_etcd_address(address):
            self._follow_leader_of(address, cluster_id, retry_deadline_s)
        self._connect()

    def _follow_leader_of(
        self, spec: str, cluster_id: str | None, retry_deadline_s: float | None
    ) -> None:
        # Imported here: etcd's stubs (and what they import) cost nothing to plain clients.
        from .leader_discovery import LeaderDiscovery
        from .leader_follow import LeaderFollower
        from .leader_follow import retry_deadline_s as resolve_deadline

        self.retry_deadline_s = resolve_deadline(retry_deadline_s)
        discovery = LeaderDiscovery(spec, cluster_id)
        try:
            view = discovery.wait_for_view(time.monotonic() + self.timeout_s)
        except BaseException:
            discovery.close()
            raise
        self.address = view.leader_address
        log.info(
            "leader master of %r is %s (etcd %s)",
            discovery.cluster_id,
            view.leader_address,
            discovery.describe_endpoints(),
        )
        self._follower = LeaderFollower(discovery, lambda: self.address, self._switch_master)

    @property
    def follows_leader(self) -> bool:
        """True when the master address is ``etcd://`` (calls go to the elected leader)."""
        return self._follower is not None

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
        address = self.address
        try:
            _, fast_port = ready.result.decode(self._send_grpc(ready, ready.args.encode()))
        except MasterUnavailableError:
            return False
        if not fast_port:
            return False
        host = address.rsplit(":", 1)[0].strip("[]")
        stream = ChannelClient(host, fast_port, self.timeout_s, self._token, tls=self._tls)
        with self._lock:
            if self.address != address:  # the leader moved meanwhile: this port is stale
                stream.close()
                return False
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
        and drop the stream channel; :meth:`connect_stream` makes a new one. With ``etcd://``
        the leader is read again first, and the new channel goes to it."""
        if self._follower is not None:
            self._follower.reconnect()
        else:
            self._connect()

    def follow_leader_if_moved(self) -> bool:
        """With ``etcd://``: re-read the leader and switch to it when it is another master
        (the stream channel too); returns whether a switch happened. False at once for a
        plain address. Never raises for etcd failures."""
        return self._follower is not None and self._follower.recheck()

    def _switch_master(self, address: str) -> None:
        """Point both channels at ``address``; called by the follower under its lock."""
        self.address = address
        self._connect()
        if self.use_stream:
            self.connect_stream()

    def _connect(self) -> None:
        """A new gRPC channel to :attr:`address`; the stream channel is dropped."""
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.enable_retries", 1),
        ]
        if is_etcd_address(self.master_spec):
            # A leader that restarts at the same address is dialed again within the lease.
            options += FAST_RECONNECT_OPTIONS
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
        """Close both channels (and, with ``etcd://``, the etcd channels)."""
        self._closed = True  # ends retry loops: a closed client has no master to follow
        with self._lock:
            channel, self._channel = self._channel, None
            self._grpc_calls = None
            stream, self._stream = self._stream, None
        if channel is not None:
            channel.close()
        if stream is not None:
            stream.close()
        if self._follower is not None:
            self._follower.close()

    def call(self, name: str, *args: Any) -> Any:
        """Call the RPC ``name`` of :data:`mooncake_py._wire.rpcs.RPCS`.

        With ``etcd://``, a transport failure is retried against the current leader as
        :mod:`~mooncake_py.client.leader_follow` says (idempotent RPCs on any failure, others
        only when they never reached a master), until the retry deadline.

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
            MasterUnavailableError: the call failed in transport (RPC_FAIL, RPC_TIMEOUT); with
                ``etcd://``, the last failure once retrying is not allowed or time is up.
        """
        rpc = RPCS[name]
        request = _encode(rpc, args)
        if self._follower is None:
            return rpc.result.decode(self._send(rpc, request))
        return rpc.result.decode(self._send_following_leader(rpc, request))

    def call_once(self, name: str, *args: Any, timeout_s: float | None = None) -> Any:
        """As :meth:`call`, but one attempt to the current master, never retried (a caller
        with its own failure handling, such as the heartbeat). With ``timeout_s`` the call goes
        over gRPC with that deadline instead of the client's (a heartbeat must notice a master
        that went silent, a partition that drops packets, within seconds)."""
        rpc = RPCS[name]
        if timeout_s is not None:
            return rpc.result.decode(self._send_grpc(rpc, _encode(rpc, args), timeout_s))
        return rpc.result.decode(self._send(rpc, _encode(rpc, args)))

    def call_with_request(self, name: str, request: Any) -> Any:
        """As :meth:`call`, with the request message of the RPC ``name`` already built."""
        rpc = RPCS[name]
        if self._follower is None:
            return rpc.result.decode(self._send(rpc, request))
        return rpc.result.decode(self._send_following_leader(rpc, request))

    def _send_following_leader(self, rpc: Rpc, request: Any) -> Any:
        """``_send``, retried across leader changes (see :mod:`.leader_follow`)."""
        follower = self._follower
        assert follower is not None
        any_failure = retried_on_any_failure(rpc.name)
        deadline = 0.0
        attempts = 0
        while True:
            generation = follower.generation
            try:
                return self._send(rpc, request)
            except MasterUnavailableError as exc:
                if not any_failure and not isinstance(exc, MasterNotReachedError):
                    # Not repeated, but the next call should not go to a dead master again.
                    follower.recheck()
                    raise
                now = time.monotonic()
                deadline = deadline or now + self.retry_deadline_s
                if now >= deadline or self._closed:
                    if attempts:
                        log.warning("%s failed after %d retries: %s", rpc.name, attempts, exc)
                    raise
                attempts += 1
                log.debug("%s to %s failed, retrying: %s", rpc.name, self.address, exc)
                follower.follow(generation, deadline)

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
            # Later calls use gRPC until the heartbeat (or a leader switch) reconnects the
            # stream. Only a refused connect, or a pool closed (by a reconnect) before the call
            # took a connection, proves the master never saw the request.
            self._drop_stream(stream)
            failure = (
                MasterNotReachedError
                if isinstance(exc, ConnectionRefusedError) or stream_closed_before_send(exc)
                else MasterUnavailableError
            )
            raise failure(
                ErrorCode.RPC_FAIL, f"{rpc.name} to {self.address} (stream): {exc}"
            ) from exc
        return rpc.response_type.FromString(body)

    def _send_grpc(self, rpc: Rpc, request: Any, timeout_s: float | None = None) -> Any:
        calls = self._grpc_calls
        if calls is None:
            raise MasterUnavailableError(ErrorCode.RPC_FAIL, "client is closed")
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            return calls[rpc.name](request, timeout=timeout, metadata=self._metadata)
        except ValueError as exc:
            if not closed_channel(exc):
                raise
            # A reconnect closed the channel this call had taken: nothing was sent.
            raise MasterNotReachedError(
                ErrorCode.RPC_FAIL, f"{rpc.name} to {self.address}: {exc}"
            ) from exc
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
            failure = (
                MasterNotReachedError
                if status == grpc.StatusCode.UNAVAILABLE and grpc_never_reached(detail or "")
                else MasterUnavailableError
            )
            raise failure(code, f"{rpc.name} to {self.address}: {status} {detail}") from exc


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
