"""Client side of the master's stream channel (framing in :mod:`mooncake_py._wire.frames`).

One TCP connection per concurrent caller, kept in a small LIFO pool: a call takes a
connection, sends one frame, reads one frame, and gives the connection back. No extra thread
sits between the caller and the socket, so a small call costs about one socket round trip plus
the message encoding.

One-way sends (:meth:`ChannelClient.send_one_way`) take a connection, write one frame with the
framing's ``ONE_WAY_CALL_ID`` and give the connection back without waiting: the master runs
the call and answers nothing. (Holding such frames back to send them with the next call was
measured slower: the background writer it needs costs more than the write it saves.)

**Ordering**: the next call *the same thread* makes goes over the connection its one-way frame
went to (the thread's next call asks for that connection even when another thread, e.g. the
heartbeat, took it meanwhile: it then waits for that connection to come back, at most the call
timeout). The master runs a connection's frames in order, so it has run the one-way call before
it runs that next call: a thread that ends its reads one-way and then removes the key finds
the key unleased. Calls of *other* threads are not ordered after it.

**Idle connections**: the master closes a connection silent for its idle timeout. Before a
call reuses a connection that sat in the pool for over ``STALE_CHECK_AFTER_S``, a zero-timeout
poll tells whether the master closed it (an idle connection has nothing to read unless it was
closed); such a connection is dropped and another taken, so the call never fails for it.

**TLS** (``tls`` given): every connection is a TLS connection (:func:`mooncake_py.tls.
client_context`, the master's certificate checked against the dialed host or the configured
server name), made and handshaken in the caller's thread before its first frame; a master that
does not answer the handshake (a plaintext one) fails the call with an ``OSError``
(``ssl.SSLError``). The frames are the same.
"""

from __future__ import annotations

import itertools
import select
import socket
import ssl
import threading
import time

from mooncake_py._wire.frames import (
    ONE_WAY_CALL_ID,
    authenticate_frame,
    one_way_frame,
    read_response,
    request_frame,
)
from mooncake_py.tls import TlsConfig, check_hostname_target, client_context

CONNECT_TIMEOUT_S = 5.0

STALE_CHECK_AFTER_S = 0.25
"""A pooled connection idle for longer is checked for a close by the master before reuse."""


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether an idle connection (no call in flight) was closed by the other end: it is then
    readable (end of stream or a reset). O(1), one poll (and one non-blocking read under TLS)."""
    try:
        # poll, not select: select refuses descriptors of 1024 and above.
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        readable = poller.poll(0)
    except (OSError, ValueError):  # closed here already
        return True
    if not readable:
        return False
    if isinstance(sock, ssl.SSLSocket):
        # TLS sends records of its own (TLS 1.3 session tickets) that make an idle
        # connection readable: read them; only an end of stream or an error means closed.
        timeout = sock.gettimeout()
        sock.setblocking(False)
        try:
            sock.recv(1)  # end of stream, or data an idle connection must not have: unusable
            return True
        except ssl.SSLWantReadError:
            return False
        except OSError:
            return True
        finally:
            sock.settimeout(timeout)
    return True


class ChannelError(Exception):
    """The master rejected a frame; ``status`` says why (the framing's status values)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ChannelClient:
    """Calls methods by name over pooled connections to ``host:port``. Thread-safe.

    Args:
        host: the master's address.
        port: its stream-channel port.
        timeout_s: socket timeout of every call.
        token: presented in an ``Authenticate`` frame on every new connection ("" for none).
        tls: connect with TLS only (see the module docstring); None for plaintext.

    Raises:
        ConfigError: a TLS file that is not valid PEM (read once, here).
    """

    def __init__(
        self, host: str, port: int, timeout_s: float, token: str = "", tls: TlsConfig | None = None
    ) -> None:
        self.host = host
        self.port = port
        self._token = token
        self._tls_context = client_context(tls) if tls is not None else None
        self._tls_name = check_hostname_target(tls, host) if tls is not None else host
        self._timeout_s = timeout_s
        self._idle: list[socket.socket] = []
        self._idle_since: dict[socket.socket, float] = {}
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)
        self._waiters = 0
        # Per thread: the connection its last one-way send used, which its next call takes.
        self._local = threading.local()
        # Never ONE_WAY_CALL_ID: ids run over 0 .. 0xFFFFFFFE.
        self._call_ids = itertools.count(1)
        self._closed = False

    def call(self, name: bytes, payload: bytes) -> bytes:
        """Send one request, return the response message bytes.

        Raises:
            OSError: the connection failed (whether the master ran the call is unknown).
            ChannelError: the master answered with a non-zero status.
        """
        sock = self._take()
        call_id = next(self._call_ids) % ONE_WAY_CALL_ID
        try:
            sock.sendall(request_frame(call_id, name, payload))
            answered_id, status, body = read_response(sock)
            while answered_id == ONE_WAY_CALL_ID:
                # A master that predates one-way frames answers them anyway: skip that answer.
                answered_id, status, body = read_response(sock)
        except BaseException:
            self._discard(sock)
            raise
        if answered_id != call_id:
            self._discard(sock)
            raise ConnectionError("stream channel answered out of order")
        self._give_back(sock)
        if status:
            raise ChannelError(status, body.decode("utf-8", "replace"))
        return body

    def send_one_way(self, name: bytes, payload: bytes) -> None:
        """Send one request the master runs without answering; returns once it is written.

        The calling thread's next :meth:`call` runs on the master after this one (see the
        module docstring). Nothing tells whether the master ran it.

        Raises:
            ConnectionError: the client is closed.
            OSError: the connection failed (the master may or may not have run the call).
        """
        sock = self._take()
        try:
            sock.sendall(one_way_frame(name, payload))
        except BaseException:
            self._discard(sock)
            raise
        self._local.follow = sock
        self._give_back(sock)

    def _take(self) -> socket.socket:
        """A connection for one call: the one this thread's last one-way send used, if any."""
        follow: socket.socket | None = getattr(self._local, "follow", None)
        with self._lock:
            if self._closed:
                raise ConnectionError("stream channel is closed")
            taken: socket.socket | None = None
            if follow is not None:
                self._local.follow = None
                taken = self._reclaim(follow)
                if taken is not None and not self._fresh(taken):
                    taken = None
            while taken is None and self._idle:
                taken = self._idle.pop()
                if not self._fresh(taken):
                    taken = None
            if taken is not None:
                return taken
        sock = socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls_context is not None:
            try:  # the handshake runs under the connect timeout
                sock = self._tls_context.wrap_socket(sock, server_hostname=self._tls_name)
            except BaseException:
                sock.close()
                raise
        sock.settimeout(self._timeout_s)
        if self._token:
            try:
                sock.sendall(authenticate_frame(self._token))
                _, status, body = read_response(sock)
            except BaseException:
                sock.close()
                raise
            if status:
                sock.close()
                raise ChannelError(status, body.decode("utf-8", "replace"))
        return sock

    def _reclaim(self, sock: socket.socket) -> socket.socket | None:
        """Take ``sock`` out of the pool, waiting while another thread uses it; None when it
        was closed meanwhile or did not come back within the timeout. Holds the lock."""
        idle = self._idle
        if idle and idle[-1] is sock:  # the common case: nobody touched it
            return idle.pop()
        deadline = time.monotonic() + self._timeout_s
        while not self._closed and sock.fileno() != -1:
            for i in range(len(idle) - 1, -1, -1):
                if idle[i] is sock:
                    del idle[i]
                    return sock
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._waiters += 1
            try:
                self._returned.wait(remaining)
            finally:
                self._waiters -= 1
        return None

    def _fresh(self, sock: socket.socket) -> bool:
        """Whether a connection just taken from the pool may carry a call; a stale one is
        closed. Holds the lock."""
        since = self._idle_since.pop(sock, None)
        if since is None or time.monotonic() - since <= STALE_CHECK_AFTER_S:
            return True
        if _closed_by_peer(sock):
            sock.close()
            return False
        return True

    def _give_back(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(sock)
                self._idle_since[sock] = time.monotonic()
                if self._waiters:
                    self._returned.notify_all()
                return
        sock.close()

    def _discard(self, sock: socket.socket) -> None:
        sock.close()
        with self._lock:
            if self._waiters:
                self._returned.notify_all()

    def close(self) -> None:
        """Close every pooled connection; later calls raise ConnectionError."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._idle_since.clear()
            self._returned.notify_all()
        for sock in idle:
            sock.close()
