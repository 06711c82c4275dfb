"""The memory API of a store with a disk tier: every segment says its tier, the stats give
memory and disk bytes apart (equal to the master's own figures), a release says the disk bytes
it freed, and a tenant's token sees only the disk tiers that tenant may use."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mooncake_py import MooncakeDistributedStore
from mooncake_py.testing import InProcessMaster
from tests.integration.disk_world import disk_client_config, fill_until_spilled, wait_until_settled
from tests.integration.test_memory_api import TOKENS, http_port, ok


@pytest.fixture
def disk_master(tmp_path: Path) -> Iterator[tuple[InProcessMaster, MooncakeDistributedStore]]:
    """A master and one client with a disk tier, after at least two spills. No background
    work (spills come from the writes' own evictions), so the figures stand still between
    the test's reads."""
    with InProcessMaster(background=False) as master:
        store = MooncakeDistributedStore()
        assert store.setup(disk_client_config(master.address, str(tmp_path / "disk"))) == 0
        try:
            fill_until_spilled(master, store, minimum=2)
            yield master, store
            master.service.check()
        finally:
            store.close()


def test_segments_say_their_tier_and_sum_per_tier(
    disk_master: tuple[InProcessMaster, MooncakeDistributedStore],
) -> None:
    master, _ = disk_master
    service = wait_until_settled(master)
    answer = ok(http_port(master), "/v1/memory/segments")
    by_tier = {s["tier"]: s for s in answer["segments"]}
    assert sorted(by_tier) == ["disk", "memory"] and answer["total_segments"] == 2
    disk, memory = by_tier["disk"], by_tier["memory"]
    assert disk["name"] == memory["name"] and disk["client_id"] == memory["client_id"]
    assert (disk["used_bytes"], disk["capacity_bytes"]) == (
        service["disk_used_bytes"],
        service["disk_capacity_bytes"],
    )
    assert disk["used_bytes"] >= 2 * (256 << 10)
    assert (memory["used_bytes"], memory["capacity_bytes"]) == (
        service["allocated_bytes"],
        service["capacity_bytes"],
    )
    for tier, segment in by_tier.items():
        summed = answer["tiers"][tier]
        assert summed["segments"] == 1
        assert (summed["used_bytes"], summed["capacity_bytes"], summed["free_bytes"]) == (
            segment["used_bytes"],
            segment["capacity_bytes"],
            segment["free_bytes"],
        )
    assert answer["total_used_bytes"] == disk["used_bytes"] + memory["used_bytes"]


def test_stats_give_memory_and_disk_apart(
    disk_master: tuple[InProcessMaster, MooncakeDistributedStore],
) -> None:
    master, store = disk_master
    port = http_port(master)
    # A read of a spilled object: a disk hit (and perhaps a promotion).
    assert store.get("k0") is not None
    service = wait_until_settled(master)
    stats = ok(port, "/v1/memory/stats")
    memory, disk = stats["memory"], stats["disk"]
    # The top-level figures stay memory only, as the service's.
    assert (stats["allocated_bytes"], stats["capacity_bytes"], stats["segments"]) == (
        memory["used_bytes"],
        memory["capacity_bytes"],
        memory["segments"],
    )
    assert (memory["used_bytes"], memory["capacity_bytes"]) == (
        service["allocated_bytes"],
        service["capacity_bytes"],
    )
    assert (disk["segments"], disk["used_bytes"], disk["capacity_bytes"]) == (
        service["disk_segments"],
        service["disk_used_bytes"],
        service["disk_capacity_bytes"],
    )
    assert disk["free_bytes"] == disk["capacity_bytes"] - disk["used_bytes"]
    assert (disk["spilled_objects"], disk["spilled_bytes"], disk["hits"]) == (
        service["spilled_objects"],
        service["spilled_bytes"],
        service["disk_hits"],
    )
    assert disk["spilled_objects"] >= 2 and disk["hits"] >= 1
    assert (disk["promoted_objects"], disk["evicted_objects"]) == (
        service["promoted_objects"],
        service["disk_evicted_objects"],
    )


def test_a_release_says_the_disk_bytes_it_freed(
    disk_master: tuple[InProcessMaster, MooncakeDistributedStore],
) -> None:
    master, _ = disk_master
    port = http_port(master)
    before = wait_until_settled(master)
    assert before["disk_used_bytes"] > 0
    answer = ok(port, "/v1/memory/release_kv_cache", {})
    assert answer["freed_disk_bytes"] == before["disk_used_bytes"]
    assert answer["freed_bytes"] + answer["pending_bytes"] == before["allocated_bytes"]
    after = wait_until_settled(master)
    assert after["disk_used_bytes"] == 0 and after["objects"] == 0
    assert ok(port, "/v1/memory/stats")["disk"]["used_bytes"] == 0


def test_a_tenant_sees_the_disk_tiers_it_may_use(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    with InProcessMaster(auth_tokens_file=str(tokens), background=False) as master:
        port = http_port(master)
        stores = []
        try:
            for token in ("token-a", "token-b"):
                store = MooncakeDistributedStore()
                config = disk_client_config(master.address, str(tmp_path / token))
                assert store.setup({**config, "auth_token": token}) == 0
                stores.append(store)
            fill_until_spilled(master, stores[0], "a")
            service = wait_until_settled(master)
            admin = ok(port, "/v1/memory/segments", token="token-admin")
            assert admin["tiers"]["disk"]["segments"] == 2
            for token, spilled in (("token-a", True), ("token-b", False)):
                seen = ok(port, "/v1/memory/segments", token=token)
                assert sorted(s["tier"] for s in seen["segments"]) == ["disk", "memory"]
                names = {s["name"] for s in seen["segments"]}
                assert len(names) == 1, token  # its own client's segment and disk tier
                disk = ok(port, "/v1/memory/stats", token=token)["disk"]
                assert disk == seen["tiers"]["disk"], token
                # A tenant is not shown the store-wide activity (other tenants' spills).
                assert "spilled_objects" not in disk
                used = service["disk_used_bytes"] if spilled else 0
                assert (disk["segments"], disk["used_bytes"]) == (1, used), token
            global_disk = ok(port, "/v1/memory/stats", token="token-admin")["disk"]
            assert global_disk["used_bytes"] == service["disk_used_bytes"] > 0
            master.service.check()
        finally:
            for store in stores:
                store.close()
