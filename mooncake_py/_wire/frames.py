"""The stream channel's framing: the same RPCs as gRPC over one long-lived TCP connection.

A Python gRPC unary call costs several times a plain socket round trip, which dominates small
operations (``is_exist``, small ``get``). Clients therefore send their calls over this channel
when the master offers it (ServiceReady's ``fast_port``) and use gRPC otherwise. The messages
are exactly those of ``proto/master.proto``; only the framing is ours:

    request  = length u32 | call id u32 | name length u8 | method name | request message
    response = length u32 | call id u32 | status u8     | response message (status 0)
                                                         | UTF-8 error text (status != 0)

(little-endian; ``length`` counts the bytes after the 9-byte header, name included.)
Status: 0 ok, 1 undecodable request, 2 unknown method, 3 unauthenticated, 4 permission denied.
Calls on one connection are answered in order. A frame longer than the master's
``max_message_bytes`` closes the connection.

When the master requires tokens, a connection's first frame must be ``Authenticate`` (call id 0)
with the token as its payload; the connection then acts for that token's tenant, and every
call before it is answered with status 3.

A request with call id ``ONE_WAY_CALL_ID`` (0xFFFFFFFF) is *one-way*: the master runs it like
any other call, in order with the connection's other frames, but writes no response, not even
for a refusal or an error (it logs those at debug level). Clients use it for calls whose answer
they do not need (``EndReads`` of a copy that finished within its lease), so the call costs no
round trip; because frames of one connection run in order, the next call the client sends on
the same connection runs after it. Ordinary calls never use that id.

Every function here is pure or touches only the socket it is given; thread-safe.
"""

from __future__ import annotations

import socket
import struct

HEADER = struct.Struct("<IIB")

STATUS_OK = 0
STATUS_UNDECODABLE = 1
STATUS_UNKNOWN_METHOD = 2
STATUS_UNAUTHENTICATED = 3
STATUS_PERMISSION_DENIED = 4

AUTHENTICATE = b"Authenticate"
AUTHENTICATE_CALL_ID = 0
ONE_WAY_CALL_ID = 0xFFFFFFFF
"""The call id of a one-way request: run it, send no response (see the module docstring)."""

# Small answers arrive whole in the first read: one system call per call.
FIRST_READ_BYTES = 65536


class FrameError(ValueError):
    """A request header the master cannot accept (too long, or a name longer than the frame)."""


def request_frame(call_id: int, name: bytes, payload: bytes) -> bytes:
    """One request frame. O(len(payload))."""
    return HEADER.pack(len(name) + len(payload), call_id, len(name)) + name + payload


def one_way_frame(name: bytes, payload: bytes) -> bytes:
    """One one-way request frame (no response will come). O(len(payload))."""
    return request_frame(ONE_WAY_CALL_ID, name, payload)


def authenticate_frame(token: str) -> bytes:
    """The ``Authenticate`` frame presenting ``token``."""
    return request_frame(AUTHENTICATE_CALL_ID, AUTHENTICATE, token.encode())


def response_frame(call_id: int, status: int, body: bytes) -> bytes:
    """One response frame: the response message for status 0, error text otherwise."""
    return HEADER.pack(len(body), call_id, status) + body


def next_request(
    buffer: bytearray, start: int, max_frame: int
) -> tuple[int, int, bytes, bytes] | None:
    """The request frame at ``buffer[start:]``, if it has fully arrived.

    Returns:
        ``(end, call id, method name, payload)`` with ``end`` the offset just past the frame;
        None while the frame is incomplete.

    Raises:
        FrameError: the header announces more than ``max_frame`` bytes or a name longer than
            the frame; checked as soon as the header is in, so an oversized frame is refused
            before its body is buffered.

    Complexity: O(frame length) for the copies of name and payload.
    """
    if len(buffer) - start < HEADER.size:
        return None
    length, call_id, name_length = HEADER.unpack_from(buffer, start)
    if length > max_frame or name_length > length:
        raise FrameError(f"bad frame header: length {length}, name length {name_length}")
    body = start + HEADER.size
    end = body + length
    if len(buffer) < end:
        return None
    return (
        end,
        call_id,
        bytes(buffer[body : body + name_length]),
        bytes(buffer[body + name_length : end]),
    )


def read_response(sock: socket.socket) -> tuple[int, int, bytes]:
    """Read one response frame from a blocking socket: ``(call id, status, body)``.

    Raises:
        ConnectionError: the master closed the connection mid-frame.
        OSError: the socket failed or timed out.
    """
    data = sock.recv(FIRST_READ_BYTES)
    while len(data) < HEADER.size:
        more = sock.recv(FIRST_READ_BYTES)
        if not more:
            raise ConnectionError("stream channel closed by the master")
        data += more
    length, call_id, status = HEADER.unpack_from(data)
    total = HEADER.size + length
    if len(data) >= total:
        return call_id, status, data[HEADER.size : total]
    body = bytearray(length)
    view = memoryview(body)
    have = len(data) - HEADER.size
    view[:have] = data[HEADER.size :]
    while have < length:
        n = sock.recv_into(view[have:])
        if n == 0:
            raise ConnectionError("stream channel closed by the master")
        have += n
    return call_id, status, bytes(body)
