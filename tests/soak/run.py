"""Soak: N client processes doing mixed operations against a master process for a while,
every value content-hashed, the master's RSS sampled.

Usage::

    python -m tests.soak.run --clients 4 --minutes 10 [--json report.json]

Each client is a real process with its own segment (:mod:`tests.soak.worker`); every other
one (``--tcp-every``) runs with ``MOONCAKE_PY_FORCE_TCP=1``, so transfers go over the TCP
transfer service as well as through shared memory. The master is ``python -m
mooncake_py.master`` in a child process (:class:`mooncake_py.testing.MasterProcess`).

The report (plain text, and JSON with ``--json``) gives operations by kind and per second,
errors by code, wrong reads, and the master's RSS: first, last, max, and after warm-up (the
first ``--warmup`` fraction of the run, at least 20 s) its slope (MiB per minute, least
squares) and its *growth*: the mean of the last fifth of the samples minus the mean of the
first fifth after warm-up.

Exit status: 0; 1 on any wrong read, a client that crashed or raised, an error the master
logged (an exception escaping a handler is logged as an ERROR with its traceback), or an RSS growth
beyond ``--rss-bound-mib`` (default 64 MiB: the master's working set is bounded by the key
space and the leases the clients hold, so once warm its RSS must stay flat; 64 MiB is far above
the allocator's and the interpreter's noise, far below a leak over minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

from mooncake_py.testing import MasterProcess

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
MIB = 1 << 20


class LogDrain:
    """Reads a child's log stream on a thread, so the pipe never fills and blocks the child,
    and keeps its error lines (``ERROR`` records, tracebacks).

    Attributes:
        lines: lines read so far.
        errors: the error lines, at most ``keep``.
        error_count: every error line, kept or not.
    """

    def __init__(self, stream: IO[str] | None, keep: int = 50) -> None:
        self.lines = 0
        self.errors: list[str] = []
        self.error_count = 0
        self._keep = keep
        self._lock = threading.Lock()
        self._taken = 0
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str] | None) -> None:
        if stream is None:
            return
        for line in stream:
            with self._lock:
                self.lines += 1
                if " ERROR " in line or line.startswith("Traceback"):
                    self.error_count += 1
                    if len(self.errors) < self._keep:
                        self.errors.append(line.rstrip())

    def take_new_errors(self) -> list[str]:
        """Error lines kept since the last call."""
        with self._lock:
            new, self._taken = self.errors[self._taken :], len(self.errors)
        return new


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def slope_per_minute(samples: list[tuple[float, int]]) -> float:
    """Least-squares slope of ``(seconds, bytes)`` samples, in MiB per minute."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_r = sum(r for _, r in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (r - mean_r) for t, r in samples)
    return cov / var * 60 / MIB


def rss_summary(samples: list[tuple[float, int]], warmup_s: float) -> dict[str, Any]:
    """First, last, max, and slope and growth after warm-up (see the module docstring)."""
    values = [r for _, r in samples]
    warm = [(t, r) for t, r in samples if t >= warmup_s] or samples
    fifth = max(1, len(warm) // 5)
    early = sum(r for _, r in warm[:fifth]) / fifth
    late = sum(r for _, r in warm[-fifth:]) / fifth
    return {
        "samples": len(samples),
        "first_mib": round(values[0] / MIB, 1),
        "last_mib": round(values[-1] / MIB, 1),
        "max_mib": round(max(values) / MIB, 1),
        "warmup_s": round(warmup_s, 1),
        "after_warmup_first_mib": round(warm[0][1] / MIB, 1),
        "slope_mib_per_min": round(slope_per_minute(warm), 2),
        "growth_mib": round((late - early) / MIB, 1),
    }


def start_worker(spec: dict[str, Any], force_tcp: bool) -> subprocess.Popen[str]:
    env = {**os.environ, "MOONCAKE_PY_FORCE_TCP": "1" if force_tcp else "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.soak.worker", json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the soak; returns the report."""
    seconds = args.seconds if args.seconds else args.minutes * 60
    warmup_s = max(20.0, seconds * args.warmup)
    with MasterProcess() as master:
        assert master.process is not None
        log = LogDrain(master.process.stderr)
        started = time.monotonic()
        samples = [(0.0, rss_bytes(master.pid))]
        workers = [
            start_worker(
                {
                    "master": master.address,
                    "index": i,
                    "clients": args.clients,
                    "seconds": seconds,
                    "seed": args.seed * 1000 + i,
                    "segment_bytes": args.segment_mib * MIB,
                    "keys": args.keys,
                },
                force_tcp=args.tcp_every > 0 and (i + 1) % args.tcp_every == 0,
            )
            for i in range(args.clients)
        ]
        while any(w.poll() is None for w in workers):
            time.sleep(args.rss_interval)
            samples.append((time.monotonic() - started, rss_bytes(master.pid)))
        reports = []
        crashed = []
        for i, worker in enumerate(workers):
            out = worker.stdout.read() if worker.stdout else ""
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if worker.returncode != 0 or not lines:
                crashed.append({"index": i, "exit": worker.returncode})
            else:
                reports.append(json.loads(lines[-1]))
        master_alive = master.process is not None and master.process.poll() is None
    ops: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    exceptions: Counter[str] = Counter()
    for report in reports:
        ops.update(report["ops"])
        errors.update(report["errors"])
        exceptions.update(report["exceptions"])
    elapsed = max((r["seconds"] for r in reports), default=seconds)
    total = sum(ops.values())
    return {
        "clients": args.clients,
        "tcp_clients": sum(1 for r in reports if r["tcp"]),
        "seconds": elapsed,
        "ops_total": total,
        "ops_per_s": round(total / elapsed, 1) if elapsed else 0.0,
        "ops": dict(sorted(ops.items())),
        "errors": dict(errors.most_common()),
        "exceptions": dict(exceptions.most_common()),
        "wrong_reads": sum(r["wrong_reads"] for r in reports),
        "wrong_examples": [e for r in reports for e in r["wrong_examples"]][:10],
        "crashed_clients": crashed,
        "master_alive_at_end": master_alive,
        "master_log_lines": log.lines,
        "master_error_lines": log.error_count,
        "master_errors": log.errors[:10],
        "master_rss": rss_summary(samples, warmup_s),
        "rss_bound_mib": args.rss_bound_mib,
    }


def verdict(report: dict[str, Any]) -> list[str]:
    """Why the soak failed (empty: it passed)."""
    reasons = []
    if report["wrong_reads"]:
        reasons.append(f"{report['wrong_reads']} wrong reads")
    if report["crashed_clients"]:
        reasons.append(f"crashed clients: {report['crashed_clients']}")
    if report["exceptions"]:
        reasons.append(f"{sum(report['exceptions'].values())} exceptions escaped data calls")
    if report["master_error_lines"]:
        reasons.append(f"the master logged {report['master_error_lines']} error lines")
    if not report["master_alive_at_end"]:
        reasons.append("the master died")
    if report["master_rss"]["growth_mib"] > report["rss_bound_mib"]:
        reasons.append(
            f"master RSS grew {report['master_rss']['growth_mib']} MiB after warm-up "
            f"(bound {report['rss_bound_mib']} MiB)"
        )
    return reasons


def print_report(report: dict[str, Any]) -> None:
    rss = report["master_rss"]
    print(
        f"soak: {report['clients']} clients ({report['tcp_clients']} over TCP), "
        f"{report['seconds']:.0f} s, {report['ops_total']} ops, {report['ops_per_s']} ops/s"
    )
    print("  ops: " + ", ".join(f"{k} {v}" for k, v in report["ops"].items()))
    print("  errors: " + (", ".join(f"{k} {v}" for k, v in report["errors"].items()) or "none"))
    print(f"  exceptions: {report['exceptions'] or 'none'}")
    print(f"  wrong reads: {report['wrong_reads']} {report['wrong_examples'] or ''}")
    print(
        f"  master log: {report['master_log_lines']} lines, "
        f"{report['master_error_lines']} errors {report['master_errors'] or ''}"
    )
    print(
        f"  master RSS MiB: first {rss['first_mib']}, after warm-up "
        f"{rss['after_warmup_first_mib']}, last {rss['last_mib']}, max {rss['max_mib']}; "
        f"after warm-up ({rss['warmup_s']} s): slope {rss['slope_mib_per_min']} MiB/min, "
        f"growth {rss['growth_mib']} MiB (bound {report['rss_bound_mib']})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=0.0, help="overrides --minutes")
    parser.add_argument("--tcp-every", type=int, default=2, help="every Nth client over TCP")
    parser.add_argument("--segment-mib", type=int, default=64)
    parser.add_argument("--keys", type=int, default=2000, help="keys per client")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rss-interval", type=float, default=2.0, help="seconds")
    parser.add_argument("--warmup", type=float, default=0.25, help="fraction of the run")
    parser.add_argument("--rss-bound-mib", type=float, default=64.0)
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    report = run(args)
    reasons = verdict(report)
    report["failed"] = reasons
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print("soak: " + ("FAILED: " + "; ".join(reasons) if reasons else "passed"))
    return 1 if reasons else 0


if __name__ == "__main__":
    sys.exit(main())
