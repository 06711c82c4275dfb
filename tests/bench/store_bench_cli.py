"""The store benchmark's command line: a run (:func:`tests.bench.store_bench.run`), and the
comparisons of result files (:mod:`tests.bench.compare`).

``python -m tests.bench.store_bench [options]`` runs the benchmark (``--help`` lists the
options); ``... compare A.json B.json`` prints the ratio table B / A; ``... compare-reference
[--reference REF.json] [--threshold 0.10] [--strict] NEW.json`` diffs a run against the
committed reference (``tests/bench/reference/``), flagging the rows that moved by more than the
threshold and saying when the machine descriptions differ.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from tests.bench import baseline as base
from tests.bench import compare as cmp
from tests.bench import store_bench
from tests.bench import upstream as up
from tests.bench.common import ROOT
from tests.bench.plan import plan_for
from tests.bench.report import table
from tests.bench.rows import NoSuchRows, catalogue, parse_patterns, select


def default_json_path() -> Path:
    return ROOT / "bench-results" / f"store-bench-{time.strftime('%Y%m%d-%H%M%S')}.json"


def compare_main(argv: list[str]) -> int:
    """``compare A.json B.json``: prints the ratio table; exit status 0."""
    parser = argparse.ArgumentParser(
        prog="store_bench compare", description="ratio table B / A between two result files"
    )
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    first, second = (json.loads(path.read_text()) for path in (args.a, args.b))
    print(cmp.compare_table(first, second, (str(args.a), str(args.b))))
    return 0


def compare_reference_main(argv: list[str]) -> int:
    """``compare-reference [--reference REF] [--threshold T] [--strict] NEW.json``: prints the
    diff against the reference. Exit status 0; 1 with ``--strict`` when a row moved by more
    than the threshold; 2 when there is no reference or the threshold is negative."""
    parser = argparse.ArgumentParser(
        prog="store_bench compare-reference",
        description="a new run against the committed reference run, rows that moved flagged",
    )
    parser.add_argument("new", type=Path, help="the new run's JSON record")
    parser.add_argument(
        "--reference",
        type=Path,
        default=None,
        help=f"the reference record (default: the newest of {cmp.REFERENCE_DIR} in the new "
        "run's mode, else the newest)",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=cmp.DEFAULT_THRESHOLD,
        help="flag rows whose new / reference ratio is off 1 by more than this (default 0.10)",
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit status 1 when any row is flagged"
    )
    args = parser.parse_args(argv)
    new = json.loads(args.new.read_text())
    try:
        path = args.reference or cmp.default_reference(new)
        reference = json.loads(path.read_text())
        text, flagged = cmp.reference_diff(
            reference, new, (str(path), str(args.new)), args.threshold
        )
    except (FileNotFoundError, ValueError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(text)
    return 1 if args.strict and flagged else 0


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run; exit status as
    :func:`tests.bench.store_bench.main`."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "compare":
        return compare_main(argv[1:])
    if argv and argv[0] == "compare-reference":
        return compare_reference_main(argv[1:])
    parser = argparse.ArgumentParser(
        description=(store_bench.__doc__ or "").split("\n", 1)[0],
        epilog="'store_bench compare A.json B.json' prints the ratio table between two runs; "
        "'store_bench compare-reference NEW.json' diffs a run against the committed reference.",
    )
    parser.add_argument("--quick", action="store_true", help="fewer iterations (< 60 s)")
    parser.add_argument("--tiny", action="store_true", help="plumbing check on small values")
    parser.add_argument("--json", type=Path, default=None, help="where to write the JSON record")
    parser.add_argument("--profile", default="", help="directory for workers' cProfile dumps")
    parser.add_argument(
        "--compare-mooncake",
        action="store_true",
        help="also run upstream Mooncake Store (PyPI wheel, own venv) with the same workloads",
    )
    parser.add_argument(
        "--install-deps",
        action="store_true",
        help="create upstream's venv, pip-install its wheel and apt-get libibverbs1 when "
        "missing (implies --compare-mooncake)",
    )
    parser.add_argument(
        "--baseline-rev",
        metavar="REV",
        default=None,
        help="also run this git revision of mooncake-py (built once into a scratch directory), "
        "taking turns with the working tree; the report gives the ratio working tree / baseline",
    )
    parser.add_argument(
        "--rows",
        metavar="PATTERN[,PATTERN]",
        action="append",
        default=None,
        help="measure only the rows whose label or id matches a pattern (substring, or glob "
        "with * ? [ ]; case-insensitive; repeatable); skips memory pressure",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="timed rounds (reps) per workload and metadata reps, instead of the mode's",
    )
    parser.add_argument(
        "--list-rows", action="store_true", help="print every row's label and id, then exit"
    )
    parser.add_argument(
        "--upstream-venv",
        type=Path,
        default=None,
        help=f"upstream's virtual environment (default ${up.VENV_ENV} or {up.DEFAULT_VENV})",
    )
    args = parser.parse_args(argv)
    if args.list_rows:
        for row_id, row in catalogue(plan_for(args.quick, args.tiny)).items():
            opt_in = "  (only when selected)" if row.get("opt_in") else ""
            print(f"{row['label']:<44} {row_id}{opt_in}")
        return 0
    try:
        patterns = parse_patterns(args.rows)
        if patterns is not None:
            select(catalogue(plan_for(args.quick, args.tiny)), patterns)
        if args.baseline_rev is not None:
            base.resolve(args.baseline_rev)
    except (NoSuchRows, base.BaselineUnavailable) as exc:
        print(str(exc), file=sys.stderr)
        return 2

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through run(), which stops every process

    signal.signal(signal.SIGTERM, terminate)
    upstream_venv = None
    if args.compare_mooncake or args.install_deps:
        upstream_venv = (args.upstream_venv or up.default_venv()).resolve()
        try:
            up.ensure(upstream_venv, args.install_deps)
        except up.UpstreamUnavailable as exc:
            print(str(exc), file=sys.stderr)
            return 2
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        args.profile = str(Path(args.profile).resolve())
    try:
        results = store_bench.run(
            args.quick,
            args.tiny,
            args.profile,
            upstream_venv,
            patterns,
            args.baseline_rev,
            args.rounds,
        )
    except base.BaselineUnavailable as exc:
        print(str(exc), file=sys.stderr)
        return 2
    path: Path = args.json or default_json_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, sort_keys=False) + "\n")
    print(table(results))
    print("\n".join(base.table_lines(results)))
    print(f"\nJSON: {path}")
    return 0 if all(check["ok"] for check in results["verification"].values()) else 1
