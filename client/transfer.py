"""The TCP transfer service: moves replica bytes between clients on different hosts.

Framing (little-endian, fixed size, one request per header):

    request  = magic "MCPY" | op u8 | 3 pad | offset u64 | length u64 | segment uuid (16 bytes)
               [+ length payload bytes when op == WRITE]
    response = magic "MCPR" | op u8 | 3 pad | status i32 | length u64
               [+ length payload bytes when op == READ and status == 0]

``status`` is 0 or a negative ErrorCode. Payload bytes go straight between the socket and their
final place: the server sends from and receives into the segment mapping, the client sends from
and receives into the caller's buffer (``recv_into`` a memoryview), so no intermediate copy is
made in Python. Requests on one connection are answered in order, which lets a client pipeline
a batch: send every request, then read every answer.

A request naming an unknown segment or a range outside it is answered with INVALID_PARAMS; for a
WRITE the connection is then closed, since its payload cannot be trusted.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import uuid
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
IO_TIMEOUT_S = 60.0


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)


def recv_exactly(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``.

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


# ---------------------------------------------------------------------------------------------
# Server


SegmentLookup = Callable[[bytes], memoryview | None]
"""Maps a segment uuid (16 bytes) to a writable view of that segment, or None if unknown."""


class TransferServer:
    """Serves this client's segments over TCP; one thread per connection.

    Args:
        host: address to listen on (a loopback or interface address, never a wildcard by
            default).
        lookup: finds a segment's memory by uuid.
        port: 0 picks a free port.
    """

    def __init__(self, host: str, lookup: SegmentLookup, port: int = 0) -> None:
        self._lookup = lookup
        self._listener = socket.create_server((host, port), reuse_port=False)
        self._listener.listen(128)
        self.host = host
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._accept_loop, name="mooncake-transfer-accept", daemon=True
        )
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """``host:port`` that peers dial."""
        return f"{self.host}:{self.port}"

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            _tune(conn)
            with self._lock:
                self._connections.add(conn)
            threading.Thread(
                target=self._serve, args=(conn,), name="mooncake-transfer-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        header = bytearray(REQUEST.size)
        header_view = memoryview(header)
        try:
            while True:
                try:
                    recv_exactly(conn, header_view)
                except ConnectionError:
                    return
                magic, op, offset, length, segment_uuid = REQUEST.unpack(header)
                if magic != REQUEST_MAGIC or op not in (OP_READ, OP_WRITE):
                    conn.sendall(
                        RESPONSE.pack(RESPONSE_MAGIC, op & 0xFF, int(ErrorCode.INVALID_PARAMS), 0)
                    )
                    return
                segment = self._lookup(segment_uuid)
                if segment is None or offset + length > len(segment):
                    conn.sendall(
                        RESPONSE.pack(RESPONSE_MAGIC, op, int(ErrorCode.INVALID_PARAMS), 0)
                    )
                    if op == OP_WRITE:
                        return
                    continue
                target = segment[offset : offset + length]
                if op == OP_READ:
                    conn.sendall(RESPONSE.pack(RESPONSE_MAGIC, op, 0, length))
                    conn.sendall(target)
                else:
                    recv_exactly(conn, target)
                    conn.sendall(RESPONSE.pack(RESPONSE_MAGIC, op, 0, length))
        except OSError as exc:
            log.debug("transfer connection ended: %s", exc)
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

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
                conn.shutdown(socket.SHUT_RDWR)
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


class TransferClient:
    """Pooled connections to peers' transfer services. Thread-safe.

    A connection is taken from the pool for one call (a batch is one call) and returned only if
    the call completed cleanly, so a connection is never shared mid-exchange.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[str, list[socket.socket]] = {}
        self._closed = False

    def run(self, endpoint: str, ops: Sequence[TransferOp]) -> list[int]:
        """Perform ``ops`` against the peer at ``endpoint``, pipelined on one connection.

        Returns:
            Per op: 0 or a negative error code from the peer.

        Raises:
            TransferError: the connection failed; the state of unanswered ops is unknown.
        """
        try:
            conn = self._take(endpoint)
        except OSError as exc:
            raise TransferError(
                ErrorCode.TRANSFER_FAIL, f"cannot connect to {endpoint}: {exc}"
            ) from exc
        try:
            results = self._exchange(conn, ops)
        except (OSError, ValueError) as exc:
            conn.close()
            raise TransferError(
                ErrorCode.TRANSFER_FAIL, f"transfer with {endpoint} failed: {exc}"
            ) from exc
        if any(r != 0 for r, op in zip(results, ops, strict=True) if op.op == OP_WRITE):
            conn.close()  # the server closes after a rejected write
        else:
            self._give_back(endpoint, conn)
        return results

    def _exchange(self, conn: socket.socket, ops: Sequence[TransferOp]) -> list[int]:
        for op in ops:
            header = REQUEST.pack(
                REQUEST_MAGIC, op.op, op.offset, len(op.buffer), uuid.UUID(op.segment_id).bytes
            )
            if op.op == OP_WRITE:
                conn.sendall(header)
                conn.sendall(op.buffer)
            else:
                conn.sendall(header)
        results: list[int] = []
        response = bytearray(RESPONSE.size)
        response_view = memoryview(response)
        for op in ops:
            recv_exactly(conn, response_view)
            magic, _, status, length = RESPONSE.unpack(response)
            if magic != RESPONSE_MAGIC:
                raise ValueError("bad response magic")
            if status == 0 and op.op == OP_READ:
                if length != len(op.buffer):
                    raise ValueError("peer answered with a different length")
                recv_exactly(conn, op.buffer)
            results.append(status)
            if status != 0 and op.op == OP_WRITE:
                break
        results.extend([int(ErrorCode.TRANSFER_FAIL)] * (len(ops) - len(results)))
        return results

    def _take(self, endpoint: str) -> socket.socket:
        with self._lock:
            idle = self._idle.get(endpoint)
            if idle:
                return idle.pop()
        host, _, port = endpoint.rpartition(":")
        conn = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
        conn.settimeout(IO_TIMEOUT_S)
        _tune(conn)
        return conn

    def _give_back(self, endpoint: str, conn: socket.socket) -> None:
        with self._lock:
            if not self._closed:
                self._idle.setdefault(endpoint, []).append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close every pooled connection."""
        with self._lock:
            self._closed = True
            pools = list(self._idle.values())
            self._idle.clear()
        for pool in pools:
            for conn in pool:
                conn.close()
