"""The master as a real process: flags, config files, restart with automatic client remount."""

from __future__ import annotations

import subprocess
import sys

from mooncake_py import MooncakeDistributedStore
from mooncake_py.testing import MasterProcess, wait_until


def test_invalid_flags_fail_at_start_with_a_clear_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mooncake_py.master", "--eviction-high-watermark-ratio", "1.5"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "eviction_high_watermark_ratio" in result.stderr


def test_config_file_and_dash_flags(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "master.yaml"
    config.write_text("client_live_ttl_sec: 3\ndefault-kv-lease-ttl: 2s\n")
    with MasterProcess(
        ["--config", str(config), "--allocation-strategy", "free_ratio_first"]
    ) as master:
        store = MooncakeDistributedStore()
        assert (
            store.setup({"master_server_address": master.address, "global_segment_size": 1 << 20})
            == 0
        )
        assert store.put("k", b"v") == 0 and store.get("k") == b"v"
        store.close()


def test_client_remounts_after_master_restart() -> None:
    # The restarted master takes the port the first one picked (no port guessed in advance
    # that another process could take first), so the client finds it at the same address.
    first = MasterProcess().start()
    port = first.address.rsplit(":", 1)[1]
    store = MooncakeDistributedStore()
    try:
        assert (
            store.setup({"master_server_address": first.address, "global_segment_size": 4 << 20})
            == 0
        )
        assert store.put("before", b"1") == 0
        first.stop()
        second = MasterProcess(["--port", port]).start()
        try:
            assert second.address == first.address
            # The client's next heartbeat learns of the restart and remounts its segment.
            wait_until(lambda: store.put("after", b"2") == 0, 20, 0.02, "the client remounted")
            assert store.get("after") == b"2"
            assert store.get("before") == b""  # metadata is runtime state: gone with the master
            assert store.health_check() == 0
        finally:
            second.stop()
    finally:
        store.close()
        first.stop()
