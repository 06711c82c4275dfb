"""The master's gRPC endpoint: every RPC of the table, run by the call pipeline.

gRPC hands each call's raw request bytes to the pipeline (no deserializer of its own, so a
request that does not parse reaches the pipeline's documented rejection instead of gRPC's
generic UNKNOWN) and sends the pipeline's serialized answer back. Refusals become gRPC
statuses: UNAUTHENTICATED, INVALID_ARGUMENT (undecodable, naming the parse error) and
PERMISSION_DENIED. Tokens travel in the ``authorization: Bearer <token>`` metadata. A sliced
call (:attr:`~mooncake_py._wire.rpcs.Rpc.sliced`) runs one slice per step of the event loop,
so other calls are served in between; a caller that cancels it stops it between two slices.

When the master requires tokens, :class:`TokenGate` checks a call's token *before* gRPC reads
its request: an unauthenticated call is refused with UNAUTHENTICATED without its message ever
being buffered (gRPC would otherwise receive a whole request, up to ``max_message_bytes``,
before a handler could look at the caller), for every service on the port: ours, health and
reflection. Probes without a token use the metrics port's ``/health``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from mooncake_py._wire.rpcs import SERVICE_NAME

from ..ha.log_store import LeadershipLost
from .pipeline import (
    NOT_LEADER_TEXT,
    NOT_SERVING_TEXT,
    BoundCall,
    CallPipeline,
    Rejection,
    drive_on_loop,
)

_STATUS_OF = {
    Rejection.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Rejection.UNDECODABLE: grpc.StatusCode.INVALID_ARGUMENT,
    Rejection.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
}


def _behaviour(
    pipeline: CallPipeline, bound: BoundCall
) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
    requires_token = pipeline.requires_token

    async def handle(payload: bytes, context: grpc.aio.ServicerContext) -> bytes:
        header = None
        if requires_token:
            metadata = dict(context.invocation_metadata() or ())
            header = metadata.get("authorization")
        serving = pipeline.serving
        if serving is not None and not serving():
            await context.abort(grpc.StatusCode.UNAVAILABLE, NOT_SERVING_TEXT)
        tenant = pipeline.authenticate_bearer(header, context.peer())
        replicator = pipeline.replicator
        marks = replicator.journal.marks if replicator is not None else 0
        if bound.sliced:
            rejection, answer = await drive_on_loop(pipeline.call_sliced(bound, payload, tenant))
        else:
            rejection, answer = pipeline.call(bound, payload, tenant)
        if rejection is not None:
            await context.abort(_STATUS_OF[rejection], answer.decode())
        if replicator is not None:
            # What the call changed is answered only once it is in the log.
            needed = replicator.needed(marks)
            if needed:
                try:
                    await replicator.durable(needed)
                except LeadershipLost:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, NOT_LEADER_TEXT)
        return answer

    return handle


async def _refuse(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
    # Never reads ``requests``: the caller's message is not received, only discarded.
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, Rejection.UNAUTHENTICATED.value)


class TokenGate(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses every call without a known Bearer token before its request is read.

    Args:
        pipeline: whose token authority decides (the gate is only installed when the
            pipeline requires tokens).

    Complexity: O(metadata) per call. Thread-safety: stateless; runs on the event loop.
    """

    def __init__(self, pipeline: CallPipeline) -> None:
        self._pipeline = pipeline
        # A stream-unary handler gets an iterator instead of the message: refusing without
        # iterating leaves the request body unread.
        self._refusal = grpc.stream_unary_rpc_method_handler(_refuse)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        header = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                header = value
                break
        if self._pipeline.authenticate_bearer(header) is None:
            return self._refusal
        return await continuation(handler_call_details)


def add_to_server(pipeline: CallPipeline, server: grpc.aio.Server) -> None:
    """Serve every RPC of ``pipeline`` on ``server`` (before it starts).

    Complexity: O(number of RPCs), once.
    """
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(_behaviour(pipeline, bound))
        for name, bound in pipeline.calls.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
