"""TLS for the TCP transfer service: a memory-BIO TLS stream for the client's full-duplex
exchange, and the server's TLS socket helpers.

Client side. The client drives each connection full duplex on one thread with a non-blocking
socket, ``poll``, ``sendmsg`` and ``recv_into`` (:mod:`mooncake_py.client.transfer`).
``ssl.SSLSocket`` has no ``sendmsg``, and a non-blocking one raises ``SSLWantReadError`` from a
send or ``SSLWantWriteError`` from a receive, which that loop cannot express; and one
``SSLSocket`` must not be read and written from two threads at once (OpenSSL's rule), which
rules out a reader thread next to a writer. So :class:`TlsStream` keeps the TLS state in an
``ssl.SSLObject`` between two ``ssl.MemoryBIO``\\ s and moves ciphertext itself, with the
socket calls the plaintext path uses, exposing the same three calls:

- ``sendmsg(buffers)`` encrypts up to ``SEND_BUDGET`` bytes of the buffers, writes what the
  socket takes and keeps the rest of the ciphertext (the *backlog*); it returns the plaintext
  bytes accepted, and raises ``BlockingIOError`` while an earlier backlog is still unsent (so
  memory stays bounded by about one budget). :meth:`TlsStream.flush` sends the backlog when no
  new plaintext is queued; :attr:`TlsStream.has_backlog` says the socket is wanted writable.
- ``recv_into(view)`` decrypts into ``view`` (no copy through a bytes object), reading the
  socket when the TLS layer has no plaintext; ``BlockingIOError`` when neither has any, 0 at
  the end of the stream (an orderly TLS close or a TCP end alike).
- ``fileno()`` is the socket's, for ``poll``.

No plaintext is buffered inside: ``recv_into`` reads only what TLS has decrypted or can
decrypt, so ``poll`` waking on the socket is always right; records the TLS layer answers by
itself (key updates) join the backlog.

Server side. The server's connections are blocking sockets with a timeout, one thread each:
an ``SSLSocket`` (made without a handshake in the accept loop, handshaken by the connection's
thread, so a stalled handshake delays nobody else) works there as is, except ``sendmsg``:
:func:`send_tls_buffers` coalesces small answers into one record-sized write.

Thread-safety: a :class:`TlsStream` belongs to one exchange at a time (the client's pool hands
a connection to one call), like the socket it wraps.
"""

from __future__ import annotations

import select
import socket
import ssl
import time
from collections.abc import Sequence
from typing import cast

SEND_BUDGET = 256 * 1024
"""Plaintext bytes one ``sendmsg`` encrypts at most (bounds the ciphertext held back)."""

_RAW_READ = 256 * 1024
_COALESCE_BYTES = 64 * 1024  # server: answers smaller than this are joined into one write


class TlsStream:
    """A client TLS connection over a non-blocking socket, used like one (module docstring).

    Args:
        raw: a connected, non-blocking TCP socket; the stream owns it from now on.
        context: from :func:`mooncake_py.tls.client_context`.
        server_hostname: the name the peer's certificate must carry
            (:func:`mooncake_py.tls.check_hostname_target`).
    """

    __slots__ = ("raw", "_tls", "_incoming", "_outgoing", "_backlog", "_scratch")

    def __init__(self, raw: socket.socket, context: ssl.SSLContext, server_hostname: str) -> None:
        self.raw = raw
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(
            self._incoming, self._outgoing, server_side=False, server_hostname=server_hostname
        )
        self._backlog = memoryview(b"")
        self._scratch = memoryview(bytearray(_RAW_READ))

    def fileno(self) -> int:
        """The socket's descriptor (for ``poll``)."""
        return self.raw.fileno()

    def close(self) -> None:
        """Close the socket (no TLS close message: the peer treats the end as a close)."""
        self.raw.close()

    @property
    def has_backlog(self) -> bool:
        """Whether ciphertext waits for the socket to become writable."""
        return bool(self._backlog)

    def handshake(self, timeout_s: float) -> None:
        """Run the TLS handshake, waiting at most ``timeout_s`` in all.

        Raises:
            ssl.SSLError: the peer is not a TLS server, its certificate is not trusted or
                does not name ``server_hostname``, or it refused ours.
            TimeoutError: the handshake did not finish in time.
            ConnectionError: the peer closed the connection during the handshake.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                pass
            self._queue_output()
            self._drain(deadline)
            self._wait(select.POLLIN, deadline)
            n = self.raw.recv_into(self._scratch)
            if n == 0:
                raise ConnectionError("connection closed during the TLS handshake")
            self._incoming.write(self._scratch[:n])
        self._queue_output()
        self._drain(deadline)

    def sendmsg(self, buffers: Sequence[memoryview]) -> int:
        """Encrypt and send the start of ``buffers``; returns the plaintext bytes accepted.

        Raises:
            BlockingIOError: ciphertext of an earlier call is still unsent.
            OSError: the socket failed.
        """
        if self._backlog:
            self.flush()
            if self._backlog:
                raise BlockingIOError
        accepted = 0
        write = self._tls.write
        for buffer in buffers:
            room = SEND_BUDGET - accepted
            accepted += write(buffer[:room] if len(buffer) > room else buffer)
            if accepted >= SEND_BUDGET:
                break
        self._queue_output()
        self.flush()
        return accepted

    def flush(self) -> bool:
        """Send what the socket takes of the backlog now; whether any byte moved.

        Raises:
            OSError: the socket failed.
        """
        backlog = self._backlog
        if not backlog:
            return False
        try:
            sent = self.raw.send(backlog)
        except (BlockingIOError, InterruptedError):
            return False
        self._backlog = backlog[sent:]
        return sent > 0

    def recv_into(self, view: memoryview, nbytes: int = 0) -> int:
        """Decrypt up to ``nbytes`` (default ``len(view)``) bytes into ``view``.

        Returns:
            The bytes written into ``view``; 0 at the end of the stream.

        Raises:
            BlockingIOError: nothing to decrypt and nothing on the socket yet.
            ssl.SSLError: the peer sent something that is not valid TLS, or an alert (such as
                refusing a missing client certificate).
            OSError: the socket failed.
        """
        size = nbytes or len(view)
        got = 0
        read = self._tls.read
        while got < size:
            try:
                # With a buffer, read() returns the count (typeshed knows only bytes). It
                # yields one TLS record (16 KiB at most) a call: loop while records are there.
                n = cast(int, read(size - got, view[got:] if got else view))
            except ssl.SSLWantReadError:
                if got:
                    break
                filled = self.raw.recv_into(self._scratch)  # BlockingIOError: nothing yet
                if filled == 0:
                    return 0
                self._incoming.write(self._scratch[:filled])
                continue
            except ssl.SSLZeroReturnError:  # the peer's orderly TLS close
                break
            if n == 0:
                break
            got += n
        if self._outgoing.pending:  # a record the TLS layer answers (a key update)
            self._queue_output()
        return got

    def still_open(self) -> bool:
        """For a pooled, idle connection: whether the peer has neither closed it nor sent
        data nobody asked for (TLS's own records, such as session tickets, are fine)."""
        try:
            got = self.raw.recv_into(self._scratch)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if got == 0:
            return False
        self._incoming.write(self._scratch[:got])
        try:
            self._tls.read(1)
        except ssl.SSLWantReadError:
            return True
        except (ssl.SSLError, OSError):
            return False
        return False  # application data on an idle connection: out of protocol

    def _queue_output(self) -> None:
        if self._outgoing.pending:
            out = self._outgoing.read()
            if self._backlog:  # rare: a key update answered while a backlog waits
                out = bytes(self._backlog) + out
            self._backlog = memoryview(out)

    def _drain(self, deadline: float) -> None:
        """Send the whole backlog (handshake only), waiting for the socket until ``deadline``."""
        while self._backlog:
            if not self.flush():
                self._wait(select.POLLOUT, deadline)

    def _wait(self, events: int, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("TLS handshake timed out")
        poller = select.poll()
        poller.register(self.raw, events)
        if not poller.poll(max(1, int(remaining * 1000))):
            raise TimeoutError("TLS handshake timed out")


def connect_tls(
    raw: socket.socket, context: ssl.SSLContext, server_hostname: str, timeout_s: float
) -> TlsStream:
    """A handshaken :class:`TlsStream` over ``raw`` (made non-blocking); closes ``raw`` on
    failure.

    Raises:
        ssl.SSLError, TimeoutError, ConnectionError: as :meth:`TlsStream.handshake`.
    """
    raw.setblocking(False)
    stream = TlsStream(raw, context, server_hostname)
    try:
        stream.handshake(timeout_s)
    except BaseException:
        raw.close()
        raise
    return stream


def send_tls_buffers(sock: socket.socket, buffers: list[memoryview]) -> None:
    """Send every buffer in order over a blocking TLS socket (an ``ssl.SSLSocket``; typed as
    the plain socket it stands in for), joining runs of small buffers
    (answer headers) into one write, so that each does not become a TLS record of its own.

    The socket's timeout applies to each underlying send, as ``send_buffers`` does.

    Raises:
        OSError: the socket failed or timed out (``ssl.SSLError`` included).
    """
    joined = bytearray()
    for buffer in buffers:
        if len(buffer) < _COALESCE_BYTES:
            joined += buffer
            if len(joined) < _COALESCE_BYTES:
                continue
        if joined:
            sock.sendall(joined)
            joined = bytearray()
        if len(buffer) >= _COALESCE_BYTES:
            sock.sendall(buffer)
    if joined:
        sock.sendall(joined)
