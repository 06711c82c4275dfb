"""Disk replicas are metadata like any other: a master with ``--enable_snapshot_restore``
killed with SIGKILL comes back serving the objects its segment owner had spilled to disk.

Real parts: the master is a subprocess killed with SIGKILL; the segment owner (with its disk
tier) and a reader are client processes (:mod:`tests.integration.ha_worker`) that outlive it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mooncake_py.master.server import free_port
from mooncake_py.testing import MasterProcess, wait_until
from tests.line_worker import call_worker

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def start_worker() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.ha_worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ),
    )


def test_spilled_objects_survive_a_master_restart(
    tmp_path: Path, workers: list[subprocess.Popen[str]]
) -> None:
    port = free_port("127.0.0.1")
    args = [
        "--port",
        str(port),
        "--enable_snapshot",
        "--enable_snapshot_restore",
        "--snapshot_dir",
        str(tmp_path / "meta"),
        "--snapshot_log_records",
        "40",
    ]
    master = MasterProcess(args).start()
    try:
        owner, reader = start_worker(), start_worker()
        workers.extend([owner, reader])
        tier = {
            "master_server_address": master.address,
            "global_segment_size": 16 * MIB,
            "enable_ssd_offload": True,
            "ssd_offload_path": str(tmp_path / "ssd"),
        }
        assert call_worker(owner, "setup", config=tier) == 0
        plain = {"master_server_address": master.address, "global_segment_size": 0}
        assert call_worker(reader, "setup", config=plain) == 0
        keys = [f"obj-{i}" for i in range(48)]
        sizes = [MIB - 4096 * (i % 5) for i in range(48)]
        # Three times the segment: most of them can only be on disk.
        assert call_worker(owner, "put", keys=keys, sizes=sizes, sessions=[[]] * 48) == [0] * 48
        assert call_worker(reader, "check", keys=keys, sizes=sizes) == ["ok"] * 48
        tiers = call_worker(reader, "tiers", keys=keys)
        on_disk = [k for k, t in zip(keys, tiers, strict=True) if t == ["disk"]]
        assert len(on_disk) >= 16

        assert master.process is not None
        os.kill(master.process.pid, signal.SIGKILL)
        master.process.wait(timeout=10)
        master = MasterProcess(args).start()  # the same port: clients keep their address

        # The owner only keeps pinging; every object, on disk or in memory, reads back.
        def all_back() -> bool:
            return call_worker(reader, "check", keys=keys, sizes=sizes) == ["ok"] * 48

        wait_until(all_back, timeout_s=30, poll_s=0.2, what="every object reads back")
        # The objects that were only on disk came back as disk replicas (the restored master
        # knew them: nothing was re-registered, the owner never restarted).
        tiers_after = call_worker(reader, "tiers", keys=on_disk)
        assert all("disk" in tiers for tiers in tiers_after)
    finally:
        master.stop()


def _owner_config(address: str, root: Path) -> dict[str, object]:
    return {
        "master_server_address": address,
        "global_segment_size": 8 * MIB,
        "enable_ssd_offload": True,
        "ssd_offload_path": str(root),
    }


def _spill_all(
    owner: subprocess.Popen[str], reader: subprocess.Popen[str], keys: list[str]
) -> list[str]:
    """Write ``keys`` (1 MiB each, 3x the segment) and return those only on disk."""
    sizes = [MIB] * len(keys)
    assert call_worker(owner, "put", keys=keys, sizes=sizes, sessions=[[]] * len(keys)) == [
        0
    ] * len(keys)
    tiers = call_worker(reader, "tiers", keys=keys)
    return [k for k, t in zip(keys, tiers, strict=True) if t == ["disk"]]


@pytest.mark.parametrize("expired", [False, True], ids=["before-expiry", "after-expiry"])
def test_a_restarted_owner_gets_its_tier_back_without_removed_objects(
    tmp_path: Path, workers: list[subprocess.Popen[str]], expired: bool
) -> None:
    """The owner is killed; one disk-only object is removed while it is down; a process
    restarted on the same directory serves every other object from disk, byte-exact, and never
    the removed one: before the old owner expired it takes the tier over, after it registers
    the tier's files again and the master refuses the removed one's."""
    port = free_port("127.0.0.1")
    master = MasterProcess(["--port", str(port), "--client_ttl", "2"]).start()
    try:
        owner, reader = start_worker(), start_worker()
        workers.extend([owner, reader])
        assert call_worker(owner, "setup", config=_owner_config(master.address, tmp_path)) == 0
        plain = {"master_server_address": master.address, "global_segment_size": 0}
        assert call_worker(reader, "setup", config=plain) == 0
        keys = [f"obj-{i}" for i in range(24)]
        on_disk = _spill_all(owner, reader, keys)
        assert len(on_disk) >= 8
        owner.kill()
        owner.wait(timeout=10)
        doomed = on_disk[0]
        assert call_worker(reader, "remove", key=doomed) == 0
        if expired:  # the old owner's objects and tier are dropped meanwhile
            wait_until(
                lambda: call_worker(reader, "exist", keys=[on_disk[1]]) == [0],
                timeout_s=15,
                what="the dead owner expires",
            )
        again = start_worker()
        workers.append(again)
        assert call_worker(again, "setup", config=_owner_config(master.address, tmp_path)) == 0
        kept = on_disk[1:]
        assert call_worker(reader, "check", keys=kept, sizes=[MIB] * len(kept)) == ["ok"] * len(
            kept
        )
        assert call_worker(reader, "check", keys=[doomed], sizes=[MIB]) == ["missing"]
        assert call_worker(reader, "exist", keys=[doomed]) == [0]  # not even listed
    finally:
        master.stop()
