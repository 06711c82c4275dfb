"""Disk-tier benchmark: hit rates and costs under memory pressure, without and with the tier.

Run from the repository root (``make bench-disk``)::

    .venv/bin/python -m tests.bench.disk_tier_bench [--quick] [--objects N] [--value-kib S]
        [--memory-fraction F] [--read-passes R] [--zipf A] [--seed K] [--rounds M]
        [--quota-mib Q] [--no-fsync] [--no-upstream] [--work-dir DIR] [--json FILE]

(``--work-dir``: keep the processes' logs there; by default they go to a temporary directory,
removed after a run that went through and kept, with its path printed, after a failure.)

The workload: a writer process, which hosts all of the store's memory (``F`` of the working set,
a quarter by default), puts N objects of S bytes; a reader process, which hosts nothing, then
gets ``R x N`` keys drawn from a zipf-like distribution (exponent ``A``, seeded: the same order
in every mode; the hottest keys are spread over the write order by a seeded permutation).
Every value read is compared byte for byte with what was written.

It runs without and with the disk tier on the same memory (:mod:`tests.bench.disk_tier_run`:
fresh master and processes per run), taking turns within each of M rounds (the order rotates
from round to round), and reports the median over the rounds of, per mode:

- hit rate (reads that returned the right value / reads) and bytes read per second;
- put failures and put p50 / p99 latency;
- get p50 / p99 latency: all reads, and for mooncake-py memory hits and disk hits apart (the
  master's ``disk_hits`` counter, read between two gets, tells which tier served each one);
- the master's counters (spills, promotions, disk hits, evictions, disk bytes) and the bytes
  found in the tier's directory;

and the ratio of the tier mode to the memory-only mode. Upstream Mooncake (its wheel, in
``.bench-venv-mooncake``, :mod:`tests.bench.upstream`) runs the same workload with its own SSD
offload in the same rounds when its environment is usable (``--no-upstream`` skips it); its
master has no per-read tier counter, so its gets are reported together.

The figures go to stdout as a markdown table; ``--json FILE`` writes every run's figures, the
medians, the settings and the machine. No figure is compared with a threshold. Exit status 1
when any read returned wrong bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tests.bench import upstream as up
from tests.bench.common import KIB, MIB, median
from tests.bench.disk_tier_run import PY, UPSTREAM, Mode, Workload, run_once
from tests.bench.report import machine

QUICK = {"objects": 256, "value_kib": 256, "read_passes": 2, "rounds": 2}
DEFAULTS = {"objects": 2048, "value_kib": 256, "read_passes": 3, "rounds": 3}
UPSTREAM_MIN_SEGMENT = 16 * MIB
"""Upstream's client refuses a smaller segment ("Total size must be at least 16777216")."""


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def zipf_order(objects: int, reads: int, exponent: float, seed: int) -> list[int]:
    """``reads`` key indexes in ``[0, objects)``, rank ``r`` drawn with weight ``1/(r+1)^a``.

    Ranks are mapped to keys by a seeded permutation, so the hottest keys are spread over the
    write order rather than being the first (or last) written. Deterministic for a seed.
    Complexity: O(objects + reads).
    """
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.power(np.arange(1, objects + 1, dtype=np.float64), exponent)
    ranks = rng.choice(objects, size=reads, p=weights / weights.sum())
    keys_by_rank = rng.permutation(objects)
    return [int(k) for k in keys_by_rank[ranks]]


def _percentiles_us(times_s: Sequence[float]) -> tuple[float | None, float | None]:
    if not times_s:
        return None, None
    us = np.asarray(times_s, dtype=np.float64) * 1e6
    p50, p99 = np.percentile(us, [50, 99])
    return float(p50), float(p99)


def figures(raw: dict[str, Any], workload: Workload) -> dict[str, float | None]:
    """One run's figures from :func:`~tests.bench.disk_tier_run.run_once`'s answer."""
    write, read, counters = raw["write"], raw["read"], raw["counters"]
    kinds: str = read["kinds"]
    times: list[float] = read["times"]
    hits = sum(kinds.count(k) for k in "mdh")
    put_p50, put_p99 = _percentiles_us(write["times"])
    get_p50, get_p99 = _percentiles_us(times)
    memory = [t for t, k in zip(times, kinds, strict=True) if k == "m"]
    disk = [t for t, k in zip(times, kinds, strict=True) if k == "d"]
    mem_p50, mem_p99 = _percentiles_us(memory)
    disk_p50, disk_p99 = _percentiles_us(disk)
    split = bool(counters)
    result: dict[str, float | None] = {
        "hit_rate": hits / len(kinds) if kinds else None,
        # Over the time spent in get calls: mooncake-py's reader reads a counter between gets.
        "read_mib_s": read["bytes_read"] / MIB / sum(times) if sum(times) else None,
        "put_failures": float(write["failed"]),
        "put_p50_us": put_p50,
        "put_p99_us": put_p99,
        "get_p50_us": get_p50,
        "get_p99_us": get_p99,
        "memory_hits": float(kinds.count("m")) if split else None,
        "memory_hit_p50_us": mem_p50,
        "memory_hit_p99_us": mem_p99,
        "disk_hits_read": float(kinds.count("d")) if split else None,
        "disk_hit_p50_us": disk_p50,
        "disk_hit_p99_us": disk_p99,
        "wrong_values": float(read["wrong"]),
        "write_mib_s": workload.objects * workload.value_bytes / MIB / write["wall_s"],
        "settle_s": raw["settle_s"],
        "tier_file_mib": raw["tier_file_bytes"] / MIB,
    }
    for name in ("spilled_objects", "promoted_objects", "disk_hits", "evicted_objects"):
        result[name] = float(counters[name]) if split else None
    result["disk_used_mib"] = counters["disk_used_bytes"] / MIB if split else None
    return result


ROWS: tuple[tuple[str, str, str], ...] = (
    ("hit_rate", "hit rate (right value / reads)", "{:.1%}"),
    ("read_mib_s", "bytes read per second in get calls", "{:,.0f} MiB/s"),
    ("put_failures", "put failures", "{:,.0f}"),
    ("put_p50_us", "put p50", "{:,.0f} us"),
    ("put_p99_us", "put p99", "{:,.0f} us"),
    ("get_p50_us", "get p50 (all reads)", "{:,.0f} us"),
    ("get_p99_us", "get p99 (all reads)", "{:,.0f} us"),
    ("memory_hits", "reads served from memory", "{:,.0f}"),
    ("memory_hit_p50_us", "get p50, memory hits", "{:,.0f} us"),
    ("memory_hit_p99_us", "get p99, memory hits", "{:,.0f} us"),
    ("disk_hits_read", "reads served from disk", "{:,.0f}"),
    ("disk_hit_p50_us", "get p50, disk hits", "{:,.0f} us"),
    ("disk_hit_p99_us", "get p99, disk hits", "{:,.0f} us"),
    ("spilled_objects", "spills (objects written to disk)", "{:,.0f}"),
    ("promoted_objects", "promotions (copied back to memory)", "{:,.0f}"),
    ("evicted_objects", "evicted (lost)", "{:,.0f}"),
    ("disk_used_mib", "disk bytes (master)", "{:,.1f} MiB"),
    ("tier_file_mib", "disk bytes (files in the tier dir)", "{:,.1f} MiB"),
    ("write_mib_s", "write phase throughput", "{:,.0f} MiB/s"),
    ("settle_s", "wait for the tier to settle", "{:.2f} s"),
)
"""The table's rows: figure, label, format."""


def medians(runs: Sequence[dict[str, float | None]]) -> dict[str, float | None]:
    """Per figure, the median over the runs that have it (None when none has)."""
    names = runs[0].keys() if runs else ()
    out: dict[str, float | None] = {}
    for name in names:
        values = [r[name] for r in runs if r[name] is not None]
        out[name] = median([v for v in values if v is not None]) if values else None
    return out


NO_RATIO = {"settle_s", "tier_file_mib", "disk_used_mib", "disk_hits_read"}
"""Figures whose ratio says nothing (a wait chosen by the run, bytes only the tier has)."""


def ratio(tier: float | None, memory: float | None) -> str:
    """``tier / memory`` as ``x1.23``; ``-`` when either is missing or the base is 0."""
    if tier is None or memory is None or memory == 0:
        return "-"
    return f"x{tier / memory:.2f}"


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def markdown_table(results: dict[Mode, dict[str, float | None]]) -> str:
    """Rows: figures; columns: the modes, then per implementation the tier / memory ratio."""
    modes = list(results)
    impls = [impl for impl in (PY, UPSTREAM) if Mode(impl, False) in results]
    impls = [impl for impl in impls if Mode(impl, True) in results]
    head = ["figure", *(m.label for m in modes), *(f"{i}: tier / memory" for i in impls)]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join([":---"] + ["---:"] * (len(head) - 1))]
    lines[-1] += "|"
    for name, label, fmt in ROWS:
        cells = [label, *(_cell(results[m][name], fmt) for m in modes)]
        cells += [
            "-"
            if name in NO_RATIO
            else ratio(results[Mode(i, True)][name], results[Mode(i, False)][name])
            for i in impls
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _upstream_usable(wanted: bool, workload: Workload) -> str:
    """ "" when upstream runs; otherwise why not."""
    if not wanted:
        return "skipped (--no-upstream)"
    if workload.memory_bytes < UPSTREAM_MIN_SEGMENT:
        return (
            f"skipped: its segments must be at least {UPSTREAM_MIN_SEGMENT // MIB} MiB and the"
            f" memory here is {workload.memory_bytes / MIB:.1f} MiB"
        )
    return up.unusable_reason()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help=f"small sizes: {QUICK}")
    parser.add_argument("--objects", type=int, help=f"N (default {DEFAULTS['objects']})")
    parser.add_argument("--value-kib", type=int, help=f"S in KiB ({DEFAULTS['value_kib']})")
    parser.add_argument(
        "--memory-fraction", type=float, default=0.25, help="memory / working set (0.25)"
    )
    parser.add_argument(
        "--read-passes", type=int, help=f"reads = R x N ({DEFAULTS['read_passes']})"
    )
    parser.add_argument("--zipf", type=float, default=0.99, help="zipf exponent (0.99)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the read order (1)")
    parser.add_argument("--rounds", type=int, help=f"rounds, medians ({DEFAULTS['rounds']})")
    parser.add_argument(
        "--quota-mib", type=float, default=0, help="disk tier size (default: 2 x working set)"
    )
    parser.add_argument("--no-fsync", action="store_true", help="mooncake-py's tier: no fsync")
    parser.add_argument("--no-upstream", action="store_true", help="skip upstream Mooncake")
    parser.add_argument(
        "--upstream-settle", type=float, default=3.0, help="upstream: wait before reading (3 s)"
    )
    parser.add_argument("--work-dir", type=Path, help="logs and tier dirs (default: a tempdir)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else DEFAULTS
    for name, default in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if min(args.objects, args.value_kib, args.read_passes, args.rounds) < 1:
        parser.error("--objects, --value-kib, --read-passes and --rounds must be positive")
    if not 0 < args.memory_fraction <= 1:
        parser.error("--memory-fraction must be in (0, 1]")
    return args


def workload_of(args: argparse.Namespace) -> Workload:
    value = args.value_kib * KIB
    working_set = args.objects * value
    return Workload(
        objects=args.objects,
        value_bytes=value,
        memory_bytes=max(int(working_set * args.memory_fraction) // 4096 * 4096, value),
        order=tuple(
            zipf_order(args.objects, args.objects * args.read_passes, args.zipf, args.seed)
        ),
        quota_bytes=int(args.quota_mib * MIB) if args.quota_mib else 2 * working_set,
        fsync=not args.no_fsync,
        upstream_settle_s=args.upstream_settle,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    workload = workload_of(args)
    upstream_problem = _upstream_usable(not args.no_upstream, workload)
    if upstream_problem:
        _log(f"upstream Mooncake: {upstream_problem}")
    impls = [PY] if upstream_problem else [PY, UPSTREAM]
    modes = [Mode(impl, tier) for impl in impls for tier in (False, True)]
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="disk-tier-bench-"))
    runs: dict[Mode, list[dict[str, float | None]]] = {m: [] for m in modes}
    raw_pids: list[dict[str, int]] = []
    started = time.time()
    try:
        for rnd in range(args.rounds):
            shift = rnd % len(modes)
            for mode in modes[shift:] + modes[:shift]:  # rotate who goes first
                _log(f"round {rnd + 1}/{args.rounds}: {mode.label}")
                raw = run_once(mode, workload, work_dir, f"r{rnd}-{mode.key}-{os.getpid()}")
                raw_pids.append(raw["pids"])
                runs[mode].append(figures(raw, workload))
    except BaseException:
        _log(f"the processes' logs are under {work_dir}")
        raise
    results = {m: medians(runs[m]) for m in modes}
    working_mib = workload.objects * workload.value_bytes / MIB
    print(
        f"disk-tier benchmark: {workload.objects:,} objects x {args.value_kib} KiB"
        f" ({working_mib:,.0f} MiB), memory {workload.memory_bytes / MIB:,.0f} MiB"
        f" ({args.memory_fraction:.0%}), {len(workload.order):,} zipf({args.zipf}) reads,"
        f" medians of {args.rounds} rounds; tier fsync {'on' if workload.fsync else 'off'};"
        f" upstream: {upstream_problem or 'with its SSD offload'}\n"
    )
    print(markdown_table(results))
    if args.work_dir is None:  # the logs of a run that went through are not worth keeping
        shutil.rmtree(work_dir, ignore_errors=True)
    else:
        print(f"\nthe processes' logs are under {work_dir / 'logs'}")
    wrong = sum(r["wrong_values"] or 0 for rs in runs.values() for r in rs)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "started": started,
            "wall_s": time.time() - started,
            "settings": {
                **{k: v for k, v in vars(args).items() if k not in ("json", "work_dir")},
                "memory_bytes": workload.memory_bytes,
                "quota_bytes": workload.quota_bytes,
            },
            "upstream": upstream_problem or "ran",
            "machine": machine(),
            "medians": {m.key: results[m] for m in modes},
            "runs": {m.key: runs[m] for m in modes},
            "pids": raw_pids,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    if wrong:
        _log(f"{wrong:.0f} reads returned wrong bytes")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
