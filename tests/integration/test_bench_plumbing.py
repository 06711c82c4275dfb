"""The store benchmark's plumbing, on tiny sizes: every row and limit is produced, every read
verified, the report, the targets and the comparison of two result files render, and every
process it started is gone afterwards. Upstream Mooncake is not needed: its side of the table is
exercised with a stand-in figure; a real tiny comparison runs only with
``MOONCAKE_BENCH_UPSTREAM_TEST=1`` and upstream's virtual environment in place."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.bench import store_bench
from tests.bench import upstream as up
from tests.bench.common import size_label
from tests.bench.plan import plan_for
from tests.bench.report import (
    NO_DIFFERENCE,
    PY,
    UPSTREAM,
    compare_table,
    evaluate_targets,
    table,
    verdict,
)


def _alive(pid: int) -> bool:
    """True when ``pid`` still runs one of the benchmark's programs (ignores reused pids)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return any(name in cmdline for name in (b"tests.bench", b"mooncake_py.master", b"mooncake_"))


def _expected_rows() -> set[str]:
    plan = plan_for(quick=True, tiny=True)
    rows = set()
    for size in plan.local_sizes:
        rows |= {f"local.{op}.{size_label(size)}" for op in ("put", "get", "put_from", "get_into")}
    for count, size, _ in plan.local_batches:
        ops = ("put_batch", "get_batch", "batch_put_from", "batch_get_into")
        rows |= {f"local.{op}.{count}x{size_label(size)}" for op in ops}
    for path in ("shm", "tcp"):
        for size in plan.sizes:
            label = size_label(size)
            rows |= {
                f"{path}.a.batch_put_from.{label}",
                f"{path}.b.get_into.{label}",
                f"{path}.b.batch_get_into.{label}",
                f"{path}.b.put_from.{label}",
            }
    for variant in ("", ".grpc"):
        rows |= {f"meta.is_exist.present{variant}", f"meta.is_exist.absent{variant}"}
        rows |= {f"meta.batch_is_exist.{n}{variant}" for n in plan.batch_exist_sizes}
        rows.add(f"meta.remove{variant}")
    return rows


def _expected_limits() -> set[str]:
    plan = plan_for(quick=True, tiny=True)
    limits = {f"memcpy_{size_label(s)}" for s in plan.memcpy_sizes}
    limits.add(f"memcpy_{size_label(max(plan.memcpy_sizes))}_{size_label(max(plan.sizes))}")
    limits |= {f"stream_{size_label(s)}" for s in plan.sizes}
    limits |= {"pingpong", "grpc_echo_ExistKey"}
    limits |= {f"grpc_echo_BatchExistKey{n}" for n in plan.batch_exist_sizes}
    limits |= {"grpc_aio_unary_ExistKey", "grpc_aio_bidi_ExistKey"}
    return limits


def _check_no_leftovers(results: dict[str, Any]) -> None:
    leftovers = [name for name, pid in results["pids"].items() if _alive(pid)]
    assert leftovers == []
    # Segments are memfds: nothing of any benchmark process is ever left in /dev/shm.
    segments = [p for pid in results["pids"].values() for p in Path("/dev/shm").glob(f"*-{pid}-*")]
    assert segments == []


@pytest.fixture(scope="module")
def tiny_results() -> dict[str, Any]:
    return store_bench.run(quick=True, tiny=True)


@pytest.mark.timeout(90)
def test_tiny_run_produces_every_figure(tiny_results: dict[str, Any]) -> None:
    results = tiny_results
    check = results["verification"][PY]
    assert check["ok"], check
    assert check["error_count"] == 0 and check["stamps_checked"] > 0 and check["full_checked"] > 0

    limits = results["limits"]
    assert set(limits) == _expected_limits()
    for limit in limits.values():
        assert limit["value"] > 0, limit

    rows = {row["id"]: row for row in results["rows"]}
    assert set(rows) == _expected_rows()
    for row in rows.values():
        figures = row[PY]
        assert figures["value"] > 0 and figures["calls"] > 0, row["id"]
        assert len(figures["reps"]) == results["params"]["rounds"] or row["group"] == "meta"
        assert 0 < figures["p50_us"] <= figures["p99_us"], row["id"]
        assert row["limit_value"] > 0 and row["fraction"] > 0, row["id"]
        assert row["limit_id"] in limits, row["id"]
        assert row[UPSTREAM] is None and row["ratio"] is None

    pressure = results["pressure"][PY]
    assert pressure is not None and pressure["all_readable_correct"]
    assert pressure["readable"] > 0 and pressure["wrong"] == 0
    assert set(results["packages"]) >= {"grpcio", "protobuf", "pyarrow", "numpy"}
    assert results["versions"][PY]["numpy"] and results["machine"]["python"]
    json.dumps(results)  # the record is plain JSON
    report = table(results)
    assert "verification (mooncake-py): PASSED" in report
    assert all(row["label"] in report for row in rows.values())
    assert "Targets" in report and "Memory pressure" in report
    statuses = {target["status"] for target in results["targets"]}
    assert statuses <= {"MET", "NOT MET", "NOT MEASURED"}
    _check_no_leftovers(results)


def _with_stand_in_upstream(results: dict[str, Any], factor: float) -> dict[str, Any]:
    """The tiny record with an upstream side whose every rate is ``factor`` x mooncake-py's."""
    faked = copy.deepcopy(results)
    faked["compared"] = True
    for row in faked["rows"]:
        peer = store_bench.upstream_peer(row["id"])
        if peer is None:
            continue
        theirs = copy.deepcopy(row[PY])
        theirs["reps"] = [r * factor for r in theirs["reps"]]
        theirs["value"] *= factor
        row[UPSTREAM], row["upstream_id"] = theirs, peer
        row["ratio"] = row[PY]["value"] / theirs["value"]
        row["verdict"] = verdict(row[PY]["reps"], theirs["reps"])
    pressure = copy.deepcopy(faked["pressure"][PY])
    pressure["failed_puts"] += 5
    faked["pressure"][UPSTREAM] = pressure
    faked["targets"] = evaluate_targets(faked)
    return faked


def test_report_with_upstream_side(tiny_results: dict[str, Any]) -> None:
    faked = _with_stand_in_upstream(tiny_results, factor=0.25)
    rows = [row for row in faked["rows"] if row.get(UPSTREAM)]
    assert rows and all(row["verdict"] == "faster" for row in rows)
    report = table(faked)
    assert "4.00x" in report and UPSTREAM in report
    targets = {t["target"].split(":")[0]: t for t in faked["targets"]}
    is_exist = next(t for name, t in targets.items() if name.startswith("is_exist"))
    assert is_exist["status"] == "MET", is_exist
    pressure = next(t for name, t in targets.items() if name.startswith("Memory pressure"))
    assert pressure["status"] == "MET", pressure
    slower = _with_stand_in_upstream(tiny_results, factor=10.0)
    is_exist = next(t for t in slower["targets"] if t["target"].startswith("is_exist"))
    assert is_exist["status"] == "NOT MET"


def test_compare_mode(tiny_results: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    same = compare_table(tiny_results, tiny_results, ("a", "b"))
    assert "1.00x" in same and NO_DIFFERENCE in same
    assert "faster" not in same and "slower" not in same
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(tiny_results))
    b.write_text(json.dumps(_with_stand_in_upstream(tiny_results, factor=0.5)))
    assert store_bench.main(["compare", str(a), str(b)]) == 0
    printed = capsys.readouterr().out
    assert "B / A" in printed and "get_into" in printed


def test_missing_upstream_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(up.UpstreamUnavailable) as caught:
        up.ensure(tmp_path / "no-venv", install_deps=False)
    message = str(caught.value)
    assert up.APT_COMMAND in message and up.PACKAGE in message and "--install-deps" in message


@pytest.mark.timeout(120)
@pytest.mark.skipif(
    os.environ.get("MOONCAKE_BENCH_UPSTREAM_TEST") != "1", reason="opt-in: needs upstream's venv"
)
def test_tiny_run_against_upstream() -> None:
    venv = up.default_venv().resolve()
    up.ensure(venv, install_deps=False)
    results = store_bench.run(quick=True, tiny=True, upstream_venv=venv)
    assert results["verification"][PY]["ok"]
    compared = [row for row in results["rows"] if row[UPSTREAM] is not None]
    assert compared and all(row["ratio"] > 0 for row in compared)
    assert results["pressure"][UPSTREAM] is not None
    assert results["versions"][UPSTREAM].get(up.PACKAGE) == up.VERSION
    _check_no_leftovers(results)
