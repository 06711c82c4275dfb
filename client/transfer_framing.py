"""The TCP transfer service's wire format and socket helpers, shared by its server and client
(:mod:`mooncake_py.client.transfer`).

Framing (little-endian, fixed size, one request per header):

    request  = magic "MCPY" | op u8 | 3 pad | offset u64 | length u64 | segment uuid (16 bytes)
               | grant (41 bytes)                                          (81 bytes in all)
               [+ length payload bytes when op == WRITE]
    response = magic "MCPR" | op u8 | 3 pad | status i32 | length u64      (24 bytes)
               [+ length payload bytes when op == READ and status == 0]

``grant`` is the master's capability for a range of the segment holding the request's range
(:func:`mooncake_py.capability.grant_of`, :data:`~mooncake_py.capability.GRANT_BYTES` bytes:
offset u64 | length u64 | mode u8 | expires_ms u64 | tag 16 bytes), or 41 zero bytes when the
sender has none (always refused). ``status`` is 0 or a negative ErrorCode: INVALID_PARAMS for
a malformed header, an unknown segment or a range outside the segment, ILLEGAL_CLIENT (-601)
when the grant does not allow the request (see :mod:`mooncake_py.client.transfer_server`).
Requests on one connection are answered in order.

A segment may be a disk segment (the owner's disk tier,
:class:`~mooncake_py.client.disk_store.DiskStore`): requests name it and its offsets exactly
as for a memory segment (a disk replica's offset, plus k for a partial read), under a grant
for that range. Only READ is served on it: a WRITE gets INVALID_PARAMS (and the connection is
closed, as after any refused WRITE). A disk READ may also fail with INVALID_PARAMS (the range
is not inside one object), FILE_NOT_FOUND (-1100: the object is gone) or FILE_READ_FAIL
(-1102: unreadable, torn or corrupt); such an answer carries no payload.

Socket buffers. Every transfer socket (the client's connections and the server's accepted
ones) asks for ``SO_SNDBUF`` and ``SO_RCVBUF`` of ``SOCKET_BUFFER_BYTES`` (4 MiB; the kernel
caps the request at ``net.core.wmem_max`` / ``rmem_max``). The environment variable
``MOONCAKE_PY_TCP_SOCKET_BUFFER`` overrides that for the whole process: a size (``212992``,
``256kb``, ``4mb``) requests that many bytes for both buffers, and ``0`` leaves both to the
kernel (its defaults, with receive autotuning). It is read once, when the first transfer
server or client of the process is created; an invalid value makes that creation fail with
:class:`~mooncake_py.units.ConfigError`. A server or client given ``socket_buffers``
explicitly ignores the variable.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import socket
import struct
from collections import deque
from typing import Literal

from mooncake_py.capability import GRANT_BYTES
from mooncake_py.units import parse_size

REQUEST = struct.Struct(f"<4sB3xQQ16s{GRANT_BYTES}s")
"""magic, op, offset, length, segment uuid, grant."""
RESPONSE = struct.Struct("<4sB3xiQ")
"""magic, op, status, length."""
REQUEST_MAGIC = b"MCPY"
RESPONSE_MAGIC = b"MCPR"
OP_READ = 1
OP_WRITE = 2
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
"""SO_SNDBUF / SO_RCVBUF requested when ``MOONCAKE_PY_TCP_SOCKET_BUFFER`` is unset."""
SOCKET_BUFFER_ENV = "MOONCAKE_PY_TCP_SOCKET_BUFFER"
MAX_IOV = 512
"""Buffers handed to one ``sendmsg``."""
STALL_TIMEOUT_S = 5.0
"""Either end fails an exchange once no byte of it has moved for this long."""
STAGING_BYTES = 256 * 1024
"""Headers and small payloads are received in chunks of up to this many bytes."""

SocketBuffers = tuple[int, int] | None
"""(SO_SNDBUF, SO_RCVBUF) to request on transfer sockets, or None to leave the kernel's."""


class _FromEnv(enum.Enum):
    FROM_ENV = "from-env"


FROM_ENV: Literal[_FromEnv.FROM_ENV] = _FromEnv.FROM_ENV
"""``socket_buffers`` default: what ``MOONCAKE_PY_TCP_SOCKET_BUFFER`` asks for."""
BufferChoice = SocketBuffers | Literal[_FromEnv.FROM_ENV]


@functools.cache
def env_socket_buffers() -> SocketBuffers:
    """The socket buffers ``MOONCAKE_PY_TCP_SOCKET_BUFFER`` asks for (read once per process).

    Returns:
        ``(SOCKET_BUFFER_BYTES,) * 2`` when unset or empty, None for ``0`` (the kernel's),
        else ``(n, n)``.

    Raises:
        ConfigError: the variable is not a size.
    """
    text = os.environ.get(SOCKET_BUFFER_ENV, "").strip()
    if not text:
        return (SOCKET_BUFFER_BYTES, SOCKET_BUFFER_BYTES)
    size = parse_size(text, SOCKET_BUFFER_ENV)
    return None if size == 0 else (size, size)


def resolve_buffers(choice: BufferChoice) -> SocketBuffers:
    """``choice`` itself, or the environment's buffers for ``FROM_ENV``.

    Raises:
        ConfigError: ``FROM_ENV`` and the variable is not a size.
    """
    return env_socket_buffers() if choice is FROM_ENV else choice


def tune(sock: socket.socket, buffers: SocketBuffers) -> None:
    """Disable Nagle and request ``buffers`` (best effort: a refused size keeps the kernel's)."""
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
    """Send every buffer in order, ``MAX_IOV`` at a time; the socket's timeout applies to each
    system call, so a slow but moving peer never times out (unlike ``sendall``)."""
    pending = deque(buffers)
    while pending:
        iov = [pending[i] for i in range(min(len(pending), MAX_IOV))]
        sent = sock.sendmsg(iov)
        advance(pending, sent)


def advance(pending: deque[memoryview], sent: int) -> None:
    """Drop ``sent`` bytes from the front of ``pending`` (and any empty buffers there)."""
    while pending:
        head = pending[0]
        if sent >= len(head):
            sent -= len(head)
            pending.popleft()
        else:
            pending[0] = head[sent:]
            return
