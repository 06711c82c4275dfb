"""The demo end to end: quick mode (embedded master, two worker processes, the replay with a disk
tier), the demo against an existing master (with and without disk tiers allowed), and its
self-check of the bytes it reads back."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mooncake_py.demo.cli import add_demo_subcommand, config_from_args, main, run_from_args
from mooncake_py.demo.report import PLOT_NAME, REPORT_NAME, SUMMARY_NAME
from mooncake_py.demo.worker import (
    EngineWorker,
    TurnJob,
    VerificationError,
    WorkerSpec,
    page_content,
)
from mooncake_py.master.clock import FakeClock
from mooncake_py.testing import InProcessMaster

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _policies(out: Path) -> dict[str, dict[str, Any]]:
    summary = json.loads((out / SUMMARY_NAME).read_text())
    return {p["name"]: p for p in summary["policies"]}


def test_quick_demo_sessions_beat_plain_lru(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:  # type: ignore[type-arg]
    assert main(["--quick", "--no-progress", "--out", str(tmp_path)]) == 0
    policies = _policies(tmp_path)
    plain, sessions = policies["plain"], policies["sessions"]
    # Same trace, both replayed in full, every loaded page verified.
    assert plain["turns"] == sessions["turns"] > 500
    assert plain["reusable"] == sessions["reusable"]
    assert plain["verified_pages"] > 0 and sessions["verified_pages"] > 0
    # What sessions buy: live conversations find their context far more often...
    assert sessions["live_hit_rate"] > plain["live_hit_rate"] + 0.05
    assert sessions["pages_recomputed"] < plain["pages_recomputed"]
    # ...because the plain run's store had no other way to tell live pages from dead ones.
    assert plain["evicted_ordinary"] > 0 and plain["evicted_soft_pinned"] == 0
    assert plain["bytes_released"] == 0 and sessions["bytes_released"] > 0
    assert sessions["session_calls"]["release"] > 0 and sessions["session_calls"]["close"] > 0
    assert (tmp_path / PLOT_NAME).read_bytes().startswith(PNG_MAGIC)
    report = (tmp_path / REPORT_NAME).read_text()
    assert "| sessions |" in report and f"]({PLOT_NAME})" in report
    printed = capsys.readouterr().out
    assert "live hit rate" in printed and "sessions" in printed
    _check_disk_tier_replay(tmp_path, printed)


def _check_disk_tier_replay(out: Path, printed: str) -> None:
    """The third replay: plain LRU on the same memory with a disk tier under each worker."""
    summary = json.loads((out / SUMMARY_NAME).read_text())
    policies = {p["name"]: p for p in summary["policies"]}
    plain, disk = policies["plain"], policies["plain+disk"]
    assert (plain["disk_tier"], disk["disk_tier"]) == (False, True)
    assert disk["turns"] == plain["turns"] and disk["reusable"] == plain["reusable"]
    assert disk["capacity_bytes"] == plain["capacity_bytes"]  # the same memory
    assert disk["verified_pages"] > plain["verified_pages"]
    # Evicted pages went to disk and were read from there instead of being recomputed.
    assert disk["spilled_objects"] > 0 and disk["disk_hits"] > 0 and disk["disk_peak_bytes"] > 0
    assert plain["spilled_objects"] == plain["disk_hits"] == plain["disk_peak_bytes"] == 0
    assert disk["hit_rate"] >= plain["hit_rate"]
    assert disk["pages_recomputed"] < plain["pages_recomputed"]
    side_by_side = summary["disk_tier"]
    assert side_by_side["ran"] is True
    assert side_by_side["hit_rate"] == {"without": plain["hit_rate"], "with": disk["hit_rate"]}
    assert side_by_side["disk_hits"] == disk["disk_hits"]
    assert side_by_side["promotions"] == disk["promoted_objects"]
    report = (out / REPORT_NAME).read_text()
    assert "## With a disk tier" in report and "| plain+disk | yes |" in report
    assert "without and with a disk tier" in printed and "promotions" in printed


def test_demo_against_an_existing_master(tmp_path: Path) -> None:
    # Short read leases: the demo waits for the removed keys' leases before the second policy.
    with InProcessMaster(default_kv_lease_ttl=200) as master:
        _run_against(master, tmp_path)


def _run_against(master: InProcessMaster, tmp_path: Path) -> None:
    args = ["--master", master.address, "--no-progress", "--out", str(tmp_path)]
    args += ["--conversations", "12", "--window", "30", "--max-turns", "3"]
    args += [
        "--think-median",
        "8",
        "--think-max",
        "20",
        "--pin-idle",
        "20",
        "--abandon-after",
        "25",
    ]
    assert main(args) == 0
    summary = json.loads((tmp_path / SUMMARY_NAME).read_text())
    assert summary["master"] == master.address and summary["embedded_master"] is False
    assert all(p["turns"] > 12 for p in summary["policies"])
    # The demo cleans up after itself: no key and no session of the run is left behind, and
    # the disk tiers are unmounted with their workers.
    stats = master.service.stats()
    assert stats["objects"] == 0 and stats["sessions"] == 0
    assert stats["disk_segments"] == 0 and stats["segments"] == 0
    names = [p["name"] for p in summary["policies"]]
    if master.config.enable_offload:
        assert names == ["plain", "sessions", "plain+disk"] and summary["disk_tier"]["ran"]
    else:
        assert names == ["plain", "sessions"]
        assert "disk tier" in summary["disk_tier"]["skipped"]
        assert "did not run" in (tmp_path / REPORT_NAME).read_text()


def test_demo_against_a_master_that_refuses_disk_tiers(tmp_path: Path) -> None:
    # The disk-tier replay is skipped with its reason; the other two still run and report.
    with InProcessMaster(default_kv_lease_ttl=200, enable_offload=False) as master:
        _run_against(master, tmp_path)


def test_unreachable_master_fails_with_a_nonzero_exit(tmp_path: Path) -> None:
    assert main(["--master", "127.0.0.1:1", "--quick", "--out", str(tmp_path)]) == 3
    assert main(["--capacity-ratio", "-1", "--out", str(tmp_path)]) == 2
    assert not (tmp_path / SUMMARY_NAME).exists()


def test_a_page_with_wrong_bytes_fails_the_turn() -> None:
    page = 4096
    clock = FakeClock()  # no timer runs: only the worker's own calls end its leases
    with InProcessMaster(clock=clock, background=False) as master:
        spec = WorkerSpec(0, master.address, 1 << 20, page, 8, "org/model", "verify-test")
        worker = EngineWorker(spec)
        try:
            job = TurnJob(prompt=("a" * 64, "b" * 64), reply=("c" * 64,))
            first = worker.turn(job)
            assert (first.loaded, first.save.written) == (0, 3)
            assert worker.turn(job).loaded == 2
            assert page_content("b" * 64, page) != page_content("a" * 64, page)
            # The turn's probes held nothing and its loads ended their leases: replace a page.
            key = worker.connector.keys.key("b" * 64)
            worker.client.upsert(key, page_content("a" * 64, page))  # raises on failure
            with pytest.raises(VerificationError, match="wrong bytes"):
                worker.turn(job)
        finally:
            worker.close()


def test_cli_registration_for_the_ops_cli() -> None:
    # The ops CLI's shape: a global --master that always has a value, register(commands, parents).
    parser = argparse.ArgumentParser(prog="mooncake-py")
    parser.add_argument("--master", default="127.0.0.1:50051")
    commands = parser.add_subparsers(dest="command", required=True)
    add_demo_subcommand(commands, None)
    args = parser.parse_args(["demo", "--quick", "--seed", "3", "--capacity-mib", "64"])
    assert args.handler is run_from_args
    config = config_from_args(args)
    assert (config.trace.seed, config.trace.conversations, config.capacity_mib) == (3, 150, 64)
    assert config.master is None and config.out_dir == Path("demo-output")  # embedded master
    assert (config.disk_tier, config.disk_fsync, config.disk_quota_mib) == (True, False, None)
    tierless = parser.parse_args(["demo", "--no-disk-tier", "--disk-fsync"])
    assert (config_from_args(tierless).disk_tier, config_from_args(tierless).disk_fsync) == (
        False,
        True,
    )
    assert (
        config_from_args(parser.parse_args(["demo", "--disk-quota-mib", "8"])).disk_quota_mib == 8
    )
    assert args.master == "127.0.0.1:50051"  # the global option is left alone
    explicit = parser.parse_args(["demo", "--master", "10.0.0.1:50051"])
    assert config_from_args(explicit).master == "10.0.0.1:50051"
    # The ops CLI hands its handlers a context holding the arguments.
    bad = parser.parse_args(["demo", "--pin-idle", "500"])
    assert run_from_args(SimpleNamespace(args=bad)) == 2
