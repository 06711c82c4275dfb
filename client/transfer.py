"""The TCP transfer service: moves replica bytes between clients on different hosts.

Framing (little-endian, fixed size, one request per header):

    request  = magic "MCPY" | op u8 | 3 pad | offset u64 | length u64 | segment uuid (16 bytes)
               [+ length payload bytes when op == WRITE]
    response = magic "MCPR" | op u8 | 3 pad | status i32 | length u64
               [+ length payload bytes when op == READ and status == 0]

``status`` is 0 or a negative ErrorCode. Requests on one connection are answered in order.

Flow control. A client pipelines a batch on one connection but keeps at most
``MAX_INFLIGHT_OPS`` requests, and ``MAX_INFLIGHT_BYTES`` of request plus response payload,
unanswered at a time (one op is always allowed, whatever its size). The client drives the
connection full duplex (non-blocking socket, ``poll``): it reads answers whenever they arrive
while it still has requests to send, so neither side can end up blocked in ``send`` with the
other blocked in ``send`` too, whatever the socket buffer sizes.

Timeouts scale with progress: an exchange fails once no byte has moved either way for
``STALL_TIMEOUT_S``, however long the whole transfer has been running. ``sendall`` is not used,
since its timeout bounds the whole call; every send and receive is a single system call.

Copies. Large payloads go straight between the socket and their final place (the segment
mapping on the server, the caller's buffer on the client). Headers and small READ answers are
received in chunks into a staging buffer and copied out, which saves a system call per op.

Server resources. At most ``max_connections`` connections are served at once, one thread each;
when that many are open, the connection idle the longest is closed to make room, and if none
is idle the new connection waits in the accept backlog. A connection with no request for
``idle_timeout_s`` is closed.

Retries. A client connection idle in its pool may have been closed by the server. Before
reuse, a pooled connection is checked (a non-blocking peek must find no EOF) and one idle for
longer than ``POOL_IDLE_S`` is dropped. If an exchange on a reused connection still fails with
a connection error (EOF, reset, broken pipe — not a stall) before any byte of any answer
arrived, the whole call is run once more on a fresh connection. That is safe for both ops: a
READ only refills the caller's buffer (untouched so far, since no answer byte arrived), and a
WRITE only stores the same bytes again at the same offsets of a range the caller still has
reserved. Nothing else is retried.

A request naming an unknown segment or a range outside it is answered with INVALID_PARAMS; for a
WRITE the connection is then closed, since its payload cannot be trusted.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import select
import socket
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mooncake_py.errors import ErrorCode, TransferError

log = logging.getLogger(__name__)

REQUEST = struct.Struct("<4sB3xQQ16s")
RESPONSE = struct.Struct("<4sB3xiQ")
REQUEST_MAGIC = b"MCPY"
RESPONSE_MAGIC = b"MCPR"
OP_READ = 1
OP_WRITE = 2
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
CONNECT_TIMEOUT_S = 5.0
STALL_TIMEOUT_S = 5.0
"""An exchange (either end) fails once no byte has moved for this long."""
MAX_INFLIGHT_OPS = 1024
MAX_INFLIGHT_BYTES = 32 * 1024 * 1024
SERVER_IDLE_TIMEOUT_S = 60.0
"""A server connection with no request for this long is closed."""
POOL_IDLE_S = 30.0
"""A pooled client connection idle for longer than this is dropped rather than reused."""
MAX_CONNECTIONS = 256
"""Connections (and threads) a TransferServer serves at once."""

_STAGING_BYTES = 256 * 1024
_DIRECT_BYTES = 64 * 1024  # payloads at least this large bypass the staging buffer
_MAX_IOV = 512
_FLUSH_BYTES = 1024 * 1024

SocketBuffers = tuple[int, int] | None
"""(SO_SNDBUF, SO_RCVBUF) to request on transfer sockets, or None to leave the kernel's."""


def _tune(sock: socket.socket, buffers: SocketBuffers = (SOCKET_BUFFER_BYTES,) * 2) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if buffers is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffers[0])
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffers[1])


def recv_exactly(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock`` (its timeout applies to each receive, not the whole view).

    Raises:
        ConnectionError: the peer closed the connection first.
    """
    received = 0
    total = len(view)
    while received < total:
        n = sock.recv_into(view[received:], total - received)
        if n == 0:
            raise ConnectionError("connection closed by peer")
        received += n


def send_buffers(sock: socket.socket, buffers: list[memoryview]) -> None:
    """Send every buffer in order, ``_MAX_IOV`` at a time; the socket's timeout applies to each
    system call, so a slow but moving peer never times out (unlike ``sendall``)."""
    pending = deque(buffers)
    while pending:
        iov = [pending[i] for i in range(min(len(pending), _MAX_IOV))]
        sent = sock.sendmsg(iov)
        _advance(pending, sent)


def _advance(pending: deque[memoryview], sent: int) -> None:
    """Drop ``sent`` bytes from the front of ``pending`` (and any empty buffers there)."""
    while pending:
        head = pending[0]
        if sent >= len(head):
            sent -= len(head)
            pending.popleft()
        else:
            pending[0] = head[sent:]
            return


# ---------------------------------------------------------------------------------------------
# Server


SegmentLookup = Callable[[bytes], memoryview | None]
"""Maps a segment uuid (16 bytes) to a writable view of that segment, or None if unknown."""


class _Conn:
    __slots__ = ("sock", "idle_since")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.idle_since: float | None = time.monotonic()


class TransferServer:
    """Serves this client's segments over TCP; one thread per connection, at most
    ``max_connections`` of them.

    Args:
        host: address to listen on (a loopback or interface address, never a wildcard by
            default).
        lookup: finds a segment's memory by uuid.
        port: 0 picks a free port.
        socket_buffers: (SO_SNDBUF, SO_RCVBUF) for accepted sockets, None for the kernel's.
        idle_timeout_s: a connection with no request for this long is closed.
        max_connections: connections served at once (see the module docstring).
    """

    def __init__(
        self,
        host: str,
        lookup: SegmentLookup,
        port: int = 0,
        *,
        socket_buffers: SocketBuffers = (SOCKET_BUFFER_BYTES, SOCKET_BUFFER_BYTES),
        idle_timeout_s: float = SERVER_IDLE_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self._lookup = lookup
        self._buffers = socket_buffers
        self._idle_timeout_s = idle_timeout_s
        self._slots = threading.Semaphore(max_connections)
        self._listener = socket.create_server((host, port), reuse_port=False)
        self._listener.listen(128)
        self.host = host
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._connections: set[_Conn] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._accept_loop, name="mooncake-transfer-accept", daemon=True
        )
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """``host:port`` that peers dial."""
        return f"{self.host}:{self.port}"

    @property
    def connection_count(self) -> int:
        """Connections being served now."""
        with self._lock:
            return len(self._connections)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            if not self._slots.acquire(timeout=0.05):
                if self._closed.is_set():
                    return
                with contextlib.suppress(OSError, ValueError):
                    if select.select([self._listener], [], [], 0)[0]:  # someone is waiting
                        self._evict_idle()
                continue
            try:
                sock, _ = self._listener.accept()
            except OSError:
                self._slots.release()
                return
            _tune(sock, self._buffers)
            sock.settimeout(min(STALL_TIMEOUT_S, self._idle_timeout_s))
            conn = _Conn(sock)
            with self._lock:
                self._connections.add(conn)
            threading.Thread(
                target=self._serve, args=(conn,), name="mooncake-transfer-conn", daemon=True
            ).start()

    def _evict_idle(self) -> None:
        """At capacity: close the connection idle the longest, if any is idle."""
        with self._lock:
            idle = [c for c in self._connections if c.idle_since is not None]
        if idle:
            victim = min(idle, key=lambda c: c.idle_since or 0.0)
            with contextlib.suppress(OSError):
                victim.sock.shutdown(socket.SHUT_RDWR)

    def _serve(self, conn: _Conn) -> None:
        sock = conn.sock
        staging = bytearray(_STAGING_BYTES)
        view = memoryview(staging)
        start = end = 0  # unparsed bytes are staging[start:end]
        out: list[memoryview] = []
        out_bytes = 0
        out_reads = False  # READ answers in ``out`` still reference segment memory
        try:
            while True:
                # One request header, from staging or the socket.
                while end - start < REQUEST.size:
                    if out:  # answer everything before waiting for more
                        send_buffers(sock, out)
                        out, out_bytes, out_reads = [], 0, False
                    if start == end:
                        start = end = 0
                        conn.idle_since = time.monotonic()
                    elif start > _STAGING_BYTES - REQUEST.size:
                        staging[: end - start] = staging[start:end]
                        start, end = 0, end - start
                    n = self._recv_header_bytes(conn, view[end:])
                    if n == 0:
                        return
                    conn.idle_since = None
                    end += n
                magic, op, offset, length, segment_uuid = REQUEST.unpack_from(staging, start)
                start += REQUEST.size
                if magic != REQUEST_MAGIC or op not in (OP_READ, OP_WRITE):
                    out.append(
                        memoryview(
                            RESPONSE.pack(
                                RESPONSE_MAGIC, op & 0xFF, int(ErrorCode.INVALID_PARAMS), 0
                            )
                        )
                    )
                    send_buffers(sock, out)
                    return
                segment = self._lookup(segment_uuid)
                if segment is None or offset + length > len(segment):
                    out.append(
                        memoryview(
                            RESPONSE.pack(RESPONSE_MAGIC, op, int(ErrorCode.INVALID_PARAMS), 0)
                        )
                    )
                    out_bytes += RESPONSE.size
                    if op == OP_WRITE:
                        send_buffers(sock, out)
                        return
                else:
                    target = segment[offset : offset + length]
                    if op == OP_READ:
                        out.append(memoryview(RESPONSE.pack(RESPONSE_MAGIC, op, 0, length)))
                        if length:
                            out.append(target)
                        out_bytes += RESPONSE.size + length
                        out_reads = True
                    else:
                        if out_reads:  # answer earlier READs before this WRITE lands
                            send_buffers(sock, out)
                            out, out_bytes, out_reads = [], 0, False
                        have = min(end - start, length)
                        target[:have] = view[start : start + have]
                        start += have
                        if have < length:
                            recv_exactly(sock, target[have:])
                        out.append(memoryview(RESPONSE.pack(RESPONSE_MAGIC, op, 0, length)))
                        out_bytes += RESPONSE.size
                if out_bytes >= _FLUSH_BYTES or len(out) >= _MAX_IOV:
                    send_buffers(sock, out)
                    out, out_bytes, out_reads = [], 0, False
        except (OSError, ConnectionError) as exc:
            log.debug("transfer connection ended: %s", exc)
        finally:
            with self._lock:
                self._connections.discard(conn)
            sock.close()
            self._slots.release()

    def _recv_header_bytes(self, conn: _Conn, into: memoryview) -> int:
        """Receive some bytes of a header; 0 when the connection should end (EOF, idle for
        ``idle_timeout_s`` or, mid-header, stalled for ``STALL_TIMEOUT_S``)."""
        waiting_since = time.monotonic()
        while True:
            try:
                return conn.sock.recv_into(into)
            except TimeoutError:
                now = time.monotonic()
                if self._closed.is_set():
                    return 0
                if conn.idle_since is None:  # mid-header: a stall
                    if now - waiting_since >= STALL_TIMEOUT_S:
                        return 0
                elif now - conn.idle_since >= self._idle_timeout_s:
                    log.debug("closing idle transfer connection")
                    return 0

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=2)


# ---------------------------------------------------------------------------------------------
# Client


@dataclass(frozen=True, slots=True)
class TransferOp:
    """One read or write of ``len(buffer)`` bytes at ``offset`` in a remote segment."""

    op: int
    segment_id: str
    offset: int
    buffer: memoryview


class _Stalled(TimeoutError):
    """No byte moved for STALL_TIMEOUT_S."""


class _Exchange:
    """One batch on one non-blocking connection, full duplex, windowed."""

    def __init__(self, sock: socket.socket, ops: Sequence[TransferOp]) -> None:
        self.sock = sock
        self.ops = ops
        self.response_bytes = 0  # answer bytes received so far (0: the peer answered nothing)

    def run(self) -> list[int]:
        sock, ops = self.sock, self.ops
        total = len(ops)
        results: list[int] = []
        pending: deque[memoryview] = deque()  # request bytes queued, not yet sent
        next_send = 0  # ops[:next_send] are queued
        inflight_bytes = 0
        staging = bytearray(_STAGING_BYTES)
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
                pending.append(
                    memoryview(
                        REQUEST.pack(
                            REQUEST_MAGIC, op.op, op.offset, size, uuid.UUID(op.segment_id).bytes
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
                    sent = sock.sendmsg([pending[i] for i in range(min(len(pending), _MAX_IOV))])
                except (BlockingIOError, InterruptedError):
                    sent = 0
                if sent:
                    _advance(pending, sent)
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
                    elif end == _STAGING_BYTES:
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
            wanted = select.POLLIN | (select.POLLOUT if pending else 0)
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
        socket_buffers: (SO_SNDBUF, SO_RCVBUF) for new sockets, None for the kernel's.
    """

    def __init__(
        self, *, socket_buffers: SocketBuffers = (SOCKET_BUFFER_BYTES, SOCKET_BUFFER_BYTES)
    ) -> None:
        self._buffers = socket_buffers
        self._lock = threading.Lock()
        self._idle: dict[str, list[tuple[socket.socket, float]]] = {}
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
        except OSError as exc:
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
        except OSError as exc:
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
        self, endpoint: str, conn: socket.socket, ops: Sequence[TransferOp], results: list[int]
    ) -> None:
        if any(r != 0 for r, op in zip(results, ops, strict=True) if op.op == OP_WRITE):
            conn.close()  # the server closes after a rejected write
        else:
            self._give_back(endpoint, conn)

    def _connect(self, endpoint: str) -> socket.socket:
        host, _, port = endpoint.rpartition(":")
        conn = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
        _tune(conn, self._buffers)
        conn.setblocking(False)
        return conn

    def _take(self, endpoint: str) -> tuple[socket.socket, bool]:
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

    def _give_back(self, endpoint: str, conn: socket.socket) -> None:
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


def _still_open(conn: socket.socket) -> bool:
    """A pooled (non-blocking, idle) connection the peer has not closed or reset."""
    try:
        conn.recv(1, socket.MSG_PEEK)  # EOF, or bytes nobody asked for: unusable either way
        return False
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False
