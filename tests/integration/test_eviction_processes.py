"""Eviction with real processes: pins under pressure, and reads racing writes and eviction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from mooncake_py import MooncakeDistributedStore, ReplicateConfig, SoftPinAction
from mooncake_py.testing import InProcessMaster
from tests.conftest import ClientProcess, client_config
from tests.integration.stress_worker import READY

WORKER = Path(__file__).resolve().parent / "stress_worker.py"
MIB = 1 << 20
# How long the writers and readers race, all at once. Each second gives hundreds of reads
# and several passes of eviction through the 6 MiB owner.
WORK_SECONDS = 2.0


def _pinned() -> ReplicateConfig:
    return ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=600_000)


def test_pinned_objects_survive_pressure_that_evicts_unpinned(
    client_processes: list[ClientProcess],
) -> None:
    with InProcessMaster() as master:
        owner = ClientProcess()
        client_processes.append(owner)
        assert owner.call("setup", config=client_config(master.address, 16 * MIB)) == 0
        writer = MooncakeDistributedStore()
        assert (
            writer.setup({"master_server_address": master.address, "global_segment_size": 0}) == 0
        )
        try:
            assert writer.put("soft", b"s" * MIB, _pinned()) == 0
            assert writer.put("hard", b"h" * MIB, ReplicateConfig(with_hard_pin=True)) == 0
            for i in range(60):  # 60 MiB through a 16 MiB store: every put must still succeed
                assert writer.put(f"plain-{i}", bytes([i]) * MIB) == 0, i
            assert writer.get("soft") == b"s" * MIB
            assert writer.get("hard") == b"h" * MIB
            assert writer.get("plain-0") == b""  # the oldest unpinned values went first
            assert writer.get("plain-59") == bytes([59]) * MIB
            stats = master.service.stats()
            assert stats["evicted_objects"] >= 60 - 14 and stats["evicted_soft_pinned"] == 0
        finally:
            writer.close()


def test_without_soft_pin_eviction_pinned_objects_survive_and_writes_fail(
    client_processes: list[ClientProcess],
) -> None:
    with InProcessMaster(allow_evict_soft_pinned_objects=False) as master:
        owner = ClientProcess()
        client_processes.append(owner)
        assert owner.call("setup", config=client_config(master.address, 8 * MIB)) == 0
        writer = MooncakeDistributedStore()
        assert (
            writer.setup({"master_server_address": master.address, "global_segment_size": 0}) == 0
        )
        try:
            codes = [writer.put(f"pinned-{i}", bytes([i]) * MIB, _pinned()) for i in range(12)]
            assert codes[:7] == [0] * 7
            assert -200 in codes[7:]  # NO_AVAILABLE_HANDLE once only pinned objects remain
            for i, code in enumerate(codes):
                if code == 0:
                    assert writer.get(f"pinned-{i}") == bytes([i]) * MIB
            assert master.service.stats()["evicted_soft_pinned"] == 0
        finally:
            writer.close()


def _start_stress_worker(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start ``stress_worker.py ARGS`` and wait for its ``ready`` line."""
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=Path(__file__).resolve().parents[2],
    )
    assert worker.stdout is not None
    line = worker.stdout.readline()
    if line.strip() != READY:
        worker.kill()
        worker.wait()
        raise AssertionError(f"stress worker {args[0]} did not get ready: {line!r}")
    return worker


def test_reads_racing_writes_and_eviction_never_see_wrong_bytes() -> None:
    with InProcessMaster(default_kv_lease_ttl=200) as master:
        # The owner's segment is mounted before anyone writes, and it is unmounted only after
        # every writer and reader is done: the race is among the workers, not their lifetimes.
        owner = _start_stress_worker("owner", master.address, str(6 * MIB))
        roles = [("writer", "0"), ("writer", "0"), ("reader", "0"), ("reader", "1")]
        workers: list[subprocess.Popen[str]] = []
        try:
            for seed, (role, tcp) in enumerate(roles, start=1):
                workers.append(
                    _start_stress_worker(
                        role,
                        master.address,
                        str(WORK_SECONDS),
                        str(seed),
                        env={"MOONCAKE_PY_FORCE_TCP": tcp},
                    )
                )
            for worker in workers:  # all set up: start them together
                assert worker.stdin is not None
                worker.stdin.write("go\n")
                worker.stdin.flush()
            totals: Counter[str] = Counter()
            for worker in workers:
                out, _ = worker.communicate(timeout=120)
                assert worker.returncode == 0
                totals.update(json.loads(out.strip().splitlines()[-1]))
            owner.communicate(input="stop\n", timeout=60)
            assert owner.returncode == 0
        finally:
            for process in (owner, *workers):
                if process.poll() is None:
                    process.kill()
                    process.wait()
        master.service.check()
        stats = master.service.stats()
    print(dict(totals), stats)
    assert totals["CORRUPT"] == 0, totals
    # The race really happened: data flowed, memory ran out, readers saw evicted keys.
    assert totals["get:ok"] + totals["get_into:ok"] > 50, totals
    assert stats["evicted_objects"] > 0, stats
    assert totals["get:miss"] + totals["get_into:-704"] > 0, totals
