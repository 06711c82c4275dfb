"""Per-tenant figures benchmark: the write path's cost and the tenant views' cost, working tree
against a baseline revision.

Run from the repository root::

    .venv/bin/python -m tests.bench.tenant_figures_bench [--objects N] [--rounds R]
        [--baseline-rev REV] [--json PATH]

Each measurement is one child process (``worker``) on an in-process :class:`MasterService`
(tokens on, a FakeClock, no sockets): three tenants, each with its own segment, and one shared
segment. It writes ``N`` objects of 1 KiB (``put_start`` then ``put_end``, keys spread over
the tenants), times ``stats(tenant, all_tenants=False)``, the tenant-scoped
``segment_usage``, the admin segment listing and (where the revision has it)
``tenant_figures`` at ``N`` objects, then removes every object. Every call is timed on its own
(``perf_counter_ns``); a figure is the median over its calls.

The baseline is either a git revision (``--baseline-rev``, default ``HEAD``), exported and
installed by :mod:`tests.bench.baseline`, or, with ``--tallies-off``, the working tree itself
(every tracked and untracked file, other work in progress included) with only
``master/state/objects.py`` taken from ``HEAD``: the object table without the tenant tallies,
so the write-path figures differ by the tallies' upkeep alone (that baseline has no counters
to read, so its view figures are not measured). ``--in-process`` compares the same two
object tables in one process (``HEAD``'s class put in place of the working tree's for the
baseline's turns), free of any difference between an installed copy and the editable
install. The two sides take turns for ``R`` rounds so
that load on the machine hits both alike, and the table gives the median over rounds of each
side's figures and their ratio. Only the implementation under test differs: the measuring code
is the working tree's on both sides.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.bench import baseline
from tests.bench.common import ROOT

TENANTS = ("tenant-a", "tenant-b", "tenant-c")
GIB = 1 << 30
VIEW_CALLS = 21
OBJECT_TABLE = "master/state/objects.py"
WRITE_FIGURES = ("put_start_ns", "put_end_ns", "remove_ns")
VIEW_FIGURES = ("stats_of_ns", "segment_usage_ns", "admin_segments_ns", "tenant_figures_ns")


def _median_ns(calls: int, call: Callable[[], object]) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - started)
    return statistics.median(times)


def measure(objects: int) -> dict[str, Any]:
    """One worker's figures (medians in ns per call) at ``objects`` objects."""
    import mooncake_py.master as master_package
    from mooncake_py.master.clock import FakeClock
    from mooncake_py.master.config import MasterConfig
    from mooncake_py.master.service.admin_queries import AdminQueries
    from mooncake_py.master.service.facade import MasterService
    from mooncake_py.types import ReplicateConfig, SegmentInfo

    def segment(seg_id: str, shared: bool) -> SegmentInfo:
        return SegmentInfo(
            id=seg_id,
            name=f"name-{seg_id}",
            base=0x1000,
            size=4 * GIB,
            te_endpoint="127.0.0.1:1",
            host_id="host",
            shared=shared,
        )

    config = MasterConfig(auth_tokens_file="tokens.yaml")
    service = MasterService(config, clock=FakeClock(), rng=random.Random(1))
    for tenant in TENANTS:
        assert service.mount_segment(f"c-{tenant}", segment(f"own-{tenant}", False), tenant) == 0
    assert service.mount_segment("ops", segment("shared", True), "ops") == 0
    replicate = ReplicateConfig()
    keys = [(TENANTS[i % len(TENANTS)], f"key-{i}") for i in range(objects)]
    starts, ends, removes = [], [], []
    clock = time.perf_counter_ns
    gc.collect()
    for tenant, key in keys:
        client = f"c-{tenant}"
        t0 = clock()
        result = service.put_start(client, tenant, key, 1024, replicate)
        t1 = clock()
        code = service.put_end(client, tenant, key)
        t2 = clock()
        assert result.code == 0 and code == 0
        starts.append(t1 - t0)
        ends.append(t2 - t1)
    gc.collect()
    admin = AdminQueries(service.context)
    figures: dict[str, Any] = {
        "objects": objects,
        "package": str(Path(master_package.__file__).parent),
        "put_start_ns": statistics.median(starts),
        "put_end_ns": statistics.median(ends),
    }
    # Views read the tallies where the tree has them (or walk objects where it predates them);
    # the tallies-off baseline has tenant views that expect tallies the table lacks.
    if hasattr(service.context.state.objects, "tallies") or not hasattr(service, "tenant_figures"):
        figures["stats_of_ns"] = _median_ns(VIEW_CALLS, lambda: service.stats(TENANTS[0], False))
        figures["segment_usage_ns"] = _median_ns(
            VIEW_CALLS, lambda: service.segment_usage(TENANTS[0], False)
        )
        figures["admin_segments_ns"] = _median_ns(VIEW_CALLS, lambda: admin.segments(TENANTS[0]))
    if hasattr(service.context.state.objects, "tallies"):
        figures["tenant_figures_ns"] = _median_ns(VIEW_CALLS, service.tenant_figures)
    for tenant, key in keys:
        t0 = clock()
        code = service.remove(tenant, key)
        removes.append(clock() - t0)
        assert code == 0
    figures["remove_ns"] = statistics.median(removes)
    assert service.stats()["objects"] == 0
    return figures


def _run_worker(objects: int, env: dict[str, str | None] | None) -> dict[str, Any]:
    child_env = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            child_env.pop(name, None)
        else:
            child_env[name] = value
    command = [sys.executable, "-m", "tests.bench.tenant_figures_bench", "worker"]
    result = subprocess.run(
        [*command, "--objects", str(objects)],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"worker failed:\n{result.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


def _fmt(ns: float | None) -> str:
    if ns is None:
        return "-"
    return f"{ns / 1000:.2f} µs" if ns < 1_000_000 else f"{ns / 1_000_000:.2f} ms"


def build_tallies_off(into: Path) -> baseline.BaselineBuild:
    """Install the working tree with ``master/state/objects.py`` from ``HEAD`` into
    ``into/site`` (see the module docstring). The repository is only read."""
    started = time.perf_counter()
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout.decode()
    source, site = into / "src", into / "site"
    for name in filter(None, listed.split("\0")):
        origin = ROOT / name
        if origin.is_file() and not origin.is_symlink():
            target = source / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(origin, target)
    table = subprocess.run(
        ["git", "show", f"HEAD:{OBJECT_TABLE}"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    (source / OBJECT_TABLE).write_bytes(table)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    command += ["--no-build-isolation", "--target", str(site), str(source)]
    subprocess.run(command, check=True, timeout=600, capture_output=True)
    revision = baseline.Revision("tallies-off", "-", f"HEAD's {OBJECT_TABLE}")
    return baseline.BaselineBuild(revision, site, time.perf_counter() - started)


def _take_turns(rounds: int, run_side: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    sides: dict[str, list[dict[str, Any]]] = {"working tree": [], "baseline": []}
    for index in range(rounds):
        order = ["working tree", "baseline"] if index % 2 else ["baseline", "working tree"]
        for side in order:
            sides[side].append(run_side(side))
            print(f"[round {index + 1}/{rounds}] {side} done", file=sys.stderr, flush=True)
    return sides


def head_object_table() -> type:
    """``HEAD``'s ``ObjectTable`` (without tallies), loaded as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"HEAD:{OBJECT_TABLE}"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    module = types.ModuleType("head_object_table")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"HEAD:{OBJECT_TABLE}", "exec"), module.__dict__)
    table: type = module.ObjectTable
    return table


def compare_in_process(objects: int, rounds: int, json_path: str | None) -> None:
    """Both sides in this process: the working tree's state with its ``ObjectTable`` or with
    ``HEAD``'s (no tallies) put in its place for the baseline's turns."""
    from mooncake_py.master.state import store

    tallied, untallied = store.ObjectTable, head_object_table()

    def run_side(side: str) -> dict[str, Any]:
        store.ObjectTable = untallied if side == "baseline" else tallied  # type: ignore[misc]
        try:
            return measure(objects)
        finally:
            store.ObjectTable = tallied  # type: ignore[misc]

    revision = baseline.Revision("in-process", "-", "HEAD's ObjectTable swapped in")
    _report(objects, rounds, revision, _take_turns(rounds, run_side), json_path, {})


def compare(objects: int, rounds: int, rev: str, tallies_off: bool, json_path: str | None) -> None:
    """Build the baseline, take turns with the working tree for ``rounds`` rounds, print the
    table."""
    with tempfile.TemporaryDirectory(prefix="tenant-figures-bench-") as scratch:
        if tallies_off:
            build = build_tallies_off(Path(scratch))
        else:
            build = baseline.build(baseline.resolve(rev), Path(scratch))

        def run_side(side: str) -> dict[str, Any]:
            return _run_worker(objects, build.env() if side == "baseline" else None)

        sides = _take_turns(rounds, run_side)
    _report(objects, rounds, build.revision, sides, json_path, build.record())


def _report(
    objects: int,
    rounds: int,
    revision: baseline.Revision,
    sides: dict[str, Any],
    json_path: str | None,
    baseline_record: dict[str, Any],
) -> None:
    medians = {
        side: {
            name: statistics.median(run[name] for run in runs) if name in runs[0] else None
            for name in WRITE_FIGURES + VIEW_FIGURES
        }
        for side, runs in sides.items()
    }
    print(
        f"{objects} objects of 1 KiB, 3 tenants + 1 shared segment; median over {rounds} rounds "
        f"of per-call medians; baseline {revision.rev} = {revision.short} ({revision.subject})"
    )
    print(f"{'figure':<22} {'baseline':>12} {'working tree':>14} {'tree/baseline':>14}")
    for name in WRITE_FIGURES + VIEW_FIGURES:
        theirs, ours = medians["baseline"][name], medians["working tree"][name]
        ratio = f"{ours / theirs:.3f}x" if ours is not None and theirs else "-"
        print(f"{name:<22} {_fmt(theirs):>12} {_fmt(ours):>14} {ratio:>14}")
    if json_path:
        record = {"objects": objects, "rounds": rounds, "baseline": baseline_record, **sides}
        Path(json_path).write_text(json.dumps(record, indent=2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", choices=("compare", "worker"), default="compare")
    parser.add_argument("--objects", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-rev", default="HEAD")
    parser.add_argument("--tallies-off", action="store_true", help="see the module docstring")
    parser.add_argument("--in-process", action="store_true", help="see the module docstring")
    parser.add_argument("--json", default=None, help="write every run's figures here")
    args = parser.parse_args(argv)
    if args.mode == "worker":
        print(json.dumps(measure(args.objects)))
    else:
        if args.in_process:
            compare_in_process(args.objects, args.rounds, args.json)
        else:
            compare(args.objects, args.rounds, args.baseline_rev, args.tallies_off, args.json)


if __name__ == "__main__":
    main()
