"""The master's stream channel: the same RPCs as gRPC over long-lived TCP connections.

The framing is :mod:`mooncake_py._wire.frames`; every call runs through the call pipeline
(:mod:`mooncake_py.master.transport.pipeline`) as gRPC calls do. This module only splits the
byte stream into frames, answers ``Authenticate`` frames (the connection then acts for the
token's identity) and unknown method names (status 2), and turns the pipeline's refusals into
status bytes: unauthenticated 3, undecodable 1, permission denied 4. A frame whose header is
unacceptable closes the connection.

A one-way frame (call id ``ONE_WAY_CALL_ID``) runs through the pipeline exactly as any other
call, in its place among the connection's frames, and gets no response at all: its answer,
refusal or error is dropped (a non-OK status is logged at debug level).

Limits, so that no caller exhausts the master: while a connection has not authenticated on a
master that requires tokens, a frame may be at most ``PRE_AUTH_MAX_FRAME`` bytes (a token fits;
a large frame closes the connection before its body is buffered), and ``max_frame`` after; the
channel holds at most ``max_connections`` connections at once and closes any connection beyond.

Calls run synchronously on the event loop, in order per connection, as the gRPC ones do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from mooncake_py._wire.frames import (
    AUTHENTICATE,
    ONE_WAY_CALL_ID,
    STATUS_OK,
    STATUS_PERMISSION_DENIED,
    STATUS_UNAUTHENTICATED,
    STATUS_UNDECODABLE,
    STATUS_UNKNOWN_METHOD,
    FrameError,
    next_request,
    response_frame,
)

from .pipeline import BoundCall, CallPipeline, Rejection

log = logging.getLogger(__name__)

PRE_AUTH_MAX_FRAME = 64 * 1024
"""Longest frame a connection may send before it authenticates (when tokens are required)."""

_STATUS_OF = {
    Rejection.UNAUTHENTICATED: STATUS_UNAUTHENTICATED,
    Rejection.UNDECODABLE: STATUS_UNDECODABLE,
    Rejection.PERMISSION_DENIED: STATUS_PERMISSION_DENIED,
}
_BAD_TOKEN_TEXT = Rejection.UNAUTHENTICATED.value.encode()


class _ChannelProtocol(asyncio.Protocol):
    """One connection: its buffer and the identity its ``Authenticate`` frame established."""

    def __init__(
        self,
        pipeline: CallPipeline,
        calls: Mapping[bytes, BoundCall],
        max_frame: int,
        live: set[asyncio.Transport],
        max_connections: int,
    ) -> None:
        self._pipeline = pipeline
        self._calls = calls
        self._tenant = pipeline.authenticate(None)  # no token presented yet
        self._max_frame = max_frame
        # Until a token is accepted, frames stay small: nothing unauthenticated is buffered.
        self._frame_limit = PRE_AUTH_MAX_FRAME if pipeline.requires_token else max_frame
        self._max_connections = max_connections
        self._live = live
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if len(self._live) >= self._max_connections:
            log.warning("stream channel full (%d connections): closing a new one", len(self._live))
            transport.abort()
            return
        self._transport = transport
        self._live.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._live.discard(self._transport)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        transport = self._transport
        if transport is None:  # refused at connection time
            return
        while True:
            try:
                frame = next_request(buffer, start, self._frame_limit)
            except FrameError as exc:
                log.warning("closing a stream channel: %s", exc)
                transport.close()
                return
            if frame is None:
                break
            start, call_id, name, payload = frame
            status, body = self._answer(name, payload)
            if call_id == ONE_WAY_CALL_ID:
                if status != STATUS_OK:
                    log.debug(
                        "one-way %s refused (status %d): %s",
                        name.decode("utf-8", "replace"),
                        status,
                        body.decode("utf-8", "replace"),
                    )
                continue
            transport.write(response_frame(call_id, status, body))
        if start:
            del buffer[:start]

    def _answer(self, name: bytes, payload: bytes) -> tuple[int, bytes]:
        """Run one frame: ``(status, response message or error text)``."""
        bound = self._calls.get(name)
        if bound is not None:
            rejection, body = self._pipeline.call(bound, payload, self._tenant)
            return (STATUS_OK if rejection is None else _STATUS_OF[rejection]), body
        if name == AUTHENTICATE:
            self._tenant = self._pipeline.authenticate(payload.decode("utf-8", "replace"))
            if self._tenant is None:
                return STATUS_UNAUTHENTICATED, _BAD_TOKEN_TEXT
            self._frame_limit = self._max_frame
            return STATUS_OK, b""
        return STATUS_UNKNOWN_METHOD, b"unknown method " + name


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
    pipeline: CallPipeline, host: str, port: int, max_frame: int, max_connections: int = 4096
) -> StreamChannel:
    """Listen on ``host:port`` (0 picks a free port) and serve every RPC of ``pipeline``.

    Args:
        max_frame: the longest frame accepted from an authenticated connection (or any, when
            no token is required); a longer one closes its connection.
        max_connections: connections held at once; a connection beyond is closed at once.

    Raises:
        OSError: the address could not be bound.
    """
    calls = {bound.rpc.wire_name: bound for bound in pipeline.calls.values()}
    live: set[asyncio.Transport] = set()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _ChannelProtocol(pipeline, calls, max_frame, live, max_connections), host, port
    )
    return StreamChannel(server, live)
