"""The store benchmark's plumbing, on tiny sizes: every row and limit is produced, every read
verified, the report renders and every process it started is gone afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench import store_bench
from tests.bench.common import size_label
from tests.bench.plan import plan_for
from tests.bench.report import table


def _alive(pid: int) -> bool:
    """True when ``pid`` still runs one of the benchmark's programs (ignores reused pids)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"tests.bench" in cmdline or b"mooncake_py.master" in cmdline


@pytest.mark.timeout(90)
def test_tiny_run_produces_every_figure() -> None:
    results = store_bench.run(quick=True, tiny=True)
    plan = plan_for(quick=True, tiny=True)

    check = results["verification"]
    assert check["ok"], check
    assert check["error_count"] == 0 and check["stamps_checked"] > 0 and check["full_checked"] > 0

    limits = results["limits"]
    expected_limits = {f"memcpy_{size_label(s)}" for s in plan.memcpy_sizes}
    expected_limits |= {f"stream_{size_label(s)}" for s in plan.sizes}
    expected_limits |= {"pingpong", "grpc_echo_ExistKey"}
    expected_limits |= {f"grpc_echo_BatchExistKey{n}" for n in plan.batch_exist_sizes}
    assert set(limits) == expected_limits
    for limit in limits.values():
        assert limit["value"] > 0, limit

    rows = {row["id"]: row for row in results["rows"]}
    expected_rows = {"meta.is_exist.present", "meta.is_exist.absent"}
    expected_rows |= {f"meta.batch_is_exist.{n}" for n in plan.batch_exist_sizes}
    for path in ("shm", "tcp"):
        for size in plan.sizes:
            label = size_label(size)
            expected_rows |= {
                f"{path}.a.batch_put_from.{label}",
                f"{path}.b.get_into.{label}",
                f"{path}.b.batch_get_into.{label}",
                f"{path}.b.put_from.{label}",
            }
    assert set(rows) == expected_rows
    for row in rows.values():
        assert row["value"] > 0 and row["calls"] > 0, row
        assert 0 < row["p50_us"] <= row["p99_us"], row
        assert row["limit_value"] > 0 and row["fraction"] > 0, row
        assert row["limit_id"] in limits, row

    assert set(results["packages"]) >= {"grpcio", "protobuf", "pyarrow", "numpy"}
    assert results["machine"]["cpu_count"] and results["machine"]["python"]
    json.dumps(results)  # the record is plain JSON
    report = table(results)
    assert "verification: PASSED" in report
    assert all(row["label"] in report for row in rows.values())

    leftovers = [name for name, pid in results["pids"].items() if _alive(pid)]
    assert leftovers == []
    segments = [
        p for pid in results["pids"].values() for p in Path("/dev/shm").glob(f"mooncake_py-{pid}-*")
    ]
    assert segments == []
