"""Scenario tests of write ids, preempted writes and probes on the master service (FakeClock)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.types import ProbeLeaseMode, PutStartResult, ReplicateConfig, SegmentInfo

KIB = 1 << 10
OK = ErrorCode.OK
LAST_HIT = ProbeLeaseMode.LAST_HIT_ONLY


def make_service(**overrides: Any) -> tuple[MasterService, FakeClock]:
    clock = FakeClock(1000.0)
    return MasterService(MasterConfig(**overrides), clock=clock, rng=random.Random(0)), clock


def mount(service: MasterService, size: int = 64 * KIB, seg_id: str = "s1") -> None:
    info = SegmentInfo(
        id=seg_id, name=f"n-{seg_id}", base=0x1000, size=size, te_endpoint="127.0.0.1:1"
    )
    assert service.mount_segment("owner", info) == OK


def upsert(service: MasterService, client: str, key: str, size: int) -> PutStartResult:
    result = service.upsert_start(client, "", key, size, ReplicateConfig())
    assert result.code == OK, ErrorCode.name_of(result.code)
    return result


def put(service: MasterService, key: str, size: int = KIB) -> None:
    result = service.put_start("w", "", key, size, ReplicateConfig())
    assert result.code == OK
    assert service.put_end("w", "", key, result.write_id) == OK


def allocated(service: MasterService) -> int:
    return service.stats()["allocated_bytes"]


# --- write ids ---------------------------------------------------------------------------------


def test_every_start_gets_its_own_write_id() -> None:
    service, _ = make_service()
    mount(service)
    first = service.put_start("w", "", "a", KIB, ReplicateConfig())
    second = service.put_start("w", "", "b", KIB, ReplicateConfig())
    batch = service.batch_put_start("w", "", ["c", "d"], [KIB, KIB], ReplicateConfig())
    ids = [first.write_id, second.write_id, *(r.write_id for r in batch)]
    assert len(set(ids)) == 4 and all(i > 0 for i in ids)
    assert service.batch_put_end("w", "", ["a", "b"], ids[:2]) == [OK, OK]
    assert service.batch_put_revoke("w", "", ["c", "d"], ids[2:]) == [OK, OK]
    assert service.batch_put_end("w", "", ["a"], [1, 2]) == [ErrorCode.INVALID_PARAMS]
    service.check()


def test_an_end_from_an_earlier_write_of_the_same_client_completes_nothing() -> None:
    """UpsertStart(K), UpsertStart(K) again by the same client, then the first write's end:
    the second write's unwritten replica must stay unreadable."""
    service, _ = make_service()
    mount(service)
    first = upsert(service, "c", "k", KIB)
    second = upsert(service, "c", "k", KIB)
    assert first.replicas[0].offset != second.replicas[0].offset
    assert service.put_end("c", "", "k", first.write_id) == ErrorCode.INVALID_WRITE
    assert service.reads.get_replica_list("", "k", "r").code == ErrorCode.REPLICA_IS_NOT_READY
    assert service.stats()["preempted_buffers"] == 0  # the first writer stopped: memory back
    assert allocated(service) == KIB
    assert service.put_end("c", "", "k", second.write_id) == OK
    listed = service.reads.get_replica_list("", "k", "r")
    assert listed.code == OK and listed.replicas[0].offset == second.replicas[0].offset
    service.check()


def test_a_revoke_from_a_preempted_write_gives_its_memory_back_and_leaves_the_new_one() -> None:
    service, _ = make_service()
    mount(service)
    first = upsert(service, "a", "k", KIB)
    second = upsert(service, "b", "k", 2 * KIB)
    assert allocated(service) == 3 * KIB
    assert service.put_revoke("a", "", "k", first.write_id) == ErrorCode.INVALID_WRITE
    assert allocated(service) == 2 * KIB
    # Another client cannot stop a write it does not own.
    assert service.put_revoke("a", "", "k", second.write_id) == ErrorCode.ILLEGAL_CLIENT
    assert service.put_end("b", "", "k", second.write_id) == OK
    assert service.reads.get_replica_list("", "k", "r").size == 2 * KIB
    service.check()


def test_racing_upserts_on_a_small_segment_do_not_fill_it_with_preempted_buffers() -> None:
    service, _ = make_service()
    mount(service, size=16 * KIB)
    for _ in range(100):  # two writers leapfrogging each other on one 2 KiB key
        first = upsert(service, "a", "k", 2 * KIB)
        second = upsert(service, "b", "k", 2 * KIB)
        assert service.put_end("a", "", "k", first.write_id) == ErrorCode.INVALID_WRITE
        assert service.put_end("b", "", "k", second.write_id) == OK
    assert allocated(service) == 2 * KIB
    assert service.stats()["preempted_buffers"] == 0
    put(service, "other", 14 * KIB)  # everything else still fits
    service.check()


def test_an_expired_writer_gives_its_preempted_buffers_back() -> None:
    service, clock = make_service(client_ttl=5)
    mount(service)
    assert service.ping("a").code == OK
    upsert(service, "a", "k", KIB)
    upsert(service, "b", "k", KIB)
    assert service.stats()["preempted_buffers"] == 1
    clock.advance(6)
    assert service.ping("owner").code == OK
    assert "a" in service.reap_expired_clients(clock())
    assert service.stats()["preempted_buffers"] == 0
    assert allocated(service) == KIB
    service.check()


def test_a_preempted_buffer_nobody_stops_goes_back_at_the_release_timeout() -> None:
    service, clock = make_service(put_start_release_timeout_sec=60)
    mount(service)
    upsert(service, "a", "k", KIB)
    upsert(service, "b", "k", KIB)
    assert service.sweep_expired_puts(clock() + 59) == 0
    assert service.sweep_expired_puts(clock() + 60) == 2  # the preempted one and b's own
    assert allocated(service) == 0
    service.check()


# --- probes ------------------------------------------------------------------------------------


def test_a_probe_does_not_keep_an_object_from_eviction() -> None:
    service, _ = make_service()
    mount(service, size=4 * KIB)
    for key in "abcd":
        put(service, key)
    assert service.reads.batch_probe_key("", list("abcd")) == [1, 1, 1, 1]
    put(service, "e")  # the oldest goes although it was just probed
    assert service.reads.probe_key("", "a") == 0
    service.check()


def test_an_existence_check_is_evicted_only_after_unheld_objects() -> None:
    service, _ = make_service()
    mount(service, size=4 * KIB)
    for key in "abcd":
        put(service, key)
    assert service.reads.exist_key("", "a", "c") == 1
    put(service, "e")
    assert [service.reads.probe_key("", k) for k in "abcde"] == [1, 0, 1, 1, 1]
    # With every other object held, the checked one is taken rather than fail the write.
    for key in "cde":
        assert service.reads.exist_key("", key, "c") == 1
    put(service, "f")
    assert sum(service.reads.probe_key("", k) for k in "acde") == 3
    service.check()


def test_last_hit_only_selects_and_holds_the_last_complete_candidate() -> None:
    service, _ = make_service()
    mount(service)
    for key in ("a", "b", "c"):
        put(service, key)
    probe = service.reads.batch_probe_key
    assert probe("", ["a", "b", "c", "missing"], "c1", LAST_HIT, 2) == [1, 1, 0, 0]
    assert probe("", ["a", "missing", "b", "c"], "c1", LAST_HIT, 2) == [0, 0, 1, 1]
    assert probe("", ["a", "b", "b", "c"], "c1", LAST_HIT, 2) == [0, 0, 1, 1]
    assert probe("", ["a", "b", "c"], "c1") == [1, 1, 1]
    assert probe("", [], "c1", LAST_HIT, 0) == []
    assert probe("", ["a", "b"], "c1", LAST_HIT, 0) == [ErrorCode.INVALID_PARAMS] * 2
    assert probe("", ["a", "b", "c"], "c1", LAST_HIT, 2) == [ErrorCode.INVALID_PARAMS] * 3
    assert probe("", ["a"], "c1", 7, 1) == [ErrorCode.INVALID_PARAMS]
    assert probe("", ["x", "y"], "c1", LAST_HIT, 1) == [0, 0]
    # Only the selected keys are held (by c1's existence holds): d, never selected, is not.
    put(service, "d")
    assert probe("", ["d", "a", "b", "c"], "c1", LAST_HIT, 2) == [0, 0, 1, 1]
    assert service.remove("", "d") == OK
    assert service.remove("", "c") == ErrorCode.OBJECT_HAS_LEASE
    listed = service.reads.get_replica_list("", "c", "c1")  # c1's read takes its hold over
    assert service.reads.end_reads("c1", [listed.read_id]) == [OK]
    assert service.remove("", "c") == OK
    service.check()


@pytest.mark.parametrize("size", [1, 3])
def test_a_batch_beyond_the_limit_is_refused_whole(size: int) -> None:
    service, _ = make_service(max_batch_keys=2)
    mount(service)
    keys = ["k"] * (2 + size)
    assert service.reads.batch_probe_key("", keys) == [ErrorCode.INVALID_PARAMS] * len(keys)
    assert service.reads.end_reads("c", [1] * len(keys)) == [ErrorCode.INVALID_PARAMS] * len(keys)


# --- regressions found by the shadow-model stress test -------------------------------------------


def test_an_upsert_never_evicts_its_own_group_to_make_room() -> None:
    service, _ = make_service()
    mount(service, size=4 * KIB)
    for key, group in (("a", "g"), ("b", "g"), ("c", "")):
        config = ReplicateConfig(group_ids=[group] if group else None)
        result = service.put_start("w", "", key, KIB, config)
        assert service.put_end("w", "", key, result.write_id) == OK
    grown = upsert(service, "u", "a", 2 * KIB)  # b's eviction would take a along: c goes
    assert [service.reads.probe_key("", k) for k in "abc"] == [0, 1, 0]  # a is being written
    assert service.put_end("u", "", "a", grown.write_id) == OK
    assert [service.reads.probe_key("", k) for k in "abc"] == [1, 1, 0]
    service.check()


def test_a_late_read_of_a_retired_replica_whose_segment_goes_is_lease_expired() -> None:
    service, clock = make_service(default_kv_lease_ttl=1_000)
    mount(service)
    put(service, "k")
    late = service.reads.get_replica_list("", "k", "late")
    clock.advance(0.5)
    other = service.reads.get_replica_list("", "k", "other")  # still copying when late expires
    assert service.remove("", "k", force=True) == OK
    clock.advance(0.6)
    service.sweep_expired_puts(clock())  # late's lease expires; other's keeps the bytes
    assert service.unmount_segment("owner", "s1") == OK
    assert service.reads.end_reads("late", [late.read_id]) == [ErrorCode.LEASE_EXPIRED]
    assert service.reads.end_reads("other", [other.read_id]) == [OK]
    service.check()
