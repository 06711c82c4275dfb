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
channel holds at most ``max_connections`` connections at once and closes any connection beyond;
a connection that has not authenticated within ``PRE_AUTH_TIMEOUT_S`` (tokens required), or
that sent nothing for ``idle_timeout_s`` while no call of its runs, is closed (clients
reconnect transparently: a pooled connection is checked before reuse).

Calls run on the event loop, in order per connection, as the gRPC ones do. A plain call runs
synchronously; a sliced call (:attr:`~mooncake_py._wire.rpcs.Rpc.sliced`) runs one slice per
step of the loop, so other connections' calls run in between, and the connection's later
frames wait (reading from it pauses) until its answer is written. Closing the connection stops
a sliced call between two slices.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Mapping
from typing import cast

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

from ..ha.log_store import LeadershipLost
from ..service.slices import Steps
from .pipeline import Answer, BoundCall, CallPipeline, Rejection, drive_on_loop

log = logging.getLogger(__name__)

PRE_AUTH_MAX_FRAME = 64 * 1024
"""Longest frame a connection may send before it authenticates (when tokens are required)."""

PRE_AUTH_TIMEOUT_S = 10.0
"""Time a connection has to authenticate (when tokens are required) before it is closed."""

_STATUS_OF = {
    Rejection.UNAUTHENTICATED: STATUS_UNAUTHENTICATED,
    Rejection.UNDECODABLE: STATUS_UNDECODABLE,
    Rejection.PERMISSION_DENIED: STATUS_PERMISSION_DENIED,
}
_BAD_TOKEN_TEXT = Rejection.UNAUTHENTICATED.value.encode()


def _status(rejection: Rejection | None) -> int:
    return STATUS_OK if rejection is None else _STATUS_OF[rejection]


class _ChannelProtocol(asyncio.Protocol):
    """One connection: its buffer, the identity its ``Authenticate`` frame established, and
    the sliced call it runs, if any."""

    def __init__(
        self,
        pipeline: CallPipeline,
        calls: Mapping[bytes, BoundCall],
        max_frame: int,
        live: dict[asyncio.Transport, _ChannelProtocol],
        max_connections: int,
    ) -> None:
        self._pipeline = pipeline
        self._calls = calls
        self._peer: object = None  # the socket's peername, once connected
        self._tenant = pipeline.authenticate(None)  # no token presented yet
        self._max_frame = max_frame
        # Until a token is accepted, frames stay small: nothing unauthenticated is buffered.
        self._frame_limit = PRE_AUTH_MAX_FRAME if pipeline.requires_token else max_frame
        self._max_connections = max_connections
        self._live = live
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._running: asyncio.Task[None] | None = None  # a sliced call of this connection
        # Answers waiting for their changes to be replicated, in call order: (the record that
        # must be durable first, or 0, frame), and the task writing them out.
        self._held: list[tuple[int, bytes]] = []
        self._releasing: asyncio.Task[None] | None = None
        self._sliced_marks = 0
        self.opened_at = self.active_at = time.monotonic()

    @property
    def authenticated(self) -> bool:
        """Whether the connection may call (it authenticated, or no token is required)."""
        return self._tenant is not None

    @property
    def busy(self) -> bool:
        """Whether a sliced call of this connection is running."""
        return self._running is not None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (asyncio's, or uvloop's, which does not derive from its class).
        transport = cast(asyncio.Transport, transport)
        if len(self._live) >= self._max_connections:
            log.warning("stream channel full (%d connections): closing a new one", len(self._live))
            transport.abort()
            return
        self._transport = transport
        self._live[transport] = self
        self._peer = transport.get_extra_info("peername")
        self._tenant = self._pipeline.authenticate(None, self._peer)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._live.pop(self._transport, None)
        if self._running is not None:
            self._running.cancel()

    def data_received(self, data: bytes) -> None:
        self.active_at = time.monotonic()
        self._buffer += data
        if self._running is None:
            self._process()

    def _process(self) -> None:
        """Answer every complete frame in the buffer, until a sliced call starts."""
        buffer = self._buffer
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
            serving = self._pipeline.serving
            if serving is not None and not serving():
                # No longer the leader: the client reconnects to the one etcd names.
                transport.close()
                return
            bound = self._calls.get(name)
            replicator = self._pipeline.replicator
            marks = replicator.journal.marks if replicator is not None else 0
            if bound is not None and bound.sliced:
                steps = self._pipeline.call_sliced(bound, payload, self._tenant)
                try:
                    next(steps)  # the first slice now: a small call needs no other
                except StopIteration as done:
                    rejection, body = done.value
                    self._respond(call_id, _status(rejection), body, self._needed(marks))
                    continue
                self._sliced_marks = marks
                # Later frames wait for its answer; stop reading so they wait in the kernel.
                transport.pause_reading()
                self._running = asyncio.get_running_loop().create_task(
                    self._finish_sliced(call_id, steps)
                )
                break
            status, body = self._answer(bound, name, payload)
            self._respond(call_id, status, body, self._needed(marks))
        if start:
            del buffer[:start]

    async def _finish_sliced(self, call_id: int, steps: Steps[Answer]) -> None:
        try:
            rejection, body = await drive_on_loop(steps)
        except asyncio.CancelledError:  # the connection went away
            return
        finally:
            self._running = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        self.active_at = time.monotonic()
        self._respond(call_id, _status(rejection), body, self._needed(self._sliced_marks))
        transport.resume_reading()
        self._process()

    def _needed(self, marks: int) -> int:
        """The record a call that began at journal ``marks`` waits for (0: none)."""
        replicator = self._pipeline.replicator
        return replicator.needed(marks) if replicator is not None else 0

    def _respond(self, call_id: int, status: int, body: bytes, needed: int = 0) -> None:
        """Answer a call; an answer whose changes are not durable yet (``needed``), and
        every answer after it, waits in :attr:`_held` so answers keep their order."""
        if call_id == ONE_WAY_CALL_ID:
            if status != STATUS_OK:
                log.debug(
                    "one-way call refused (status %d): %s",
                    status,
                    body.decode("utf-8", "replace"),
                )
            return
        assert self._transport is not None
        frame = response_frame(call_id, status, body)
        replicator = self._pipeline.replicator
        if self._held or (replicator is not None and needed > replicator.durable_generation):
            self._held.append((needed, frame))
            if self._releasing is None:
                self._releasing = asyncio.get_running_loop().create_task(self._release_held())
            return
        self._transport.write(frame)

    async def _release_held(self) -> None:
        """Write the held answers as their records become durable; a master that lost the
        leadership closes the connection instead (its client reconnects to the new one)."""
        replicator = self._pipeline.replicator
        assert replicator is not None
        try:
            while self._held:
                await replicator.durable(max(needed for needed, _ in self._held))
                held, self._held = self._held, []
                transport = self._transport
                if transport is None or transport.is_closing():
                    return
                transport.write(b"".join(frame for _, frame in held))
        except LeadershipLost:
            self._held.clear()
            if self._transport is not None:
                self._transport.close()
        finally:
            self._releasing = None

    def _answer(self, bound: BoundCall | None, name: bytes, payload: bytes) -> tuple[int, bytes]:
        """Run one frame of the RPC ``bound`` (None: not an RPC): ``(status, response message
        or error text)``."""
        if bound is not None:
            rejection, body = self._pipeline.call(bound, payload, self._tenant)
            return _status(rejection), body
        if name == AUTHENTICATE:
            self._tenant = self._pipeline.authenticate(
                payload.decode("utf-8", "replace"), self._peer
            )
            if self._tenant is None:
                return STATUS_UNAUTHENTICATED, _BAD_TOKEN_TEXT
            self._frame_limit = self._max_frame
            return STATUS_OK, b""
        return STATUS_UNKNOWN_METHOD, b"unknown method " + name


def close_idle(
    live: Mapping[asyncio.Transport, _ChannelProtocol], now: float, idle_timeout_s: float
) -> int:
    """Close the connections that overstayed: unauthenticated for ``PRE_AUTH_TIMEOUT_S``, or
    silent for ``idle_timeout_s`` (0: never) with no call running. Returns how many.

    Complexity: O(connections).
    """
    doomed = [
        transport
        for transport, conn in live.items()
        if (not conn.authenticated and now - conn.opened_at > PRE_AUTH_TIMEOUT_S)
        or (idle_timeout_s > 0 and not conn.busy and now - conn.active_at > idle_timeout_s)
    ]
    for transport in doomed:
        transport.close()
    return len(doomed)


class StreamChannel:
    """A listening stream channel, its open connections and its idle-connection timer."""

    def __init__(
        self,
        server: asyncio.Server,
        live: dict[asyncio.Transport, _ChannelProtocol],
        idle_timeout_s: float,
    ) -> None:
        self._server = server
        self._live = live
        self._idle_timeout_s = idle_timeout_s
        self._reaper = asyncio.get_running_loop().create_task(self._reap_idle())

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._live)

    async def _reap_idle(self) -> None:
        # Often enough that an unauthenticated connection goes within ~1.25x its time.
        timeouts = [PRE_AUTH_TIMEOUT_S] + ([self._idle_timeout_s] if self._idle_timeout_s else [])
        interval = min(timeouts) / 4
        while True:
            await asyncio.sleep(interval)
            closed = close_idle(self._live, time.monotonic(), self._idle_timeout_s)
            if closed:
                log.debug("stream channel: closed %d idle connections", closed)

    async def close(self) -> None:
        """Stop listening and drop every connection (clients then fall back or reconnect)."""
        self._reaper.cancel()
        self._server.close()
        for transport in list(self._live):
            transport.close()
        await self._server.wait_closed()


async def start_channel(
    pipeline: CallPipeline,
    host: str,
    port: int,
    max_frame: int,
    max_connections: int = 4096,
    idle_timeout_s: float = 300.0,
    ssl_context: ssl.SSLContext | None = None,
) -> StreamChannel:
    """Listen on ``host:port`` (0 picks a free port) and serve every RPC of ``pipeline``.

    Args:
        max_frame: the longest frame accepted from an authenticated connection (or any, when
            no token is required); a longer one closes its connection.
        max_connections: connections held at once; a connection beyond is closed at once.
        idle_timeout_s: a connection silent this long (no call of its running) is closed;
            0 keeps idle connections open.
        ssl_context: serve TLS only (:func:`mooncake_py.tls.server_context`): a connection
            whose TLS handshake fails or does not finish within ``PRE_AUTH_TIMEOUT_S`` (a
            plaintext client, a client without a required certificate) is closed before any
            frame is read; None serves plaintext.

    Raises:
        OSError: the address could not be bound.
    """
    calls = {bound.rpc.wire_name: bound for bound in pipeline.calls.values()}
    live: dict[asyncio.Transport, _ChannelProtocol] = {}
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _ChannelProtocol(pipeline, calls, max_frame, live, max_connections),
        host,
        port,
        ssl=ssl_context,
        # A handshake that stalls holds a connection as an unauthenticated one would.
        ssl_handshake_timeout=PRE_AUTH_TIMEOUT_S if ssl_context is not None else None,
    )
    return StreamChannel(server, live, idle_timeout_s)
