"""Turning raw measurements into figures: limits, workload rows, the table and the JSON record."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from collections.abc import Sequence
from typing import Any

from tests.bench.common import latency_summary, median, size_label

PACKAGES = ("grpcio", "protobuf", "pyarrow", "numpy", "mooncake-py")


def machine() -> dict[str, Any]:
    """Where the figures were taken."""
    cpu_model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu_model = next(
                (line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")),
                "",
            )
    except OSError:
        pass
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = 0
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_bytes": memory,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "hostname": platform.node(),
    }


def packages() -> dict[str, str | None]:
    """Installed versions of the packages the figures depend on."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def limit_figure(raw: dict[str, Any], label: str) -> dict[str, Any]:
    """A limit's summary: median rate over reps (and per-call latency for request/answer ones)."""
    figure: dict[str, Any] = {"label": label, "kind": raw["kind"], "size": raw["size"]}
    if "rates_Bps" in raw:
        figure |= {
            "unit": "MB/s",
            "value": median(raw["rates_Bps"]) / 1e6,
            "reps_MBps": [r / 1e6 for r in raw["rates_Bps"]],
        }
    else:
        figure |= {"unit": "ops/s", "value": median(raw["rates"]), "reps_ops": raw["rates"]}
        figure |= latency_summary(raw["times"])
    return {**raw_without_samples(raw), **figure}


def raw_without_samples(raw: dict[str, Any]) -> dict[str, Any]:
    """The raw record minus per-call samples and per-rep lists (kept in summary form)."""
    return {k: v for k, v in raw.items() if k not in ("times", "rates", "rates_Bps")}


class RowAccumulator:
    """Collects the commands' answers for one workload row across rounds."""

    def __init__(self, row: dict[str, Any]) -> None:
        self.row = row
        self.times: list[float] = []
        self.rep_rates: list[float] = []

    def add(self, answer: dict[str, Any], work_per_call: float | None = None) -> None:
        """Record one command's calls as one rep.

        Args:
            answer: the worker's answer (``times``, optionally ``bytes_per_call``).
            work_per_call: units of work per call (keys for batch_is_exist, 1 for a call);
                data rows take the bytes from the answer.
        """
        times = answer["times"]
        if not times:
            return
        if work_per_call is None:
            work = sum(answer["bytes_per_call"]) / 1e6
        else:
            work = work_per_call * len(times)
        self.times += times
        self.rep_rates.append(work / sum(times))

    def figure(self, limits: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The row's figures, its limit and the fraction reached."""
        row = dict(self.row)
        row["value"] = median(self.rep_rates)
        row["reps"] = self.rep_rates
        row["times_us"] = [round(t * 1e6, 1) for t in self.times]
        row |= latency_summary(self.times)
        limit = limits.get(row["limit_id"])
        if limit is not None:
            scale = row.get("limit_scale", 1)
            row["limit_label"] = limit["label"]
            row["limit_value"] = limit["value"] * scale
            row["fraction"] = row["value"] / row["limit_value"] if row["limit_value"] else None
        return row


def _fmt_rate(value: float, unit: str) -> str:
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:,.1f} {unit}"


def _fmt_us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


LEGEND = (
    "memcpy N: numpy.copyto of N bytes between preallocated buffers, 1 thread; shm rows use the",
    "  smallest measured N >= the bytes one call moves (else the largest).",
    "stream N msgs: loopback TCP, sender in another process, sendall / recv_into of N-byte",
    "  messages into a preallocated buffer (TCP rows: N = value size).",
    "ping-pong: sequential 64-byte round trips over loopback TCP (reference for small calls).",
    "grpc echo N: grpc.aio generic echo server in another process, sync client, sequential calls;",
    "  N = serialized size of the master request the row makes (keys/s = calls/s x keys).",
    "A fraction near or above 100% is within the limit's spread on this shared machine.",
)


def table(results: dict[str, Any]) -> str:
    """The human-readable report."""
    info = results["machine"]
    params = results["params"]
    lines = [
        f"mooncake-py store benchmark ({results['mode']}): {info['cpu_count']} CPUs "
        f"({info['cpu_model'] or info['machine']}), Python {info['python']}, 127.0.0.1 only",
        f"packages: {', '.join(f'{k} {v}' for k, v in results['packages'].items())}",
        "MB = 10^6 bytes. Rates are medians over reps (workloads: a rep = one round of calls;",
        "limits: reps taken half before and half after the workloads); p50/p99 are per call.",
        "",
        f"{'Limit':<20} {'median':>15} {'p50 us':>8} {'p99 us':>8} {'reps':>5}  "
        "reps min..max (the machine's noise)",
    ]
    for limit in results["limits"].values():
        reps = limit.get("reps_MBps") or limit.get("reps_ops") or [0.0]
        lines.append(
            f"{limit['label']:<20} {_fmt_rate(limit['value'], limit['unit']):>15} "
            f"{_fmt_us(limit.get('p50_us')):>8} {_fmt_us(limit.get('p99_us')):>8} {len(reps):>5}  "
            f"{min(reps):,.0f}..{max(reps):,.0f}"
        )
    lines += [
        "",
        "A = process owning the segment; B = another process, no segment (its puts land in A's).",
        f"{'Workload':<34} {'mooncake-py':>15} {'p50 us':>8} {'p99 us':>8} {'calls':>6}  "
        f"{'limit':<18} {'limit value':>15} {'of limit':>8}",
    ]
    for row in results["rows"]:
        fraction = row.get("fraction")
        lines.append(
            f"{row['label']:<34} {_fmt_rate(row['value'], row['unit']):>15} "
            f"{_fmt_us(row.get('p50_us')):>8} {_fmt_us(row.get('p99_us')):>8} "
            f"{row.get('calls', 0):>6}  {row.get('limit_label', '-'):<18} "
            f"{_fmt_rate(row.get('limit_value', 0.0), row['unit']):>15} "
            f"{'-' if fraction is None else f'{fraction:.0%}':>8}"
        )
    check = results["verification"]
    lines += [
        "",
        *LEGEND,
        "",
        f"verification: {'PASSED' if check['ok'] else 'FAILED'}: {check['stamps_checked']} "
        f"values stamp-checked, {check['full_checked']} compared byte for byte, "
        f"{check['error_count']} errors",
    ]
    lines += [f"  {error}" for error in check["errors"][:10]]
    lines += [
        f"rounds: {params['rounds']} (+{params['warmup']} warm-up) of {params['values']} per "
        "path, fresh keys every round.",
        f"A's segment: {size_label(params['segment'])}, written end to end before timing, so "
        "timed calls pay no first-touch page faults.",
        f"master: read lease {params['lease_ms']} ms, no eviction; untimed waits for the memory "
        f"of removed keys (held until their lease ends): {results['budget_wait_s']:.1f} s.",
        f"run took {results['duration_s']:.1f} s",
    ]
    return "\n".join(lines)


def values_text(sizes: Sequence[int], counts: dict[int, int]) -> str:
    """``32 x 1MiB, 32 x 4MiB`` for the report's footer."""
    return ", ".join(f"{counts[s]} x {size_label(s)}" for s in sizes)
