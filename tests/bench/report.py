"""Turning raw measurements into figures: limits, workload rows, ratios and their noise, the
table and the targets (the comparison of two result files is :mod:`tests.bench.compare`)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from collections.abc import Sequence
from typing import Any

import numpy as np

from tests.bench.common import latency_summary, median, quartiles, relative_spread, size_label

PY = "mooncake-py"
UPSTREAM = "upstream"
IMPLEMENTATIONS = (PY, UPSTREAM)
PACKAGES = ("grpcio", "protobuf", "pyarrow", "numpy", "mooncake-py")
NO_DIFFERENCE = "no difference"


def _os_name() -> str:
    """The distribution's PRETTY_NAME from /etc/os-release ("" when there is none)."""
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME", "")
    except OSError:
        return ""


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
        "kernel": platform.release(),
        "kernel_version": platform.version(),
        "os": _os_name(),
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
    """Installed versions (in this, mooncake-py's, environment) of what the figures depend on."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


# ---------------------------------------------------------------------------------------------
# Figures


LIMIT_PERCENTILE = 90


def limit_figure(raw: dict[str, Any], label: str) -> dict[str, Any]:
    """A limit's summary. Its value is the 90th percentile of the reps, not their median: other
    programs on a shared machine only ever slow a rep down, and a limit is what the machine can
    do (per-call latency too for request/answer limits)."""
    figure: dict[str, Any] = {"label": label, "kind": raw["kind"], "size": raw["size"]}
    if "rates_Bps" in raw:
        reps = [r / 1e6 for r in raw["rates_Bps"]]
        figure |= {"unit": "MB/s", "reps_MBps": reps}
    else:
        reps = list(raw["rates"])
        figure |= {"unit": "ops/s", "reps_ops": reps}
        figure |= latency_summary(raw["times"])
    figure["value"] = float(np.percentile(reps, LIMIT_PERCENTILE)) if reps else 0.0
    figure["median"] = median(reps)
    figure["spread"] = relative_spread(reps)
    return {**raw_without_samples(raw), **figure}


def raw_without_samples(raw: dict[str, Any]) -> dict[str, Any]:
    """The raw record minus per-call samples and per-rep lists (kept in summary form)."""
    return {k: v for k, v in raw.items() if k not in ("times", "rates", "rates_Bps")}


def verdict(ours: Sequence[float], theirs: Sequence[float]) -> str:
    """``faster`` / ``slower`` / ``no difference`` for two sets of per-rep rates: no difference
    when their interquartile ranges overlap (the ratio of medians is inside the noise)."""
    if not ours or not theirs:
        return ""
    a1, a3 = quartiles(ours)
    b1, b3 = quartiles(theirs)
    if a1 <= b3 and b1 <= a3:
        return NO_DIFFERENCE
    return "faster" if median(ours) > median(theirs) else "slower"


class RowAccumulator:
    """Collects one implementation's answers for one workload row across rounds."""

    def __init__(self, row: dict[str, Any]) -> None:
        self.row = row
        self.times: list[float] = []
        self.reps: list[dict[str, float]] = []

    def add(self, answer: dict[str, Any], keys_per_call: int = 1) -> None:
        """Record one command's calls as one rep.

        Args:
            answer: the worker's answer (``times``, optionally ``bytes_per_call``).
            keys_per_call: keys per call (batch_is_exist), for keys/s rows.
        """
        times = answer["times"]
        if not times:
            return
        self.times += times
        self.reps.append(
            {
                "calls": len(times),
                "seconds": sum(times),
                "bytes": sum(answer.get("bytes_per_call", ())),
                "keys": keys_per_call * len(times),
            }
        )

    def rates(self, unit: str) -> list[float]:
        """Per-rep rates in ``unit`` (MB/s, ops/s or keys/s)."""
        field, scale = {"MB/s": ("bytes", 1e-6), "ops/s": ("calls", 1.0), "keys/s": ("keys", 1.0)}[
            unit
        ]
        return [rep[field] * scale / rep["seconds"] for rep in self.reps if rep["seconds"] > 0]

    def figure(self) -> dict[str, Any]:
        """This implementation's figures for the row."""
        reps = self.rates(self.row["unit"])
        q1, q3 = quartiles(reps)
        figure: dict[str, Any] = {
            "value": median(reps),
            "reps": reps,
            "q1": q1,
            "q3": q3,
            "spread": relative_spread(reps),
            "ops_per_s": median(self.rates("ops/s")),
        }
        if any(rep["bytes"] for rep in self.reps):
            figure["MBps"] = median(self.rates("MB/s"))
        figure |= latency_summary(self.times)
        figure["times_us"] = [round(t * 1e6, 1) for t in self.times]
        return figure


def row_record(
    definition: dict[str, Any],
    ours: RowAccumulator,
    theirs: RowAccumulator | None,
    limits: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """One table row: both implementations' figures, their ratio, the limit and the fractions."""
    row = dict(definition)
    row[PY] = ours.figure()
    row[UPSTREAM] = theirs.figure() if theirs is not None and theirs.reps else None
    value = row[PY]["value"]
    if row[UPSTREAM] is not None and row[UPSTREAM]["value"] > 0:
        row["ratio"] = value / row[UPSTREAM]["value"]
        row["verdict"] = verdict(row[PY]["reps"], row[UPSTREAM]["reps"])
    else:
        row["ratio"], row["verdict"] = None, ""
    limit = limits.get(row["limit_id"])
    if limit is not None:
        row["limit_label"] = limit["label"]
        row["limit_value"] = limit["value"] * row.get("limit_scale", 1)
        row["fraction"] = value / row["limit_value"] if row["limit_value"] else None
        if row[UPSTREAM] is not None and row["limit_value"]:
            row["upstream_fraction"] = row[UPSTREAM]["value"] / row["limit_value"]
    return row


def pressure_summary(reps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Median and range of the memory-pressure reps of one implementation."""
    if not reps:
        return None
    summary: dict[str, Any] = {"reps": reps}
    for field in ("failed_puts", "readable", "correct", "wrong", "missing", "put_s", "wall_s"):
        values = [rep[field] for rep in reps]
        summary[field] = median(values)
        summary[f"{field}_range"] = [min(values), max(values)]
    summary["all_readable_correct"] = all(rep["wrong"] == 0 for rep in reps)
    return summary


# ---------------------------------------------------------------------------------------------
# Formatting


def fmt_rate(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    text = f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"
    return f"{text} {unit}".rstrip()


def _fmt_us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _fmt_spread(spread: float | None) -> str:
    return "-" if spread is None else f"±{spread:.0%}"


def _fmt_ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _fmt_fraction(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.0%}"


LEGEND = (
    "memcpy N: numpy.copyto of N bytes between preallocated buffers, 1 thread; data rows use the",
    "  smallest measured N >= the bytes one call moves (else the largest). memcpy N/P: the same",
    "  N bytes copied as N/P copies of P bytes (the limit of batches of P-byte values).",
    "stream N msgs: loopback TCP, sender in another process, sendall / recv_into of N-byte",
    "  messages into a preallocated buffer (TCP rows: N = value size).",
    "ping-pong: sequential 64-byte round trips over loopback TCP (reference for small calls).",
    "grpc echo N: grpc.aio generic echo server in another process, sync grpc client (as",
    "  mooncake-py's gRPC master client), sequential calls; N = serialized size of the master",
    "  request the row makes (keys/s = calls/s x keys). grpc.aio unary / bidi: the same server",
    "  called from a grpc.aio client, unary calls / write+read round trips on one bidi stream.",
    "spread: half the interquartile range of the reps, over their median. ratio = mooncake-py /",
    f"  upstream; '{NO_DIFFERENCE}' when the two sets of reps' interquartile ranges overlap.",
    "* upstream has no shared-memory path: its cross-process B rows (protocol tcp on loopback) are",
    "  measured once and stand next to both the shm and the forced-TCP rows (its A writes its own",
    "  segment locally, so forced-TCP A rows have no upstream figure); it has one master",
    "  transport, shown next to both of mooncake-py's (stream channel, gRPC).",
    "A fraction near or above 100% is within the limit's spread on this shared machine.",
)

GROUPS = (
    ("local", "Single process: the segment owner writes and reads its own segment"),
    ("shm", "Cross-process on one host: A owns the segment, B (no segment) reads and writes it"),
    ("tcp", "Cross-process, forced TCP (MOONCAKE_PY_FORCE_TCP=1)"),
    ("meta", "Metadata, from B (one sequential caller)"),
)


def _versions_line(name: str, versions: dict[str, Any] | None) -> str:
    if not versions:
        return f"  {name}: not run"
    shown = ", ".join(f"{k} {v}" for k, v in versions.items() if k != "executable")
    return f"  {name}: {shown}"


def _workload_lines(results: dict[str, Any]) -> list[str]:
    compared = results.get("compared", False)
    header = f"{'Workload':<44} {PY:>16} {'spread':>6} {'p50 us':>8} {'p99 us':>8}"
    if compared:
        header += f" {UPSTREAM:>16} {'spread':>6} {'p50 us':>8} {'ratio':>7} {'verdict':<13}"
    header += f"  {'limit':<20} {'limit value':>16} {'of limit':>8}"
    lines: list[str] = []
    for group, title in GROUPS:
        rows = [row for row in results["rows"] if row.get("group") == group]
        if not rows:
            continue
        lines += ["", title, header]
        for row in rows:
            ours, theirs = row[PY], row.get(UPSTREAM)
            unit = row["unit"]
            text = (
                f"{row['label']:<44} {fmt_rate(ours['value'], unit):>16} "
                f"{_fmt_spread(ours.get('spread')):>6} {_fmt_us(ours.get('p50_us')):>8} "
                f"{_fmt_us(ours.get('p99_us')):>8}"
            )
            if compared:
                mark = "*" if row.get("upstream_id") not in (row["id"], None) else " "
                if theirs is None:
                    text += f" {'-':>16} {'-':>6} {'-':>8} {'-':>7} {'':<13}"
                else:
                    text += (
                        f" {fmt_rate(theirs['value'], unit) + mark:>16} "
                        f"{_fmt_spread(theirs.get('spread')):>6} "
                        f"{_fmt_us(theirs.get('p50_us')):>8} {_fmt_ratio(row.get('ratio')):>7} "
                        f"{row.get('verdict', ''):<13}"
                    )
            text += (
                f"  {row.get('limit_label', '-'):<20} "
                f"{fmt_rate(row.get('limit_value'), unit):>16} "
                f"{_fmt_fraction(row.get('fraction')):>8}"
            )
            lines.append(text)
    return lines


def _pressure_lines(results: dict[str, Any]) -> list[str]:
    pressure = results.get("pressure") or {}
    if not any(pressure.values()):
        return []
    params = results["params"]
    puts = params["pressure_bytes"] // params["pressure_value"]
    lines = [
        "",
        f"Memory pressure: one client, a {size_label(params['pressure_segment'])} segment, "
        f"{puts} put_from calls of {size_label(params['pressure_value'])} "
        f"({size_label(params['pressure_bytes'])}), master eviction at its defaults; then every "
        "key read back with get_into and each readable value compared byte for byte "
        "(medians over reps, min..max in brackets)",
        f"{'':<14} {'failed puts':>16} {'readable':>14} {'correct':>14} {'wrong':>8} "
        f"{'put wall s':>16} {'total wall s':>16}",
    ]
    for name in IMPLEMENTATIONS:
        summary = pressure.get(name)
        if not summary:
            continue

        def cell(field: str, digits: int = 0, summary: dict[str, Any] = summary) -> str:
            low, high = summary[f"{field}_range"]
            value = summary[field]
            if low == high:
                return f"{value:.{digits}f}"
            return f"{value:.{digits}f} [{low:.{digits}f}..{high:.{digits}f}]"

        lines.append(
            f"{name:<14} {cell('failed_puts'):>16} {cell('readable'):>14} {cell('correct'):>14} "
            f"{cell('wrong'):>8} {cell('put_s', 2):>16} {cell('wall_s', 2):>16}"
        )
    return lines


def table(results: dict[str, Any]) -> str:
    """The human-readable report."""
    info = results["machine"]
    params = results["params"]
    versions = results.get("versions", {})
    lines = [
        f"mooncake-py store benchmark ({results['mode']}): {info['cpu_count']} CPUs "
        f"({info['cpu_model'] or info['machine']}), {info['memory_bytes'] / 2**30:.0f} GiB, "
        f"{info['platform']}, 127.0.0.1 only",
        _load_line(results),
        "versions:",
        _versions_line(PY, versions.get(PY) or results.get("packages")),
        _versions_line(UPSTREAM, versions.get(UPSTREAM)),
        "MB = 10^6 bytes. Workload rates are medians over reps (a rep = one round of calls; the",
        "two implementations take turns round by round); p50/p99 are per call. A limit is the",
        "90th percentile of its reps, split between checkpoints before, between and after the",
        "store phases (load from other programs only slows a rep down).",
        "",
        f"{'Limit':<24} {'limit (p90)':>15} {'median':>15} {'spread':>6} {'p50 us':>8} "
        f"{'p99 us':>8} {'reps':>5}  reps min..max",
    ]
    for limit in results["limits"].values():
        reps = limit.get("reps_MBps") or limit.get("reps_ops") or [0.0]
        lines.append(
            f"{limit['label']:<24} {fmt_rate(limit['value'], limit['unit']):>15} "
            f"{fmt_rate(limit.get('median'), limit['unit']):>15} "
            f"{_fmt_spread(limit.get('spread')):>6} {_fmt_us(limit.get('p50_us')):>8} "
            f"{_fmt_us(limit.get('p99_us')):>8} {len(reps):>5}  "
            f"{min(reps):,.0f}..{max(reps):,.0f}"
        )
    lines += _workload_lines(results)
    lines += _pressure_lines(results)
    lines += ["", *LEGEND, ""]
    for name, check in results["verification"].items():
        if not isinstance(check, dict):
            continue
        lines.append(
            f"verification ({name}): {'PASSED' if check['ok'] else 'FAILED'}: "
            f"{check['stamps_checked']} values stamp-checked, {check['full_checked']} compared "
            f"byte for byte, {check['error_count']} errors"
        )
        lines += [f"  {error}" for error in check["errors"][:10]]
    lines += [
        f"rounds: {params['rounds']} (+{params['warmup']} warm-up); cross-process "
        f"{params['values']} per round and path; fresh keys every round.",
        f"A's segment: {size_label(params['segment'])}, written end to end before timing, so "
        "timed calls pay no first-touch page faults.",
        f"masters: read lease {params['lease_ms']} ms, no eviction (except memory pressure); "
        f"untimed waits for the memory of removed keys: {results['budget_wait_s']:.1f} s.",
        f"run took {results['duration_s']:.1f} s",
    ]
    if results.get("targets"):
        lines += ["", *targets_lines(results["targets"], results.get("targets_context", ()))]
    return "\n".join(lines)


def _load_line(results: dict[str, Any]) -> str:
    load = results.get("load_average") or {}
    start, end = load.get("start"), load.get("end")
    if not start or not end:
        return "load average (1/5/15 min): not recorded"
    shown = ("/".join(f"{v:.2f}" for v in start), "/".join(f"{v:.2f}" for v in end))
    return f"load average (1/5/15 min): {shown[0]} at the start, {shown[1]} at the end"


def values_text(sizes: Sequence[int], counts: dict[int, int]) -> str:
    """``32 x 1MiB, 32 x 4MiB`` for the report's footer."""
    return ", ".join(f"{counts[s]} x {size_label(s)}" for s in sizes)


# ---------------------------------------------------------------------------------------------
# Targets


def _ratio_check(rows: dict[str, dict[str, Any]], row_id: str, need: float) -> dict[str, Any]:
    row = rows.get(row_id)
    what = f"{row['label'] if row else row_id}: >= {need:g}x upstream"
    if row is None:
        return {"what": what, "status": "NOT MEASURED", "measured": "row not in this mode"}
    ratio, theirs = row.get("ratio"), row.get(UPSTREAM)
    if ratio is None or theirs is None:
        return {"what": what, "status": "NOT MEASURED", "measured": "needs --compare-mooncake"}
    unit = row["unit"]
    measured = (
        f"{fmt_rate(row[PY]['value'], unit)} vs {fmt_rate(theirs['value'], unit)} = "
        f"{ratio:.2f}x ({row.get('verdict', '')})"
    )
    met = ratio >= need or (need == 1.0 and row.get("verdict") == NO_DIFFERENCE)
    note = " (within noise)" if met and ratio < need else ""
    return {
        "what": what,
        "status": "MET" + note if met else "NOT MET",
        "measured": measured,
        "ratio": ratio,
        "need": need,
    }


def _fraction_check(rows: dict[str, dict[str, Any]], row_id: str, need: float) -> dict[str, Any]:
    row = rows.get(row_id)
    if row is None or row.get("fraction") is None:
        what = f"{row_id}: >= {need:.0%} of its limit"
        return {"what": what, "status": "NOT MEASURED", "measured": "row not in this mode"}
    unit = row["unit"]
    what = f"{row['label']}: >= {need:.0%} of {row['limit_label']}"
    fraction = row["fraction"]
    return {
        "what": what,
        "status": "MET" if fraction >= need else "NOT MET",
        "measured": f"{fmt_rate(row[PY]['value'], unit)} of {fmt_rate(row['limit_value'], unit)}"
        f" = {fraction:.0%}",
        "fraction": fraction,
        "need": need,
    }


def _pressure_check(results: dict[str, Any]) -> dict[str, Any]:
    what = "memory pressure: fewer failed puts than upstream, every readable object correct"
    pressure = results.get("pressure") or {}
    ours, theirs = pressure.get(PY), pressure.get(UPSTREAM)
    if ours is None:
        return {"what": what, "status": "NOT MEASURED", "measured": "not run"}
    correct = ours["all_readable_correct"]
    measured = (
        f"mooncake-py {ours['failed_puts']:.0f} failed, {ours['readable']:.0f} readable, "
        f"{ours['wrong']:.0f} wrong"
    )
    if theirs is None:
        return {
            "what": what,
            "status": "NOT MEASURED",
            "measured": measured + "; upstream needs --compare-mooncake",
        }
    measured += (
        f"; upstream {theirs['failed_puts']:.0f} failed, {theirs['readable']:.0f} readable, "
        f"{theirs['wrong']:.0f} wrong"
    )
    fewer = ours["failed_puts"] < theirs["failed_puts"]
    both_none = ours["failed_puts"] == 0 == theirs["failed_puts"]
    met = correct and (fewer or both_none)
    status = ("MET (both 0)" if both_none else "MET") if met else "NOT MET"
    return {"what": what, "status": status, "measured": measured}


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each performance target: its checks and MET / NOT MET / NOT MEASURED."""
    rows = {row["id"]: row for row in results["rows"]}
    targets = [
        (
            "Cross-process batch_get_into 32 x 4MiB on one host: >= 3x upstream, >= 50% memcpy",
            [
                _ratio_check(rows, "shm.b.batch_get_into.4MiB", 3.0),
                _fraction_check(rows, "shm.b.batch_get_into.4MiB", 0.5),
            ],
        ),
        (
            "Forced-TCP cross-process 4MiB get_into: >= 1.5x upstream, >= 60% raw socket stream",
            [
                _ratio_check(rows, "tcp.b.get_into.4MiB", 1.5),
                _fraction_check(rows, "tcp.b.get_into.4MiB", 0.6),
            ],
        ),
        (
            "Single-process zero-copy 16MiB put_from / get_into: >= 1x upstream",
            [
                _ratio_check(rows, "local.put_from.16MiB", 1.0),
                _ratio_check(rows, "local.get_into.16MiB", 1.0),
            ],
        ),
        (
            "is_exist and 4KiB get, one sequential caller: >= 0.4x upstream ops/s",
            [
                _ratio_check(rows, "meta.is_exist.present", 0.4),
                _ratio_check(rows, "meta.is_exist.absent", 0.4),
                _ratio_check(rows, "local.get.4KiB", 0.4),
            ],
        ),
        (
            "batch_is_exist(1024): >= 1x upstream keys/s",
            [_ratio_check(rows, "meta.batch_is_exist.1024", 1.0)],
        ),
        (
            "Memory pressure: fewer failed puts than upstream, every still-readable object correct",
            [_pressure_check(results)],
        ),
    ]
    evaluated = []
    for name, checks in targets:
        statuses = [check["status"] for check in checks]
        if any(s == "NOT MET" for s in statuses):
            status = "NOT MET"
        elif all(s.startswith("MET") for s in statuses):
            status = "MET"
        else:
            status = "NOT MEASURED"
        evaluated.append({"target": name, "status": status, "checks": checks})
    return evaluated


def context_lines(results: dict[str, Any]) -> list[str]:
    """Bare-gRPC references next to upstream's is_exist rate (the per-call overhead target)."""
    rows = {row["id"]: row for row in results["rows"]}
    row = rows.get("meta.is_exist.present")
    theirs = row.get(UPSTREAM) if row else None
    if not theirs or not theirs["value"]:
        return []
    parts = []
    for limit_id in ("grpc_echo_ExistKey", "grpc_aio_unary_ExistKey", "grpc_aio_bidi_ExistKey"):
        limit = results["limits"].get(limit_id)
        if limit:
            parts.append(f"{limit['label']} {limit['value'] / theirs['value']:.2f}x")
    ping = results["limits"].get("pingpong")
    if ping:
        parts.append(f"raw socket ping-pong {ping['value'] / theirs['value']:.2f}x")
    return [
        f"  context: upstream is_exist {fmt_rate(theirs['value'], 'ops/s')}; " + ", ".join(parts)
    ]


def targets_lines(targets: list[dict[str, Any]], context: Sequence[str] = ()) -> list[str]:
    lines = ["Targets"]
    for target in targets:
        lines.append(f"[{target['status']}] {target['target']}")
        for check in target["checks"]:
            lines.append(f"    {check['status']:<22} {check['what']}: {check['measured']}")
    return lines + list(context)
