"""Many-clients benchmark: client processes running mixed batch calls against one master.

Run from the repository root (``make bench-many``)::

    .venv/bin/python -m tests.bench.many_clients_bench [--quick] [--clients N] [--duration S]
        [--rounds M] [--segment-mib G] [--shared B] [--window W] [--seed K] [--no-upstream]
        [--install-deps] [--no-profile] [--profile-duration P] [--top T] [--work-dir DIR]
        [--json FILE]

(``--work-dir``: keep the processes' logs and py-spy's raw output there; by default they go to
a temporary directory, removed after a run that went through and kept, with its path printed,
after a failure.)

The workload (:mod:`tests.bench.many_clients_worker`): N client processes (8 by default), each
contributing a segment of G MiB (128), run for S seconds per round the same cycle of eight
batch calls: ``put_batch`` of 16 x 64 KiB and of 64 x 4 KiB, ``batch_get_into`` of 16 x 64 KiB
and ``get_batch`` of 64 x 4 KiB (each once of the client's own recent keys and once of keys
another client wrote before the round), ``batch_is_exist`` of 128 keys (64 present, 64
absent) and one forced ``batch_remove`` of the client's oldest two batches (80 keys). The
proportions per cycle: 2 puts, 2 ``batch_get_into``, 2 ``get_batch``, 1 ``batch_is_exist``,
1 remove. Every value read is compared byte for byte with what was written.

mooncake-py (the drop-in ``MooncakeDistributedStore``, same-host segments over shared memory)
and upstream Mooncake 0.3.13 (its wheel in ``.bench-venv-mooncake``, protocol "tcp" on
loopback, :mod:`tests.bench.upstream`) run the same worker code, each against its own master
(5 s read leases, no eviction); both sides stay up for the run and take turns round by round
(the order alternates). Reported per side, medians over the M rounds: aggregate ops/s and
keys/s, per call type calls/s and per-call p50 / p99 latency, failures, the master's CPU use
during the timed phase (user and system, fractions of one core, from ``/proc/<pid>/stat``),
the clients' CPU use summed, both as CPU microseconds per call (what a call costs, whoever
got the cores), and the whole machine's busy fraction; and the ratio
mooncake-py / upstream. Then one extra round of mooncake-py alone with py-spy recording its
master (not part of the medians: sampling pauses the master): the top frames by self and by
inclusive samples.

The figures go to stdout as markdown tables; ``--json FILE`` writes every round's figures, the
medians, the settings, the machine, the versions and the profile. No figure is compared with a
threshold. Exit status 1 when a call failed (a wrong byte, code or answer) on either side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.bench import many_clients_stats as stats
from tests.bench import upstream as up
from tests.bench.common import MIB
from tests.bench.many_clients_run import PY, PYSPY, UPSTREAM, Settings, Side, run_round, start_side
from tests.bench.report import machine

QUICK = {"duration": 4.0, "rounds": 2, "profile_duration": 4.0}
DEFAULTS = {"duration": 20.0, "rounds": 5, "profile_duration": 15.0}
UPSTREAM_MIN_SEGMENT_MIB = 16
"""Upstream's client refuses a smaller segment ("Total size must be at least 16777216")."""


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    value = stats.ratio(ours, theirs)
    return "-" if value is None else f"x{value:.2f}"


def table_rows() -> list[tuple[str, str, Any]]:
    """The summary table's rows: flattened figure name (:func:`stats.medians`), label, format."""
    rows: list[tuple[str, str, Any]] = [
        ("figures.ops_per_s", "aggregate ops/s (calls)", _number),
        ("figures.keys_per_s", "aggregate keys/s", _number),
        ("failures_total", "failures (all calls, all rounds: a sum)", _number),
    ]
    for type_id, label in stats.CALL_TYPES:
        rows += [
            (f"figures.types.{type_id}.calls_per_s", f"{label}: calls/s", _number),
            (f"figures.types.{type_id}.p50_us", f"{label}: p50 us", _number),
            (f"figures.types.{type_id}.p99_us", f"{label}: p99 us", _number),
        ]
    rows += [
        ("master_cpu.user", "master CPU, user (of one core)", _percent),
        ("master_cpu.system", "master CPU, system", _percent),
        ("master_cpu.total", "master CPU, total", _percent),
        ("cpu_us_per_call.master", "master CPU per call, us", _number),
        ("clients_cpu.total", "clients' CPU, summed (of one core)", _percent),
        ("cpu_us_per_call.clients", "clients' CPU per call, us (summed)", _number),
        ("machine_busy", "machine busy (all cores)", _percent),
    ]
    return rows


NO_RATIO = {"failures_total", "machine_busy"}
"""Rows whose ratio says nothing (a count that should be 0; the machine as a whole)."""


def markdown_table(results: dict[str, dict[str, float | None]]) -> str:
    """Rows: figures; columns: each side, then mooncake-py / upstream when both ran."""
    sides = list(results)
    both = PY in results and UPSTREAM in results
    head = ["figure", *sides, *(["mooncake-py / upstream"] if both else [])]
    lines = ["| " + " | ".join(head) + " |", "|:---|" + "---:|" * (len(head) - 1)]
    for name, label, fmt in table_rows():
        cells = [label, *(fmt(results[side].get(name)) for side in sides)]
        if both:
            no_ratio = name in NO_RATIO
            cells.append(
                "-" if no_ratio else _ratio(results[PY].get(name), results[UPSTREAM].get(name))
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def profile_tables(profile: dict[str, Any], wall_s: float, rate_hz: float = 100.0) -> str:
    """The py-spy summary as two markdown tables (self, inclusive), with the share of the
    samples py-spy would take of a thread holding the GIL all along (``wall_s x rate_hz``)."""
    samples = profile["samples"]
    expected = wall_s * rate_hz
    lines = [
        f"py-spy (GIL-holding samples only, -g): {samples:,} samples over {wall_s:.0f} s"
        f" ({samples / expected:.0%} of {expected:,.0f}, the samples of a GIL held all along;"
        " a master that waits for a core while holding the GIL is still sampled)",
    ]
    if profile.get("in_every_sample"):
        lines.append(
            f"(inclusive leaves out the {len(profile['in_every_sample'])} frames found in every"
            " sample, such as the entry point and the event loop)"
        )
    for kind in ("self", "inclusive"):
        lines += ["", f"| {kind} | samples | share |", "|:---|---:|---:|"]
        lines += [
            f"| `{entry['frame']}` | {entry['samples']:,} | {entry['share']:.1%} |"
            for entry in profile[kind]
        ]
    return "\n".join(lines)


def _upstream_problem(args: argparse.Namespace) -> str:
    """ "" when upstream runs; otherwise why not."""
    if args.no_upstream:
        return "skipped (--no-upstream)"
    if args.segment_mib < UPSTREAM_MIN_SEGMENT_MIB:
        return f"skipped: its segments must be at least {UPSTREAM_MIN_SEGMENT_MIB} MiB"
    return up.unusable_reason(args.install_deps)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help=f"about a minute: {QUICK}")
    parser.add_argument("--clients", type=int, default=8, help="client processes per side (8)")
    parser.add_argument("--duration", type=float, help=f"s per round ({DEFAULTS['duration']})")
    parser.add_argument("--rounds", type=int, help=f"rounds, medians ({DEFAULTS['rounds']})")
    parser.add_argument("--segment-mib", type=int, default=128, help="segment per client (128)")
    parser.add_argument("--shared", type=int, default=8, help="shared batches per size (8)")
    parser.add_argument("--window", type=int, default=8, help="window batches per size (8)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the clients' choices (1)")
    parser.add_argument("--no-upstream", action="store_true", help="skip upstream Mooncake")
    parser.add_argument(
        "--install-deps", action="store_true", help="install upstream's venv when missing"
    )
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy round")
    parser.add_argument(
        "--profile-duration", type=float, help=f"py-spy round, s ({DEFAULTS['profile_duration']})"
    )
    parser.add_argument("--top", type=int, default=15, help="py-spy frames listed (15)")
    parser.add_argument("--work-dir", type=Path, help="logs, py-spy output (default: a tempdir)")
    parser.add_argument("--json", type=Path, help="write the full record here")
    args = parser.parse_args(argv)
    for name, default in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if min(args.clients, args.rounds, args.segment_mib, args.shared, args.window, args.top) < 1:
        parser.error("counts and sizes must be positive")
    if args.duration <= 0 or args.profile_duration < 1:
        parser.error("--duration must be positive and --profile-duration at least 1 s")
    return args


def _sides(upstream_problem: str) -> list[Side]:
    sides = [Side(PY, "py")]
    if not upstream_problem:
        python = str(up.venv_python(up.default_venv()))
        sides.append(Side(UPSTREAM, "upstream", python=python, env=dict(up.CLIENT_ENV)))
    return sides


def _profile_round(
    side: Side, settings: Settings, args: argparse.Namespace, work_dir: Path, tag: str
) -> dict[str, Any]:
    """The extra round of mooncake-py with py-spy on its master; its figures and summary."""
    if not PYSPY.exists():
        return {"profile_error": f"py-spy not found at {PYSPY}"}
    profiled = Settings(**{**vars(settings), "duration_s": args.profile_duration})
    raw = work_dir / "py-master-profile.txt"
    return run_round(side, profiled, f"{tag}/profile", args.seed + 1000, raw, args.top)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings(
        clients=args.clients,
        segment_bytes=args.segment_mib * MIB,
        shared=args.shared,
        window=args.window,
        duration_s=args.duration,
    )
    upstream_problem = _upstream_problem(args)
    if upstream_problem:
        _log(f"upstream Mooncake: {upstream_problem}")
    sides = _sides(upstream_problem)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="many-clients-bench-"))
    logs = work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    tag = f"many-{os.getpid()}-{time.time_ns() // 1_000_000}"
    rounds: dict[str, list[dict[str, Any]]] = {side.name: [] for side in sides}
    pids: dict[str, dict[str, int]] = {}
    profiled: dict[str, Any] = {}
    started = time.time()
    load_at_start = os.getloadavg()
    try:
        with contextlib.ExitStack() as stack:
            for side in sides:
                _log(f"starting {side.name}: a master and {args.clients} clients")
                pids[side.name] = start_side(side, settings, stack, logs)
            for rnd in range(args.rounds):
                order = sides if rnd % 2 == 0 else sides[::-1]  # who goes first alternates
                for side in order:
                    _log(f"round {rnd + 1}/{args.rounds}: {side.name}")
                    prefix = f"{tag}/r{rnd}/{side.impl}"
                    rounds[side.name].append(run_round(side, settings, prefix, args.seed + rnd))
            if not args.no_profile:
                _log(f"profile round: {PY} with py-spy on its master")
                profiled = _profile_round(sides[0], settings, args, work_dir, tag)
    except BaseException:
        _log(f"the processes' logs are under {logs}")
        raise
    results = {name: stats.medians(runs) for name, runs in rounds.items()}
    for name, runs in rounds.items():  # a median would hide a round's failures
        results[name]["failures_total"] = float(sum(r["figures"]["failures"] for r in runs))
    failures = sum(r["figures"]["failures"] for runs in rounds.values() for r in runs)
    failures += sum(r["preload"]["failed_batches"] for runs in rounds.values() for r in runs)
    print(
        f"many-clients benchmark: {args.clients} client processes per side, each with a"
        f" {args.segment_mib} MiB segment; medians of {args.rounds} rounds of {args.duration:g} s"
        f" (sides taking turns); upstream: {upstream_problem or 'Mooncake 0.3.13, tcp'}\n"
    )
    print(markdown_table(results))
    if "profile" in profiled:
        cpu = profiled["master_cpu"]["total"]
        print(
            f"\nmooncake-py master under py-spy ({args.profile_duration:g} s round, master CPU"
            f" {_percent(cpu)} of one core, {_number(profiled['figures']['ops_per_s'])} ops/s):\n"
        )
        print(profile_tables(profiled["profile"], args.profile_duration))
    elif profiled:
        print(f"\nno profile: {profiled.get('profile_error')}")
    errors = [e for runs in rounds.values() for r in runs for e in r["errors"]]
    if errors:
        print("\nerror samples:\n  " + "\n  ".join(errors[:10]))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "started": started,
            "wall_s": time.time() - started,
            "settings": {k: v for k, v in vars(args).items() if k not in ("json", "work_dir")},
            "upstream": upstream_problem or "ran",
            "machine": machine(),
            "load_average": {"start": load_at_start, "end": os.getloadavg()},
            "versions": {side.name: side.versions for side in sides},
            "call_types": dict(stats.CALL_TYPES),
            "medians": results,
            "ratios": {
                name: stats.ratio(value, results[UPSTREAM].get(name))
                for name, value in results.get(PY, {}).items()
            }
            if UPSTREAM in results
            else {},
            "rounds": rounds,
            "profile_round": profiled,
            "pids": pids,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(f"\nwrote {args.json}")
    if args.work_dir is None:  # the logs of a run that went through are not worth keeping
        shutil.rmtree(work_dir, ignore_errors=True)
    else:
        print(f"\nthe processes' logs and py-spy's raw output are under {work_dir}")
    if failures:
        _log(f"{failures:.0f} calls failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
