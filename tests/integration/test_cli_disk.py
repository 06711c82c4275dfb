"""``mooncake-py stats`` and ``segments ls`` of a store with a disk tier: bytes per tier, the
same over gRPC and over the HTTP memory API."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator

import pytest

from mooncake_py import AsyncMooncakeStore, MooncakeDistributedStore
from mooncake_py.cli.output import format_size
from mooncake_py.errors import ErrorCode
from mooncake_py.testing import InProcessMaster
from tests.conftest import client_config
from tests.integration.cli_twins import run_cli, segments_match
from tests.integration.disk_world import disk_client_config, fill_until_spilled, wait_until_settled


@pytest.fixture(scope="module")
def spilled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessMaster]:
    """A master whose one client has spilled objects to its disk tier (no background work:
    the figures stand still between the gRPC and the HTTP run)."""
    root = str(tmp_path_factory.mktemp("disk"))
    with InProcessMaster(background=False) as master:
        store = MooncakeDistributedStore()
        assert store.setup(disk_client_config(master.address, root)) == 0
        try:
            fill_until_spilled(master, store, minimum=2)
            yield master
            master.service.check()
        finally:
            store.close()


def both(master: InProcessMaster, *args: str) -> tuple[str, str]:
    """Stdout of ``args`` over gRPC and over HTTP (each must exit 0)."""
    wait_until_settled(master)
    grpc = run_cli("--master", master.address, *args)
    http = run_cli("--http", f"http://127.0.0.1:{master.metrics_port}", *args)
    assert (grpc.returncode, http.returncode) == (0, 0), (grpc.stderr, http.stderr)
    return grpc.stdout, http.stdout


def test_segments_ls_shows_each_tier_alike_both_ways(spilled: InProcessMaster) -> None:
    stats = wait_until_settled(spilled)
    grpc, http = both(spilled, "segments", "ls", "--json")
    rows = json.loads(grpc)
    assert [row["tier"] for row in rows] == ["memory", "disk"]
    memory, disk = rows
    assert (disk["used_bytes"], disk["size"]) == (
        stats["disk_used_bytes"],
        stats["disk_capacity_bytes"],
    )
    assert memory["used_bytes"] == stats["allocated_bytes"]
    assert [row["tier"] for row in json.loads(http)] == ["memory", "disk"]
    for args in (("segments", "ls"), ("segments", "ls", "--json")):
        wait_until_settled(spilled)
        segments_match(
            run_cli("--master", spilled.address, *args),
            run_cli("--http", f"http://127.0.0.1:{spilled.metrics_port}", *args),
        )
    table, _ = both(spilled, "segments", "ls")
    assert table.splitlines()[0].split()[:3] == ["SEGMENT", "NAME", "TIER"]


def test_stats_show_bytes_per_tier_alike_both_ways(spilled: InProcessMaster) -> None:
    grpc, http = both(spilled, "stats")
    assert grpc == http
    stats = wait_until_settled(spilled)
    cells = [re.split(r"\s{2,}", line.strip()) for line in grpc.splitlines()[-3:]]
    assert cells[0] == ["TIER", "SEGMENTS", "USED", "CAPACITY", "FREE", "USE%"]
    tiers = {row[0]: row[1:] for row in cells[1:]}
    disk_free = stats["disk_capacity_bytes"] - stats["disk_used_bytes"]
    assert tiers["disk"][:4] == [
        "1",
        format_size(stats["disk_used_bytes"]),
        format_size(stats["disk_capacity_bytes"]),
        format_size(disk_free),
    ]
    assert tiers["memory"][:3] == [
        "1",
        format_size(stats["allocated_bytes"]),
        format_size(stats["capacity_bytes"]),
    ]
    grpc_json, http_json = both(spilled, "stats", "--json")
    assert json.loads(grpc_json)["disk_used_bytes"] == json.loads(http_json)["disk_used_bytes"]
    assert json.loads(grpc_json)["disk_used_bytes"] == stats["disk_used_bytes"] > 0


def test_keys_demote_moves_keys_to_disk(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = str(tmp_path_factory.mktemp("demote"))
    with InProcessMaster() as master:
        store = MooncakeDistributedStore()
        assert store.setup(disk_client_config(master.address, root)) == 0
        try:
            assert store.put("cold", b"c" * 4096) == 0
            done = run_cli("--master", master.address, "--json", "keys", "demote", "cold", "gone")
            assert done.returncode != 0  # one key could not be demoted
            assert json.loads(done.stdout) == {
                "demoted": {"cold": "OK", "gone": "OBJECT_NOT_FOUND"}
            }
            wait_until_settled(master)
            tiers = [d.is_disk_replica() for d in store.get_replica_desc("cold")]
            assert tiers[0] and store.get("cold") == b"c" * 4096
        finally:
            store.close()


@pytest.mark.parametrize("force_tcp", [False, True], ids=["shared-memory", "tcp"])
def test_the_store_faces_demote_keys(
    tmp_path_factory: pytest.TempPathFactory, force_tcp: bool
) -> None:
    """``batch_demote`` on the drop-in store and its asyncio twin; a reader on the same host
    (shared memory allowed or forced TCP) gets the demoted bytes back from the disk tier."""
    root = str(tmp_path_factory.mktemp("faces"))
    with InProcessMaster() as master:
        store = MooncakeDistributedStore()
        assert store.setup(disk_client_config(master.address, root)) == 0
        reader = MooncakeDistributedStore()
        plain = {**client_config(master.address, 0), "force_tcp": force_tcp}
        assert reader.setup(plain) == 0
        try:
            assert store.put("a", b"a" * 5000) == 0 and store.put("b", b"b" * 6000) == 0
            assert store.batch_demote(["a", "gone"]) == [0, ErrorCode.OBJECT_NOT_FOUND]

            async def demote_b() -> list[int]:
                return await AsyncMooncakeStore(store).batch_demote(["b"])

            assert asyncio.run(demote_b()) == [0]
            wait_until_settled(master)
            assert reader.get("a") == b"a" * 5000 and reader.get("b") == b"b" * 6000
            assert master.service.stats()["operator_demotions"] == 2
        finally:
            reader.close()
            store.close()
