"""Session listing and release: what operators use to free memory held by conversations."""

from __future__ import annotations

import pytest

from mooncake_py import MooncakeError, ObjectDataType, ReplicateConfig
from mooncake_py.testing import InProcessMaster


def tagged(*sessions: str, keys: int = 1, **extra) -> ReplicateConfig:  # type: ignore[no-untyped-def]
    return ReplicateConfig(kv_sessions=[list(sessions)] * keys, **extra)


@pytest.fixture
def leaseless_master():  # type: ignore[no-untyped-def]
    # Reads end their leases when their copies are done, and a release never keeps an object
    # for its readers (they finish on the old bytes), so each test controls protection itself.
    with InProcessMaster() as running:
        yield running
        running.service.check()


def test_release_frees_exclusive_members_and_keeps_shared_ones(
    leaseless_master, make_store
) -> None:  # type: ignore[no-untyped-def]
    master = leaseless_master
    store = make_store(master.address, 16 << 20)
    assert store.put_batch(["a", "b", "c"], [b"x" * 1000] * 3, tagged("s1", keys=3)) == 0
    assert store.put("hard", b"h" * 1000, tagged("s1", with_hard_pin=True)) == 0
    assert store.attach_kv_session("s2", ["a"]) == [0]
    used_before = master.service.stats()["allocated_bytes"]
    result = store.release_kv_session("s1")
    assert (result.sessions, result.released_objects) == (1, 2)
    assert (result.kept_shared, result.kept_hard_pinned) == (1, 1)
    # Freed bytes are exactly what the allocator got back (sizes rounded to its alignment).
    assert result.freed_bytes == used_before - master.service.stats()["allocated_bytes"] == 2048
    assert store.batch_is_exist(["a", "b", "c", "hard"]) == [1, 0, 0, 1]
    with pytest.raises(MooncakeError, match="SESSION_NOT_FOUND"):
        store.get_kv_session("s1")
    assert store.get_kv_session("s2").exclusive_bytes == 1000
    unknown = store.release_kv_session("never-existed")
    assert unknown.released_objects == 0 and "never-existed" in unknown.message


def test_listing_filters_and_pages(leaseless_master, make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store(leaseless_master.address, 16 << 20)
    for i in range(5):
        assert store.put(f"k{i}", b"v" * (i + 1) * 100, tagged(f"s{i}")) == 0
    store.pin_kv_session("s1")
    store.pin_kv_session("s3")
    everyone, cursor = [], ""
    while True:
        page, cursor = store.list_kv_sessions(cursor, limit=2)
        everyone += page
        if not cursor:
            break
    assert [i.session_id for i in everyone] == ["s0", "s1", "s2", "s3", "s4"]
    assert [i.bytes for i in everyone] == [100, 200, 300, 400, 500]
    pinned, _ = store.list_kv_sessions(pinned=True)
    assert [i.session_id for i in pinned] == ["s1", "s3"]
    idle, _ = store.list_kv_sessions(min_idle_ms=3_600_000)
    assert idle == []


def test_release_stale_all_and_kv_cache(make_store) -> None:  # type: ignore[no-untyped-def]
    from mooncake_py.master.clock import FakeClock

    clock = FakeClock()
    with InProcessMaster(clock=clock, background=False) as master:
        store = make_store(master.address, 16 << 20)
        assert store.put("old", b"o" * 100, tagged("old")) == 0
        assert store.put("old-pinned", b"p" * 100, tagged("old-pinned")) == 0
        store.pin_kv_session("old-pinned")
        clock.advance(120)
        assert store.put("fresh", b"f" * 100, tagged("fresh")) == 0
        stale = store.release_stale_kv_sessions(60_000)
        assert (stale.sessions, stale.released_objects) == (1, 1)
        assert store.batch_is_exist(["old", "old-pinned", "fresh"]) == [0, 1, 1]
        with_pinned = store.release_stale_kv_sessions(60_000, include_pinned=True)
        assert with_pinned.sessions == 1 and store.is_exist("old-pinned") == 0
        with pytest.raises(MooncakeError, match="INVALID_PARAMS"):
            store.release_all_kv_sessions()
        assert store.release_all_kv_sessions(confirm=True).sessions == 1

        weights = ReplicateConfig(data_type=ObjectDataType.WEIGHT)
        assert store.put("weights", b"w" * 1000, weights) == 0
        assert store.put("kv", b"k" * 1000, ReplicateConfig(data_type=ObjectDataType.KVCACHE)) == 0
        assert store.put("untyped", b"u" * 1000) == 0
        assert store.put("live", b"l" * 1000, tagged("conversation")) == 0
        store.pin_kv_session("conversation")
        cleared = store.release_kv_cache()
        assert (cleared.released_objects, cleared.kept_pinned) == (2, 1)
        assert store.batch_is_exist(["weights", "kv", "untyped", "live"]) == [1, 0, 0, 1]
        assert store.release_kv_cache(keep_pinned=False).released_objects == 1
        assert store.get("weights") == b"w" * 1000
        master.service.check()


def test_all_pages_removes_shared_members_too(leaseless_master, make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store(leaseless_master.address, 16 << 20)
    assert store.put_batch(["a", "b"], [b"x" * 1024] * 2, tagged("s1", keys=2)) == 0
    assert store.put("hard", b"h" * 1024, tagged("s1", with_hard_pin=True)) == 0
    assert store.attach_kv_session("s2", ["a"]) == [0]
    result = store.release_kv_session("s1", all_pages=True)
    assert (result.released_objects, result.kept_shared, result.kept_hard_pinned) == (2, 0, 1)
    assert result.freed_bytes == 2048
    assert store.batch_is_exist(["a", "b", "hard"]) == [0, 0, 1]
    # s2 lost its only member with it: nothing is left of it.
    with pytest.raises(MooncakeError, match="SESSION_NOT_FOUND"):
        store.get_kv_session("s2")
