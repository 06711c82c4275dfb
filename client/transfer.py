"""The TCP transfer service: moves replica bytes between clients on different hosts.

This module is the client side (:class:`TransferClient`) and re-exports the server
(:class:`TransferServer`, :mod:`mooncake_py.client.transfer_server`) and the wire format
(:mod:`mooncake_py.client.transfer_framing`: one fixed-size header per request and per
answer, answered in order).

Socket buffers. Every transfer socket, the client's connections and the server's accepted
ones alike, requests SO_SNDBUF and SO_RCVBUF of ``MOONCAKE_PY_TCP_SOCKET_BUFFER`` bytes (read
once per process; a size such as ``212992`` or ``256kb``; ``0`` leaves both to the kernel;
unset: ``SOCKET_BUFFER_BYTES``, 4 MiB, which the kernel caps at ``net.core.wmem_max`` /
``rmem_max``). An explicit ``socket_buffers`` argument wins over the variable. Details in
:mod:`mooncake_py.client.transfer_framing`.

Flow control. A client pipelines a batch on one connection but keeps at most
``MAX_INFLIGHT_OPS`` requests, and ``MAX_INFLIGHT_BYTES`` of request plus response payload,
unanswered at a time (one op is always allowed, whatever its size). The client drives the
connection full duplex (non-blocking socket, ``poll``): it reads answers whenever they arrive
while it still has requests to send, so neither side can end up blocked in ``send`` with the
other blocked in ``send`` too, whatever the socket buffer sizes.

Timeouts scale with progress: an exchange fails once no byte has moved either way for
``STALL_TIMEOUT_S``, however long the whole transfer has been running. ``sendall`` is not used,
since its timeout bounds the whole call; every send and receive is a single system call.

Copies. Large READ answers go straight from the socket into the caller's buffer. Headers and
small READ answers are received in chunks into a staging buffer and copied out, which saves a
system call per op.

Retries. A client connection idle in its pool may have been closed by the server. Before
reuse, a pooled connection is checked (a non-blocking peek must find no EOF) and one idle for
longer than ``POOL_IDLE_S`` is dropped. If an exchange on a reused connection still fails with
a connection error (EOF, reset, broken pipe — not a stall) before any byte of any answer
arrived, the whole call is run once more on a fresh connection. That is safe for both ops: a
READ only refills the caller's buffer (untouched so far, since no answer byte arrived), and a
WRITE only stores the same bytes again at the same offsets of a range the caller still has
reserved. Nothing else is retried.

Capabilities. Every request carries its op's grant (:attr:`TransferOp.grant`, the master's
capability for the replica: :func:`mooncake_py.capability.grant_of`); an op without one (or
with one of another length) sends zeros, which the server refuses. A refused op's result is the
server's code, as for any other: ILLEGAL_CLIENT when the grant does not allow it (forged,
expired, another segment's or range's, READ only for a WRITE), INVALID_PARAMS for an unknown
segment or a range outside it.

A WRITE the server rejects (no valid capability, unknown segment, range outside it) ends the
connection there: the rejected op gets the server's code and every later op of the call
TRANSFER_FAIL.

TLS. A client and server given a :class:`~mooncake_py.tls.TlsConfig` speak TLS only: the
client checks the server's certificate against the endpoint's host (or the configured server
name) and presents its own when it has one; a server with ``require_client_cert`` serves only
peers presenting one signed by the CA. The exchange stays full duplex on one non-blocking
socket: a :class:`~mooncake_py.client.transfer_tls.TlsStream` (TLS over memory BIOs) stands in
for the socket, with the same ``sendmsg``/``recv_into``. A handshake failure (a plaintext peer,
an untrusted or missing certificate) fails the call with TRANSFER_FAIL. Without TLS the
exchange runs on the socket itself, exactly as before.
"""

from __future__ import annotations

import errno
import logging
import select
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from mooncake_py.capability import GRANT_BYTES
from mooncake_py.errors import ErrorCode, TransferError
from mooncake_py.tls import TlsConfig, check_hostname_target, client_context

from .transfer_framing import (
    FROM_ENV,
    MAX_IOV,
    OP_READ,
    OP_WRITE,
    REQUEST,
    REQUEST_MAGIC,
    RESPONSE,
    RESPONSE_MAGIC,
    SOCKET_BUFFER_BYTES,
    STAGING_BYTES,
    STALL_TIMEOUT_S,
    BufferChoice,
    SocketBuffers,
    advance,
    recv_exactly,
    resolve_buffers,
    send_buffers,
    tune,
)
from .transfer_server import MAX_CONNECTIONS, SERVER_IDLE_TIMEOUT_S, SegmentLookup, TransferServer
from .transfer_tls import TlsStream, connect_tls

__all__ = [
    "FROM_ENV",
    "MAX_CONNECTIONS",
    "OP_READ",
    "OP_WRITE",
    "REQUEST",
    "REQUEST_MAGIC",
    "RESPONSE",
    "RESPONSE_MAGIC",
    "SERVER_IDLE_TIMEOUT_S",
    "SOCKET_BUFFER_BYTES",
    "STALL_TIMEOUT_S",
    "SegmentLookup",
    "SocketBuffers",
    "TransferClient",
    "TransferOp",
    "TransferServer",
    "recv_exactly",
    "send_buffers",
]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
MAX_INFLIGHT_OPS = 1024
MAX_INFLIGHT_BYTES = 32 * 1024 * 1024
POOL_IDLE_S = 30.0
"""A pooled client connection idle for longer than this is dropped rather than reused."""

_DIRECT_BYTES = 64 * 1024  # payloads at least this large bypass the staging buffer
_NO_GRANT = bytes(GRANT_BYTES)


@dataclass(frozen=True, slots=True)
class TransferOp:
    """One read or write of ``len(buffer)`` bytes at ``offset`` in a remote segment, under
    ``grant`` (the master's capability for a range that holds it:
    :func:`mooncake_py.capability.grant_of`, :data:`~mooncake_py.capability.GRANT_BYTES`
    bytes; empty, or any other length, sends zeros: the server refuses the op)."""

    op: int
    segment_id: str
    offset: int
    buffer: memoryview
    grant: bytes = b""


class _Stalled(TimeoutError):
    """No byte moved for STALL_TIMEOUT_S."""


Connection = socket.socket | TlsStream
"""A pooled transfer connection: a non-blocking socket, or a TLS stream over one."""


class _Exchange:
    """One batch on one non-blocking connection, full duplex, windowed."""

    def __init__(self, sock: Connection, ops: Sequence[TransferOp]) -> None:
        self.sock = sock
        # TLS may hold ciphertext back after accepting plaintext: it must be sent on its own.
        self.tls = sock if isinstance(sock, TlsStream) else None
        self.ops = ops
        self.response_bytes = 0  # answer bytes received so far (0: the peer answered nothing)

    def run(self) -> list[int]:
        sock, ops, tls = self.sock, self.ops, self.tls
        total = len(ops)
        results: list[int] = []
        pending: deque[memoryview] = deque()  # request bytes queued, not yet sent
        next_send = 0  # ops[:next_send] are queued
        inflight_bytes = 0
        staging = bytearray(STAGING_BYTES)
        view = memoryview(staging)
        start = end = 0
        payload: memoryview | None = None  # the READ answer being received
        filled = 0
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        registered = select.POLLIN
        last_progress = time.monotonic()
        while len(results) < total:
            # Queue requests while the window allows.
            while next_send < total:
                op = ops[next_send]
                size = len(op.buffer)
                inflight = next_send - len(results)
                if inflight and (
                    inflight >= MAX_INFLIGHT_OPS or inflight_bytes + size > MAX_INFLIGHT_BYTES
                ):
                    break
                grant = op.grant if len(op.grant) == GRANT_BYTES else _NO_GRANT
                pending.append(
                    memoryview(
                        REQUEST.pack(
                            REQUEST_MAGIC,
                            op.op,
                            op.offset,
                            size,
                            uuid.UUID(op.segment_id).bytes,
                            grant,
                        )
                    )
                )
                if op.op == OP_WRITE and size:
                    pending.append(op.buffer.cast("B") if op.buffer.format != "B" else op.buffer)
                inflight_bytes += size
                next_send += 1
            progressed = False
            if pending:
                try:
                    sent = sock.sendmsg([pending[i] for i in range(min(len(pending), MAX_IOV))])
                except (BlockingIOError, InterruptedError):
                    sent = 0
                if sent:
                    advance(pending, sent)
                    progressed = True
            elif tls is not None and tls.flush():
                progressed = True
            # Receive answers.
            try:
                if payload is not None and len(payload) - filled >= _DIRECT_BYTES:
                    n = sock.recv_into(payload[filled:])
                    if n == 0:
                        raise ConnectionError("connection closed by peer")
                    filled += n
                else:
                    if start == end:
                        start = end = 0
                    elif end == STAGING_BYTES:
                        staging[: end - start] = staging[start:end]
                        start, end = 0, end - start
                    n = sock.recv_into(view[end:])
                    if n == 0:
                        raise ConnectionError("connection closed by peer")
                    end += n
                self.response_bytes += n
                progressed = True
            except (BlockingIOError, InterruptedError):
                pass
            # Parse what has arrived.
            while len(results) < total:
                if payload is not None:
                    have = min(end - start, len(payload) - filled)
                    if have:
                        payload[filled : filled + have] = view[start : start + have]
                        start += have
                        filled += have
                    if filled < len(payload):
                        break
                    payload = None
                    inflight_bytes -= len(ops[len(results)].buffer)
                    results.append(0)
                    continue
                if end - start < RESPONSE.size:
                    break
                magic, _, status, length = RESPONSE.unpack_from(staging, start)
                start += RESPONSE.size
                op = ops[len(results)]
                if magic != RESPONSE_MAGIC:
                    raise ValueError("bad response magic")
                if status == 0 and op.op == OP_READ:
                    if length != len(op.buffer):
                        raise ValueError("peer answered with a different length")
                    payload = op.buffer.cast("B") if op.buffer.format != "B" else op.buffer
                    filled = 0
                    continue
                inflight_bytes -= len(op.buffer)
                results.append(status)
                if status != 0 and op.op == OP_WRITE:  # the server closes after this
                    results.extend([int(ErrorCode.TRANSFER_FAIL)] * (total - len(results)))
                    return results
            if len(results) >= total:
                break
            now = time.monotonic()
            if progressed:
                last_progress = now
                continue
            if now - last_progress >= STALL_TIMEOUT_S:
                raise _Stalled(f"no progress for {STALL_TIMEOUT_S:g} s")
            backlog = tls is not None and tls.has_backlog
            wanted = select.POLLIN | (select.POLLOUT if pending or backlog else 0)
            if wanted != registered:
                poller.modify(sock, wanted)
                registered = wanted
            poller.poll(max(1, int((STALL_TIMEOUT_S - (now - last_progress)) * 1000)))
        return results


class TransferClient:
    """Pooled connections to peers' transfer services. Thread-safe.

    A connection is taken from the pool for one call (a batch is one call) and returned only if
    the call completed cleanly, so a connection is never shared mid-exchange.

    Args:
        socket_buffers: (SO_SNDBUF, SO_RCVBUF) for new sockets, None for the kernel's; by
            default what ``MOONCAKE_PY_TCP_SOCKET_BUFFER`` asks for (4 MiB when unset).
        tls: connect with TLS only (module docstring); None for plaintext.

    Raises:
        ConfigError: by default, when ``MOONCAKE_PY_TCP_SOCKET_BUFFER`` is not a size; a TLS
            file that is not valid PEM.
    """

    def __init__(
        self, *, socket_buffers: BufferChoice = FROM_ENV, tls: TlsConfig | None = None
    ) -> None:
        self._buffers = resolve_buffers(socket_buffers)
        self._tls = tls
        self._tls_context = client_context(tls) if tls is not None else None
        self._lock = threading.Lock()
        self._idle: dict[str, list[tuple[Connection, float]]] = {}
        self._closed = False

    def run(self, endpoint: str, ops: Sequence[TransferOp]) -> list[int]:
        """Perform ``ops`` against the peer at ``endpoint``, pipelined on one connection.

        Returns:
            Per op: 0 or a negative error code from the peer.

        Raises:
            TransferError: the connection failed or stalled; the state of unanswered ops is
                unknown.
        """
        try:
            conn, reused = self._take(endpoint)
        except (OSError, ValueError) as exc:  # ValueError: an endpoint that is no host:port
            raise TransferError(
                ErrorCode.TRANSFER_FAIL, f"cannot connect to {endpoint}: {exc}"
            ) from exc
        exchange = _Exchange(conn, ops)
        try:
            results = exchange.run()
        except (OSError, ValueError) as exc:
            conn.close()
            retry = (
                reused
                and exchange.response_bytes == 0
                and (isinstance(exc, ConnectionError) or _is_reset(exc))
            )
            if not retry:
                raise TransferError(
                    ErrorCode.TRANSFER_FAIL, f"transfer with {endpoint} failed: {exc}"
                ) from exc
            log.debug("pooled connection to %s was closed (%s); retrying once", endpoint, exc)
            return self._run_fresh(endpoint, ops)
        self._finish(endpoint, conn, ops, results)
        return results

    def _run_fresh(self, endpoint: str, ops: Sequence[TransferOp]) -> list[int]:
        try:
            conn = self._connect(endpoint)
        except (OSError, ValueError) as exc:
            raise TransferError(
                ErrorCode.TRANSFER_FAIL, f"cannot connect to {endpoint}: {exc}"
            ) from exc
        try:
            results = _Exchange(conn, ops).run()
        except (OSError, ValueError) as exc:
            conn.close()
            raise TransferError(
                ErrorCode.TRANSFER_FAIL, f"transfer with {endpoint} failed: {exc}"
            ) from exc
        self._finish(endpoint, conn, ops, results)
        return results

    def _finish(
        self, endpoint: str, conn: Connection, ops: Sequence[TransferOp], results: list[int]
    ) -> None:
        if any(r != 0 for r, op in zip(results, ops, strict=True) if op.op == OP_WRITE):
            conn.close()  # the server closes after a rejected write
        else:
            self._give_back(endpoint, conn)

    def _connect(self, endpoint: str) -> Connection:
        host, _, port = endpoint.rpartition(":")
        conn = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
        tune(conn, self._buffers)
        if self._tls is not None and self._tls_context is not None:
            name = check_hostname_target(self._tls, host.strip("[]"))
            return connect_tls(conn, self._tls_context, name, CONNECT_TIMEOUT_S)
        conn.setblocking(False)
        return conn

    def _take(self, endpoint: str) -> tuple[Connection, bool]:
        """A connection to ``endpoint`` and whether it came from the pool."""
        while True:
            with self._lock:
                idle = self._idle.get(endpoint)
                if not idle:
                    break
                conn, since = idle.pop()
            if time.monotonic() - since <= POOL_IDLE_S and _still_open(conn):
                return conn, True
            conn.close()
        return self._connect(endpoint), False

    def _give_back(self, endpoint: str, conn: Connection) -> None:
        with self._lock:
            if not self._closed:
                self._idle.setdefault(endpoint, []).append((conn, time.monotonic()))
                return
        conn.close()

    def close(self) -> None:
        """Close every pooled connection."""
        with self._lock:
            self._closed = True
            pools = list(self._idle.values())
            self._idle.clear()
        for pool in pools:
            for conn, _ in pool:
                conn.close()


def _is_reset(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ECONNRESET, errno.EPIPE)


def _still_open(conn: Connection) -> bool:
    """A pooled (non-blocking, idle) connection the peer has not closed or reset."""
    if isinstance(conn, TlsStream):
        return conn.still_open()
    try:
        conn.recv(1, socket.MSG_PEEK)  # EOF, or bytes nobody asked for: unusable either way
        return False
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False
