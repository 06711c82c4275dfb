"""Releases through the master service facade: ``all_pages``, the counts by release kind, the
KV-cache sleep state, and the read hit/miss counts. Pure logic, a FakeClock, no sockets; each
test ends with ``service.check()``."""

from __future__ import annotations

import random
from typing import Any

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.service.release import RELEASE_KINDS
from mooncake_py.types import ObjectDataType, ReplicateConfig, SegmentInfo

MIB = 1 << 20
OK = ErrorCode.OK


def make_service(**overrides: Any) -> tuple[MasterService, FakeClock]:
    clock = FakeClock(1000.0)
    service = MasterService(MasterConfig(**overrides), clock=clock, rng=random.Random(0))
    info = SegmentInfo(id="s1", name="seg", base=0x1000, size=4 * MIB, te_endpoint="127.0.0.1:1")
    assert service.mount_segment("owner", info) == OK
    return service, clock


def start(
    service: MasterService, key: str, tenant: str = "", sessions: tuple[str, ...] = (), **cfg: Any
) -> None:
    if sessions:
        cfg["kv_sessions"] = [list(sessions)]
    assert service.put_start("w", tenant, key, 1000, ReplicateConfig(**cfg)).code == OK


def put(
    service: MasterService, key: str, tenant: str = "", sessions: tuple[str, ...] = (), **cfg: Any
) -> None:
    start(service, key, tenant, sessions, **cfg)
    assert service.put_end("w", tenant, key) == OK


def present(service: MasterService, keys: list[str], tenant: str = "") -> list[int]:
    return service.reads.batch_exist_key(tenant, keys)


def session_members(service: MasterService, session_id: str) -> int | None:
    code, found = service.sessions.get_kv_session("", session_id)
    return None if found is None else found.member_count


def kind_counts(service: MasterService, kind: str) -> tuple[int, int, int]:
    stats = service.stats()
    return (
        stats[f"{kind}_releases"],
        stats[f"{kind}_released_objects"],
        stats[f"{kind}_released_bytes"],
    )


# --- all_pages ---------------------------------------------------------------------------------


def _shared_session_fixture(service: MasterService) -> None:
    """s1 holds a, b (exclusive), shared (also in s2), hard (hard pinned) and writing (a
    write in flight); s2 holds shared and own."""
    put(service, "a", sessions=("s1",))
    put(service, "b", sessions=("s1",))
    put(service, "shared", sessions=("s1", "s2"))
    put(service, "own", sessions=("s2",))
    put(service, "hard", sessions=("s1",), with_hard_pin=True)
    start(service, "writing", sessions=("s1",))


def test_a_release_keeps_shared_members_by_default() -> None:
    service, _ = make_service()
    _shared_session_fixture(service)
    code, result = service.releases.release_kv_session("", "s1")
    assert code == OK
    assert (result.released_objects, result.kept_shared) == (2, 1)
    assert (result.kept_hard_pinned, result.kept_writing) == (1, 1)
    assert present(service, ["a", "b", "shared", "own", "hard"]) == [0, 0, 1, 1, 1]
    assert session_members(service, "s2") == 2
    service.check()


def test_all_pages_removes_shared_members_but_not_hard_pinned_or_writing_ones() -> None:
    service, _ = make_service()
    _shared_session_fixture(service)
    used = service.stats()["allocated_bytes"]
    code, result = service.releases.release_kv_session("", "s1", all_pages=True)
    assert code == OK
    assert (result.sessions, result.released_objects, result.kept_shared) == (1, 3, 0)
    assert (result.kept_hard_pinned, result.kept_writing) == (1, 1)
    assert result.freed_bytes == used - service.stats()["allocated_bytes"] > 0
    assert present(service, ["a", "b", "shared", "own", "hard"]) == [0, 0, 0, 1, 1]
    # The shared member left s2 with its removal; s2 keeps its own member.
    assert session_members(service, "s2") == 1
    assert session_members(service, "s1") is None
    # The write in flight still completes, outside any session.
    assert service.put_end("w", "", "writing") == OK
    assert present(service, ["writing"]) == [1]
    service.check()


def test_all_pages_through_the_sliced_call_across_many_slices() -> None:
    service, _ = make_service()
    keys = [f"k{i:03}" for i in range(150)]  # more than two pages of members
    for key in keys:
        put(service, key, sessions=("big", "other"))
    service.releases.slice_seconds = 0.0  # every page its own slice
    steps = service.releases.release_kv_session_sliced("", "big", all_pages=True)
    slices = 0
    try:
        while True:
            next(steps)
            slices += 1
    except StopIteration as done:
        code, result = done.value
    assert slices >= 2
    assert code == OK and (result.released_objects, result.kept_shared) == (150, 0)
    assert service.stats()["objects"] == 0
    assert session_members(service, "other") is None  # emptied, so it ended
    service.check()


# --- counts by kind ----------------------------------------------------------------------------


def test_every_kind_counts_its_calls_objects_and_bytes() -> None:
    service, clock = make_service()
    releases = service.releases
    assert {kind: kind_counts(service, kind) for kind in RELEASE_KINDS} == dict.fromkeys(
        RELEASE_KINDS, (0, 0, 0)
    )

    put(service, "s-a", sessions=("one",))
    put(service, "s-b", sessions=("one",))
    code, one = releases.release_kv_session("", "one")
    assert code == OK and kind_counts(service, "session") == (1, 2, one.freed_bytes)
    assert one.freed_bytes > 0
    # An unknown session is an OK answer: a call that released nothing.
    assert releases.release_kv_session("", "nobody")[0] == OK
    assert kind_counts(service, "session") == (2, 2, one.freed_bytes)
    # Refused calls do not count.
    assert releases.release_kv_session("", "nul\0id")[0] == ErrorCode.INVALID_PARAMS
    assert kind_counts(service, "session") == (2, 2, one.freed_bytes)

    put(service, "old", sessions=("old",))
    clock.advance(120)
    put(service, "fresh", sessions=("fresh",))
    code, stale = releases.release_stale_kv_sessions("", 60_000)
    assert code == OK and kind_counts(service, "stale") == (1, 1, stale.freed_bytes)
    assert releases.release_stale_kv_sessions("", -1)[0] == ErrorCode.INVALID_PARAMS
    assert kind_counts(service, "stale")[0] == 1

    assert releases.release_all_kv_sessions("")[0] == ErrorCode.INVALID_PARAMS  # no confirm
    assert kind_counts(service, "all") == (0, 0, 0)
    code, everything = releases.release_all_kv_sessions("", confirm=True)
    assert code == OK and kind_counts(service, "all") == (1, 1, everything.freed_bytes)

    put(service, "kv", data_type=ObjectDataType.KVCACHE)
    put(service, "weights", data_type=ObjectDataType.WEIGHT)
    code, cache = releases.release_kv_cache("")
    assert code == OK and kind_counts(service, "kv_cache") == (1, 1, cache.freed_bytes)
    assert present(service, ["kv", "weights"]) == [0, 1]

    # The kinds add up to the store-wide release counters.
    stats = service.stats()
    assert stats["released_objects"] == sum(kind_counts(service, k)[1] for k in RELEASE_KINDS)
    assert stats["released_bytes"] == sum(kind_counts(service, k)[2] for k in RELEASE_KINDS)
    service.check()


# --- KV-cache sleep state ----------------------------------------------------------------------


def test_sleep_state_follows_releases_that_remove_and_kv_commits() -> None:
    service, _ = make_service()
    assert service.kv_cache_state("") == "awake"
    # Nothing to remove: no release happened, the tenant stays awake.
    assert service.releases.release_kv_cache("")[1].released_objects == 0
    assert service.kv_cache_state("") == "awake"
    put(service, "pinned", with_hard_pin=True)
    assert service.releases.release_kv_cache("")[1].kept_hard_pinned == 1
    assert service.kv_cache_state("") == "awake"

    put(service, "kv", data_type=ObjectDataType.KVCACHE)
    assert service.releases.release_kv_cache("")[1].released_objects == 1
    assert service.kv_cache_state("") == "kv_cache_released"
    assert service.releases.kv_cache_released_tenants() == ["default"]
    # Writes that are not KV cache, or not committed, do not wake it.
    put(service, "weights", data_type=ObjectDataType.WEIGHT)
    start(service, "pending", data_type=ObjectDataType.KVCACHE)
    assert service.kv_cache_state("") == "kv_cache_released"
    assert service.put_revoke("w", "", "pending") == OK
    assert service.kv_cache_state("") == "kv_cache_released"
    # The first committed KV-cache write (UNKNOWN counts as KV cache) wakes it.
    put(service, "again", data_type=ObjectDataType.UNKNOWN)
    assert service.kv_cache_state("") == "awake"
    assert service.releases.kv_cache_released_tenants() == []
    service.check()


def test_sleep_state_is_per_tenant_and_batch_ends_and_upserts_wake_it() -> None:
    service, _ = make_service(enable_multi_tenants=True)
    for tenant in ("t1", "t2"):
        put(service, "kv", tenant=tenant)
    for tenant in ("t1", "t2"):
        assert service.releases.release_kv_cache(tenant)[1].released_objects == 1
    assert service.releases.kv_cache_released_tenants() == ["t1", "t2"]
    assert service.kv_cache_state("t3") == "awake"
    assert service.kv_cache_state("_bad") == "awake"

    start(service, "x", tenant="t1")
    start(service, "y", tenant="t1")
    assert service.batch_put_end("w", "t1", ["x", "y"]) == [OK, OK]
    assert (service.kv_cache_state("t1"), service.kv_cache_state("t2")) == (
        "awake",
        "kv_cache_released",
    )
    upsert = service.upsert_start("w", "t2", "u", 1000, ReplicateConfig())
    assert upsert.code == OK and service.kv_cache_state("t2") == "kv_cache_released"
    assert service.put_end("w", "t2", "u") == OK
    assert service.kv_cache_state("t2") == "awake"
    service.check()


def test_a_write_committed_after_a_release_slice_wakes_even_while_the_release_runs() -> None:
    service, _ = make_service()
    for i in range(3):
        put(service, f"kv{i}")
    service.releases.slice_seconds = 0.0  # one object per slice
    steps = service.releases.release_kv_cache_sliced("")
    next(steps)  # the first slice removed an object: released
    assert service.kv_cache_state("") == "kv_cache_released"
    put(service, "late")  # after the release's snapshot: it stays
    assert service.kv_cache_state("") == "awake"
    next(steps)  # a later slice removes again: released again
    assert service.kv_cache_state("") == "kv_cache_released"
    for _ in steps:
        pass
    assert present(service, ["kv0", "kv1", "kv2", "late"]) == [0, 0, 0, 1]
    service.check()


# --- read hits and misses ----------------------------------------------------------------------


def test_get_replica_list_counts_each_key_as_hit_or_miss() -> None:
    service, _ = make_service()
    put(service, "here")
    start(service, "unwritten")
    answers = service.reads.batch_get_replica_list("", ["here", "gone", "here", "unwritten"])
    assert [a.code for a in answers] == [
        OK,
        ErrorCode.OBJECT_NOT_FOUND,
        OK,
        ErrorCode.REPLICA_IS_NOT_READY,
    ]
    assert service.reads.get_replica_list("", "").code == ErrorCode.INVALID_PARAMS
    assert service.reads.get_replica_list("", "missing").code == ErrorCode.OBJECT_NOT_FOUND
    stats = service.stats()
    assert (stats["get_hits"], stats["get_misses"]) == (2, 2)
    service.check()
