"""Master memory per object of real master processes: mooncake-py next to upstream Mooncake.

Run from the repository root (``make bench-master-rss``)::

    .venv/bin/python -m tests.bench.master_rss_bench [--objects 1000000] [--value-bytes 64]
        [--batch 1000] [--sample 2000] [--no-upstream] [--install-deps] [--work-dir DIR]
        [--json FILE]

For each side in turn, mooncake-py first, then upstream Mooncake 0.3.13 (its wheel in
``.bench-venv-mooncake``, :mod:`tests.bench.upstream`): a fresh master process with no
eviction (``--eviction_high_watermark_ratio 1.0`` on both) and one client process of that side
(:mod:`tests.bench.master_rss_worker`: mooncake-py's ``MooncakeDistributedStore``, or
upstream's ``mooncake.store.MooncakeDistributedStore`` over protocol "tcp" on loopback), whose
segment holds every value twice over (values rounded up to 64 bytes, at least 16 MiB, the
smallest segment upstream's client accepts). After the client joined, the master's resident
set (``VmRSS`` of ``/proc/<pid>/status``) is read; the client then writes N objects of B bytes
with ``put_batch`` in batches; one second later the master's resident set is read again. Per
side it reports (RSS after - RSS before) / N, the write rate (N over the summed time of the
``put_batch`` calls, the client's stamping of values left out) and that time; then the client
reads back a seeded sample of the keys and compares every byte. Keys are ``mrss/<index>``,
the index in 6 digits or more (11 bytes up to 1M objects), the same on both sides. The CPU
time the master and the client spent during the write (``/proc/<pid>/stat``) is reported too,
to tell which process a write rate is bound by.

A master's resident set counts what its allocator keeps, not only live objects, and one run
per side is one sample: at 1M objects a difference of a few percent says little. The table
goes to stdout; ``--json FILE`` writes the record with the machine description
(:func:`tests.bench.report.machine`), the load average, the commit and modified paths of the
working tree, both sides' versions and settings.
Exit status 1 when a put or a verified read failed on either side.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from mooncake_py.testing import MasterProcess
from tests.bench import upstream as up
from tests.bench.common import MIB, ROOT, Child, latency_summary
from tests.bench.many_clients_run import LEASE_MS, LOCAL_BUFFER, PY, UPSTREAM
from tests.bench.many_clients_stats import proc_stat_cpu_ticks
from tests.bench.report import machine

KEY_PREFIX = "mrss"
VALUE_ALIGN = 64
"""Values are rounded up to this in sizing the segment (the allocators' granularity or less)."""
UPSTREAM_MIN_SEGMENT = 16 * MIB
"""Upstream's client refuses a smaller segment ("Total size must be at least 16777216")."""
SETTLE_S = 1.0
"""How long the master is left alone before each reading of its resident set."""
WRITE_TIMEOUT_S = 3600.0


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclasses.dataclass
class Side:
    """One implementation under test: how its client process is started."""

    name: str  # PY or UPSTREAM
    impl: str  # the worker's --impl
    python: str | None = None  # None: this interpreter
    env: dict[str, str | None] = dataclasses.field(default_factory=dict)


def segment_bytes(objects: int, value_bytes: int) -> int:
    """The client's segment: every value (rounded up to :data:`VALUE_ALIGN`) twice over, in
    whole MiB, at least :data:`UPSTREAM_MIN_SEGMENT`."""
    per_value = -(-value_bytes // VALUE_ALIGN) * VALUE_ALIGN
    return max(UPSTREAM_MIN_SEGMENT, -(-2 * objects * per_value // MIB) * MIB)


def proc_memory(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak resident set) of process ``pid``, in bytes.

    Raises:
        OSError: no such process.
        RuntimeError: ``/proc/<pid>/status`` has no ``VmRSS`` line (a zombie).
    """
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(rest.split()[0]) * 1024  # the kernel writes "<n> kB"
    if "VmRSS" not in found:
        raise RuntimeError(f"no VmRSS in /proc/{pid}/status")
    return found


def key_bytes(objects: int) -> int:
    """The length of the longest key of a run (:func:`tests.bench.worker.keys_of`)."""
    return len(KEY_PREFIX) + 1 + max(6, len(str(objects - 1)))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time process ``pid`` has used, in seconds (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
        user, system = proc_stat_cpu_ticks(handle.read())
    return (user + system) / os.sysconf("SC_CLK_TCK")


def working_tree() -> dict[str, Any]:
    """The commit the figures were taken at and the paths modified since (``git status``),
    as the masters import the tree as it is; empty when git cannot answer."""
    found: dict[str, Any] = {}
    for name, command in (
        ("commit", ["git", "rev-parse", "HEAD"]),
        ("modified", ["git", "status", "--porcelain", "--untracked-files=no"]),
    ):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            result = subprocess.run(
                command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
            )
            found[name] = result.stdout.strip() if name == "commit" else result.stdout.split("\n")
    if "modified" in found:
        found["modified"] = [line.strip() for line in found["modified"] if line.strip()]
    return found


def _drain(stream: IO[str] | None) -> None:
    """Read a pipe to its end in a daemon thread, so that the writer never blocks on it."""
    if stream is not None:
        sink: collections.deque[str] = collections.deque(maxlen=50)
        threading.Thread(target=sink.extend, args=(stream,), daemon=True).start()


def _start_master(side: Side, stack: contextlib.ExitStack, logs: Path) -> tuple[int, str, str]:
    """Start ``side``'s master (stopped when ``stack`` closes); ``(pid, address, metadata)``."""
    if side.impl == "py":
        args = ["--log_level", "WARNING", "--eviction_high_watermark_ratio", "1.0"]
        master = MasterProcess(args=args)
        stack.callback(master.stop)
        master.start()
        assert master.process is not None
        _drain(master.process.stdout)
        _drain(master.process.stderr)
        return master.pid, master.address, "P2PHANDSHAKE"
    upstream = up.UpstreamMaster(up.default_venv(), logs / "up-master.log", LEASE_MS, False)
    stack.callback(upstream.stop)
    upstream.start()
    return upstream.pid, upstream.address, upstream.metadata


def run_side(side: Side, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """One side's run: fresh master and client, RSS before, the write, RSS after, the check.

    Returns: ``rss_before`` / ``rss_after`` / ``hwm_after`` (bytes), ``bytes_per_object``,
    ``write_s`` (summed ``put_batch`` time), ``keys_per_s``, ``write_wall_s`` (the write
    command as the parent saw it), ``master_cpu_s`` / ``client_cpu_s`` (CPU time used during
    the write command), ``put_batch`` (per-call latency figures), ``put_errors``,
    ``verified`` / ``verify_errors`` (samples), ``master_pid``, ``segment_bytes``,
    ``versions``, ``setup_s``.
    Raises:
        RuntimeError: the master did not start.
        tests.bench.common.ChildError: the client failed to start, join or answer.
    """
    segment = segment_bytes(args.objects, args.value_bytes)
    with contextlib.ExitStack() as stack:
        master_pid, address, metadata = _start_master(side, stack, logs)
        short = "py" if side.impl == "py" else "up"
        client = Child(
            f"{short}-client",
            "tests.bench.master_rss_worker",
            ["--impl", side.impl],
            side.env,
            logs,
            side.python,
        )
        stack.callback(client.stop)
        ready = client.receive(120.0)
        joined = client.call(
            timeout_s=120.0,
            cmd="setup",
            master=address,
            metadata=metadata,
            segment=segment,
            buffer=args.batch * args.value_bytes,
            local_buffer=LOCAL_BUFFER,
        )
        time.sleep(SETTLE_S)
        before = proc_memory(master_pid)
        _log(f"{side.name}: master RSS {before['VmRSS'] / MIB:.1f} MiB; writing {args.objects:,}")
        cpu_before = cpu_seconds(master_pid), cpu_seconds(client.pid)
        started = time.perf_counter()
        written = client.call(
            timeout_s=WRITE_TIMEOUT_S,
            cmd="put",
            prefix=KEY_PREFIX,
            n=args.objects,
            size=args.value_bytes,
            batch=args.batch,
            mode="copy",  # put_batch of views of the registered buffer
        )
        write_wall_s = time.perf_counter() - started
        cpu_after = cpu_seconds(master_pid), cpu_seconds(client.pid)
        time.sleep(SETTLE_S)
        after = proc_memory(master_pid)
        checked = client.call(
            timeout_s=600.0,
            cmd="verify_sample",
            prefix=KEY_PREFIX,
            n=args.objects,
            size=args.value_bytes,
            sample=args.sample,
            seed=args.seed,
        )
    write_s = float(sum(written["times"]))
    return {
        "master_pid": master_pid,
        "segment_bytes": segment,
        "setup_s": joined.get("setup_s"),
        "versions": ready.get("versions", {}),
        "rss_before": before["VmRSS"],
        "rss_after": after["VmRSS"],
        "hwm_after": after.get("VmHWM"),
        "bytes_per_object": (after["VmRSS"] - before["VmRSS"]) / args.objects,
        "write_s": write_s,
        "keys_per_s": args.objects / write_s if write_s > 0 else None,
        "write_wall_s": write_wall_s,
        "master_cpu_s": cpu_after[0] - cpu_before[0],
        "client_cpu_s": cpu_after[1] - cpu_before[1],
        "put_batch": latency_summary(written["times"]),
        "put_errors": written["error_count"],
        "put_error_samples": written["errors"],
        "verified": checked["checked"],
        "verify_errors": checked["error_count"],
        "verify_error_samples": checked["errors"],
    }


def _ratio(ours: float | None, theirs: float | None) -> str:
    return "-" if ours is None or not theirs else f"{ours / theirs:.2f}"


COLUMNS = (
    ("RSS before, MiB", "rss_before", lambda v: f"{v / MIB:,.1f}"),
    ("RSS after, MiB", "rss_after", lambda v: f"{v / MIB:,.1f}"),
    ("B / object", "bytes_per_object", lambda v: f"{v:,.0f}"),
    ("put_batch keys/s", "keys_per_s", lambda v: f"{v or 0:,.0f}"),
    ("write s", "write_s", lambda v: f"{v:.1f}"),
    ("master CPU s", "master_cpu_s", lambda v: f"{v:.1f}"),
    ("client CPU s", "client_cpu_s", lambda v: f"{v:.1f}"),
)
"""The table's figures: heading, key in :func:`run_side`'s answer, format."""


def table(results: dict[str, dict[str, Any]]) -> str:
    """A markdown table: a row per side, then mooncake-py / upstream when both ran."""
    lines = [
        "| side | " + " | ".join(head for head, _, _ in COLUMNS) + " | verified |",
        "|:---|" + "---:|" * (len(COLUMNS) + 1),
    ]
    for name, figures in results.items():
        cells = [fmt(figures[key]) for _, key, fmt in COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {figures['verified']:,} |")
    if PY in results and UPSTREAM in results:
        ours, theirs = results[PY], results[UPSTREAM]
        cells = [_ratio(ours[key], theirs[key]) for _, key, _ in COLUMNS]
        lines.append("| mooncake-py / upstream | " + " | ".join(cells) + " | - |")
    return "\n".join(lines)


def _upstream_problem(args: argparse.Namespace) -> str:
    """ "" when upstream runs; otherwise why not."""
    if args.no_upstream:
        return "skipped (--no-upstream)"
    return up.unusable_reason(args.install_deps)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--objects", type=int, default=1_000_000, help="objects written (1M)")
    parser.add_argument("--value-bytes", type=int, default=64, help="bytes per value (64)")
    parser.add_argument("--batch", type=int, default=1_000, help="keys per put_batch (1000)")
    parser.add_argument("--sample", type=int, default=2_000, help="keys read back (2000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the sample (1)")
    parser.add_argument("--no-upstream", action="store_true", help="skip upstream Mooncake")
    parser.add_argument(
        "--install-deps", action="store_true", help="install upstream's venv when missing"
    )
    parser.add_argument("--work-dir", type=Path, help="keep the processes' logs here")
    parser.add_argument("--json", type=Path, help="write the record here")
    args = parser.parse_args(argv)
    if min(args.objects, args.batch, args.sample) < 1:
        parser.error("--objects, --batch and --sample must be positive")
    if args.value_bytes < 16:
        parser.error("--value-bytes must be at least 16 (each value starts with a 16-byte stamp)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    upstream_problem = _upstream_problem(args)
    if upstream_problem:
        _log(f"upstream Mooncake: {upstream_problem}")
    sides = [Side(PY, "py")]
    if not upstream_problem:
        python = str(up.venv_python(up.default_venv()))
        sides.append(Side(UPSTREAM, "upstream", python=python, env=dict(up.CLIENT_ENV)))
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="master-rss-bench-"))
    logs = work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.time()
    load_at_start = os.getloadavg()
    tree = working_tree()
    results: dict[str, dict[str, Any]] = {}
    try:
        for side in sides:
            results[side.name] = run_side(side, args, logs)
    except BaseException:
        _log(f"the processes' logs are under {logs}")
        raise
    print(
        f"master RSS per object: {args.objects:,} objects of {args.value_bytes} B, put_batch of"
        f" {args.batch}, keys of up to {key_bytes(args.objects)} B, one client process,"
        " no eviction; one run per side (mooncake-py first);"
        f" upstream: {upstream_problem or 'Mooncake 0.3.13'}\n"
    )
    print(table(results))
    failures = sum(r["put_errors"] + r["verify_errors"] for r in results.values())
    for name, r in results.items():
        for sample in r["put_error_samples"] + r["verify_error_samples"]:
            print(f"{name}: {sample}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "started": started,
            "wall_s": time.time() - started,
            "settings": {k: v for k, v in vars(args).items() if k not in ("json", "work_dir")},
            "key_bytes": key_bytes(args.objects),
            "upstream": upstream_problem or f"{up.PACKAGE}=={up.VERSION}",
            "machine": machine(),
            "working_tree": tree,
            "load_average": {"start": load_at_start, "end": os.getloadavg()},
            "results": results,
            "ratios": {
                name: results[PY][name] / results[UPSTREAM][name]
                for name in ("bytes_per_object", "keys_per_s", "rss_before", "rss_after")
                if UPSTREAM in results and results[PY][name] is not None and results[UPSTREAM][name]
            },
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(f"\nwrote {args.json}")
    if args.work_dir is None:
        shutil.rmtree(work_dir, ignore_errors=True)
    if failures:
        _log(f"{failures} puts or verified reads failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
