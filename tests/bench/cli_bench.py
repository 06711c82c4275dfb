"""Ops CLI listing benchmark: ``mooncake-py sessions ls --sort bytes --top 10`` over 100,000
sessions.

Run from the repository root::

    .venv/bin/python -m tests.bench.cli_bench [--sessions 100000] [--repeat 5]

A real master (:class:`InProcessMaster`, gRPC plus stream channel on 127.0.0.1) is filled with
one object per session through a :class:`MooncakeDistributedStore`: tagged ``put_batch`` calls
of 1,000 keys, each key tagged with its own session (sizes vary, so sorting by bytes matters).
Then the CLI runs as a child process (``python -m mooncake_py.cli``) several times; the report
gives the wall time of each run (process start and imports included), the time of the same
command with ``--help`` only (the start-up share), and an in-process fetch of all pages
through :class:`MasterClient` (the paging share). The CPU time of the CLI process, and with
``--master-process`` that of the master per listing, show where the time goes.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

from mooncake_py import MooncakeDistributedStore, ReplicateConfig
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.testing import InProcessMaster, MasterProcess

BATCH = 1000


def _populate(store: MooncakeDistributedStore, sessions: int) -> None:
    for start in range(0, sessions, BATCH):
        ids = range(start, min(start + BATCH, sessions))
        keys = [f"key-{i:06d}" for i in ids]
        values = [b"x" * (64 + (i * 7919) % 4000) for i in ids]
        tags = ReplicateConfig(kv_sessions=[[f"session-{i:06d}"] for i in ids])
        assert store.put_batch(keys, values, tags) == 0


def _run_cli(address: str, *args: str) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the child, stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "mooncake_py.cli", "--master", address, *args],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, result.stdout


def _process_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` (Linux), 0 without one."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(address: str, sessions: int, repeat: int, master_pid: int | None) -> None:
    client = MasterClient(address)
    client.connect_stream()
    fetch_times = []
    for _ in range(repeat):
        started, cursor, count = time.perf_counter(), "", 0
        while True:
            code, page, cursor = client.list_kv_sessions("default", cursor, 1024, None, 0)
            assert code == 0
            count += len(page)
            if not cursor:
                break
        fetch_times.append(time.perf_counter() - started)
        assert count == sessions
    client.close()

    help_runs = [_run_cli(address, "--help") for _ in range(repeat)]
    help_times = [wall for wall, _, _ in help_runs]
    ls_times, ls_cpu, master_cpu = [], [], []
    stdout = ""
    for _ in range(repeat):
        master_before = _process_cpu_s(master_pid)
        wall, cpu, stdout = _run_cli(address, "sessions", "ls", "--sort", "bytes", "--top", "10")
        master_cpu.append(_process_cpu_s(master_pid) - master_before)
        ls_times.append(wall)
        ls_cpu.append(cpu)
    print(stdout, end="")
    print(f"fetch of all pages (MasterClient):  median {statistics.median(fetch_times):.2f}s")
    print(f"CLI start-up (--help):              median {statistics.median(help_times):.2f}s")
    print(
        f"sessions ls --sort bytes --top 10:  median {statistics.median(ls_times):.2f}s, "
        f"min {min(ls_times):.2f}s, max {max(ls_times):.2f}s over {repeat} runs"
    )
    print(
        f"CPU time of the CLI process:        median {statistics.median(ls_cpu):.2f}s "
        f"(start-up {statistics.median(cpu for _, cpu, _ in help_runs):.2f}s)"
    )
    if master_pid is not None:
        print(f"CPU time of the master per listing: median {statistics.median(master_cpu):.2f}s")


def main() -> None:
    """Populate, measure, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--master-process",
        action="store_true",
        help="run the master as a child process instead of in this process",
    )
    options = parser.parse_args()
    flags = {"kv_session_max_sessions": max(options.sessions, 1)}
    master: InProcessMaster | MasterProcess
    if options.master_process:
        master = MasterProcess([arg for k, v in flags.items() for arg in (f"--{k}", str(v))])
        master.start()
    else:
        master = InProcessMaster(**flags).start()
    store = MooncakeDistributedStore()
    try:
        config = {"master_server_address": master.address, "global_segment_size": 512 << 20}
        assert store.setup(config) == 0
        started = time.perf_counter()
        _populate(store, options.sessions)
        kind = "child process" if options.master_process else "in-process"
        print(
            f"{kind} master: populated {options.sessions} sessions in "
            f"{time.perf_counter() - started:.1f}s"
        )
        pid = master.pid if isinstance(master, MasterProcess) else None
        _measure(master.address, options.sessions, options.repeat, pid)
    finally:
        store.close()
        master.stop()


if __name__ == "__main__":
    main()
