"""The JSON record of a benchmark run: every side's rows paired up (upstream's through
:func:`tests.bench.rows.upstream_peer`, a baseline's by row id), the limits, memory pressure,
verification, the processes' pids and what the run was set up with."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING, Any

from tests.bench import baseline as base
from tests.bench import upstream as up
from tests.bench.common import size_label
from tests.bench.report import (
    PY,
    UPSTREAM,
    context_lines,
    evaluate_targets,
    machine,
    packages,
    pressure_summary,
    row_record,
    values_text,
)
from tests.bench.rows import upstream_peer

if TYPE_CHECKING:
    from tests.bench.store_bench import Bench

GROUP_ORDER = {"local": 0, "shm": 1, "tcp": 2, "meta": 3}


def results_record(bench: Bench, wall_start: float) -> dict[str, Any]:
    """The record of a finished run (``wall_start``: its ``time.time()`` at the start); rows
    the working tree did not measure are left out. Plain JSON values only."""
    plan = bench.plan
    limits = bench.limit_figures()
    py, upstream = bench.side(PY), bench.side(UPSTREAM)
    assert py is not None, "the working tree's side always runs"
    baseline = bench.side(base.BASELINE)
    rows = []
    ordered = sorted(
        bench.definitions.values(), key=lambda d: GROUP_ORDER.get(d.get("group", ""), 9)
    )
    for definition in ordered:
        ours = py.rows.get(definition["id"])
        if ours is None or not ours.reps:
            continue
        peer = upstream_peer(definition["id"])
        theirs = upstream.rows.get(peer) if upstream is not None and peer else None
        row = row_record({**definition, "upstream_id": peer}, ours, theirs, limits)
        if baseline is not None:
            base.attach(row, baseline.rows.get(definition["id"]))
        rows.append(row)
    versions = {PY: {**packages(), **py.versions}}
    if upstream is not None:
        versions[UPSTREAM] = upstream.versions
    if baseline is not None:
        versions[base.BASELINE] = baseline.versions
    results: dict[str, Any] = {
        "schema": 2,
        "mode": plan.mode,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(wall_start)),
        "duration_s": time.time() - wall_start,
        "compared": upstream is not None,
        "baseline": bench.baseline.record() if bench.baseline is not None else None,
        "selected_rows": sorted(bench.selected) if bench.restricted else None,
        "machine": machine(),
        "load_average": {"start": list(bench.load_at_start), "end": list(os.getloadavg())},
        "packages": packages(),
        "versions": versions,
        "params": {
            **{k: v for k, v in dataclasses.asdict(plan).items() if k not in ("values",)},
            "values": values_text(plan.sizes, plan.values),
            "values_per_round": {size_label(s): n for s, n in plan.values.items()},
            "echo_payload_bytes": bench.payloads,
        },
        "limits": limits,
        "rows": rows,
        "pressure": {side.name: pressure_summary(side.pressure) for side in bench.sides},
        "verification": {side.name: side.check.summary() for side in bench.sides},
        "pids": bench.pids,
        "budget_wait_s": sum(side.waited_s for side in bench.sides),
        "budget_waits": {side.name: side.waits for side in bench.sides},
        "prefill": {side.name: side.prefill for side in bench.sides},
    }
    if upstream is not None and bench.upstream_venv is not None:
        master = bench.upstream_master
        results["upstream_setup"] = {
            "venv": str(bench.upstream_venv),
            "package": f"{up.PACKAGE}=={up.VERSION}",
            "master": str(master.binary) if master else None,
            "master_args": master._args(0, 0, 0)[1:] if master else None,
            "client_env": up.CLIENT_ENV,
            "client_setup": {"protocol": "tcp", "local_hostname": "127.0.0.1"},
        }
    results["targets"] = evaluate_targets(results)
    results["targets_context"] = context_lines(results)
    return results
