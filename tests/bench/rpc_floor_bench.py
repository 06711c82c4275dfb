"""Per-call cost of the master's stream channel against the floor of a bare uvloop server.

Run as ``python -m tests.bench.rpc_floor_bench [--calls 20000] [--rounds 5]``. Each round
measures, in turn, from this process over one TCP connection on 127.0.0.1:

- **floor**: a child process running only a uvloop protocol that splits request frames
  (:mod:`mooncake_py._wire.frames`) and writes a fixed two-byte answer: the least any Python
  server on this loop can cost per call (system calls, wake-ups, the loop);
- **master**: a real master child (``python -m mooncake_py.master``), called with
  ``ServiceReady`` (no work: the pipeline's own cost) and ``ExistKey`` of an absent key (the
  cheapest keyed call).

Per target it reports the medians over the rounds of the round-trip time and of the server's
CPU microseconds per call (user + system, read from ``/proc``; a loaded machine disturbs it
far less than the round trip), and the ratio of each master figure to the floor's. The gap
between the floor and ``ServiceReady`` is what the transport and pipeline cost beyond the
loop; the gap between the two master calls is the call's own work. Linux only. Benchmarks
only: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from mooncake_py._proto import master_pb2
from mooncake_py._wire.frames import read_response, request_frame
from tests.bench.common import free_port
from tests.bench.many_clients_stats import proc_stat_cpu_ticks

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
WARMUP_CALLS = 2000
START_TIMEOUT_S = 20.0


def _process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (Linux ``/proc``)."""
    return sum(proc_stat_cpu_ticks(Path(f"/proc/{pid}/stat").read_text())) / CLOCK_TICKS


def _serve_floor(port: int) -> None:
    """The floor server: answer every request frame with status 0 and ``08 01`` at once."""
    import uvloop

    header = struct.Struct("<IIB")

    class Floor(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)
            self.buffer = bytearray()

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while len(self.buffer) >= header.size:
                length, call_id, _ = header.unpack_from(self.buffer)
                if len(self.buffer) < header.size + length:
                    break
                del self.buffer[: header.size + length]
                self.transport.write(header.pack(2, call_id, 0) + b"\x08\x01")

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Floor, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


def _connect(port: int, child: subprocess.Popen[bytes]) -> socket.socket:
    """A connection to ``port`` once the child listens there (raises if it died or stalled)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if child.poll() is not None:
            raise RuntimeError(f"server exited with {child.returncode}")
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


def _measure(sock: socket.socket, pid: int, frame: bytes, calls: int) -> tuple[float, float]:
    """``(round trip µs, server CPU µs)`` per call over ``calls`` calls of ``frame``.

    Raises:
        RuntimeError: a warm-up call was not answered with status 0 (the figures would time
            a refusal).
    """
    for _ in range(WARMUP_CALLS):
        sock.sendall(frame)
        _, status, body = read_response(sock)
        if status != 0:
            raise RuntimeError(f"call answered with status {status}: {body[:200]!r}")
    cpu_before = _process_cpu_s(pid)
    started = time.perf_counter()
    for _ in range(calls):
        sock.sendall(frame)
        read_response(sock)
    elapsed = time.perf_counter() - started
    cpu = _process_cpu_s(pid) - cpu_before
    return elapsed / calls * 1e6, cpu / calls * 1e6


def _stop(child: subprocess.Popen[bytes]) -> None:
    child.terminate()
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _round(calls: int, record: Callable[[str, float, float], None]) -> None:
    """One round: the floor, then the master's two calls; figures go to ``record``."""
    port = free_port()
    floor = subprocess.Popen([sys.executable, "-m", __spec__.name, "--floor", str(port)])
    try:
        with _connect(port, floor) as sock:
            record("floor", *_measure(sock, floor.pid, request_frame(1, b"ExistKey", b""), calls))
    finally:
        _stop(floor)
    port = free_port()
    master = subprocess.Popen(
        [sys.executable, "-m", "mooncake_py.master", "--port", str(free_port())]
        + ["--fast_rpc_port", str(port), "--metrics_port", "-1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with _connect(port, master) as sock:
            ready = request_frame(1, b"ServiceReady", b"")
            record("ServiceReady", *_measure(sock, master.pid, ready, calls))
            key = master_pb2.KeyRequest(client_id="bench-client", key="absent/key/1")
            exist = request_frame(1, b"ExistKey", key.SerializeToString())
            record("ExistKey", *_measure(sock, master.pid, exist, calls))
    finally:
        _stop(master)


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table (or serve the floor with ``--floor PORT``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per target per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--floor", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.floor:
        _serve_floor(args.floor)
        return 0
    figures: dict[str, tuple[list[float], list[float]]] = {}

    def record(target: str, rtt_us: float, cpu_us: float) -> None:
        rtts, cpus = figures.setdefault(target, ([], []))
        rtts.append(rtt_us)
        cpus.append(cpu_us)

    for number in range(args.rounds):
        _round(args.calls, record)
        print(f"round {number + 1}/{args.rounds} done", file=sys.stderr)
    floor_rtt, floor_cpu = (statistics.median(values) for values in figures["floor"])
    print("| target | round trip µs | ratio | server CPU µs/call | ratio |")
    print("|:--|--:|--:|--:|--:|")
    for target, (rtts, cpus) in figures.items():
        rtt, cpu = statistics.median(rtts), statistics.median(cpus)
        print(
            f"| {target} | {rtt:.1f} | {rtt / floor_rtt:.2f} | {cpu:.1f} | {cpu / floor_cpu:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
