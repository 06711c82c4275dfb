"""Comparing benchmark result files: the ratio table B / A (``store_bench compare``) and a new
run against the committed reference (``store_bench compare-reference``).

The reference is a results record kept in ``tests/bench/reference/`` (see its README): a run
of ``make bench BENCH_ARGS=--compare-mooncake`` on a described machine. A new run is diffed
against it row by row, for each implementation, and by the ratio mooncake-py / upstream; a
row that moved by more than the threshold (default 10%) is flagged. Figures taken on another
machine, another kernel or other package versions move for that reason alone: the machine
descriptions are compared first and every difference is printed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.bench.common import ROOT
from tests.bench.report import (
    IMPLEMENTATIONS,
    NO_DIFFERENCE,
    PY,
    UPSTREAM,
    _fmt_ratio,
    _fmt_spread,
    fmt_rate,
    verdict,
)

REFERENCE_DIR = ROOT / "tests" / "bench" / "reference"
DEFAULT_THRESHOLD = 0.10
# What describes the machine a record was taken on (hostname left out: containers rename it).
MACHINE_FIELDS = (
    "cpu_model",
    "cpu_count",
    "cpu_affinity",
    "memory_bytes",
    "machine",
    "kernel",
    "os",
    "python",
    "python_implementation",
)
VERSION_NOISE = ("executable", "package_dir")  # paths, not versions


def _figures(results: dict[str, Any], impl: str) -> dict[str, dict[str, Any]]:
    """Per row id: label, unit and the figures of ``impl`` (schema 1 files: mooncake-py only)."""
    found = {}
    for row in results.get("rows", []):
        old_schema = results.get("schema", 1) < 2
        figures = (row if impl == PY else None) if old_schema else row.get(impl)
        if impl == UPSTREAM and row.get("upstream_id") != row["id"]:
            continue  # the same upstream figure, shown next to another mooncake-py row
        if figures:
            label = row["label"].removesuffix(" (stream)") if impl == UPSTREAM else row["label"]
            found[row["id"]] = {"label": label, "unit": row["unit"], **figures}
    return found


def _common_rows(fa: dict[str, Any], fb: dict[str, Any]) -> list[str]:
    return [row_id for row_id in fa if row_id in fb and fa[row_id]["unit"] == fb[row_id]["unit"]]


def compare_table(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> str:
    """Ratio table B / A for every row both result files have, per implementation.

    Complexity: O(rows); neither record is changed.
    """
    lines = [
        f"A: {names[0]} ({a.get('mode')}, {a.get('started_at')})",
        f"B: {names[1]} ({b.get('mode')}, {b.get('started_at')})",
        f"ratio = B / A; '{NO_DIFFERENCE}' when the reps' interquartile ranges overlap.",
    ]
    for impl in IMPLEMENTATIONS:
        fa, fb = _figures(a, impl), _figures(b, impl)
        common = _common_rows(fa, fb)
        if not common:
            continue
        lines += [
            "",
            f"{impl}",
            f"{'Workload':<40} {'A':>16} {'spread':>6} {'B':>16} {'spread':>6} {'B/A':>7}  verdict",
        ]
        for row_id in common:
            ra, rb = fa[row_id], fb[row_id]
            ratio = rb["value"] / ra["value"] if ra["value"] else None
            lines.append(
                f"{rb['label']:<40} {fmt_rate(ra['value'], ra['unit']):>16} "
                f"{_fmt_spread(ra.get('spread')):>6} {fmt_rate(rb['value'], rb['unit']):>16} "
                f"{_fmt_spread(rb.get('spread')):>6} {_fmt_ratio(ratio):>7}  "
                f"{verdict(rb.get('reps', []), ra.get('reps', []))}"
            )
        only = sorted(set(fa) ^ set(fb))
        if only:
            lines.append(f"  (rows in only one file: {', '.join(only)})")
    for impl in IMPLEMENTATIONS:
        pa = (a.get("pressure") or {}).get(impl)
        pb = (b.get("pressure") or {}).get(impl)
        if pa and pb:
            lines.append(
                f"memory pressure ({impl}): failed puts {pa['failed_puts']:.0f} -> "
                f"{pb['failed_puts']:.0f}, readable {pa['readable']:.0f} -> {pb['readable']:.0f}, "
                f"wrong {pa['wrong']:.0f} -> {pb['wrong']:.0f}"
            )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# compare-reference


def default_reference(new: dict[str, Any], directory: Path = REFERENCE_DIR) -> Path:
    """The committed reference to diff ``new`` against: among ``directory``'s records, one of
    ``new``'s mode when there is one, the newest by start time.

    Raises:
        FileNotFoundError: ``directory`` holds no record.
    """
    records = []
    for path in sorted(directory.glob("*.json")):
        record = json.loads(path.read_text())
        records.append((record.get("mode") == new.get("mode"), record.get("started_at", ""), path))
    if not records:
        raise FileNotFoundError(f"no reference record (*.json) in {directory}")
    return max(records)[2]


def machine_differences(reference: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between the two records' machine descriptions, one line per field: the
    machine itself (:data:`MACHINE_FIELDS`), the mode, and each side's package versions
    (a side that ran in only one record is said so). [] when they match."""
    differences = []
    machines = reference.get("machine") or {}, new.get("machine") or {}
    for field in MACHINE_FIELDS:
        was, now = machines[0].get(field), machines[1].get(field)
        if was != now:
            differences.append(f"machine {field}: {was!r} -> {now!r}")
    if reference.get("mode") != new.get("mode"):
        differences.append(f"mode: {reference.get('mode')!r} -> {new.get('mode')!r}")
    versions = reference.get("versions") or {}, new.get("versions") or {}
    for side in sorted(set(versions[0]) | set(versions[1])):
        was, now = versions[0].get(side), versions[1].get(side)
        if not was or not now:
            differences.append(f"{side}: ran only in the {'new run' if now else 'reference'}")
            continue
        for name in sorted(set(was) | set(now)):
            if name not in VERSION_NOISE and was.get(name) != now.get(name):
                differences.append(f"{side} {name}: {was.get(name)!r} -> {now.get(name)!r}")
    return differences


def _moved(ratio: float | None, threshold: float) -> str:
    if ratio is None or abs(ratio - 1.0) <= threshold:
        return ""
    return f"MOVED {ratio - 1.0:+.0%}"


def _load_text(record: dict[str, Any]) -> str:
    load = record.get("load_average") or {}
    parts = [
        f"{when} {load[when][0]:.2f}" for when in ("start", "end") if len(load.get(when) or ()) > 0
    ]
    return ", ".join(parts) or "not recorded"


def reference_diff(
    reference: dict[str, Any],
    new: dict[str, Any],
    names: tuple[str, str],
    threshold: float = DEFAULT_THRESHOLD,
) -> tuple[str, list[str]]:
    """The report of ``new`` against ``reference`` and the labels of the rows flagged.

    Each implementation's rows present in both records get new / reference and a flag when
    it is off 1 by more than ``threshold``; then, for rows with an upstream figure in both,
    the ratio mooncake-py / upstream in each record and its change (flagged the same way):
    that ratio compares rounds run moments apart, so it moves less with the machine's load.

    Raises:
        ValueError: ``threshold`` is negative.
    Complexity: O(rows); neither record is changed.
    """
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, not {threshold}")
    differences = machine_differences(reference, new)
    lines = [
        f"reference: {names[0]} ({reference.get('mode')}, {reference.get('started_at')}; "
        f"1-min load {_load_text(reference)})",
        f"new:       {names[1]} ({new.get('mode')}, {new.get('started_at')}; "
        f"1-min load {_load_text(new)})",
    ]
    if differences:
        lines.append(
            "the machine descriptions (or the runs' set-ups) DIFFER; figures may move for "
            "that alone:"
        )
        lines += [f"  {line}" for line in differences]
    else:
        info = new.get("machine") or {}
        lines.append(
            f"the machine descriptions match ({info.get('cpu_model')}, {info.get('cpu_count')} "
            f"CPUs, kernel {info.get('kernel')}, Python {info.get('python')}, same packages)"
        )
    lines.append(
        f"ratio = new / reference; rows off 1.00x by more than {threshold:.0%} are flagged "
        f"MOVED; verdict '{NO_DIFFERENCE}' when the reps' interquartile ranges overlap."
    )
    flagged: list[str] = []
    for impl in IMPLEMENTATIONS:
        fa, fb = _figures(reference, impl), _figures(new, impl)
        common = _common_rows(fa, fb)
        if not common:
            continue
        lines += [
            "",
            impl,
            f"{'Workload':<44} {'reference':>16} {'new':>16} {'new/ref':>8}  "
            f"{'verdict':<13}  moved",
        ]
        for row_id in common:
            ra, rb = fa[row_id], fb[row_id]
            ratio = rb["value"] / ra["value"] if ra["value"] else None
            moved = _moved(ratio, threshold)
            if moved:
                flagged.append(f"{impl}: {rb['label']}")
            lines.append(
                f"{rb['label']:<44} {fmt_rate(ra['value'], ra['unit']):>16} "
                f"{fmt_rate(rb['value'], rb['unit']):>16} {_fmt_ratio(ratio):>8}  "
                f"{verdict(rb.get('reps', []), ra.get('reps', [])):<13}  {moved}"
            )
        only = sorted(set(fa) ^ set(fb))
        if only:
            lines.append(f"  (rows in only one record: {', '.join(only)})")
    lines += _ratio_lines(reference, new, threshold, flagged)
    lines += [
        "",
        f"{len(flagged)} row(s) moved by more than {threshold:.0%}"
        + (": " + "; ".join(flagged) if flagged else ""),
    ]
    return "\n".join(lines), flagged


def _ratio_lines(
    reference: dict[str, Any], new: dict[str, Any], threshold: float, flagged: list[str]
) -> list[str]:
    """The mooncake-py / upstream ratio of every row both records compared; appends the
    labels of the rows whose ratio moved to ``flagged``."""
    ratios = [
        {row["id"]: row for row in record.get("rows", []) if row.get("ratio")}
        for record in (reference, new)
    ]
    common = [row_id for row_id in ratios[0] if row_id in ratios[1]]
    if not common:
        return []
    lines = [
        "",
        f"ratio {PY} / {UPSTREAM}",
        f"{'Workload':<44} {'reference':>10} {'new':>10} {'new/ref':>8}  moved",
    ]
    for row_id in common:
        was, now = ratios[0][row_id]["ratio"], ratios[1][row_id]["ratio"]
        change = now / was
        moved = _moved(change, threshold)
        label = ratios[1][row_id]["label"]
        if moved:
            flagged.append(f"ratio: {label}")
        lines.append(
            f"{label:<44} {_fmt_ratio(was):>10} {_fmt_ratio(now):>10} {_fmt_ratio(change):>8}  "
            f"{moved}"
        )
    return lines
