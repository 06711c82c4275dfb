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

from mooncake_py.testing import MasterProcess
from tests.bench import store_bench
from tests.bench import store_bench_cli as cli
from tests.bench import upstream as up
from tests.bench.common import Child, size_label
from tests.bench.compare import REFERENCE_DIR, compare_table, default_reference, reference_diff
from tests.bench.plan import plan_for
from tests.bench.report import (
    NO_DIFFERENCE,
    PY,
    UPSTREAM,
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
    rows.add("local.read_remove_write.4KiB")
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
        for probe in ("", "cold.", "miss."):
            rows |= {f"meta.batch_is_exist.{probe}{n}{variant}" for n in plan.batch_exist_sizes}
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


def test_tiny_run_probe_and_round_trip_rows(tiny_results: dict[str, Any]) -> None:
    plan = plan_for(quick=True, tiny=True)
    rows = {row["id"]: row for row in tiny_results["rows"]}
    for variant in ("", ".grpc"):
        for size in plan.batch_exist_sizes:
            for probe in ("cold", "miss"):
                row = rows[f"meta.batch_is_exist.{probe}.{size}{variant}"]
                assert row["unit"] == "keys/s" and row["probe"] == probe
                assert len(row[PY]["reps"]) == plan.call_reps  # rep 0 warms up
                assert row[PY]["calls"] == plan.call_reps * plan.batch_exist_calls[size]
                assert store_bench.upstream_peer(row["id"]) == f"meta.batch_is_exist.{probe}.{size}"
    trip = rows["local.read_remove_write.4KiB"]
    assert trip[PY]["calls"] == plan.rounds * plan.local_calls[4096]
    assert trip["limit_id"] == "pingpong" and trip["unit"] == "ops/s"
    report = table(tiny_results)
    assert "batch_is_exist 16 keys, cold (stream)" in report
    assert "batch_is_exist 64 keys, absent (gRPC)" in report
    assert "get, remove, put 4KiB (rounds/s)" in report
    assert "load average (1/5/15 min):" in report
    info = tiny_results["machine"]
    assert info["kernel"] and info["cpu_model"] is not None and info["memory_bytes"] > 0


@pytest.mark.timeout(60)
def test_worker_probes_and_round_trips_check_what_they_read(tmp_path: Path) -> None:
    """The worker's cold / missing probes and get-remove-put rounds against a real master:
    right answers pass, and a probe expecting the wrong answer counts every key as wrong."""
    master = MasterProcess(args=["--log_level", "WARNING"]).start()
    writer = Child("writer", "tests.bench.worker", log_dir=tmp_path)
    prober = Child("prober", "tests.bench.worker", log_dir=tmp_path)
    try:
        for worker, segment in ((writer, 64 * 2**20), (prober, 0)):
            worker.receive(timeout_s=60)
            worker.call(
                cmd="setup",
                master=master.address,
                segment=segment,
                buffer=2**20,
                local_buffer=16 * 2**20,
            )
        writer.call(cmd="put", prefix="cold", n=3 * 16, size=64, batch=16)
        probe: dict[str, Any] = {
            "cmd": "batch_exist",
            "prefix": "cold",
            "n": 16,
            "calls": 3,
            "distinct": True,
        }
        cold = prober.call(**probe, expect=1)
        assert cold["error_count"] == 0 and len(cold["times"]) == 3
        missing = prober.call(**{**probe, "prefix": "absent"}, expect=0)
        assert missing["error_count"] == 0
        wrong = prober.call(**{**probe, "prefix": "absent"}, expect=1)
        assert wrong["error_count"] == 3 * 16
        trips = writer.call(cmd="read_remove_write", prefix="trips", n=8, size=64)
        assert trips["errors"] == [] and len(trips["times"]) == 8
        assert trips["stamps_checked"] == 8 == trips["full_checked"]
        # the rounds left each key holding its round's value, not the first one
        reread = writer.call(cmd="get", prefix="trips", n=8, size=64, batch=8, mode="copy")
        assert reread["error_count"] == 8 and "wrong stamp" in reread["errors"][0]
    finally:
        prober.stop()
        writer.stop()
        master.stop()


def _record(mode: str, rates: dict[str, float], kernel: str, upstream: float | None) -> Any:
    """A minimal results record: one mooncake-py figure per row (and upstream's at
    ``upstream`` x it), on a machine that differs from others only in its kernel."""
    rows = []
    for row_id, value in rates.items():
        ours = {"value": value, "reps": [value * 0.99, value, value * 1.01], "spread": 0.01}
        theirs = None if upstream is None else {**ours, "value": value * upstream}
        rows.append(
            {
                "id": row_id,
                "label": f"row {row_id}",
                "unit": "ops/s",
                "upstream_id": row_id,
                PY: ours,
                UPSTREAM: theirs,
                "ratio": None if upstream is None else 1 / upstream,
            }
        )
    return {
        "schema": 2,
        "mode": mode,
        "started_at": "2026-12-01T12:00:00+0000",
        "machine": {"cpu_model": "cpu", "cpu_count": 2, "memory_bytes": 2**34, "kernel": kernel},
        "versions": {PY: {"numpy": "2.0", "executable": f"/{kernel}/python"}},
        "load_average": {"start": [0.5, 0.5, 0.5], "end": [1.0, 1.0, 1.0]},
        "rows": rows,
    }


def test_compare_reference_flags_moved_rows(tmp_path: Path, capsys: Any) -> None:
    reference = _record("quick", {"a": 1000.0, "b": 1000.0, "c": 1000.0}, "6.1", upstream=1.0)
    new = _record("quick", {"a": 1250.0, "b": 1050.0, "c": 800.0}, "6.1", upstream=1.0)
    ref_path, new_path = tmp_path / "reference.json", tmp_path / "new.json"
    ref_path.write_text(json.dumps(reference))
    new_path.write_text(json.dumps(new))
    argv = ["compare-reference", "--reference", str(ref_path), str(new_path)]
    assert store_bench.main(argv) == 0
    printed = capsys.readouterr().out
    lines: dict[str, str] = {}
    for line in printed.splitlines():  # the first section: mooncake-py's figures
        if line.startswith("row "):
            lines.setdefault(line.split()[1], line)
    assert "MOVED +25%" in lines["a"] and "MOVED -20%" in lines["c"]
    assert "MOVED" not in lines["b"]  # 5% is inside the default 10%
    assert "the machine descriptions match" in printed and "DIFFER" not in printed
    assert store_bench.main([*argv, "--strict"]) == 1
    capsys.readouterr()
    assert store_bench.main([*argv, "--strict", "--threshold", "0.3"]) == 0
    assert "0 row(s) moved" in capsys.readouterr().out

    elsewhere = _record("full", {"a": 1000.0}, "6.8", upstream=0.5)
    text, flagged = reference_diff(reference, elsewhere, ("ref", "new"))
    assert "machine descriptions (or the runs' set-ups) DIFFER" in text
    assert "machine kernel: '6.1' -> '6.8'" in text and "mode: 'quick' -> 'full'" in text
    assert "executable" not in text  # paths are not versions
    # upstream's figure halved, so the ratio mooncake-py / upstream went from 1.00x to 2.00x
    assert flagged == ["upstream: row a", "ratio: row a"]
    assert "ratio mooncake-py / upstream" in text and "2.00x" in text
    with pytest.raises(ValueError):
        reference_diff(reference, new, ("ref", "new"), threshold=-0.1)


def test_compare_reference_picks_the_reference_of_the_same_mode(
    tmp_path: Path, capsys: Any
) -> None:
    for name, mode, started in (("q", "quick", "2026-01-01"), ("f", "full", "2026-02-01")):
        record = {**_record(mode, {"a": 1.0}, "6.1", None), "started_at": started}
        (tmp_path / f"{name}.json").write_text(json.dumps(record))
    quick = _record("quick", {"a": 1.0}, "6.1", None)
    assert default_reference(quick, tmp_path) == tmp_path / "q.json"
    assert default_reference(_record("tiny", {}, "6.1", None), tmp_path) == tmp_path / "f.json"
    with pytest.raises(FileNotFoundError):
        default_reference(quick, tmp_path / "empty")
    new = tmp_path / "new.json"
    new.write_text(json.dumps(quick))
    assert cli.compare_reference_main(["--reference", str(tmp_path / "q.json"), str(new)]) == 0
    assert "q.json" in capsys.readouterr().out
    committed = sorted(REFERENCE_DIR.glob("*.json"))
    assert committed, "a reference record is committed"
    assert {"cpu_model", "kernel", "memory_bytes"} <= set(
        json.loads(committed[0].read_text())["machine"]
    )
