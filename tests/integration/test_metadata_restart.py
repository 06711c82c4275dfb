"""A single master with ``--enable_snapshot`` survives ``kill -9``: restarted on its log and
snapshots, it serves every object whose segment comes back, with sessions, pins and exact
accounting; the objects of a segment whose owner died with it go once the owner's TTL passes.

Real parts: the master is a subprocess killed with SIGKILL; two client processes
(:mod:`tests.integration.ha_worker`) hold the segments and outlive it (one of them is killed
while the master is down).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from mooncake_py.master.server import free_port
from mooncake_py.testing import MasterProcess, wait_until
from tests.line_worker import call_worker

CLIENT_TTL_S = 4
REPO = Path(__file__).resolve().parents[2]


def start_worker(env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A :mod:`tests.integration.ha_worker` process (``env`` added to this one's)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.ha_worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def stats(master: MasterProcess) -> dict[str, Any]:
    url = f"http://127.0.0.1:{master.metrics_port}/v1/memory/stats"
    with urllib.request.urlopen(url, timeout=10) as answer:
        data: dict[str, Any] = json.load(answer)
    return data


def test_restart_recovers_what_remounts_and_drops_what_does_not(
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
        # A snapshot every 25 records: recovery reads a snapshot and the log after it.
        "--snapshot_log_records",
        "25",
        "--client_ttl",
        str(CLIENT_TTL_S),
    ]
    master = MasterProcess(args).start()
    try:
        config = {"master_server_address": master.address, "global_segment_size": 16 << 20}
        keeper, doomed = start_worker(), start_worker()
        workers.extend([keeper, doomed])
        for worker in (keeper, doomed):
            assert call_worker(worker, "setup", config=config) == 0

        kept = [f"kept-{i}" for i in range(80)]
        kept_sizes = [1000 + 37 * i for i in range(80)]
        tags = [[f"conv-{i % 4}"] + (["shared"] if i % 10 == 0 else []) for i in range(80)]
        codes = call_worker(keeper, "put", keys=kept, sizes=kept_sizes, sessions=tags, local=True)
        assert codes == [0] * 80
        lost = [f"lost-{i}" for i in range(20)]
        lost_sizes = [4096] * 20
        lost_tags = [["conv-1"] if i % 2 else [] for i in range(20)]
        codes = call_worker(
            doomed, "put", keys=lost, sizes=lost_sizes, sessions=lost_tags, local=True
        )
        assert codes == [0] * 20
        assert call_worker(keeper, "remove", key="kept-5") == 0
        assert call_worker(keeper, "pin", session_id="conv-2") == 0
        before = {s: call_worker(keeper, "session", session_id=s) for s in ("conv-1", "conv-2")}
        figures = stats(master)

        assert master.stop(signal.SIGKILL) == -signal.SIGKILL
        doomed.kill()  # its segment never comes back
        doomed.wait(timeout=10)

        master = MasterProcess(args).start()
        survivors = [k for k in kept if k != "kept-5"]
        sizes = [s for k, s in zip(kept, kept_sizes, strict=True) if k != "kept-5"]
        # The client finds the master again on its own (its heartbeat reconnects).
        wait_until(
            lambda: call_worker(keeper, "check", keys=survivors[:1], sizes=sizes[:1]) == ["ok"],
            timeout_s=15,
            what="the client reaches the restarted master",
        )
        # Every acknowledged write of the surviving segment reads back byte-exact.
        assert call_worker(keeper, "check", keys=survivors, sizes=sizes) == ["ok"] * 79
        assert call_worker(keeper, "exist", keys=["kept-5"]) == [0]
        after = call_worker(keeper, "session", session_id="conv-2")
        assert after == before["conv-2"] and after["pinned"] is True
        restored = stats(master)
        assert restored["objects"] == figures["objects"]
        assert restored["allocated_bytes"] == figures["allocated_bytes"]

        # The dead owner's objects go with its segment once its TTL passes; accounting follows.
        wait_until(
            lambda: stats(master)["objects"] == 79,
            timeout_s=CLIENT_TTL_S * 5,
            what="the dead client's objects are dropped",
        )
        assert call_worker(keeper, "exist", keys=lost) == [0] * 20
        conv1 = call_worker(keeper, "session", session_id="conv-1")
        assert conv1["member_count"] == before["conv-1"]["member_count"] - 10
        assert conv1["pinned"] is False
        # The store goes on writing after the restart.
        assert call_worker(keeper, "put", keys=["after"], sizes=[512], sessions=[[]]) == [0]
        assert call_worker(keeper, "check", keys=["after"], sizes=[512]) == ["ok"]
    finally:
        master.stop()


def test_without_restore_a_restart_starts_empty(tmp_path: Path) -> None:
    """--enable_snapshot alone logs, but a restart without --enable_snapshot_restore begins
    with nothing, and a later restore does not bring back that older life's objects."""
    meta = tmp_path / "meta"
    base = ["--enable_snapshot", "--snapshot_dir", str(meta)]
    from mooncake_py import MooncakeDistributedStore

    with MasterProcess([*base, "--enable_snapshot_restore"]) as first:
        store = MooncakeDistributedStore()
        config = {"master_server_address": first.address, "global_segment_size": 8 << 20}
        assert store.setup(config) == 0
        assert store.put("old", b"x" * 100) == 0
        store.close()
    with MasterProcess(base) as second:
        assert stats(second)["objects"] == 0
    with MasterProcess([*base, "--enable_snapshot_restore"]) as third:
        assert stats(third)["objects"] == 0


def test_every_put_acknowledged_before_a_kill_survives_it(
    tmp_path: Path, workers: list[subprocess.Popen[str]]
) -> None:
    """The master is killed while a client writes as fast as it can: every put it had
    acknowledged reads back after the restart (answers wait for the log's fsync)."""
    port = free_port("127.0.0.1")
    args = ["--port", str(port), "--enable_snapshot", "--enable_snapshot_restore"]
    args += ["--snapshot_dir", str(tmp_path / "meta"), "--snapshot_log_records", "200"]
    master = MasterProcess(args).start()
    try:
        writer = start_worker()
        workers.append(writer)
        config = {"master_server_address": master.address, "global_segment_size": 64 << 20}
        assert call_worker(writer, "setup", config=config) == 0
        assert writer.stdin is not None and writer.stdout is not None
        writer.stdin.write(
            json.dumps({"op": "put_until_failure", "prefix": "w", "count": 100_000, "size": 2048})
            + "\n"
        )
        writer.stdin.flush()
        wait_until(lambda: stats(master)["objects"] > 300, timeout_s=30, what="writes flow")
        master.stop(signal.SIGKILL)
        answer = json.loads(writer.stdout.readline())
        assert answer["ok"], answer
        acked = answer["result"]
        assert len(acked) >= 300  # more than 300 objects existed, at most one of them in flight
        master = MasterProcess(args).start()
        sizes = [2048] * len(acked)
        wait_until(
            lambda: call_worker(writer, "check", keys=acked[:1], sizes=sizes[:1]) == ["ok"],
            timeout_s=15,
            what="the client reaches the restarted master",
        )
        verdicts = call_worker(writer, "check", keys=acked, sizes=sizes)
        lost = [k for k, v in zip(acked, verdicts, strict=True) if v != "ok"]
        assert not lost, lost
    finally:
        master.stop()
