"""Client side of the master's stream channel (framing in :mod:`mooncake_py._wire.frames`).

One TCP connection per concurrent caller, kept in a small pool: a call takes a connection,
sends one frame, reads one frame, and gives the connection back. No extra thread sits between
the caller and the socket, so a small call costs about one socket round trip plus the message
encoding.
"""

from __future__ import annotations

import itertools
import socket
import threading

from mooncake_py._wire.frames import authenticate_frame, read_response, request_frame

CONNECT_TIMEOUT_S = 5.0


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
        self._call_ids = itertools.count(1)
        self._closed = False

    def call(self, name: bytes, payload: bytes) -> bytes:
        """Send one request, return the response message bytes.

        Raises:
            OSError: the connection failed (whether the master ran the call is unknown).
            ChannelError: the master answered with a non-zero status.
        """
        sock = self._take()
        call_id = next(self._call_ids) & 0xFFFFFFFF
        try:
            sock.sendall(request_frame(call_id, name, payload))
            answered_id, status, body = read_response(sock)
        except BaseException:
            sock.close()
            raise
        if answered_id != call_id:
            sock.close()
            raise ConnectionError("stream channel answered out of order")
        self._give_back(sock)
        if status:
            raise ChannelError(status, body.decode("utf-8", "replace"))
        return body

    def _take(self) -> socket.socket:
        with self._lock:
            if self._closed:
                raise ConnectionError("stream channel is closed")
            if self._idle:
                return self._idle.pop()
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
        return sock

    def _give_back(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(sock)
                return
        sock.close()

    def close(self) -> None:
        """Close every pooled connection; later calls raise ConnectionError."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()
