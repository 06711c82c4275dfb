"""Release, sleep-state, per-tenant and read hit/miss metrics, read from ``/metrics`` of a real
master while real clients put, get and release."""

from __future__ import annotations

from typing import Any

import pytest

from mooncake_py import MooncakeError, ObjectDataType, ReplicateConfig
from mooncake_py.master.clock import FakeClock
from mooncake_py.testing import InProcessMaster
from tests.integration.metrics_scrape import Scrape

KV = ReplicateConfig(data_type=ObjectDataType.KVCACHE)
WEIGHT = ReplicateConfig(data_type=ObjectDataType.WEIGHT)
KINDS = ("session", "stale", "all", "kv_cache")


def tagged(session: str, keys: int = 1) -> ReplicateConfig:
    """A KV-cache write of ``keys`` keys, each joining ``session``."""
    return ReplicateConfig(kv_sessions=[[session]] * keys, data_type=ObjectDataType.KVCACHE)


def sleep_states(scrape: Scrape) -> dict[str, str]:
    """tenant -> the one sleep state at 1; asserts both states are exported, one at 1."""
    states: dict[str, dict[str, float]] = {}
    for sample in scrape.samples:
        if sample.name == "master_kv_cache_sleep_state":
            labels = sample.labels
            states.setdefault(labels["tenant"], {})[labels["sleep_state"]] = sample.value
    current = {}
    for tenant, values in states.items():
        assert sorted(values) == ["awake", "kv_cache_released"], values
        assert sorted(values.values()) == [0, 1], values
        current[tenant] = next(state for state, value in values.items() if value == 1)
    return current


def tenant_gauges(scrape: Scrape, tenant: str) -> tuple[float, ...]:
    names = ("objects", "bytes", "kv_sessions", "kv_pinned_sessions")
    return tuple(scrape.value(f"master_tenant_{name}", tenant=tenant) for name in names)


def by_kind(scrape: Scrape, family: str) -> dict[str, float]:
    found = scrape.by_label(f"{family}_total", "kind")
    assert sorted(found) == sorted(KINDS)
    return found


def test_sleep_state_and_tenant_gauges_follow_release_kv_cache(make_store: Any) -> None:
    with InProcessMaster(enable_multi_tenants=True) as master:
        t1 = make_store(master.address, 4 << 20, tenant_id="t1")
        t2 = make_store(master.address, 4 << 20, tenant_id="t2")
        assert t1.put_batch(["kv1", "kv2"], [b"k" * 1000] * 2, tagged("s", keys=2)) == 0
        assert t1.put("w", b"w" * 500, WEIGHT) == 0
        assert t2.put("x", b"x" * 2000, tagged("p")) == 0
        t2.pin_kv_session("p")

        before = Scrape(master)
        assert sleep_states(before) == {"t1": "awake", "t2": "awake"}
        assert tenant_gauges(before, "t1") == (3, 2500, 1, 0)
        assert tenant_gauges(before, "t2") == (1, 2000, 1, 1)
        assert by_kind(before, "master_releases") == dict.fromkeys(KINDS, 0)

        cleared = t1.release_kv_cache()
        assert cleared.released_objects == 2 and cleared.freed_bytes > 0
        kept = t2.release_kv_cache()  # its one object is in a pinned session: nothing goes
        assert (kept.released_objects, kept.kept_pinned) == (0, 1)
        after = Scrape(master)
        assert sleep_states(after) == {"t1": "kv_cache_released", "t2": "awake"}
        assert tenant_gauges(after, "t1") == (1, 500, 0, 0)  # the session emptied and ended
        assert by_kind(after, "master_releases") == {**dict.fromkeys(KINDS, 0), "kv_cache": 2}
        assert by_kind(after, "master_released_key_count_by_kind")["kv_cache"] == 2
        bytes_by_kind = by_kind(after, "master_released_bytes_by_kind")
        assert bytes_by_kind == {**dict.fromkeys(KINDS, 0), "kv_cache": cleared.freed_bytes}
        assert after.value("master_released_bytes_total") == cleared.freed_bytes

        # Other data does not wake the tenant; its next KV-cache write does.
        assert t1.put("w2", b"w" * 100, WEIGHT) == 0
        assert sleep_states(Scrape(master))["t1"] == "kv_cache_released"
        assert t1.put("kv3", b"k" * 100, KV) == 0
        assert sleep_states(Scrape(master))["t1"] == "awake"

        # A released tenant left with no objects and no sessions is still shown.
        assert t2.release_kv_cache(keep_pinned=False).released_objects == 1
        emptied = Scrape(master)
        assert sleep_states(emptied) == {"t1": "awake", "t2": "kv_cache_released"}
        assert tenant_gauges(emptied, "t2") == (0, 0, 0, 0)
        assert emptied.value("master_releases_total", kind="kv_cache") == 3
        master.service.check()


def test_release_kinds_and_read_hits_and_misses_on_the_default_tenant(make_store: Any) -> None:
    clock = FakeClock()
    with InProcessMaster(clock=clock, background=False) as master:
        store = make_store(master.address, 16 << 20)
        assert store.put("hit", b"h" * 100) == 0
        assert store.get("hit") == b"h" * 100
        assert store.get_batch(["hit", "nope", "nope2"]) == [b"h" * 100, b"", b""]
        assert store.get("nope") == b""
        reads = Scrape(master)
        assert reads.value("master_get_hits_total") == 2
        assert reads.value("master_get_misses_total") == 3
        assert sleep_states(reads) == {"default": "awake"}
        assert tenant_gauges(reads, "default") == (1, 100, 0, 0)

        assert store.put_batch(["a", "b"], [b"a" * 1000] * 2, tagged("one", keys=2)) == 0
        one = store.release_kv_session("one")
        assert store.release_kv_session("unknown").released_objects == 0  # an OK answer
        assert store.put("old", b"o" * 1000, tagged("old")) == 0
        clock.advance(120)
        assert store.put("fresh", b"f" * 3000, tagged("fresh")) == 0
        stale = store.release_stale_kv_sessions(60_000)
        with pytest.raises(MooncakeError, match="INVALID_PARAMS"):
            store.release_all_kv_sessions()  # refused: not counted
        everything = store.release_all_kv_sessions(confirm=True)
        assert (one.released_objects, stale.released_objects, everything.released_objects) == (
            2,
            1,
            1,
        )

        released = Scrape(master)
        assert by_kind(released, "master_releases") == {
            "session": 2,
            "stale": 1,
            "all": 1,
            "kv_cache": 0,
        }
        objects = by_kind(released, "master_released_key_count_by_kind")
        assert objects == {"session": 2, "stale": 1, "all": 1, "kv_cache": 0}
        freed = by_kind(released, "master_released_bytes_by_kind")
        assert freed == {
            "session": one.freed_bytes,
            "stale": stale.freed_bytes,
            "all": everything.freed_bytes,
            "kv_cache": 0,
        }
        assert released.value("master_released_key_count_total") == sum(objects.values())
        assert released.value("master_released_bytes_total") == sum(freed.values())
        # Session releases do not change the KV-cache sleep state.
        assert sleep_states(released) == {"default": "awake"}
        master.service.check()
