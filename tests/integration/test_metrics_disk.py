"""The disk tier's Prometheus metrics on a real master whose clients have disk tiers: every
family equals the master's own figure, memory families stay memory only, and the per-tenant
disk bytes are served only to admin scrapes. The masters run no background work, so the
figures stand still between the master's stats and the scrape."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from mooncake_py import MooncakeDistributedStore
from mooncake_py.testing import InProcessMaster
from tests.integration.disk_world import disk_client_config, fill_until_spilled, wait_until_settled
from tests.integration.metrics_scrape import Scrape
from tests.integration.test_memory_api import TOKENS, call, http_port

# metric sample -> the MasterService.stats key it reports
DISK_SAMPLES = {
    "master_disk_segments": "disk_segments",
    "master_disk_capacity_bytes": "disk_capacity_bytes",
    "master_total_file_capacity_bytes": "disk_capacity_bytes",
    "master_disk_used_bytes": "disk_used_bytes",
    "master_allocated_file_size_bytes": "disk_used_bytes",
    "master_disk_tasks": "disk_tasks",
    "master_spills_in_flight": "spills_in_flight",
    "master_disk_deletes_pending": "disk_deletes_pending",
    "master_spills_started_total": "spills_started",
    "master_spilled_key_count_total": "spilled_objects",
    "master_spilled_size_bytes_total": "spilled_bytes",
    "master_spill_failures_total": "spill_failures",
    "master_demoted_key_count_total": "demoted_objects",
    "master_promotion_started_total": "promotions_started",
    "master_promotion_completed_total": "promoted_objects",
    "master_promotion_failed_total": "promotion_failures",
    "master_disk_evicted_key_count_total": "disk_evicted_objects",
    "master_disk_evicted_size_bytes_total": "disk_evicted_bytes",
    "master_disk_hits_total": "disk_hits",
    # Memory only, beside the disk tier.
    "master_total_capacity_bytes": "capacity_bytes",
    "master_allocated_bytes": "allocated_bytes",
    "master_mounted_segments": "segments",
}


def test_every_disk_family_is_the_masters_figure(tmp_path: Path) -> None:
    with InProcessMaster(background=False) as master:
        store = MooncakeDistributedStore()
        assert store.setup(disk_client_config(master.address, str(tmp_path))) == 0
        try:
            fill_until_spilled(master, store, minimum=2)
            assert store.get("k0") is not None  # a disk hit
            stats = wait_until_settled(master)
            scrape = Scrape(master)
            for sample, key in DISK_SAMPLES.items():
                assert scrape.value(sample) == stats[key], sample
            assert stats["spilled_objects"] >= 2 and stats["disk_hits"] >= 1
            assert stats["disk_segments"] == stats["segments"] == 1
            disk_bytes = scrape.by_label("master_tenant_disk_bytes", "tenant")
            assert disk_bytes == {"default": stats["disk_used_bytes"]}
            # A counter is typed as one (rate() may take it), a gauge as a gauge.
            assert scrape.families["master_spilled_key_count"] == "counter"
            assert scrape.families["master_disk_used_bytes"] == "gauge"
            master.service.check()
        finally:
            store.close()


def test_per_tenant_disk_bytes_need_an_admin_token(tmp_path: Path) -> None:
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
            assert stores[1].put("b", b"b" * 4096) == 0  # in memory: no disk bytes
            stats = wait_until_settled(master)

            def disk_bytes(token: str | None) -> dict[str, float]:
                status, _, body = call(port, "/metrics", token=token)
                assert status == 200
                families = text_string_to_metric_families(body.decode())
                return {
                    s.labels["tenant"]: s.value
                    for f in families
                    if f.name == "master_tenant_disk_bytes"
                    for s in f.samples
                }

            assert disk_bytes("token-admin") == {
                "tenant-a": stats["disk_used_bytes"],
                "tenant-b": 0,
            }
            assert disk_bytes(None) == disk_bytes("token-a") == {}
            master.service.check()
        finally:
            for store in stores:
                store.close()
