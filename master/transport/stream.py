"""The master's stream channel: the same RPCs as gRPC over one long-lived TCP connection.

A Python gRPC unary call costs several times a plain socket round trip, which dominates small
operations (``is_exist``, small ``get``). Clients therefore send their calls over this channel
when the master offers it (ServiceReady's ``fast_port``) and use gRPC otherwise. The messages
are exactly those of ``proto/master.proto``; only the framing is ours:

    request  = length u32 | call id u32 | name length u8 | method name | request message
    response = length u32 | call id u32 | status u8     | response message (status 0)
                                                         | UTF-8 error text (status != 0)

(little-endian; ``length`` counts the bytes after the 9-byte header, name included.)
Status: 0 ok, 1 undecodable request, 2 unknown method, 3 unauthenticated, 4 permission denied.
Calls on one connection are answered in order. A frame longer than ``max_message_bytes``
closes the connection.

When the master requires tokens, a connection's first frame must be ``Authenticate`` with the
token as its payload; the connection then acts for that token's tenant (see
:mod:`mooncake_py.master.transport.auth`) and every other call before it is answered with status 3.

Handlers run synchronously on the event loop, as the gRPC handlers do.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

from google.protobuf.message import DecodeError

from .auth import Denial, TokenAuthority, bind_tenant
from .handlers import Method

log = logging.getLogger(__name__)

HEADER = struct.Struct("<IIB")
STATUS_OK = 0
STATUS_UNDECODABLE = 1
STATUS_UNKNOWN_METHOD = 2
STATUS_UNAUTHENTICATED = 3
STATUS_PERMISSION_DENIED = 4
AUTHENTICATE = b"Authenticate"


class _ChannelProtocol(asyncio.Protocol):
    def __init__(
        self,
        methods: dict[bytes, Method],
        max_frame: int,
        live: set[asyncio.Transport],
        authority: TokenAuthority | None,
    ) -> None:
        self._methods = methods
        self._authority = authority
        self._tenant: str | None = None
        self._max_frame = max_frame
        self._live = live
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._live.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._live.discard(self._transport)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        while len(buffer) - start >= HEADER.size:
            length, call_id, name_length = HEADER.unpack_from(buffer, start)
            if length > self._max_frame or name_length > length:
                log.warning("closing a stream channel: bad frame header")
                assert self._transport is not None
                self._transport.close()
                return
            end = start + HEADER.size + length
            if len(buffer) < end:
                break
            body = start + HEADER.size
            name = bytes(buffer[body : body + name_length])
            payload = bytes(buffer[body + name_length : end])
            self._answer(call_id, name, payload)
            start = end
        if start:
            del buffer[:start]

    def _answer(self, call_id: int, name: bytes, payload: bytes) -> None:
        status, body = self._run(name, payload)
        assert self._transport is not None
        self._transport.write(HEADER.pack(len(body), call_id, status) + body)

    def _run(self, name: bytes, payload: bytes) -> tuple[int, bytes]:
        authority = self._authority
        if name == AUTHENTICATE:
            self._tenant = (
                authority.tenant_of(payload.decode("utf-8", "replace")) if authority else ""
            )
            if self._tenant is None:
                return STATUS_UNAUTHENTICATED, Denial.UNAUTHENTICATED.value.encode()
            return STATUS_OK, b""
        method = self._methods.get(name)
        if method is None:
            return STATUS_UNKNOWN_METHOD, b"unknown method " + name
        if authority is not None and self._tenant is None:
            return STATUS_UNAUTHENTICATED, Denial.UNAUTHENTICATED.value.encode()
        try:
            request: Any = method.request_type.FromString(payload)
        except DecodeError as exc:
            return STATUS_UNDECODABLE, f"undecodable request: {exc}".encode()
        denied = self._tenant and bind_tenant(request, self._tenant) is not None
        if authority is not None and denied:
            return STATUS_PERMISSION_DENIED, Denial.PERMISSION_DENIED.value.encode()
        return STATUS_OK, method.handler(request).SerializeToString()


class StreamChannel:
    """A listening stream channel and its open connections."""

    def __init__(self, server: asyncio.Server, live: set[asyncio.Transport]) -> None:
        self._server = server
        self._live = live

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening and drop every connection (clients then fall back or reconnect)."""
        self._server.close()
        for transport in list(self._live):
            transport.close()
        await self._server.wait_closed()


async def start_channel(
    methods: list[Method],
    host: str,
    port: int,
    max_frame: int,
    authority: TokenAuthority | None = None,
) -> StreamChannel:
    """Listen on ``host:port`` (0 picks a free port) and serve ``methods``."""
    by_name = {m.name.encode(): m for m in methods}
    live: set[asyncio.Transport] = set()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _ChannelProtocol(by_name, max_frame, live, authority), host, port
    )
    return StreamChannel(server, live)
