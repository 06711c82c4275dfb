"""The master's gRPC endpoint: every RPC of the table, run by the call pipeline.

gRPC hands each call's raw request bytes to the pipeline (no deserializer of its own, so a
request that does not parse reaches the pipeline's documented rejection instead of gRPC's
generic UNKNOWN) and sends the pipeline's serialized answer back. Refusals become gRPC
statuses: UNAUTHENTICATED, INVALID_ARGUMENT (undecodable, naming the parse error) and
PERMISSION_DENIED. Tokens travel in the ``authorization: Bearer <token>`` metadata.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc

from mooncake_py._wire.rpcs import SERVICE_NAME

from .pipeline import BoundCall, CallPipeline, Rejection

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
        tenant: str | None = ""
        if requires_token:
            metadata = dict(context.invocation_metadata() or ())
            tenant = pipeline.authenticate_bearer(metadata.get("authorization"))
        rejection, answer = pipeline.call(bound, payload, tenant)
        if rejection is not None:
            await context.abort(_STATUS_OF[rejection], answer.decode())
        return answer

    return handle


def add_to_server(pipeline: CallPipeline, server: grpc.aio.Server) -> None:
    """Serve every RPC of ``pipeline`` on ``server`` (before it starts).

    Complexity: O(number of RPCs), once.
    """
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(_behaviour(pipeline, bound))
        for name, bound in pipeline.calls.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
