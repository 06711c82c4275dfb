"""What this machine can do without mooncake-py: the limits the store is compared with.

- memcpy: single-thread ``numpy.copyto`` between two preallocated, pre-touched buffers;
- socket stream: a sender in another process ``sendall``s fixed-size messages over loopback
  TCP, this process ``recv_into``s each into a preallocated buffer (same socket options as the
  store's transfer service: TCP_NODELAY, 4 MiB buffers);
- socket ping-pong: 64-byte request, 64-byte answer, sequential round trips;
- gRPC echo: a ``grpc.aio`` server with a generic bytes-identity handler, called sequentially
  by a synchronous ``grpc`` client (what the store's master calls are made of), and by a
  ``grpc.aio`` client: unary calls, and a bidi-stream ping-pong (one long-lived stream, one
  message written and one read per round trip), the bare-gRPC reference for small calls.

The servers run in two child processes, ``python -m tests.bench.limits sockets`` (stream and
ping-pong) and ``... grpc`` (the echo; kept apart so that gRPC's threads never compete with the
stream sender for its GIL). Each prints its ports as a JSON line and exits when its stdin closes
or on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any

import grpc
import numpy as np

from tests.bench.common import MIB, protocol_stdout, reply

STREAM_REQUEST = struct.Struct("<QQ")  # message size, message count (size 0 = goodbye)
PING_BYTES = 64
SOCKET_BUFFER_BYTES = 4 * MIB
ECHO_SERVICE = "bench.Echo"
ECHO_METHOD = f"/{ECHO_SERVICE}/Echo"
ECHO_STREAM_METHOD = f"/{ECHO_SERVICE}/EchoStream"


def tune(sock: socket.socket) -> None:
    """The store's transfer-socket options."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)


def recv_exactly(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock`` (raises ConnectionError if the peer closes first)."""
    received, total = 0, len(view)
    while received < total:
        n = sock.recv_into(view[received:], total - received)
        if n == 0:
            raise ConnectionError("connection closed by peer")
        received += n


# ---------------------------------------------------------------------------------------------
# Measurements (this process)


_MEMCPY_BUFFERS: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def memcpy(size: int, reps: int, piece: int = 0) -> dict[str, Any]:
    """Single-thread copy of ``size`` bytes between two preallocated buffers; bytes/s per rep.

    ``piece``: copy the ``size`` bytes as consecutive ``piece``-byte copies (one ``copyto``
    each), as a batch of values moves them. glibc copies one very large block with
    non-temporal stores, a few MiB with ordinary ones, and the two rates differ by up to 2x on
    some machines, so a batch of 4 MiB values is compared with 4 MiB copies.

    The buffers are kept for the next call of the same size (the limits are measured several
    times per run): first-touch page faults of 2 x 256 MiB take seconds on a small VM.
    """
    if size not in _MEMCPY_BUFFERS:
        _MEMCPY_BUFFERS[size] = (np.full(size, 7, dtype=np.uint8), np.ones(size, dtype=np.uint8))
    src, dst = _MEMCPY_BUFFERS[size]
    step = piece or size
    pairs = [(dst[i : i + step], src[i : i + step]) for i in range(0, size, step)]

    def copy() -> None:
        for target, source in pairs:
            np.copyto(target, source)

    copy()
    rates = []
    for _ in range(reps):
        started = time.perf_counter()
        copy()
        rates.append(size / (time.perf_counter() - started))
    return {"kind": "memcpy", "size": size, "piece": step, "rates_Bps": rates}


def release_buffers() -> None:
    """Drop the buffers :func:`memcpy` keeps."""
    _MEMCPY_BUFFERS.clear()


def stream(port: int, message: int, total: int, reps: int, slots: int) -> dict[str, Any]:
    """Receive ``total`` bytes as ``message``-byte messages per rep; bytes/s per rep.

    Each message lands in the next of ``slots`` preallocated slots, as a batched ``get_into``
    fills a registered buffer.
    """
    count = max(1, total // message)
    slots = max(1, min(slots, count))
    buffer = np.ones(message * slots, dtype=np.uint8)
    views = [buffer.data[i * message : (i + 1) * message] for i in range(slots)]
    rates = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        tune(sock)
        for rep in range(reps + 1):  # the first rep warms the connection up and is dropped
            started = time.perf_counter()
            sock.sendall(STREAM_REQUEST.pack(message, count))
            for i in range(count):
                recv_exactly(sock, views[i % slots])
            if rep:
                rates.append(message * count / (time.perf_counter() - started))
        sock.sendall(STREAM_REQUEST.pack(0, 0))
    return {"kind": "stream", "size": message, "bytes_per_rep": message * count, "rates_Bps": rates}


def pingpong(port: int, calls: int, reps: int) -> dict[str, Any]:
    """Sequential 64-byte round trips; per-call times and round trips/s per rep."""
    request = b"p" * PING_BYTES
    answer = memoryview(bytearray(PING_BYTES))
    times: list[float] = []
    rates = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        tune(sock)
        for rep in range(reps + 1):
            rep_times = []
            for _ in range(calls):
                started = time.perf_counter()
                sock.sendall(request)
                recv_exactly(sock, answer)
                rep_times.append(time.perf_counter() - started)
            if rep:
                times += rep_times
                rates.append(calls / sum(rep_times))
    return {"kind": "pingpong", "size": PING_BYTES, "times": times, "rates": rates}


def grpc_echo(port: int, payload: int, calls: int, reps: int) -> dict[str, Any]:
    """Sequential unary echo calls of ``payload`` bytes; per-call times and calls/s per rep."""
    request = os.urandom(payload)
    times: list[float] = []
    rates = []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        echo = channel.unary_unary(ECHO_METHOD)
        for rep in range(reps + 1):
            rep_times = []
            for _ in range(calls):
                started = time.perf_counter()
                answer = echo(request, timeout=10)
                rep_times.append(time.perf_counter() - started)
            if len(answer) != payload:
                raise RuntimeError("echo answered with a different payload")
            if rep:
                times += rep_times
                rates.append(calls / sum(rep_times))
    return {"kind": "grpc_echo", "size": payload, "times": times, "rates": rates}


def grpc_aio(port: int, payload: int, calls: int, reps: int, bidi: bool) -> dict[str, Any]:
    """Sequential echoes of ``payload`` bytes from a ``grpc.aio`` client: unary calls, or
    write-then-read round trips on one bidi stream; per-call times and calls/s per rep."""
    return asyncio.run(_grpc_aio(port, payload, calls, reps, bidi))


async def _grpc_aio(port: int, payload: int, calls: int, reps: int, bidi: bool) -> dict[str, Any]:
    request = os.urandom(payload)
    times: list[float] = []
    rates = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        if bidi:
            stream = channel.stream_stream(ECHO_STREAM_METHOD)()

            async def once() -> bytes:
                await stream.write(request)
                answer = await stream.read()
                if not isinstance(answer, bytes):
                    raise RuntimeError("echo stream ended early")
                return answer

        else:
            unary = channel.unary_unary(ECHO_METHOD)

            async def once() -> bytes:
                answer: bytes = await unary(request, timeout=10)
                return answer

        for rep in range(reps + 1):
            rep_times = []
            answer = b""
            for _ in range(calls):
                started = time.perf_counter()
                answer = await once()
                rep_times.append(time.perf_counter() - started)
            if len(answer) != payload:
                raise RuntimeError("echo answered with a different payload")
            if rep:
                times += rep_times
                rates.append(calls / sum(rep_times))
        if bidi:
            await stream.done_writing()
    kind = "grpc_aio_bidi" if bidi else "grpc_aio_unary"
    return {"kind": kind, "size": payload, "times": times, "rates": rates}


# ---------------------------------------------------------------------------------------------
# Servers (the child process)


def _serve_forever(listener: socket.socket, handler: Any) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        tune(conn)
        threading.Thread(target=handler, args=(conn,), daemon=True).start()


def _stream_connection(conn: socket.socket) -> None:
    header = memoryview(bytearray(STREAM_REQUEST.size))
    payload = bytearray(0)
    with conn, contextlib.suppress(OSError):
        while True:
            recv_exactly(conn, header)
            message, count = STREAM_REQUEST.unpack(header)
            if message == 0:
                return
            if len(payload) < message:
                payload = bytearray(os.urandom(1024)) * (message // 1024 + 1)
            view = memoryview(payload)[:message]
            for _ in range(count):
                conn.sendall(view)


def _pong_connection(conn: socket.socket) -> None:
    buffer = memoryview(bytearray(PING_BYTES))
    with conn, contextlib.suppress(OSError):
        while True:
            recv_exactly(conn, buffer)
            conn.sendall(buffer)


async def _echo(request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
    return request


async def _echo_stream(requests: Any, _context: grpc.aio.ServicerContext) -> Any:
    async for request in requests:
        yield request


async def _serve(out: Any, role: str) -> None:
    """Serve ``role`` ("sockets": stream and ping-pong; "grpc": the echo) until stopped."""
    info: dict[str, Any] = {"ready": True, "pid": os.getpid()}
    listeners = []
    server = None
    if role == "sockets":
        for name, handler in (("stream_port", _stream_connection), ("pong_port", _pong_connection)):
            listener = socket.create_server(("127.0.0.1", 0))
            listeners.append(listener)
            info[name] = listener.getsockname()[1]
            threading.Thread(target=_serve_forever, args=(listener, handler), daemon=True).start()
    else:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    ECHO_SERVICE,
                    {
                        "Echo": grpc.unary_unary_rpc_method_handler(_echo),
                        "EchoStream": grpc.stream_stream_rpc_method_handler(_echo_stream),
                    },
                ),
            )
        )
        info["grpc_port"] = server.add_insecure_port("127.0.0.1:0")
        await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # stdin closing (the parent is done, or gone) also stops the child
    threading.Thread(
        target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stop.set)), daemon=True
    ).start()
    reply(out, info)
    await stop.wait()
    if server is not None:
        await server.stop(0)
    for listener in listeners:
        listener.close()


def main() -> int:
    """Run the limit servers of the role named by the first argument until stdin closes."""
    role = sys.argv[1] if len(sys.argv) > 1 else "sockets"
    if role not in ("sockets", "grpc"):
        print(f"unknown role {role!r}", file=sys.stderr)
        return 2
    asyncio.run(_serve(protocol_stdout(), role))
    return 0


if __name__ == "__main__":
    sys.exit(main())
