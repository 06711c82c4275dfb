"""The store benchmark's ``--baseline-rev`` and ``--rows``: row selection, and a tiny run that
builds this repository's HEAD as the baseline and takes turns with the working tree on a few
rows (real masters and workers on 127.0.0.1). The full-size comparison is
``make bench-baseline REV=...``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.bench import baseline as base
from tests.bench import store_bench
from tests.bench.common import ROOT
from tests.bench.plan import plan_for
from tests.bench.report import PY
from tests.bench.rows import NoSuchRows, catalogue, parse_patterns, select

TINY_ROWS = ["get 4KiB", "shm * 4 x 256KiB"]
TINY_SELECTED = {
    "local.get.4KiB",
    "shm.b.get.4KiB",
    "tcp.b.get.4KiB",
    "shm.a.batch_put_from.256KiB",
    "shm.b.batch_get_into.256KiB",
}


def _running(pid: int) -> bool:
    """True when ``pid`` still runs one of the benchmark's programs (ignores reused pids)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"tests.bench" in cmdline or b"mooncake_py.master" in cmdline


def test_selection_by_substring_glob_and_id() -> None:
    rows = catalogue(plan_for(quick=True, tiny=False))
    assert select(rows, ["GET 4kib"]) == {"local.get.4KiB", "shm.b.get.4KiB", "tcp.b.get.4KiB"}
    assert select(rows, ["shm * 32 x 4MiB"]) == {
        "shm.a.batch_put_from.4MiB",
        "shm.b.batch_get_into.4MiB",
    }
    assert select(rows, ["meta.remove*"]) == {"meta.remove", "meta.remove.grpc"}
    default = select(rows, None)
    assert default and all(not rows[row_id].get("opt_in") for row_id in default)
    assert "shm.b.get.4KiB" not in default and "local.get.4KiB" in default
    assert parse_patterns("a, b,,c") == ["a", "b", "c"]
    assert parse_patterns(["a,b", "c"]) == ["a", "b", "c"]
    assert parse_patterns(None) is None
    with pytest.raises(NoSuchRows):
        parse_patterns(" , ")
    with pytest.raises(NoSuchRows, match="no-such-row") as caught:
        select(rows, ["get 4KiB", "no-such-row"])
    assert "local.get.4KiB" in str(caught.value)  # the message lists the rows


def test_unusable_arguments_exit_2(capsys: Any) -> None:
    assert store_bench.main(["--tiny", "--rows", "no-such-row"]) == 2
    assert "matches no row" in capsys.readouterr().err
    assert store_bench.main(["--tiny", "--baseline-rev", "no-such-revision-xyz"]) == 2
    assert "is not a commit" in capsys.readouterr().err
    with pytest.raises(base.BaselineUnavailable):
        base.resolve("no-such-revision-xyz")


@pytest.fixture(scope="module")
def tiny_baseline_results() -> dict[str, Any]:
    return store_bench.run(quick=True, tiny=True, rows=TINY_ROWS, baseline_rev="HEAD", rounds=3)


@pytest.mark.timeout(90)
def test_tiny_baseline_run_measures_both_sides(tiny_baseline_results: dict[str, Any]) -> None:
    results = tiny_baseline_results
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    info = results["baseline"]
    assert info["rev"] == "HEAD" and info["commit"] == head and info["subject"]
    assert results["selected_rows"] == sorted(TINY_SELECTED)
    assert results["params"]["rounds"] == 3 != plan_for(quick=True, tiny=True).rounds

    rows = {row["id"]: row for row in results["rows"]}
    assert set(rows) == TINY_SELECTED
    for row in rows.values():
        ours, theirs = row[PY], row[base.BASELINE]
        assert theirs is not None, row["id"]
        for figures in (ours, theirs):
            assert figures["value"] > 0 and figures["calls"] > 0, row["id"]
            assert len(figures["reps"]) == 3, row["id"]
        assert row["baseline_ratio"] == pytest.approx(ours["value"] / theirs["value"])
        assert row["baseline_verdict"] in ("faster", "slower", "no difference")

    # each side imported its own mooncake_py: the working tree's, and the one built for HEAD
    versions = results["versions"]
    assert Path(versions[PY]["package_dir"]) == ROOT / "mooncake_py"
    site = Path(info["site"])
    assert Path(versions[base.BASELINE]["package_dir"]) == site / "mooncake_py"
    assert not site.parent.exists()  # the scratch build is gone

    for name in (PY, base.BASELINE):
        check = results["verification"][name]
        assert check["ok"] and check["error_count"] == 0, (name, check)
    assert {"py-master", "base-master", "base-shm-A", "base-shm-B"} <= set(results["pids"])
    assert "base-shm-B-grpc" not in results["pids"]  # no metadata row selected
    assert set(results["limits"]) == {row["limit_id"] for row in rows.values()}
    assert results["pressure"] == {PY: None, base.BASELINE: None}  # skipped when restricted
    leftovers = [name for name, pid in results["pids"].items() if _running(pid)]
    assert leftovers == []

    json.dumps(results)
    section = "\n".join(base.table_lines(results))
    assert head[:9] in section
    for row in rows.values():
        line = next(line for line in section.splitlines() if line.startswith(row["label"]))
        assert f"{row['baseline_ratio']:.3f}x" in line
