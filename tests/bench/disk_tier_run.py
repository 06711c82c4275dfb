"""One run of the disk-tier benchmark: a fresh master, a writer and a reader, one mode.

A *mode* is an implementation (mooncake-py or upstream Mooncake) with or without the disk tier.
:func:`run_once` starts the mode's master, a writer process that hosts the store's memory (and,
with the tier, mounts it under a fresh directory) and a reader process that hosts nothing;
the writer puts every object, the run waits for the tier to settle, the reader gets the keys of
the read order; then the master's counters are read and every process is stopped by its pid.

Settling: mooncake-py's master says how many spills are in flight (``spills_in_flight``), so the
run waits until there are none; upstream's does not say, so its tier gets a fixed wait
(:attr:`Workload.upstream_settle_s`, a few of its offload heartbeats), and so does its
memory-only mode, so that its two modes differ only by the tier (its eviction runs on a timer
too). mooncake-py's memory-only mode has nothing to wait for.

Upstream's tier needs, besides ``setup(enable_ssd_offload=True, ssd_offload_path=...)`` and the
master's ``--enable_offload``, two of its client's environment settings (:data:`UPSTREAM_TIER_ENV`):
its offload heartbeat (10 s by default, longer than a short run) and its bucket limits (by
default a bucket waits for more objects than a short run writes, and nothing reaches the disk).

Thread-safety: none; one run at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from mooncake_py.client.api import Client
from mooncake_py.testing import MasterProcess
from tests.bench import upstream as up
from tests.bench.common import MIB, Child

PY = "py"
UPSTREAM = "upstream"
SETTLE_TIMEOUT_S = 120.0
PY_COUNTERS = (
    "get_hits",
    "get_misses",
    "evicted_objects",
    "spilled_objects",
    "spill_failures",
    "promoted_objects",
    "disk_hits",
    "disk_used_bytes",
    "disk_evicted_objects",
)


@dataclasses.dataclass(frozen=True)
class Mode:
    """An implementation with or without the disk tier."""

    impl: str  # PY or UPSTREAM
    tier: bool

    @property
    def label(self) -> str:
        """``py, memory only``, ``upstream, disk tier``, ..."""
        return f"{self.impl}, {'disk tier' if self.tier else 'memory only'}"

    @property
    def key(self) -> str:
        """``py-memory``, ``upstream-disk``, ... (the JSON record's name)."""
        return f"{self.impl}-{'disk' if self.tier else 'memory'}"


@dataclasses.dataclass(frozen=True)
class Workload:
    """What every mode runs.

    Attributes:
        objects: N, objects written.
        value_bytes: S, bytes per object.
        memory_bytes: the writer's memory segment (the store's whole memory).
        order: the reader's key indexes, in read order.
        quota_bytes: the disk tier's size (0: the implementation's default).
        fsync: mooncake-py's tier syncs each file before it may be served.
        upstream_settle_s: the wait before reading, for upstream's modes.
        lease_ms: the masters' read-lease TTL.
    """

    objects: int
    value_bytes: int
    memory_bytes: int
    order: tuple[int, ...]
    quota_bytes: int
    fsync: bool
    upstream_settle_s: float
    lease_ms: int = 1000


UPSTREAM_TIER_ENV = {
    "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": "1",
    "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT": "1",
}
"""Upstream client settings its tier needs in a short run (see the module docstring); the
bucket size limit is set to one value's size per run."""


def _drain(stream: Any, into: deque[str]) -> None:
    threading.Thread(target=into.extend, args=(stream,), daemon=True).start()


class _Processes:
    """The run's processes, each stopped by its pid when the run ends (also on error)."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack = stack
        self.pids: dict[str, int] = {}

    def child(self, name: str, mode: Mode, logs: Path, env: dict[str, str | None]) -> Child:
        python = str(up.venv_python(up.default_venv())) if mode.impl == UPSTREAM else None
        args = ["--impl", "upstream" if mode.impl == UPSTREAM else "py"]
        child = Child(name, "tests.bench.disk_tier_worker", args, env, logs, python)
        self.stack.callback(child.stop)
        self.pids[name] = child.pid
        child.receive(120.0)  # the ready line
        return child


def _py_master(processes: _Processes, lease_ms: int, stderr: deque[str]) -> MasterProcess:
    master = MasterProcess(
        args=["--log_level", "WARNING", "--default_kv_lease_ttl", f"{lease_ms}ms"]
    )
    processes.stack.callback(master.stop)
    master.start()
    processes.pids["master"] = master.pid
    if master.process is not None and master.process.stderr is not None:
        _drain(master.process.stderr, stderr)  # so that it never blocks on a full pipe
    return master


class _OffloadingUpstreamMaster(up.UpstreamMaster):
    """Upstream's master with its SSD offload accepted (``--enable_offload``)."""

    def _args(self, rpc: int, http: int, metrics: int) -> list[str]:
        return [*super()._args(rpc, http, metrics), "--enable_offload=true"]


def _upstream_master(
    processes: _Processes, mode: Mode, logs: Path, lease_ms: int
) -> up.UpstreamMaster:
    kind = _OffloadingUpstreamMaster if mode.tier else up.UpstreamMaster
    master = kind(up.default_venv(), logs / f"{mode.key}-master.log", lease_ms, True)
    processes.stack.callback(master.stop)
    master.start()
    processes.pids["master"] = master.pid
    return master


def directory_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


def _settle(stats: Client | None, mode: Mode, workload: Workload) -> float:
    """Wait until the store is quiet (see the module docstring); returns the seconds waited."""
    started = time.perf_counter()
    if stats is None:
        time.sleep(workload.upstream_settle_s)
        return time.perf_counter() - started
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while mode.tier and stats.stats().get("spills_in_flight", 0) and time.monotonic() < deadline:
        time.sleep(0.02)
    return time.perf_counter() - started


def run_once(mode: Mode, workload: Workload, work_dir: Path, tag: str) -> dict[str, Any]:
    """Run ``workload`` in ``mode`` once; returns the raw answers and counters.

    Args:
        work_dir: holds the logs and, during the run, the tier directory (removed after).
        tag: unique per run (names the keys and the tier directory).

    Returns:
        ``write`` and ``read`` (the workers' answers), ``settle_s``, ``counters`` (mooncake-py's
        master counters after the reads; empty for upstream), ``tier_file_bytes`` (bytes in
        the tier directory after the reads), ``pids``.

    Raises:
        tests.bench.common.ChildError: a worker failed or did not answer.
        RuntimeError: a master did not start.
    """
    logs = work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    tier_dir = work_dir / f"tier-{tag}"
    stderr: deque[str] = deque(maxlen=50)
    with contextlib.ExitStack() as stack:
        processes = _Processes(stack)
        stack.callback(shutil.rmtree, tier_dir, True)
        env: dict[str, str | None] = {}
        stats: Client | None = None
        if mode.impl == PY:
            master = _py_master(processes, workload.lease_ms, stderr)
            address, metadata = master.address, "P2PHANDSHAKE"
            stats = Client.connect(master_server_addr=address, global_segment_size=0)
            stack.callback(stats.close)
        else:
            upstream_master = _upstream_master(processes, mode, logs, workload.lease_ms)
            address, metadata = upstream_master.address, upstream_master.metadata
            env = dict(up.CLIENT_ENV)
            if mode.tier:
                env |= UPSTREAM_TIER_ENV
                env["MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES"] = str(workload.value_bytes)
        base = {
            "local_hostname": "127.0.0.1",
            "metadata_server": metadata,
            "local_buffer_size": workload.value_bytes + 16 * MIB,
            "protocol": "tcp",
            "rdma_devices": "",
            "master_server_addr": address,
        }
        writer_config = {**base, "global_segment_size": workload.memory_bytes}
        if mode.tier:
            tier_dir.mkdir(parents=True)  # upstream's FileStorage refuses a missing directory
            writer_config |= {"enable_ssd_offload": True, "ssd_offload_path": str(tier_dir)}
            if mode.impl == PY:
                writer_config["ssd_offload_fsync"] = workload.fsync
                if workload.quota_bytes:
                    writer_config["ssd_offload_quota"] = workload.quota_bytes
        writer = processes.child(f"{tag}-writer", mode, logs, env)
        writer.call(cmd="setup", config=writer_config, buffer=workload.value_bytes, timeout_s=120)
        reader = processes.child(f"{tag}-reader", mode, logs, env)
        reader.call(
            cmd="setup", config={**base, "global_segment_size": 0}, buffer=workload.value_bytes
        )
        prefix = f"{tag}/obj"
        common = {"prefix": prefix, "n": workload.objects, "size": workload.value_bytes}
        written = writer.call(cmd="write", timeout_s=1800, **common)
        settle_s = _settle(stats, mode, workload)
        read = reader.call(
            cmd="read",
            order=list(workload.order),
            split_by_master_counter=mode.impl == PY,
            timeout_s=1800,
            **common,
        )
        counters: dict[str, int] = {}
        if stats is not None:
            answered = stats.stats()
            counters = {name: int(answered.get(name, 0)) for name in PY_COUNTERS}
        tier_file_bytes = directory_bytes(tier_dir)
        for child in (reader, writer):
            child.call(cmd="quit", timeout_s=60)
        return {
            "write": written,
            "read": read,
            "settle_s": settle_s,
            "counters": counters,
            "tier_file_bytes": tier_file_bytes,
            "pids": dict(processes.pids),
        }
