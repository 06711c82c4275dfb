"""Scenario tests of the master service facade: pure logic, no sockets, time on a FakeClock.

Each test builds a :class:`MasterService` with a seeded RNG, mounts fake segments, drives it and
ends with ``service.check()``.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.context import DEFAULT_TENANT, TenantResolver
from mooncake_py.master.service.facade import MasterService
from mooncake_py.types import (
    ClientStatus,
    PutStartResult,
    ReplicaStatus,
    ReplicateConfig,
    SegmentInfo,
    SoftPinAction,
)

KIB = 1 << 10
MIB = 1 << 20
ALIGN = 64  # the allocator's default alignment: allocations are rounded up to it
T0 = 1000.0  # FakeClock's initial reading

OK = ErrorCode.OK


# --- helpers -----------------------------------------------------------------------------------


def rounded(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


def make_service(**overrides: Any) -> tuple[MasterService, FakeClock]:
    clock = FakeClock(T0)
    service = MasterService(MasterConfig(**overrides), clock=clock, rng=random.Random(0))
    return service, clock


def seg(
    seg_id: str, name: str | None = None, size: int = MIB, host_id: str = "host-a"
) -> SegmentInfo:
    return SegmentInfo(
        id=seg_id,
        name=name or f"name-{seg_id}",
        base=0x1000,
        size=size,
        te_endpoint="127.0.0.1:1",
        host_id=host_id,
    )


def mount(service: MasterService, client: str, seg_id: str, **kwargs: Any) -> SegmentInfo:
    info = seg(seg_id, **kwargs)
    assert service.mount_segment(client, info) == OK
    return info


def start(
    service: MasterService, client: str, key: str, size: int, tenant: str = "", **cfg: Any
) -> PutStartResult:
    result = service.put_start(client, tenant, key, size, ReplicateConfig(**cfg))
    assert result.code == OK, ErrorCode.name_of(result.code)
    return result


def put(
    service: MasterService, client: str, key: str, size: int, tenant: str = "", **cfg: Any
) -> PutStartResult:
    result = start(service, client, key, size, tenant, **cfg)
    assert service.put_end(client, tenant, key) == OK
    return result


def allocated(service: MasterService) -> int:
    return service.stats()["allocated_bytes"]


def segments_of_key(service: MasterService, key: str, tenant: str = "") -> set[str]:
    meta = service.object_of(tenant, key)
    assert meta is not None
    return {r.segment_id for r in meta.replicas}


# --- write path --------------------------------------------------------------------------------


def test_put_start_is_invisible_until_put_end() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1")
    result = service.put_start("w", "", "k", 1000, ReplicateConfig())
    assert result.code == OK
    assert len(result.replicas) == 1
    replica = result.replicas[0]
    assert replica.status == ReplicaStatus.PROCESSING
    assert replica.segment_id == "s1"
    assert replica.segment_name == "name-s1"
    assert replica.size == 1000
    assert replica.te_endpoint == "127.0.0.1:1"
    assert replica.host_id == "host-a"
    assert allocated(service) == rounded(1000)

    assert service.reads.get_replica_list("", "k").code == ErrorCode.REPLICA_IS_NOT_READY
    assert service.reads.batch_get_replica_list("", ["k"])[0].code == ErrorCode.REPLICA_IS_NOT_READY
    assert service.reads.exist_key("", "k") == 0
    assert service.reads.batch_exist_key("", ["k"]) == [0]
    service.check()

    assert service.put_end("w", "", "k") == OK
    listed = service.reads.get_replica_list("", "k")
    assert listed.code == OK
    assert listed.lease_ttl_ms == service.config.default_kv_lease_ttl
    assert listed.size == 1000
    assert len(listed.replicas) == 1
    assert listed.replicas[0].status == ReplicaStatus.COMPLETE
    assert listed.replicas[0].offset == replica.offset
    assert listed.replicas[0].id == replica.id
    assert service.reads.exist_key("", "k") == 1
    assert service.stats()["objects"] == 1
    service.check()


def test_lease_ttl_reported_is_the_configured_one() -> None:
    service, _ = make_service(default_kv_lease_ttl=2500)
    mount(service, "owner", "s1")
    put(service, "w", "k", 10)
    assert service.reads.get_replica_list("", "k").lease_ttl_ms == 2500
    service.check()


def test_put_start_on_readable_key_already_exists() -> None:
    service, clock = make_service()
    mount(service, "owner", "s1")
    put(service, "w", "k", 100)
    before = allocated(service)
    assert service.put_start("w", "", "k", 100, ReplicateConfig()).code == (
        ErrorCode.OBJECT_ALREADY_EXISTS
    )
    assert service.put_start("other", "", "k", 50, ReplicateConfig()).code == (
        ErrorCode.OBJECT_ALREADY_EXISTS
    )
    # Age never lets a new write replace a readable object.
    clock.advance(10_000)
    assert service.put_start("other", "", "k", 50, ReplicateConfig()).code == (
        ErrorCode.OBJECT_ALREADY_EXISTS
    )
    assert allocated(service) == before
    assert service.reads.get_replica_list("", "k").size == 100
    service.check()


def test_put_start_on_young_inflight_key_already_exists() -> None:
    service, clock = make_service()
    mount(service, "owner", "s1")
    start(service, "w1", "k", 100)
    assert service.put_start("w2", "", "k", 100, ReplicateConfig()).code == (
        ErrorCode.OBJECT_ALREADY_EXISTS
    )
    clock.advance(service.config.put_start_discard_timeout_sec - 0.1)
    assert service.put_start("w2", "", "k", 100, ReplicateConfig()).code == (
        ErrorCode.OBJECT_ALREADY_EXISTS
    )
    # Also for the original writer: a retry does not replace its own young write.
    assert service.put_start("w1", "", "k", 100, ReplicateConfig()).code == (
        ErrorCode.OBJECT_ALREADY_EXISTS
    )
    assert allocated(service) == rounded(100)
    meta = service.object_of("", "k")
    assert meta is not None and meta.client_id == "w1"
    assert service.put_end("w1", "", "k") == OK
    service.check()


def test_stale_inflight_write_is_preempted_and_its_buffer_released_later() -> None:
    service, clock = make_service()
    mount(service, "owner", "s1")
    old = start(service, "w1", "k", 1000)
    assert allocated(service) == 1024

    clock.advance(service.config.put_start_discard_timeout_sec + 1)
    new = start(service, "w2", "k", 2000)
    assert new.replicas[0].status == ReplicaStatus.PROCESSING
    # The old buffer stays allocated, so the new one cannot overlap it.
    assert new.replicas[0].offset != old.replicas[0].offset
    assert allocated(service) == 1024 + rounded(2000)
    assert service.stats()["preempted_buffers"] == 1
    assert service.stats()["objects"] == 1
    meta = service.object_of("", "k")
    assert meta is not None and meta.client_id == "w2" and meta.size == 2000
    service.check()

    # The preempted writer has lost the key (without its write id it cannot even say it
    # stopped, so its buffer waits for the release timeout).
    assert service.put_end("w1", "", "k") == ErrorCode.ILLEGAL_CLIENT
    assert service.put_revoke("w1", "", "k") == ErrorCode.ILLEGAL_CLIENT
    assert old.write_id != new.write_id
    assert service.reads.get_replica_list("", "k").code == ErrorCode.REPLICA_IS_NOT_READY

    release_at = T0 + service.config.put_start_release_timeout_sec
    assert service.sweep_expired_puts(release_at - 0.01) == 0
    assert allocated(service) == 1024 + rounded(2000)
    service.check()
    # At put_start_time + release timeout the old buffer is freed; the new write is untouched.
    assert service.sweep_expired_puts(release_at) == 1
    assert allocated(service) == rounded(2000)
    assert service.stats()["preempted_buffers"] == 0
    service.check()

    assert service.put_end("w2", "", "k", new.write_id) == OK
    listed = service.reads.get_replica_list("", "k")
    assert listed.code == OK and listed.size == 2000
    assert listed.replicas[0].offset == new.replicas[0].offset
    service.check()


def test_stale_write_can_be_preempted_by_its_own_client() -> None:
    service, clock = make_service()
    mount(service, "owner", "s1")
    first = start(service, "w", "k", 100)
    clock.advance(31)
    second = start(service, "w", "k", 100)
    assert service.stats()["preempted_buffers"] == 1
    # The first write's end names its write: it completes nothing of the second one, and its
    # buffer comes back at once since its writer has evidently stopped.
    assert service.put_end("w", "", "k", first.write_id) == ErrorCode.INVALID_WRITE
    assert service.stats()["preempted_buffers"] == 0
    assert service.reads.exist_key("", "k") == 0
    assert service.put_end("w", "", "k", second.write_id) == OK
    assert service.reads.exist_key("", "k") == 1
    assert allocated(service) == rounded(100)
    service.check()


def test_preempt_then_no_space_loses_the_stale_write() -> None:
    # Upstream erases the stale metadata before allocating, so a failed allocation leaves nothing.
    service, clock = make_service()
    mount(service, "owner", "s1", size=4 * KIB)
    start(service, "w1", "k", 3 * KIB)
    clock.advance(31)
    assert service.put_start("w2", "", "k", 2 * KIB, ReplicateConfig()).code == (
        ErrorCode.NO_AVAILABLE_HANDLE
    )
    assert service.object_of("", "k") is None
    assert allocated(service) == 3 * KIB  # the discarded buffer waits for its release time
    service.check()
    assert service.sweep_expired_puts(T0 + 600) == 1
    assert allocated(service) == 0
    service.check()


def test_inflight_write_exactly_at_discard_timeout_still_exists() -> None:
    service, clock = make_service(put_start_discard_timeout_sec=30.0)
    mount(service, "owner", "s1")
    start(service, "w1", "k", 100)
    clock.advance(30.0)  # put_start_time + 30 == now
    code = service.put_start("w2", "", "k", 100, ReplicateConfig()).code
    service.check()
    assert code == ErrorCode.OBJECT_ALREADY_EXISTS


def test_put_end_errors_and_retry() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1")
    assert service.put_end("w", "", "missing") == ErrorCode.OBJECT_NOT_FOUND
    start(service, "w", "k", 100)
    assert service.put_end("intruder", "", "k") == ErrorCode.ILLEGAL_CLIENT
    assert service.reads.get_replica_list("", "k").code == ErrorCode.REPLICA_IS_NOT_READY
    assert service.put_end("w", "", "k") == OK
    # A retry after success is harmless; another client is still refused.
    assert service.put_end("w", "", "k") == OK
    assert service.batch_put_end("w", "", ["k", "k"]) == [OK, OK]
    assert service.put_end("intruder", "", "k") == ErrorCode.ILLEGAL_CLIENT
    assert service.put_end("w", "", "") == ErrorCode.INVALID_PARAMS
    assert service.reads.exist_key("", "k") == 1
    service.check()


def test_put_revoke_frees_memory_and_object_disappears() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1", name="n1")
    mount(service, "owner", "s2", name="n2")
    start(service, "w", "k", 1000, replica_num=2)
    assert allocated(service) == 2 * 1024
    assert service.put_revoke("intruder", "", "k") == ErrorCode.ILLEGAL_CLIENT
    assert service.put_revoke("w", "", "k") == OK
    assert allocated(service) == 0
    assert service.object_of("", "k") is None
    assert service.reads.get_replica_list("", "k").code == ErrorCode.OBJECT_NOT_FOUND
    assert service.put_end("w", "", "k") == ErrorCode.OBJECT_NOT_FOUND
    assert service.put_revoke("w", "", "k") == ErrorCode.OBJECT_NOT_FOUND
    assert service.put_revoke("w", "", "") == ErrorCode.INVALID_PARAMS
    service.check()
    # The key is free again at once: revoke is not a stale write that needs the discard timeout.
    put(service, "other", "k", 10)
    assert service.reads.get_replica_list("", "k").size == 10
    service.check()


def test_put_revoke_of_a_complete_object_is_invalid_write() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1")
    put(service, "w", "k", 100)
    assert service.put_revoke("w", "", "k") == ErrorCode.INVALID_WRITE
    assert service.reads.exist_key("", "k") == 1
    assert allocated(service) == rounded(100)
    service.check()


def test_sweep_frees_writes_never_ended_after_release_timeout() -> None:
    service, clock = make_service()
    mount(service, "owner", "s1", name="n1")
    mount(service, "owner", "s2", name="n2")
    start(service, "w", "stuck", 1000, replica_num=2)
    put(service, "w", "done", 100)
    clock.advance(300)
    start(service, "w", "young", 500)
    release = service.config.put_start_release_timeout_sec
    assert service.sweep_expired_puts(T0 + release - 0.001) == 0
    assert service.object_of("", "stuck") is not None
    service.check()

    assert service.sweep_expired_puts(T0 + release) == 2  # both replicas of "stuck"
    assert service.object_of("", "stuck") is None
    assert service.reads.get_replica_list("", "stuck").code == ErrorCode.OBJECT_NOT_FOUND
    assert service.put_end("w", "", "stuck") == ErrorCode.OBJECT_NOT_FOUND
    assert service.reads.get_replica_list("", "young").code == ErrorCode.REPLICA_IS_NOT_READY
    assert service.reads.exist_key("", "done") == 1
    assert allocated(service) == rounded(100) + rounded(500)
    service.check()

    # The sweep is repeatable and frees "young" at its own deadline.
    assert service.sweep_expired_puts(T0 + release) == 0
    assert service.sweep_expired_puts(T0 + 300 + release) == 1
    assert service.object_of("", "young") is None
    assert allocated(service) == rounded(100)
    # The swept key can be written again.
    start(service, "w", "stuck", 10)
    service.check()


# --- leases and remove -------------------------------------------------------------------------


@pytest.mark.parametrize("reader", ["get", "batch_get"])
def test_a_read_lease_blocks_remove_until_its_reader_ends_it(reader: str) -> None:
    service, clock = make_service(default_kv_lease_ttl=10_000)
    mount(service, "owner", "s1")
    put(service, "w", "k", 100)
    if reader == "get":
        listed = service.reads.get_replica_list("", "k", "r")
    else:
        listed = service.reads.batch_get_replica_list("", ["k"], "r")[0]
    assert listed.code == OK and listed.read_id > 0 and listed.lease_ttl_ms == 10_000
    assert service.remove("", "k") == ErrorCode.OBJECT_HAS_LEASE
    assert service.batch_remove("", ["k"]) == [ErrorCode.OBJECT_HAS_LEASE]
    clock.advance(1)
    assert service.reads.end_reads("r", [listed.read_id]) == [OK]
    assert service.remove("", "k") == OK  # at once, not at the TTL
    assert allocated(service) == 0
    service.check()


def test_a_read_lease_nobody_ends_lasts_its_ttl() -> None:
    service, clock = make_service(default_kv_lease_ttl=10_000)
    mount(service, "owner", "s1")
    put(service, "w", "k", 100)
    listed = service.reads.get_replica_list("", "k", "r")
    clock.advance(9.9)
    assert service.remove("", "k") == ErrorCode.OBJECT_HAS_LEASE
    clock.advance(0.1)
    assert service.remove("", "k") == OK
    # The reader comes back late: the object is gone but its range was never handed out again.
    assert service.reads.end_reads("r", [listed.read_id]) == [OK]
    service.check()


@pytest.mark.parametrize("checker", ["exist", "batch_exist"])
def test_an_existence_hold_blocks_remove_until_the_same_client_reads(checker: str) -> None:
    service, clock = make_service(default_kv_lease_ttl=10_000)
    mount(service, "owner", "s1")
    put(service, "w", "k", 100)
    if checker == "exist":
        assert service.reads.exist_key("", "k", "c") == 1
    else:
        assert service.reads.batch_exist_key("", ["k"], "c") == [1]
    assert service.remove("", "k") == ErrorCode.OBJECT_HAS_LEASE
    # Another client's read does not take this client's hold over.
    other = service.reads.get_replica_list("", "k", "someone-else")
    assert service.reads.end_reads("someone-else", [other.read_id]) == [OK]
    assert service.remove("", "k") == ErrorCode.OBJECT_HAS_LEASE
    mine = service.reads.get_replica_list("", "k", "c")
    assert service.reads.end_reads("c", [mine.read_id]) == [OK]
    assert service.remove("", "k") == OK
    service.check()


def test_an_existence_hold_lapses_at_the_ttl() -> None:
    service, clock = make_service(default_kv_lease_ttl=10_000)
    mount(service, "owner", "s1")
    put(service, "w", "k", 100)
    assert service.reads.exist_key("", "k", "c") == 1
    clock.advance(9.9)
    assert service.reads.exist_key("", "k", "c") == 1  # renews to now + 10 s
    clock.advance(9.9)
    assert service.remove("", "k") == ErrorCode.OBJECT_HAS_LEASE
    clock.advance(0.2)
    assert service.remove("", "k") == OK
    service.check()


def test_probes_lease_nothing() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1")
    put(service, "w", "k", 100)
    start(service, "w", "writing", 100)
    assert service.reads.probe_key("", "k") == 1
    assert service.reads.batch_probe_key("", ["k", "missing", "writing"]) == [1, 0, 0]
    assert service.reads.probe_key("", "") == ErrorCode.INVALID_PARAMS
    assert service.stats()["existence_holds"] == service.stats()["read_holds"] == 0
    assert service.remove("", "k") == OK
    service.check()


def test_force_remove_under_a_reader_keeps_the_bytes_until_the_read_ends() -> None:
    service, clock = make_service(default_kv_lease_ttl=10_000)
    mount(service, "owner", "s1", name="n1")
    mount(service, "owner", "s2", name="n2")
    put(service, "w", "k", 100, replica_num=2)
    listed = service.reads.get_replica_list("", "k", "r")
    assert service.remove("", "k", force=True) == OK
    assert service.reads.get_replica_list("", "k", "r2").code == ErrorCode.OBJECT_NOT_FOUND
    assert service.stats()["objects"] == 0
    # The bytes the reader is copying are not handed out again while it reads.
    assert allocated(service) == 2 * rounded(100)
    assert service.stats()["retired_buffers"] == 2
    service.check()
    put(service, "w", "k", 100)  # the key itself is free at once
    assert service.remove("", "k") == OK  # unread: freed at once
    assert allocated(service) == 2 * rounded(100)
    assert service.reads.end_reads("r", [listed.read_id]) == [OK]
    assert allocated(service) == 0
    assert service.stats()["retired_buffers"] == 0
    service.check()


def test_retired_bytes_come_back_at_the_ttl_when_the_reader_never_does() -> None:
    service, clock = make_service(default_kv_lease_ttl=10_000)
    mount(service, "owner", "s1")
    put(service, "w", "k", 100)
    listed = service.reads.get_replica_list("", "k", "r")
    assert service.remove("", "k", force=True) == OK
    service.sweep_expired_puts(T0 + 9.9)
    assert allocated(service) == rounded(100)
    service.sweep_expired_puts(T0 + 10)
    assert allocated(service) == 0
    service.check()
    # Nothing reused the range yet: the late reader's bytes are still the ones it read.
    assert service.reads.end_reads("r", [listed.read_id]) == [OK]
    assert service.reads.end_reads("r", [listed.read_id]) == [ErrorCode.LEASE_EXPIRED]
    service.check()


def test_a_late_read_whose_range_was_reused_reports_lease_expired() -> None:
    service, clock = make_service(default_kv_lease_ttl=1_000)
    mount(service, "owner", "s1", size=4 * KIB)
    put(service, "w", "k", 4 * KIB)
    slow = service.reads.get_replica_list("", "k", "slow")
    assert service.remove("", "k", force=True) == OK
    clock.advance(1)
    put(service, "w", "k2", 4 * KIB)  # only fits in the late reader's range
    assert service.reads.end_reads("slow", [slow.read_id]) == [ErrorCode.LEASE_EXPIRED]
    # Another client cannot end this client's reads.
    fresh = service.reads.get_replica_list("", "k2", "r")
    assert service.reads.end_reads("intruder", [fresh.read_id]) == [ErrorCode.LEASE_EXPIRED]
    assert service.remove("", "k2") == ErrorCode.OBJECT_HAS_LEASE
    assert service.reads.end_reads("r", [fresh.read_id]) == [OK]
    service.check()


def test_a_late_read_of_a_rewritten_object_reports_lease_expired() -> None:
    service, clock = make_service(default_kv_lease_ttl=1_000)
    mount(service, "owner", "s1")
    put(service, "w", "k", 100)
    slow = service.reads.get_replica_list("", "k", "slow")
    clock.advance(2)
    rewrite = service.upsert_start("w", "", "k", 100, ReplicateConfig())
    assert rewrite.code == OK and rewrite.replicas[0].offset == slow.replicas[0].offset
    assert service.reads.end_reads("slow", [slow.read_id]) == [ErrorCode.LEASE_EXPIRED]
    assert service.put_end("w", "", "k", rewrite.write_id) == OK
    service.check()


def test_reads_of_one_object_by_one_client_share_a_hold() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1")
    put(service, "w", "k", 100)
    ids = [service.reads.get_replica_list("", "k", "r").read_id for _ in range(3)]
    assert len(set(ids)) == 1
    assert service.stats()["read_holds"] == 1 and service.stats()["reads_in_flight"] == 3
    assert service.reads.end_reads("r", ids[:2]) == [OK, OK]
    assert service.remove("", "k") == ErrorCode.OBJECT_HAS_LEASE  # one read still copies
    assert service.reads.end_reads("r", ids[2:]) == [OK]
    assert service.stats()["read_holds"] == 0
    assert service.remove("", "k") == OK
    service.check()


def test_an_expired_client_gives_its_reads_back() -> None:
    service, clock = make_service(client_ttl=5)
    mount(service, "owner", "s1")
    put(service, "w", "k", 100)
    assert service.ping("owner").code == OK
    assert service.ping("reader").code == OK
    listed = service.reads.get_replica_list("", "k", "reader")
    assert service.remove("", "k", force=True) == OK
    assert allocated(service) == rounded(100)
    clock.advance(3)
    assert service.ping("owner").code == OK
    clock.advance(3)
    assert service.reap_expired_clients(clock()) == ["reader"]
    assert allocated(service) == 0
    assert service.reads.end_reads("reader", [listed.read_id]) == [ErrorCode.LEASE_EXPIRED]
    service.check()


def test_remove_of_inflight_write_is_not_ready_even_with_force() -> None:
    service, clock = make_service()
    mount(service, "owner", "s1")
    start(service, "w", "k", 100)
    assert service.remove("", "k") == ErrorCode.REPLICA_IS_NOT_READY
    assert service.remove("", "k", force=True) == ErrorCode.REPLICA_IS_NOT_READY
    clock.advance(100)  # even a stale write
    assert service.batch_remove("", ["k"], force=True) == [ErrorCode.REPLICA_IS_NOT_READY]
    assert allocated(service) == rounded(100)
    assert service.put_end("w", "", "k") == OK
    service.check()


def test_remove_missing_and_invalid_keys() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1")
    assert service.remove("", "missing") == ErrorCode.OBJECT_NOT_FOUND
    assert service.remove("", "missing", force=True) == ErrorCode.OBJECT_NOT_FOUND
    assert service.remove("", "") == ErrorCode.INVALID_PARAMS
    service.check()


def test_put_end_grants_no_lease() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1")
    put(service, "w", "k", 100)
    assert service.is_leased("", "k") is False
    assert service.remove("", "k") == OK
    assert allocated(service) == 0
    service.check()


def test_a_zero_lease_ttl_is_refused() -> None:
    with pytest.raises(ValueError, match="default_kv_lease_ttl"):
        make_service(default_kv_lease_ttl=0)


def test_batch_calls_answer_per_key_in_input_order() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1", size=64 * KIB)
    put(service, "w", "existing", 10)
    keys = ["a", "", "b", "existing", "a", "huge", "c"]
    sizes = [100, 100, 200, 10, 100, 10 * MIB, 0]
    results = service.batch_put_start("w", "", keys, sizes, ReplicateConfig())
    assert [r.code for r in results] == [
        OK,
        ErrorCode.INVALID_PARAMS,
        OK,
        ErrorCode.OBJECT_ALREADY_EXISTS,
        ErrorCode.OBJECT_ALREADY_EXISTS,  # the batch's own earlier "a" is a young write
        ErrorCode.NO_AVAILABLE_HANDLE,
        ErrorCode.INVALID_PARAMS,
    ]
    assert results[0].replicas[0].size == 100 and results[2].replicas[0].size == 200
    assert results[1].replicas == ()
    service.check()

    ends = service.batch_put_end("w", "", ["b", "missing", "a", "", "existing"])
    assert ends == [OK, ErrorCode.OBJECT_NOT_FOUND, OK, ErrorCode.INVALID_PARAMS, OK]
    assert service.batch_put_end("x", "", ["a"]) == [ErrorCode.ILLEGAL_CLIENT]

    listed = service.reads.batch_get_replica_list("", ["b", "missing", "a", "", "existing"])
    assert [r.code for r in listed] == [
        OK,
        ErrorCode.OBJECT_NOT_FOUND,
        OK,
        ErrorCode.INVALID_PARAMS,
        OK,
    ]
    assert [r.size for r in listed] == [200, 0, 100, 0, 10]
    assert service.reads.batch_exist_key("", ["missing", "a", "", "b"]) == [
        0,
        1,
        int(ErrorCode.INVALID_PARAMS),
        1,
    ]

    start(service, "w", "pending", 10)
    revokes = service.batch_put_revoke("w", "", ["pending", "a", "missing", ""])
    assert revokes == [
        OK,
        ErrorCode.INVALID_WRITE,
        ErrorCode.OBJECT_NOT_FOUND,
        ErrorCode.INVALID_PARAMS,
    ]
    start(service, "w", "pending", 10)
    removed = service.batch_remove("", ["pending", "a", "missing", "", "b"], force=True)
    assert removed == [
        ErrorCode.REPLICA_IS_NOT_READY,
        OK,
        ErrorCode.OBJECT_NOT_FOUND,
        ErrorCode.INVALID_PARAMS,
        OK,
    ]
    assert service.batch_put_revoke("w", "", ["pending"]) == [OK]
    assert service.stats()["objects"] == 1
    service.check()
    # "a" and "b" were leased by the reads above; their memory returns when the lease ends.
    service.sweep_expired_puts(T0 + service.config.default_kv_lease_ttl / 1000)
    assert allocated(service) == rounded(10)
    service.check()


def test_batch_put_start_length_mismatch_fails_every_key() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1")
    results = service.batch_put_start("w", "", ["a", "b", "c"], [10, 20], ReplicateConfig())
    assert [r.code for r in results] == [ErrorCode.INVALID_PARAMS] * 3
    results = service.batch_put_start("w", "", ["a"], [10, 20], ReplicateConfig())
    assert [r.code for r in results] == [ErrorCode.INVALID_PARAMS]
    assert service.stats()["objects"] == 0
    assert allocated(service) == 0
    assert service.batch_put_start("w", "", [], [], ReplicateConfig()) == []
    service.check()


def test_batches_larger_than_max_batch_keys_fail_every_key() -> None:
    service, _ = make_service(max_batch_keys=4)
    mount(service, "owner", "s1")
    four = ["a", "b", "c", "d"]
    five = [*four, "e"]
    bad = [ErrorCode.INVALID_PARAMS] * 5
    assert [r.code for r in service.batch_put_start("w", "", five, [1] * 5, ReplicateConfig())] == (
        bad
    )
    assert service.stats()["objects"] == 0
    # Exactly the limit is accepted.
    assert [r.code for r in service.batch_put_start("w", "", four, [1] * 4, ReplicateConfig())] == (
        [OK] * 4
    )
    assert service.batch_put_end("w", "", five) == bad
    assert service.batch_put_revoke("w", "", five) == bad
    assert service.batch_put_end("w", "", four) == [OK] * 4
    assert [r.code for r in service.reads.batch_get_replica_list("", five)] == bad
    assert service.reads.batch_exist_key("", five) == [int(ErrorCode.INVALID_PARAMS)] * 5
    assert service.batch_remove("", five, force=True) == bad
    assert service.reads.batch_exist_key("", four) == [1] * 4
    assert service.batch_remove("", four, force=True) == [OK] * 4
    service.check()


def test_ten_thousand_key_batch_exist_key() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1")
    stored = {f"key-{i}" for i in range(0, 10_000, 97)}
    for key in sorted(stored):
        put(service, "w", key, 64)
    keys = [f"key-{i}" for i in range(10_000)]
    results = service.reads.batch_exist_key("", keys)
    assert len(results) == 10_000
    assert results == [1 if k in stored else 0 for k in keys]
    listed = service.reads.batch_get_replica_list("", keys)
    assert [r.code == OK for r in listed] == [k in stored for k in keys]
    service.check()


# --- bad input ---------------------------------------------------------------------------------


def test_empty_key_is_invalid_everywhere() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1")
    assert service.put_start("w", "", "", 10, ReplicateConfig()).code == ErrorCode.INVALID_PARAMS
    assert service.put_end("w", "", "") == ErrorCode.INVALID_PARAMS
    assert service.put_revoke("w", "", "") == ErrorCode.INVALID_PARAMS
    assert service.reads.get_replica_list("", "").code == ErrorCode.INVALID_PARAMS
    assert service.reads.exist_key("", "") == int(ErrorCode.INVALID_PARAMS)
    assert service.remove("", "", force=True) == ErrorCode.INVALID_PARAMS
    assert allocated(service) == 0
    service.check()


def test_key_length_limit_is_4096_utf8_bytes() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1")
    for key in ["a" * 4096, "é" * 2048, "\U0001f600" * 1024]:
        assert len(key.encode()) == 4096
        put(service, "w", key, 10)
        assert service.reads.exist_key("", key) == 1
    for key in ["a" * 4097, "é" * 2049, "a" + "\U0001f600" * 1024, "x" * 100_000]:
        assert len(key.encode()) > 4096
        assert service.put_start("w", "", key, 10, ReplicateConfig()).code == (
            ErrorCode.INVALID_PARAMS
        )
        assert service.reads.get_replica_list("", key).code == ErrorCode.INVALID_PARAMS
        assert service.reads.exist_key("", key) == int(ErrorCode.INVALID_PARAMS)
        assert service.remove("", key) == ErrorCode.INVALID_PARAMS
    assert service.stats()["objects"] == 3
    service.check()


def test_bad_sizes() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1", size=64 * KIB)
    mount(service, "owner", "s2", size=128 * KIB)
    for size in (0, -1):
        assert service.put_start("w", "", "k", size, ReplicateConfig()).code == (
            ErrorCode.INVALID_PARAMS
        )
    # Larger than any single segment, though smaller than their sum.
    assert service.put_start("w", "", "k", 128 * KIB + 1, ReplicateConfig()).code == (
        ErrorCode.NO_AVAILABLE_HANDLE
    )
    assert service.put_start("w", "", "k", 1 << 60, ReplicateConfig()).code in (
        ErrorCode.INVALID_PARAMS,
        ErrorCode.NO_AVAILABLE_HANDLE,
    )
    assert service.object_of("", "k") is None
    # A segment filled exactly to capacity.
    put(service, "w", "whole", 128 * KIB)
    assert segments_of_key(service, "whole") == {"s2"}
    assert allocated(service) == 128 * KIB
    service.check()


def test_no_segment_mounted_is_no_available_handle() -> None:
    service, _ = make_service()
    assert service.put_start("w", "", "k", 10, ReplicateConfig()).code == (
        ErrorCode.NO_AVAILABLE_HANDLE
    )
    service.check()


def test_a_replica_num_no_unsigned_field_holds_is_refused_on_assignment() -> None:
    with pytest.raises(TypeError, match="replica_num"):
        ReplicateConfig(replica_num=-1)
    config = ReplicateConfig()
    for bad in (-1, 1 << 64, 1.5, "2"):
        with pytest.raises(TypeError, match="soft_pin_ttl_ms"):
            config.soft_pin_ttl_ms = bad  # type: ignore[assignment]
    config.soft_pin_ttl_ms = None
    config.replica_num = (1 << 64) - 1  # held, and refused by the master (see below)


@pytest.mark.parametrize("replica_num", [0, 65, (1 << 64) - 1])
def test_bad_replica_num(replica_num: int) -> None:
    service, _ = make_service()
    mount(service, "owner", "s1")
    config = ReplicateConfig(replica_num=replica_num)
    assert service.put_start("w", "", "k", 10, config).code == ErrorCode.INVALID_PARAMS
    results = service.batch_put_start("w", "", ["a", "b"], [1, 1], config)
    assert [r.code for r in results] == [ErrorCode.INVALID_PARAMS] * 2
    assert service.stats()["objects"] == 0
    service.check()


def test_group_ids_must_match_the_keys() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1")
    for group_ids in ([], ["g1", "g2"]):
        config = ReplicateConfig(group_ids=group_ids)
        assert service.put_start("w", "", "k", 10, config).code == ErrorCode.INVALID_PARAMS
    results = service.batch_put_start(
        "w", "", ["a", "b", "c"], [1, 1, 1], ReplicateConfig(group_ids=["g1", "g2"])
    )
    assert [r.code for r in results] == [ErrorCode.INVALID_PARAMS] * 3
    assert service.stats()["objects"] == 0

    put(service, "w", "k", 10, group_ids=["g"])
    results = service.batch_put_start(
        "w", "", ["a", "b"], [1, 1], ReplicateConfig(group_ids=["ga", "gb"])
    )
    assert [r.code for r in results] == [OK, OK]
    groups = {}
    for key in ("k", "a", "b"):
        meta = service.object_of("", key)
        assert meta is not None
        groups[key] = meta.group_id
    assert groups == {"k": "g", "a": "ga", "b": "gb"}
    service.check()


@pytest.mark.parametrize(
    ("action", "ttl"),
    [
        (SoftPinAction.PRESERVE, 1000),
        (SoftPinAction.PRESERVE, 0),
        (SoftPinAction.DISABLE, 1000),
        (SoftPinAction.DISABLE, 0),
        (SoftPinAction.ENABLE, 86_400_001),
        (SoftPinAction.ENABLE, (1 << 64) - 1),  # (negative TTLs are refused on assignment)
        (7, None),
    ],
)
def test_invalid_soft_pin_requests(action: int, ttl: int | None) -> None:
    service, _ = make_service(max_kv_soft_pin_ttl=86_400_000)
    mount(service, "owner", "s1")
    config = ReplicateConfig(soft_pin_action=action, soft_pin_ttl_ms=ttl)  # type: ignore[arg-type]
    assert service.put_start("w", "", "k", 10, config).code == ErrorCode.INVALID_PARAMS
    results = service.batch_put_start("w", "", ["a", "b"], [1, 1], config)
    assert [r.code for r in results] == [ErrorCode.INVALID_PARAMS] * 2
    assert service.stats()["objects"] == 0
    service.check()


def test_soft_pin_enable_commits_its_deadline_at_put_end() -> None:
    service, clock = make_service(default_kv_soft_pin_ttl=60_000, max_kv_soft_pin_ttl=120_000)
    mount(service, "owner", "s1")
    start(service, "w", "explicit", 10, soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=5000)
    start(service, "w", "default", 10, soft_pin_action=SoftPinAction.ENABLE)
    start(service, "w", "at-max", 10, soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=120_000)
    start(service, "w", "zero", 10, soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=0)
    start(service, "w", "disabled", 10, soft_pin_action=SoftPinAction.DISABLE)
    start(service, "w", "preserved", 10)
    keys = ["explicit", "default", "at-max", "zero", "disabled", "preserved"]
    for key in keys:
        meta = service.object_of("", key)
        assert meta is not None and meta.soft_pin_deadline == 0.0  # pending until put_end
    clock.advance(2)
    assert service.batch_put_end("w", "", keys) == [OK] * len(keys)
    deadlines = {}
    for key in keys:
        meta = service.object_of("", key)
        assert meta is not None
        deadlines[key] = meta.soft_pin_deadline
    assert deadlines == {
        "explicit": pytest.approx(T0 + 2 + 5),
        "default": pytest.approx(T0 + 2 + 60),
        "at-max": pytest.approx(T0 + 2 + 120),
        "zero": 0.0,
        "disabled": 0.0,
        "preserved": 0.0,
    }
    # Reads and repeated put_end never extend the deadline.
    clock.advance(1)
    assert service.reads.get_replica_list("", "explicit").code == OK
    assert service.reads.exist_key("", "explicit") == 1
    assert service.put_end("w", "", "explicit") == OK
    meta = service.object_of("", "explicit")
    assert meta is not None and meta.soft_pin_deadline == pytest.approx(T0 + 7)
    service.check()


def test_hard_pin_is_recorded_and_does_not_block_remove() -> None:
    service, _ = make_service()
    mount(service, "owner", "s1")
    put(service, "w", "k", 10, with_hard_pin=True)
    meta = service.object_of("", "k")
    assert meta is not None and meta.hard_pinned
    assert service.remove("", "k") == OK
    service.check()


# --- segments ----------------------------------------------------------------------------------


def test_mount_validation() -> None:
    service, _ = make_service()
    good = seg("s1")
    bad = [
        SegmentInfo(id="s1", name="n", base=0, size=MIB, te_endpoint="127.0.0.1:1"),
        SegmentInfo(id="s1", name="n", base=-1, size=MIB, te_endpoint="127.0.0.1:1"),
        SegmentInfo(id="s1", name="n", base=0x1000, size=0, te_endpoint="127.0.0.1:1"),
        SegmentInfo(id="s1", name="n", base=0x1000, size=-5, te_endpoint="127.0.0.1:1"),
        SegmentInfo(id="", name="n", base=0x1000, size=MIB, te_endpoint="127.0.0.1:1"),
        SegmentInfo(id="s1", name="", base=0x1000, size=MIB, te_endpoint="127.0.0.1:1"),
    ]
    for info in bad:
        assert service.mount_segment("c1", info) == ErrorCode.INVALID_PARAMS, info
    assert service.mount_segment("", good) == ErrorCode.INVALID_PARAMS
    assert service.stats()["segments"] == 0
    assert service.stats()["clients"] == 0  # a failed mount does not register the client

    assert service.mount_segment("c1", good) == OK
    assert service.mount_segment("c1", good) == OK  # idempotent
    assert service.stats()["segments"] == 1
    assert service.stats()["capacity_bytes"] == MIB
    # Another client may not take the id over.
    assert service.mount_segment("c2", seg("s1", name="other")) == ErrorCode.INVALID_PARAMS
    mounted = service.segment_of("s1")
    assert mounted is not None and mounted.client_id == "c1"
    service.check()


def test_mount_is_idempotent_and_keeps_allocations() -> None:
    service, _ = make_service()
    info = mount(service, "c1", "s1")
    put(service, "w", "k", 100)
    assert service.mount_segment("c1", info) == OK
    assert service.remount_segments("c1", [info]) == OK
    assert allocated(service) == rounded(100)
    assert service.reads.exist_key("", "k") == 1
    service.check()


def test_unmount_ownership_and_unknown() -> None:
    service, _ = make_service()
    mount(service, "c1", "s1")
    put(service, "w", "k", 100)
    assert service.unmount_segment("c2", "s1") == ErrorCode.INVALID_PARAMS
    assert service.segment_of("s1") is not None
    assert service.reads.exist_key("", "k") == 1
    assert service.unmount_segment("c2", "unknown") == OK
    assert service.unmount_segment("c1", "s1") == OK
    assert service.unmount_segment("c1", "s1") == OK  # idempotent
    assert service.segment_of("s1") is None
    assert service.stats()["segments"] == 0
    service.check()


def test_remount_validates_every_segment_first() -> None:
    service, _ = make_service()
    mount(service, "c2", "taken")
    good = seg("s1")
    assert service.remount_segments("c1", [good, seg("taken")]) == ErrorCode.INVALID_PARAMS
    assert service.remount_segments("c1", [good, seg("s2", size=0)]) == ErrorCode.INVALID_PARAMS
    assert service.remount_segments("", [good]) == ErrorCode.INVALID_PARAMS
    assert service.segment_of("s1") is None
    assert service.ping("c1").client_status == ClientStatus.NEED_REMOUNT
    assert service.remount_segments("c1", [good, seg("s2")]) == OK
    assert service.segment_of("s1") is not None and service.segment_of("s2") is not None
    assert service.ping("c1").client_status == ClientStatus.OK
    service.check()


def test_unmount_drops_objects_living_only_there() -> None:
    service, _ = make_service()
    mount(service, "c1", "s1", name="n1")
    mount(service, "c2", "s2", name="n2")
    put(service, "w", "solo", 100, preferred_segment="n1")
    put(service, "w", "dual", 200, replica_num=2)
    put(service, "w", "other", 300, preferred_segment="n2")
    start(service, "w", "inflight", 400, preferred_segment="n1")
    assert segments_of_key(service, "solo") == {"s1"}
    assert segments_of_key(service, "dual") == {"s1", "s2"}
    assert segments_of_key(service, "other") == {"s2"}
    assert service.reads.exist_key("", "solo") == 1  # a lease does not keep an object alive

    assert service.unmount_segment("c1", "s1") == OK
    assert service.reads.get_replica_list("", "solo").code == ErrorCode.OBJECT_NOT_FOUND
    assert service.object_of("", "inflight") is None
    assert service.put_end("w", "", "inflight") == ErrorCode.OBJECT_NOT_FOUND
    dual = service.reads.get_replica_list("", "dual")
    assert dual.code == OK and [r.segment_id for r in dual.replicas] == ["s2"]
    assert service.reads.get_replica_list("", "other").code == OK
    assert service.stats()["objects"] == 2
    assert allocated(service) == rounded(200) + rounded(300)
    service.check()


@pytest.mark.parametrize(
    ("discard", "how"),
    [("preempt", "unmount"), ("preempt", "reap"), ("read-remove", "unmount")],
)
def test_held_buffer_does_not_survive_segment_remount(discard: str, how: str) -> None:
    service, clock = make_service(client_ttl=10)
    info = mount(service, "c1", "s1")
    if discard == "preempt":
        old = start(service, "w1", "k", 100)
        clock.advance(31)
        start(service, "w2", "k", 100)  # preempts: old buffer held until T0 + 600
        assert service.stats()["preempted_buffers"] == 1
    else:
        old = put(service, "w1", "k", 100)
        clock.advance(11)
        assert service.reads.get_replica_list("", "k", "r").code == OK  # held until T0 + 21
        assert service.remove("", "k", force=True) == OK  # retired while the read lasts
        assert service.stats()["retired_buffers"] == 1
    if how == "unmount":
        assert service.unmount_segment("c1", "s1") == OK
    else:
        assert service.reap_expired_clients(clock()) == ["c1"]
    assert service.segment_of("s1") is None
    service.check()

    # The same client comes back with the same segment (what a remount after expiry does).
    assert service.remount_segments("c1", [info]) == OK
    service.check()  # fails today: the stale discarded buffer is counted against the new s1
    reused = start(service, "w3", "k2", 100)
    assert service.put_end("w3", "", "k2") == OK
    assert reused.replicas[0].offset == old.replicas[0].offset  # the new s1 is empty
    clock.advance(600)
    service.sweep_expired_puts(clock())  # must not free k2's live buffer
    service.check()
    assert allocated(service) == rounded(100)
    other = start(service, "w4", "k3", 100)
    assert other.replicas[0].offset != reused.replicas[0].offset  # no two objects share bytes
    service.check()


# --- placement ---------------------------------------------------------------------------------


def test_two_replicas_land_on_distinct_segment_names() -> None:
    service, _ = make_service()
    mount(service, "c1", "s1", name="n1")
    mount(service, "c2", "s2", name="n2")
    for i in range(10):
        result = start(service, "w", f"k{i}", 100, replica_num=2)
        assert {r.segment_id for r in result.replicas} == {"s1", "s2"}
        assert len({r.segment_name for r in result.replicas}) == 2
        assert len({r.id for r in result.replicas}) == 2
        assert service.put_end("w", "", f"k{i}") == OK
        listed = service.reads.get_replica_list("", f"k{i}")
        assert len(listed.replicas) == 2
    assert allocated(service) == 10 * 2 * rounded(100)
    service.check()


def test_segments_sharing_a_name_hold_one_replica() -> None:
    service, _ = make_service()
    mount(service, "c1", "s1", name="host")
    mount(service, "c1", "s2", name="host")
    result = start(service, "w", "k", 100, replica_num=2)
    assert len(result.replicas) == 1
    service.check()


def test_replica_num_beyond_segments_is_best_effort() -> None:
    service, _ = make_service()
    mount(service, "c1", "s1")
    result = start(service, "w", "k", 100, replica_num=3)
    assert len(result.replicas) == 1
    assert service.put_end("w", "", "k") == OK
    assert len(service.reads.get_replica_list("", "k").replicas) == 1
    # With two names of which one is full, replica_num=2 still succeeds with one replica.
    mount(service, "c2", "tiny", name="tiny", size=64)
    put(service, "w", "fill", 64, preferred_segment="tiny")
    result = start(service, "w", "k2", 100, replica_num=2)
    assert [r.segment_id for r in result.replicas] == ["s1"]
    service.check()


def test_preferred_segment_is_honoured() -> None:
    service, _ = make_service()
    for i in range(4):
        mount(service, f"c{i}", f"s{i}", name=f"n{i}")
    for i in range(20):
        put(service, "w", f"one{i}", 10, preferred_segment="n2")
        assert segments_of_key(service, f"one{i}") == {"s2"}
    for i in range(20):
        put(service, "w", f"many{i}", 10, replica_num=2, preferred_segments=["n3", "n1"])
        assert segments_of_key(service, f"many{i}") == {"s3", "s1"}
    # preferred_segment wins over preferred_segments.
    put(service, "w", "both", 10, preferred_segment="n0", preferred_segments=["n3"])
    assert segments_of_key(service, "both") == {"s0"}
    # An unknown preferred name falls back to the strategy.
    put(service, "w", "unknown", 10, preferred_segment="nowhere")
    assert len(segments_of_key(service, "unknown")) == 1
    service.check()


def test_full_preferred_segment_falls_back() -> None:
    service, _ = make_service()
    mount(service, "c1", "small", name="small", size=4 * KIB)
    mount(service, "c2", "big", name="big")
    put(service, "w", "k", 8 * KIB, preferred_segment="small")
    assert segments_of_key(service, "k") == {"big"}
    service.check()


@pytest.mark.parametrize(
    ("strategy", "flag"), [("local_first", False), ("random", True), ("free_ratio_first", True)]
)
def test_local_first_prefers_the_writers_host(strategy: str, flag: bool) -> None:
    service, _ = make_service(allocation_strategy=strategy)
    mount(service, "ca", "sa", name="na", host_id="host-a")
    mount(service, "cb", "sb", name="nb", host_id="host-b")
    mount(service, "cc", "sc", name="nc", host_id="host-c")
    for i in range(20):
        host = ["host-b", "host-c"][i % 2]
        put(service, "w", f"k{i}", 100, host_id=host, prefer_alloc_in_same_node=flag)
        assert segments_of_key(service, f"k{i}") == {"sb" if host == "host-b" else "sc"}
    service.check()


def test_random_strategy_spreads_without_locality() -> None:
    service, _ = make_service()
    for name in ("a", "b", "c"):
        mount(service, f"c{name}", f"s{name}", name=f"n{name}", host_id=f"host-{name}")
    used = set()
    for i in range(30):
        put(service, "w", f"k{i}", 100, host_id="host-a")
        used |= segments_of_key(service, f"k{i}")
    assert len(used) > 1
    service.check()


def test_free_ratio_first_picks_the_emptier_segment() -> None:
    service, _ = make_service(allocation_strategy="free_ratio_first")
    mount(service, "c1", "s1", name="n1", size=64 * KIB)
    mount(service, "c2", "s2", name="n2", size=64 * KIB)
    put(service, "w", "ballast", 32 * KIB, preferred_segment="n1")
    for i in range(16):
        put(service, "w", f"k{i}", KIB)
        assert segments_of_key(service, f"k{i}") == {"s2"}
    # s2 now holds 16 KiB and s1 32 KiB; removing the ballast flips the order.
    assert service.remove("", "ballast") == OK
    for i in range(4):
        put(service, "w", f"after{i}", KIB)
        assert segments_of_key(service, f"after{i}") == {"s1"}
    service.check()


# --- liveness ----------------------------------------------------------------------------------


def test_ping_needs_remount_until_remount_segments() -> None:
    service = MasterService(
        MasterConfig(), clock=FakeClock(T0), rng=random.Random(0), view_version=7
    )
    answer = service.ping("c1")
    assert answer.code == OK
    assert answer.client_status == ClientStatus.NEED_REMOUNT
    assert answer.view_version == 7
    info = mount(service, "c1", "s1")
    assert service.ping("c1").client_status == ClientStatus.NEED_REMOUNT  # mount is not enough
    assert service.stats()["active_clients"] == 0
    assert service.remount_segments("c1", [info]) == OK
    assert service.ping("c1") == type(answer)(OK, ClientStatus.OK, 7)
    assert service.stats()["active_clients"] == 1
    assert service.stats()["segments"] == 1
    # A remount with no segments also restores standing.
    assert service.remount_segments("c2", []) == OK
    assert service.ping("c2").client_status == ClientStatus.OK
    assert service.ping("").code == ErrorCode.INVALID_PARAMS
    service.check()


def test_reaping_an_expired_client_unmounts_its_segments() -> None:
    service, clock = make_service(client_ttl=10)
    sa = mount(service, "A", "sa", name="na")
    sb = mount(service, "B", "sb", name="nb")
    assert service.remount_segments("A", [sa]) == OK
    assert service.remount_segments("B", [sb]) == OK
    put(service, "w", "only_a", 100, preferred_segment="na")
    put(service, "w", "both", 200, replica_num=2)
    put(service, "w", "only_b", 300, preferred_segment="nb")
    start(service, "w", "writing_a", 400, preferred_segment="na")
    assert segments_of_key(service, "both") == {"sa", "sb"}

    clock.advance(6)
    assert service.ping("B").code == OK
    assert service.reap_expired_clients(clock()) == []
    clock.advance(3.9)
    assert service.reap_expired_clients(clock()) == []
    clock.advance(0.1)  # A's deadline: T0 + 10
    assert service.reap_expired_clients(clock()) == ["A"]
    assert service.segment_of("sa") is None
    assert service.segment_of("sb") is not None
    assert service.reads.get_replica_list("", "only_a").code == ErrorCode.OBJECT_NOT_FOUND
    assert service.object_of("", "writing_a") is None
    both = service.reads.get_replica_list("", "both")
    assert both.code == OK and [r.segment_id for r in both.replicas] == ["sb"]
    assert service.reads.get_replica_list("", "only_b").size == 300
    assert allocated(service) == rounded(200) + rounded(300)
    assert service.stats()["clients"] == 1
    assert service.stats()["active_clients"] == 1
    assert service.reap_expired_clients(clock()) == []  # already gone
    service.check()

    # The expired client comes back: it must remount, and its old data is gone.
    assert service.ping("A").client_status == ClientStatus.NEED_REMOUNT
    assert service.ping("B").client_status == ClientStatus.OK
    assert service.remount_segments("A", [sa]) == OK
    assert service.ping("A").client_status == ClientStatus.OK
    mounted = service.segment_of("sa")
    assert mounted is not None and mounted.allocator.used_bytes == 0
    assert service.reads.get_replica_list("", "only_a").code == ErrorCode.OBJECT_NOT_FOUND
    service.check()


def test_a_client_that_keeps_pinging_is_not_reaped() -> None:
    service, clock = make_service(client_ttl=10)
    info = mount(service, "A", "sa")
    mount(service, "B", "sb")
    assert service.remount_segments("A", [info]) == OK
    put(service, "w", "k", 100, preferred_segment=info.name)
    for _ in range(50):
        clock.advance(4)
        assert service.ping("A").client_status == ClientStatus.OK
        reaped = service.reap_expired_clients(clock())
        assert "A" not in reaped
    assert service.segment_of("sa") is not None
    assert service.segment_of("sb") is None  # B never pinged
    assert service.reads.exist_key("", "k") == 1
    service.check()


def test_reap_is_driven_by_the_given_now() -> None:
    service, clock = make_service(client_ttl=10)
    mount(service, "A", "sa")
    mount(service, "B", "sb")
    clock.advance(5)
    service.ping("B")
    assert service.reap_expired_clients(T0 + 9.99) == []
    assert service.reap_expired_clients(T0 + 15) == ["A", "B"]
    assert service.stats()["segments"] == 0
    service.check()


# --- regex and remove_all ----------------------------------------------------------------------


def test_remove_by_regex() -> None:
    service, _ = make_service()
    mount(service, "c1", "s1")
    for key in ("user/1", "user/2", "user/3", "admin/1", "xuser/9"):
        put(service, "w", key, 10)
    start(service, "w", "user/pending", 10)
    assert service.reads.exist_key("", "user/3") == 1  # leased

    code, count = service.remove_by_regex("", "^user/")
    assert (code, count) == (OK, 2)  # user/1, user/2; leased user/3 and pending skipped
    assert service.reads.exist_key("", "user/1") == 0
    assert service.reads.exist_key("", "user/3") == 1
    # re.search semantics: an unanchored pattern matches anywhere in the key.
    assert service.remove_by_regex("", r"user/\d") == (OK, 1)  # xuser/9; user/3 leased
    assert service.reads.exist_key("", "xuser/9") == 0
    assert service.remove_by_regex("", "user", force=True) == (OK, 1)  # user/3; pending skipped
    assert service.object_of("", "user/pending") is not None
    assert service.remove_by_regex("", "nothing-matches") == (OK, 0)
    assert service.remove_by_regex("", "(") == (ErrorCode.INVALID_PARAMS, 0)
    assert service.remove_by_regex("", "[a-") == (ErrorCode.INVALID_PARAMS, 0)
    assert service.reads.exist_key("", "admin/1") == 1
    assert service.remove_by_regex("", "", force=True) == (OK, 1)  # admin/1
    assert service.stats()["objects"] == 1
    service.check()
    service.sweep_expired_puts(T0 + 10)  # user/3's lease has ended: its quarantine too
    assert allocated(service) == rounded(10)
    service.check()


def test_remove_all() -> None:
    service, _ = make_service()
    mount(service, "c1", "s1")
    for i in range(5):
        put(service, "w", f"k{i}", 10)
    start(service, "w", "pending", 10)
    assert service.reads.get_replica_list("", "k0").code == OK
    assert service.reads.exist_key("", "k1") == 1
    assert service.remove_all("") == 3
    assert service.stats()["objects"] == 3
    assert service.remove_all("") == 0
    assert service.remove_all("", force=True) == 2
    assert service.object_of("", "pending") is not None  # in-flight writes survive even force
    service.check()
    service.sweep_expired_puts(T0 + 10)  # k0 and k1's leases have ended: their quarantine too
    assert allocated(service) == rounded(10)
    service.check()


# --- tenants -----------------------------------------------------------------------------------


def test_tenants_are_separate_key_spaces() -> None:
    service, _ = make_service(enable_multi_tenants=True)
    mount(service, "c1", "s1")
    put(service, "w", "k", 100, tenant="t1")
    put(service, "w", "k", 200, tenant="t2")
    put(service, "w", "k", 300)  # default tenant
    assert service.stats()["objects"] == 3
    assert service.reads.get_replica_list("t1", "k").size == 100
    assert service.reads.get_replica_list("t2", "k").size == 200
    assert service.reads.get_replica_list("", "k").size == 300
    assert service.reads.get_replica_list("default", "k").size == 300  # "" means "default"
    assert service.reads.get_replica_list("t3", "k").code == ErrorCode.OBJECT_NOT_FOUND
    assert service.put_end("w", "t3", "k") == ErrorCode.OBJECT_NOT_FOUND

    put(service, "w", "only1", 10, tenant="t1")
    assert service.reads.exist_key("t1", "only1") == 1
    assert service.reads.exist_key("t2", "only1") == 0
    assert service.remove_all("t1", force=True) == 2
    assert service.reads.get_replica_list("t1", "k").code == ErrorCode.OBJECT_NOT_FOUND
    assert service.reads.get_replica_list("t2", "k").size == 200
    assert service.reads.exist_key("", "k") == 1
    assert service.remove_by_regex("t2", "k", force=True) == (OK, 1)
    assert service.reads.exist_key("", "k") == 1
    assert service.remove("t2", "k") == ErrorCode.OBJECT_NOT_FOUND
    service.check()


@pytest.mark.parametrize("tenant", ["_x", "_", "a\x00b", "tab\there", "del\x7f", "\n"])
def test_invalid_tenants_are_rejected(tenant: str) -> None:
    service, _ = make_service(enable_multi_tenants=True)
    mount(service, "c1", "s1")
    put(service, "w", "k", 10)
    bad = ErrorCode.INVALID_PARAMS
    assert service.put_start("w", tenant, "n", 10, ReplicateConfig()).code == bad
    assert [
        r.code for r in service.batch_put_start("w", tenant, ["a", "b"], [1, 1], ReplicateConfig())
    ] == [bad, bad]
    assert service.put_end("w", tenant, "k") == bad
    assert service.put_revoke("w", tenant, "k") == bad
    assert service.reads.get_replica_list(tenant, "k").code == bad
    assert [r.code for r in service.reads.batch_get_replica_list(tenant, ["k", "z"])] == [bad, bad]
    assert service.reads.exist_key(tenant, "k") == int(bad)
    assert service.reads.batch_exist_key(tenant, ["k"]) == [int(bad)]
    assert service.remove(tenant, "k", force=True) == bad
    assert service.batch_remove(tenant, ["k"], force=True) == [bad]
    assert service.remove_by_regex(tenant, ".*", force=True) == (bad, 0)
    assert service.remove_all(tenant, force=True) == 0
    assert service.stats()["objects"] == 1
    assert allocated(service) == rounded(10)
    service.check()


def test_tenant_resolver_rule() -> None:
    shared = TenantResolver(multi_tenant=True)
    assert shared.resolve("t1") == "t1"
    assert shared.resolve("") == DEFAULT_TENANT
    assert [shared.resolve(t) for t in ("_x", "a\x00b", "del\x7f")] == [None, None, None]
    single = TenantResolver(multi_tenant=False)
    assert [single.resolve(t) for t in ("t1", "", "_x")] == [DEFAULT_TENANT] * 3


def test_tenants_collapse_to_default_when_disabled() -> None:
    service, _ = make_service(enable_multi_tenants=False)
    mount(service, "c1", "s1")
    put(service, "w", "k", 100, tenant="t1")
    assert service.put_start("w", "t2", "k", 100, ReplicateConfig()).code == (
        ErrorCode.OBJECT_ALREADY_EXISTS
    )
    assert service.reads.get_replica_list("t2", "k").size == 100
    assert service.reads.get_replica_list("", "k").size == 100
    assert service.reads.exist_key("_x", "k") == 1  # not validated: every tenant is "default"
    meta = service.object_of("anything", "k")
    assert meta is not None and meta.tenant == "default"
    assert service.remove_all("t9", force=True) == 1
    assert service.stats()["objects"] == 0
    service.check()


def test_remove_all_with_empty_tenant_wipes_every_tenant() -> None:
    service, _ = make_service(enable_multi_tenants=True)
    mount(service, "c1", "s1")
    put(service, "w", "k", 10, tenant="t1")
    put(service, "w", "k", 10, tenant="t2")
    put(service, "w", "k", 10)
    count = service.remove_all("", force=True)
    service.check()
    assert count == 3
    assert service.stats()["objects"] == 0
