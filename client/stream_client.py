"""Client side of the master's stream channel (framing in :mod:`mooncake_py._wire.frames`).

One TCP connection per concurrent caller, kept in a small LIFO pool: a call takes a
connection, sends one frame, reads one frame, and gives the connection back. No extra thread
sits between the caller and the socket, so a small call costs about one socket round trip plus
the message encoding.

One-way sends (:meth:`ChannelClient.send_one_way`) write a frame with the framing's
``ONE_WAY_CALL_ID``: the master runs the call and answers nothing. The frame is not written on
its own: it waits on an idle connection, and whichever call takes that connection next sends
it in the same write as its own request (one system call, and one wakeup of the master, for
both). A background thread writes one-way frames that waited ``ONE_WAY_FLUSH_S`` with no call
to carry them, and closing the client writes what is left, so they are delayed by at most that
much. With no idle connection the frame is written at once on a new one.

**Ordering**: the next call *the same thread* makes goes over the connection its one-way frame
went to (the thread's next call asks for that connection even when another thread, e.g. the
heartbeat, took it meanwhile: it then waits for that connection to come back, at most the call
timeout). The master runs a connection's frames in order, so it has run the one-way call before
it runs that next call: a thread that ends its reads one-way and then removes the key finds
the key unleased. Calls of *other* threads are not ordered after it.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time

from mooncake_py._wire.frames import (
    ONE_WAY_CALL_ID,
    authenticate_frame,
    one_way_frame,
    read_response,
    request_frame,
)

CONNECT_TIMEOUT_S = 5.0
ONE_WAY_FLUSH_S = 0.001
"""Longest a one-way frame waits for a call to carry it before it is written on its own."""


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
    """

    def __init__(self, host: str, port: int, timeout_s: float, token: str = "") -> None:
        self.host = host
        self.port = port
        self._token = token
        self._timeout_s = timeout_s
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)
        self._waiters = 0
        # One-way frames waiting on idle connections: connection -> (since, frames). Only idle
        # connections have an entry: taking a connection takes its frames along.
        self._pending: dict[socket.socket, tuple[float, bytearray]] = {}
        self._pending_added = threading.Condition(self._lock)
        self._flusher: threading.Thread | None = None
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
        sock, carried = self._take()
        call_id = next(self._call_ids) % ONE_WAY_CALL_ID
        try:
            frame = request_frame(call_id, name, payload)
            sock.sendall(carried + frame if carried else frame)
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
        """Send one request the master runs without answering, without waiting for anything.

        The frame goes out with the next call on its connection, or within ``ONE_WAY_FLUSH_S``
        (see the module docstring); the calling thread's next :meth:`call` runs on the master
        after it. Nothing tells whether the master ran it.

        Raises:
            ConnectionError: the client is closed.
            OSError: no connection was idle and a new one failed (the call was not sent).
        """
        frame = one_way_frame(name, payload)
        with self._lock:
            if self._closed:
                raise ConnectionError("stream channel is closed")
            if self._idle:
                sock = self._idle[-1]  # the connection the next call takes (LIFO)
                waiting = self._pending.get(sock)
                if waiting is None:
                    self._pending[sock] = (time.monotonic(), bytearray(frame))
                    self._start_flusher()
                    self._pending_added.notify()
                else:
                    waiting[1].extend(frame)
                self._local.follow = sock
                return
        sock, carried = self._take()
        try:
            sock.sendall(carried + frame if carried else frame)
        except BaseException:
            self._discard(sock)
            raise
        self._local.follow = sock
        self._give_back(sock)

    def _start_flusher(self) -> None:
        """Start the thread that writes one-way frames no call carried. Holds the lock."""
        if self._flusher is None:
            self._flusher = threading.Thread(
                target=self._flush_loop, name="mooncake-stream-flush", daemon=True
            )
            self._flusher.start()

    def _flush_loop(self) -> None:
        """Write the one-way frames that waited ``ONE_WAY_FLUSH_S`` on an idle connection."""
        with self._lock:
            while not self._closed:
                if not self._pending:
                    self._pending_added.wait()
                    continue
                now = time.monotonic()
                oldest = min(since for since, _ in self._pending.values())
                if oldest + ONE_WAY_FLUSH_S > now:
                    self._pending_added.wait(oldest + ONE_WAY_FLUSH_S - now)
                    continue
                due = [
                    sock
                    for sock, (since, _) in self._pending.items()
                    if since + ONE_WAY_FLUSH_S <= now
                ]
                batch = []
                for sock in due:
                    _, frames = self._pending.pop(sock)
                    self._idle.remove(sock)
                    batch.append((sock, frames))
                self._lock.release()
                sent = []
                try:
                    for sock, frames in batch:
                        try:
                            sock.sendall(frames)
                            sent.append(sock)
                        except OSError:
                            sock.close()
                finally:
                    self._lock.acquire()
                if self._closed:
                    for sock in sent:
                        sock.close()
                    break
                self._idle.extend(sent)
                if self._waiters:
                    self._returned.notify_all()

    def _take(self) -> tuple[socket.socket, bytes]:
        """A connection for one call, and the one-way frames waiting on it (sent first)."""
        follow: socket.socket | None = getattr(self._local, "follow", None)
        with self._lock:
            if self._closed:
                raise ConnectionError("stream channel is closed")
            taken: socket.socket | None = None
            if follow is not None:
                self._local.follow = None
                taken = self._reclaim(follow)
            if taken is None and self._idle:
                taken = self._idle.pop()
            if taken is not None:
                waiting = self._pending.pop(taken, None)
                return taken, bytes(waiting[1]) if waiting is not None else b""
        sock = socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT_S)
        sock.settimeout(self._timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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
        return sock, b""

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

    def _give_back(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(sock)
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
        """Write the one-way frames still waiting, close every pooled connection; later calls
        raise ConnectionError."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            pending, self._pending = self._pending, {}
            self._returned.notify_all()
            self._pending_added.notify_all()
        for sock in idle:
            waiting = pending.get(sock)
            if waiting is not None:
                with contextlib.suppress(OSError):
                    sock.sendall(waiting[1])
            sock.close()
