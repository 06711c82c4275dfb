"""The TCP transfer service's server: serves this client's segments to its peers.

Wire format: :mod:`mooncake_py.client.transfer_framing`; the client side and its flow control:
:mod:`mooncake_py.client.transfer`.

Resources. At most ``max_connections`` connections are served at once, one thread each; when
that many are open and another is waiting, the connection idle the longest is closed to make
room at once (one eviction per newcomer), and if none is idle the newcomer waits in the accept
backlog (1024 deep, or the kernel's ``somaxconn`` if lower). A connection's staging buffer
(``STAGING_BYTES``) is allocated only once its first byte arrives, so connections that never
send cost a thread and a socket, nothing more. A connection with no request for
``idle_timeout_s`` is closed, and one stalled mid-request (or mid-answer) for
``STALL_TIMEOUT_S``.

Answers are batched: a connection answers everything it has parsed before it waits for more
bytes, and at least every ``_FLUSH_BYTES`` of answers, so a client that pipelines requests
gets answers while it is still sending. Large WRITE payloads are received straight into the
segment mapping; READ answers are sent straight from it.

Capabilities. A request is served only under a grant from the master
(:mod:`mooncake_py.capability`) that was made with the segment's key for the segment's id,
covers the request's range, allows its access (READ or WRITE) and has not expired; each
connection remembers the grants it has verified, so the parts of a multi-part op and repeated
reads under one grant pay for one tag check (:mod:`mooncake_py.client.transfer_grants`).
Refusals, checked in this order:

- a malformed header (bad magic, unknown op): INVALID_PARAMS, then the connection is closed;
- an unknown segment: INVALID_PARAMS;
- no grant, or one that does not allow the request (forged, expired, another segment's, another
  range, READ only for a WRITE): ILLEGAL_CLIENT ("no valid capability"), before anything about
  the segment (such as its size) is looked at;
- a range outside the segment: INVALID_PARAMS.

Disk segments. A segment may also be a disk tier (:class:`DiskSource`, a
:class:`~mooncake_py.client.disk_store.DiskStore`): its offsets are the disk segment's virtual
addresses, one object file each. The checks above run in the same order; then a WRITE is
refused with INVALID_PARAMS (peers never write disk replicas), and a READ is answered with
:meth:`DiskSource.read_range`'s bytes or its code as the status: INVALID_PARAMS for a range not
inside one object, FILE_NOT_FOUND for an object that is gone, FILE_READ_FAIL for one that is
unreadable, torn or corrupt (it is then quarantined, and not a byte of it is sent). A disk
READ is read into a fresh buffer on the connection's thread; memory segments are served as
before, from the mapping, at the cost of one type check per request.

A refused READ is answered with its code and the connection goes on. After a refused WRITE the
connection is closed without reading the payload: it cannot be trusted, nor told apart from the
next header. Not a byte of a segment is sent, nor written, for a refused request.

TLS. A server given a :class:`~mooncake_py.tls.TlsConfig` serves TLS only. The accept loop only
wraps the socket; the handshake runs on the connection's thread under the stall timeout, so a
peer that stalls it (or speaks plaintext, or lacks a required client certificate) is closed
without an answer and delays nobody else. A TLS connection cannot peek, so its first byte is
read into a one-byte buffer and starts the staging buffer; answers are sent with
:func:`~mooncake_py.client.transfer_tls.send_tls_buffers`.
"""

from __future__ import annotations

import contextlib
import logging
import random
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Protocol

from mooncake_py import capability
from mooncake_py.errors import ErrorCode
from mooncake_py.tls import TlsConfig, server_context

from .transfer_framing import (
    FROM_ENV,
    MAX_IOV,
    OP_READ,
    OP_WRITE,
    REQUEST,
    REQUEST_MAGIC,
    RESPONSE,
    RESPONSE_MAGIC,
    STAGING_BYTES,
    STALL_TIMEOUT_S,
    BufferChoice,
    recv_exactly,
    resolve_buffers,
    send_buffers,
    tune,
)
from .transfer_grants import VerifiedGrants
from .transfer_tls import send_tls_buffers

log = logging.getLogger(__name__)

SERVER_IDLE_TIMEOUT_S = 60.0
"""A server connection with no request for this long is closed."""
MAX_CONNECTIONS = 256
"""Connections (and threads) a TransferServer serves at once."""

_FLUSH_BYTES = 1024 * 1024


class DiskSource(Protocol):
    """A disk segment's bytes, as a :class:`~mooncake_py.client.disk_store.DiskStore` serves
    them: called from connection threads, concurrently."""

    def read_range(self, offset: int, length: int) -> memoryview | int:
        """Bytes ``[offset, offset + length)`` of the disk segment, or a negative code."""


SegmentLookup = Callable[[bytes], tuple[memoryview | DiskSource, bytes] | None]
"""Maps a segment uuid (16 bytes) to that segment's bytes and its capability key
(:func:`mooncake_py.capability.new_segment_key`, as mounted; empty: the segment serves
nobody), or None if unknown. The bytes are a writable view of a memory segment, or a
:class:`DiskSource` for a disk segment (served for READ only). Called once per request, from
connection threads."""

_MODE_OF = {OP_READ: capability.READ, OP_WRITE: capability.WRITE}
_INVALID = int(ErrorCode.INVALID_PARAMS)
_ILLEGAL = int(ErrorCode.ILLEGAL_CLIENT)


def _hang_up(sock: socket.socket) -> None:
    """Shut both directions of a connection another thread serves, so its blocked receive
    returns. Called on the socket itself even for TLS: ``SSLSocket.shutdown`` would also drop
    the TLS state under the serving thread's feet."""
    socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Conn:
    __slots__ = ("sock", "idle_since", "served_ops", "served_bytes")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.idle_since: float | None = time.monotonic()
        # Written only by the connection's own thread; summed under the server's lock.
        self.served_ops = 0
        self.served_bytes = 0


UPSTREAM_PORTS = range(12300, 14300)
"""Where upstream's clients pick their port when none is given (their segment name's port)."""

PICK_FROM_UPSTREAM_PORTS = -1
"""``port`` value: a free port of :data:`UPSTREAM_PORTS` (an ephemeral one if none is free)."""


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; see :data:`PICK_FROM_UPSTREAM_PORTS`."""
    if port != PICK_FROM_UPSTREAM_PORTS:
        return socket.create_server((host, port), reuse_port=False)
    for candidate in random.sample(UPSTREAM_PORTS, 32):
        try:
            return socket.create_server((host, candidate), reuse_port=False)
        except OSError:  # taken: try another
            continue
    return socket.create_server((host, 0), reuse_port=False)


class TransferServer:
    """Serves this client's segments over TCP; one thread per connection, at most
    ``max_connections`` of them.

    Args:
        host: address to listen on (a loopback or interface address, never a wildcard by
            default).
        lookup: finds a segment's memory (or disk source) by uuid.
        port: 0 picks a free port; :data:`PICK_FROM_UPSTREAM_PORTS` one of upstream's range.
        socket_buffers: (SO_SNDBUF, SO_RCVBUF) for accepted sockets, None for the kernel's;
            by default what ``MOONCAKE_PY_TCP_SOCKET_BUFFER`` asks for (4 MiB when unset).
        idle_timeout_s: a connection with no request for this long is closed.
        max_connections: connections served at once (see the module docstring).
        tls: serve TLS only, with this certificate (and client certificates required when
            it says so); None serves plaintext.

    Raises:
        OSError: the address could not be bound.
        ConfigError: by default, when ``MOONCAKE_PY_TCP_SOCKET_BUFFER`` is not a size; a TLS
            certificate or key that does not load.
    """

    def __init__(
        self,
        host: str,
        lookup: SegmentLookup,
        port: int = 0,
        *,
        socket_buffers: BufferChoice = FROM_ENV,
        idle_timeout_s: float = SERVER_IDLE_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        tls: TlsConfig | None = None,
    ) -> None:
        self._tls_context = server_context(tls) if tls is not None else None
        self._lookup = lookup
        self._buffers = resolve_buffers(socket_buffers)
        self._idle_timeout_s = idle_timeout_s
        self._slots = threading.Semaphore(max_connections)
        self._listener = _listen(host, port)
        # Room for a burst: a full backlog drops SYNs, which costs the dialer 1 s or more.
        self._listener.listen(1024)
        self.host = host
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._connections: set[_Conn] = set()
        self._ended_ops = self._ended_bytes = 0  # served by connections that have closed
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

    @property
    def served(self) -> tuple[int, int]:
        """``(ops, payload bytes)`` answered with success since start, READs and WRITEs alike.
        An op is counted before its answer is sent, so a client holding an answer sees it."""
        with self._lock:
            ops = self._ended_ops + sum(c.served_ops for c in self._connections)
            size = self._ended_bytes + sum(c.served_bytes for c in self._connections)
        return ops, size

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            # Full: make room for a waiting connection first, then wait for the slot, so a
            # flood of idle connections costs one eviction per newcomer, not one poll period.
            if not self._slots.acquire(blocking=False):
                with contextlib.suppress(OSError, ValueError):
                    if select.select([self._listener], [], [], 0)[0]:  # someone is waiting
                        self._evict_idle()
                if not self._slots.acquire(timeout=0.05):
                    continue
            if self._closed.is_set():
                self._slots.release()
                return
            try:
                sock, _ = self._listener.accept()
            except OSError:
                self._slots.release()
                return
            tune(sock, self._buffers)
            sock.settimeout(min(STALL_TIMEOUT_S, self._idle_timeout_s))
            if self._tls_context is not None:  # no I/O here: the handshake is the thread's
                sock = self._tls_context.wrap_socket(
                    sock, server_side=True, do_handshake_on_connect=False
                )
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
                _hang_up(victim.sock)

    def _serve(self, conn: _Conn) -> None:
        sock = conn.sock
        tls = isinstance(sock, ssl.SSLSocket)
        send = send_tls_buffers if tls else send_buffers
        first = bytearray(1)
        try:
            if isinstance(sock, ssl.SSLSocket):
                sock.do_handshake()
            # A connection that never sends costs no staging buffer (idle floods stay cheap).
            if not self._recv_header_bytes(conn, memoryview(first), 0 if tls else socket.MSG_PEEK):
                return self._end(conn)
        except (OSError, ConnectionError) as exc:
            log.debug("transfer connection ended: %s", exc)
            return self._end(conn)
        staging = bytearray(STAGING_BYTES)
        view = memoryview(staging)
        start = end = 0  # unparsed bytes are staging[start:end]
        if tls:  # TLS cannot peek: the byte read is the first of the staging buffer
            staging[0] = first[0]
            end = 1
        out: list[memoryview] = []
        out_bytes = 0
        out_reads = False  # READ answers in ``out`` still reference segment memory
        grants = VerifiedGrants()
        try:
            while True:
                # One request header, from staging or the socket.
                while end - start < REQUEST.size:
                    if out:  # answer everything before waiting for more
                        send(sock, out)
                        out, out_bytes, out_reads = [], 0, False
                    if start == end:
                        start = end = 0
                        conn.idle_since = time.monotonic()
                    elif start > STAGING_BYTES - REQUEST.size:
                        staging[: end - start] = staging[start:end]
                        start, end = 0, end - start
                    n = self._recv_header_bytes(conn, view[end:])
                    if n == 0:
                        return
                    conn.idle_since = None
                    end += n
                magic, op, offset, length, segment_uuid, grant = REQUEST.unpack_from(staging, start)
                start += REQUEST.size
                if magic != REQUEST_MAGIC or op not in (OP_READ, OP_WRITE):
                    out.append(
                        memoryview(
                            RESPONSE.pack(
                                RESPONSE_MAGIC, op & 0xFF, int(ErrorCode.INVALID_PARAMS), 0
                            )
                        )
                    )
                    send(sock, out)
                    return
                target = self._target(grants, op, offset, length, segment_uuid, grant)
                if isinstance(target, int):  # refused
                    out.append(memoryview(RESPONSE.pack(RESPONSE_MAGIC, op, target, 0)))
                    out_bytes += RESPONSE.size
                    if op == OP_WRITE:
                        send(sock, out)
                        return
                else:
                    if op == OP_READ:
                        conn.served_ops += 1
                        conn.served_bytes += length
                        out.append(memoryview(RESPONSE.pack(RESPONSE_MAGIC, op, 0, length)))
                        if length:
                            out.append(target)
                        out_bytes += RESPONSE.size + length
                        out_reads = True
                    else:
                        if out_reads:  # answer earlier READs before this WRITE lands
                            send(sock, out)
                            out, out_bytes, out_reads = [], 0, False
                        have = min(end - start, length)
                        target[:have] = view[start : start + have]
                        start += have
                        if have < length:
                            recv_exactly(sock, target[have:])
                        conn.served_ops += 1
                        conn.served_bytes += length
                        out.append(memoryview(RESPONSE.pack(RESPONSE_MAGIC, op, 0, length)))
                        out_bytes += RESPONSE.size
                if out_bytes >= _FLUSH_BYTES or len(out) >= MAX_IOV:
                    send(sock, out)
                    out, out_bytes, out_reads = [], 0, False
        except (OSError, ConnectionError) as exc:
            log.debug("transfer connection ended: %s", exc)
        finally:
            self._end(conn)

    def _target(
        self,
        grants: VerifiedGrants,
        op: int,
        offset: int,
        length: int,
        segment_uuid: bytes,
        grant: bytes,
    ) -> memoryview | int:
        """The segment memory a request may access (for a disk segment: the bytes read), or
        the code refusing it (see the module docstring for the order of the checks)."""
        found = self._lookup(segment_uuid)
        if found is None:
            return _INVALID
        segment, key = found
        if not grants.allows(key, segment_uuid, grant, offset, length, _MODE_OF[op]):
            log.debug("transfer request refused: no valid capability")
            return _ILLEGAL
        if isinstance(segment, memoryview):
            if offset + length > len(segment):
                return _INVALID
            return segment[offset : offset + length]
        if op == OP_WRITE:  # disk replicas are written by their owner only, never by peers
            return _INVALID
        return segment.read_range(offset, length)

    def _end(self, conn: _Conn) -> None:
        """Forget a connection whose thread is done with it, and free its slot."""
        with self._lock:
            self._connections.discard(conn)
            self._ended_ops += conn.served_ops
            self._ended_bytes += conn.served_bytes
        conn.sock.close()
        self._slots.release()

    def _recv_header_bytes(self, conn: _Conn, into: memoryview, flags: int = 0) -> int:
        """Receive some bytes of a header (``flags`` as for ``recv_into``); 0 when the
        connection should end (EOF, idle for ``idle_timeout_s`` or, mid-header, stalled for
        ``STALL_TIMEOUT_S``)."""
        waiting_since = time.monotonic()
        while True:
            try:
                return conn.sock.recv_into(into, 0, flags)
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
                _hang_up(conn.sock)
        self._thread.join(timeout=2)
