"""The many-clients benchmark's processes: one master and its clients per side, and their rounds.

A *side* is an implementation (mooncake-py or upstream Mooncake) with its own master on free
loopback ports and ``clients`` :mod:`tests.bench.many_clients_worker` processes, each
contributing a segment. Both sides are started once and stay up for the whole run (idle while
the other side takes its turn); every round uses fresh keys and removes them after.

:func:`run_round` drives one round of one side: every client preloads (a barrier: nobody reads
before every shared batch is written), then all run the mixed loop from the same wall-clock
instant for the same duration, while the parent samples ``/proc/<pid>/stat`` of the master
and of every client (and ``/proc/stat`` for the whole machine) at the start and the end of
the timed phase; then every client removes its keys. With ``profile_to``, py-spy records the
master during the timed phase (``py-spy record -p PID -f raw -g -d SECONDS -o FILE``).

Every process started is stopped by its pid when the run's :class:`contextlib.ExitStack`
closes, also on error. Thread-safety: none; one round at a time.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from mooncake_py.testing import MasterProcess
from tests.bench import many_clients_stats as stats
from tests.bench import upstream as up
from tests.bench.common import MIB, ROOT, Child
from tests.bench.many_clients_worker import BUFFER_BYTES

PY = "mooncake-py"
UPSTREAM = "upstream"
LEASE_MS = 5000
"""Both masters' read-lease TTL: upstream's default (mooncake-py's is 10 s). Upstream fails a
read whose transfer outlives its lease (-707); on a loaded 2-core machine 16 x 64 KiB reads
of 8 clients were seen to stall past 1 s. The loop's removes are forced, so a lease never
delays them."""
LOCAL_BUFFER = 32 * MIB
"""Upstream's copying calls (``put_batch``, ``get_batch``) stage values in this buffer."""
PYSPY = ROOT / ".venv" / "bin" / "py-spy"
"""The sampling profiler the profiled round runs (installed in mooncake-py's venv)."""
START_MARGIN_S = 0.5
"""The clients are told to start this long after the run command is sent to the first."""


@dataclasses.dataclass
class Settings:
    """What every round of a run shares.

    Attributes:
        clients: client processes per side.
        segment_bytes: the segment each client contributes.
        shared: shared batches per client and size (read by every client, kept all round).
        window: window batches per client and size (written, read and removed in the loop).
        duration_s: the timed phase of a round.
    """

    clients: int
    segment_bytes: int
    shared: int
    window: int
    duration_s: float


@dataclasses.dataclass
class Side:
    """One implementation under test and its running processes."""

    name: str  # PY or UPSTREAM
    impl: str  # the worker's --impl
    python: str | None = None  # None: this interpreter
    env: dict[str, str | None] = dataclasses.field(default_factory=dict)
    address: str = ""
    metadata: str = "P2PHANDSHAKE"
    master_pid: int = 0
    clients: list[Child] = dataclasses.field(default_factory=list)
    versions: dict[str, Any] = dataclasses.field(default_factory=dict)


def _drain(stream: Any, into: collections.deque[str]) -> None:
    threading.Thread(target=into.extend, args=(stream,), daemon=True).start()


def start_side(
    side: Side, settings: Settings, stack: contextlib.ExitStack, logs: Path
) -> dict[str, int]:
    """Start ``side``'s master and clients and join every client to the store.

    Returns: the pids (``master``, ``client-<i>``).
    Raises:
        RuntimeError: the master did not start.
        tests.bench.common.ChildError: a client failed to start or to join.
    """
    pids: dict[str, int] = {}
    if side.impl == "py":
        args = ["--log_level", "WARNING", "--default_kv_lease_ttl", f"{LEASE_MS}ms"]
        args += ["--eviction_high_watermark_ratio", "1.0"]  # the loop keeps memory bounded
        master = MasterProcess(args=args)
        stack.callback(master.stop)
        master.start()
        if master.process is not None and master.process.stderr is not None:
            _drain(master.process.stderr, collections.deque(maxlen=50))  # never a full pipe
        side.address, side.master_pid = master.address, master.pid
    else:
        upstream = up.UpstreamMaster(up.default_venv(), logs / "up-master.log", LEASE_MS, False)
        stack.callback(upstream.stop)
        upstream.start()
        side.address, side.metadata, side.master_pid = (
            upstream.address,
            upstream.metadata,
            upstream.pid,
        )
    pids["master"] = side.master_pid
    short = "py" if side.impl == "py" else "up"
    for index in range(settings.clients):
        child = Child(
            f"{short}-client-{index}",
            "tests.bench.many_clients_worker",
            ["--impl", side.impl],
            side.env,
            logs,
            side.python,
        )
        stack.callback(child.stop)
        side.clients.append(child)
        pids[f"client-{index}"] = child.pid
    for child in side.clients:
        ready = child.receive(120.0)
        side.versions = side.versions or ready.get("versions", {})
    for child in side.clients:
        child.send(
            cmd="setup",
            master=side.address,
            metadata=side.metadata,
            segment=settings.segment_bytes,
            buffer=BUFFER_BYTES,
            local_buffer=LOCAL_BUFFER,
        )
    for child in side.clients:
        child.receive(120.0)
    return pids


def _read_ticks(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
        return stats.proc_stat_cpu_ticks(handle.read())


def _machine_ticks() -> tuple[int, int]:
    """``(busy, total)`` clock ticks of all cores since boot, from ``/proc/stat``."""
    with open("/proc/stat", encoding="utf-8") as handle:
        fields = [int(v) for v in handle.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is counted in user already
    return total - idle, total


def _sleep_until(wall_time: float) -> None:
    delay = wall_time - time.time()
    if delay > 0:
        time.sleep(delay)


def _pyspy(pid: int, duration_s: float, output: Path, log: Path) -> subprocess.Popen[bytes]:
    seconds = max(1, int(duration_s))
    with open(log, "ab") as handle:
        return subprocess.Popen(
            [str(PYSPY), "record", "-p", str(pid), "-f", "raw", "-g"]
            + ["-d", str(seconds), "-o", str(output)],
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=handle,
        )


def run_round(
    side: Side,
    settings: Settings,
    prefix: str,
    seed: int,
    profile_to: Path | None = None,
    profile_top: int = 15,
) -> dict[str, Any]:
    """One round of ``side``: preload, the timed mixed loop, cleanup.

    Args:
        prefix: the round's key prefix (fresh per round and side).
        seed: seeds every client's choices (with its index).
        profile_to: record the master with py-spy during the timed phase into this file (raw
            format); the summary (``profile_top`` frames per list) is under ``profile`` in the
            answer.

    Returns:
        ``figures`` (:func:`~tests.bench.many_clients_stats.round_figures`), ``master_cpu`` and
        ``clients_cpu`` (:func:`~tests.bench.many_clients_stats.cpu_share`; the clients'
        summed), ``cpu_us_per_call`` (``master``, ``clients``: CPU microseconds per call of the
        loop, :func:`~tests.bench.many_clients_stats.cpu_us_per_call`), ``machine_busy`` (the
        machine's busy fraction, all cores), ``preload`` (keys written, failed batches),
        ``cleanup`` (keys removed, failed), ``errors`` (samples), ``profile`` (with
        ``profile_to``: the py-spy summary, or ``profile_error``).

    Raises:
        tests.bench.common.ChildError: a client failed or did not answer.
    """
    for index, child in enumerate(side.clients):
        child.send(
            cmd="preload",
            prefix=prefix,
            me=index,
            clients=len(side.clients),
            shared=settings.shared,
            window=settings.window,
            seed=seed,
        )
    preloads = [child.receive(600.0) for child in side.clients]
    start_at = time.time() + START_MARGIN_S
    for child in side.clients:
        child.send(cmd="run", start_at=start_at, duration_s=settings.duration_s)
    pids = [side.master_pid, *(child.pid for child in side.clients)]
    _sleep_until(start_at)
    profiler = None
    if profile_to is not None:
        profiler = _pyspy(
            side.master_pid, settings.duration_s, profile_to, profile_to.with_suffix(".log")
        )
    before = [_read_ticks(pid) for pid in pids]
    machine_before = _machine_ticks()
    sampled_at = time.perf_counter()
    _sleep_until(start_at + settings.duration_s)
    after = [_read_ticks(pid) for pid in pids]
    machine_after = _machine_ticks()
    wall_s = time.perf_counter() - sampled_at
    answers = [child.receive(settings.duration_s + 300.0) for child in side.clients]
    ticks = os.sysconf("SC_CLK_TCK")
    clients_before = (sum(t[0] for t in before[1:]), sum(t[1] for t in before[1:]))
    clients_after = (sum(t[0] for t in after[1:]), sum(t[1] for t in after[1:]))
    busy = machine_after[0] - machine_before[0]
    total = machine_after[1] - machine_before[1]
    figures = stats.round_figures(answers)
    master_cpu = stats.cpu_share(before[0], after[0], wall_s, ticks)
    clients_cpu = stats.cpu_share(clients_before, clients_after, wall_s, ticks)
    result: dict[str, Any] = {
        "figures": figures,
        "master_cpu": master_cpu,
        "clients_cpu": clients_cpu,
        "cpu_us_per_call": {
            "master": stats.cpu_us_per_call(master_cpu["total"], figures["ops_per_s"]),
            "clients": stats.cpu_us_per_call(clients_cpu["total"], figures["ops_per_s"]),
        },
        "machine_busy": busy / total if total > 0 else None,
        "preload": {
            "written": sum(p["written"] for p in preloads),
            "failed_batches": sum(p["failed_batches"] for p in preloads),
        },
        "errors": [e for a in preloads + answers for e in a["errors"]][:20],
        "cycles": sum(a["cycles"] for a in answers),
    }
    if profiler is not None and profile_to is not None:
        try:
            profiler.wait(timeout=settings.duration_s + 60)
        except subprocess.TimeoutExpired:
            profiler.kill()
            profiler.wait()
        if profiler.returncode == 0 and profile_to.exists():
            result["profile"] = stats.pyspy_summary(
                profile_to.read_text(errors="replace"), profile_top
            )
        else:
            log = profile_to.with_suffix(".log")
            tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
            result["profile_error"] = f"py-spy exited {profiler.returncode}: {tail}"
    for child in side.clients:
        child.send(cmd="cleanup")
    cleanups = [child.receive(600.0) for child in side.clients]
    result["cleanup"] = {
        "removed": sum(c["removed"] for c in cleanups),
        "failed": sum(c["failed"] for c in cleanups),
    }
    return result
