"""The disk tier's rules on a master service (no transport): spills instead of loss, the
quota's own LRU, promotions, what removal, upsert and unmount do to disk replicas, and a
seeded stress run holding every invariant (``check()``) after each step."""

from __future__ import annotations

import dataclasses
import random

import pytest

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.state.disk_tier import DISK_TASK_TIMEOUT_S
from mooncake_py.types import (
    DiskReplicaEntry,
    DiskTaskKind,
    ReplicateConfig,
    SegmentInfo,
    SoftPinAction,
)

KIB = 1 << 10
OWNER = "owner"
MEMORY = "mem-owner"
DISK = "disk-owner"
OK = ErrorCode.OK


def service_with_tier(
    memory: int = 64 * KIB, disk: int = 256 * KIB, **overrides: object
) -> tuple[MasterService, FakeClock]:
    clock = FakeClock(100.0)
    config = MasterConfig(**overrides)  # type: ignore[arg-type]
    service = MasterService(config, clock=clock, rng=random.Random(7))
    key = bytes(range(32))
    memory_info = SegmentInfo(MEMORY, "host:1", 0x1000, memory, "127.0.0.1:1", capability_key=key)
    disk_info = SegmentInfo(DISK, "host:1", 0, disk, "127.0.0.1:1", capability_key=key, disk=True)
    assert service.mount_segment(OWNER, memory_info) == OK
    assert service.mount_segment(OWNER, disk_info) == OK
    return service, clock


def put(service: MasterService, key: str, size: int = 8 * KIB, **config: object) -> int:
    start = service.put_start("w", "", key, size, ReplicateConfig(**config))  # type: ignore[arg-type]
    if start.code != OK:
        return int(start.code)
    return int(service.put_end("w", "", key, start.write_id))


def run_tasks(service: MasterService, code: int = 0) -> list[DiskTaskKind]:
    """The owner runs everything it is handed (as DiskTierHost does), reporting ``code``."""
    batch = service.disk.fetch_disk_tasks(OWNER, 256)
    ids = [t.task_id for t in batch.tasks]
    assert service.disk.finish_disk_tasks(OWNER, ids, [code] * len(ids)) == [0] * len(ids)
    return [t.kind for t in batch.tasks]


def tiers_of(service: MasterService, key: str) -> list[str]:
    state = service.context.state
    meta = state.objects.get(("default", key))
    if meta is None:
        return []
    return sorted("disk" if state.on_disk(r) else "memory" for r in meta.complete_replicas())


def fill(service: MasterService, count: int, size: int = 8 * KIB) -> list[int]:
    return [put(service, f"k{i}", size) for i in range(count)]


def test_eviction_spills_and_memory_goes_only_once_the_file_is_complete() -> None:
    service, clock = service_with_tier()
    assert fill(service, 8) == [OK] * 8
    used = service.stats()["allocated_bytes"]
    service.evict_once(clock())
    spilling = service.stats()["spills_in_flight"]
    assert spilling > 0
    # Nothing is lost or freed yet: the owner has not written the files.
    assert service.stats()["allocated_bytes"] == used
    assert all(tiers_of(service, f"k{i}") == ["memory"] for i in range(8))
    assert run_tasks(service) == [DiskTaskKind.SPILL] * spilling
    service.check()
    on_disk = [i for i in range(8) if tiers_of(service, f"k{i}") == ["disk"]]
    assert len(on_disk) == spilling
    assert service.stats()["allocated_bytes"] == used - spilling * 8 * KIB
    assert service.stats()["disk_used_bytes"] == spilling * 8 * KIB
    # A disk-only object is read from its disk replica.
    found = service.reads.get_replica_list("", f"k{on_disk[0]}", "r")
    assert found.code == OK and found.replicas[0].disk
    assert service.stats()["objects"] == 8


def test_a_failed_spill_keeps_the_object_in_memory_and_pauses_the_tier() -> None:
    service, clock = service_with_tier()
    fill(service, 8)
    service.evict_once(clock())
    failed = run_tasks(service, int(ErrorCode.FILE_WRITE_FAIL))
    assert failed
    service.check()
    assert all(tiers_of(service, f"k{i}") == ["memory"] for i in range(8))
    assert service.stats()["disk_used_bytes"] == 0
    assert service.stats()["spill_failures"] == len(failed)
    # While the tier is paused eviction drops objects as it would without one.
    service.evict_once(clock())
    assert service.stats()["evicted_objects"] > 0
    assert service.stats()["spills_in_flight"] == 0


def test_a_write_without_room_while_spills_run_is_told_to_retry() -> None:
    service, _ = service_with_tier()
    assert fill(service, 8) == [OK] * 8  # the segment is full
    start = service.put_start("w", "", "late", 8 * KIB, ReplicateConfig())
    assert start.code == ErrorCode.NO_AVAILABLE_HANDLE
    assert start.retry_after_ms > 0
    run_tasks(service)
    assert put(service, "late") == OK
    service.check()


def test_a_full_tier_frees_its_oldest_objects_but_never_pinned_or_read_ones() -> None:
    service, clock = service_with_tier(disk=24 * KIB)
    fill(service, 8)
    service.evict_once(clock())
    run_tasks(service)
    on_disk = [i for i in range(8) if tiers_of(service, f"k{i}") == ["disk"]]
    assert 0 < len(on_disk) <= 3  # the quota holds three
    held = service.reads.get_replica_list("", f"k{on_disk[0]}", "r")  # a reader copies it
    assert held.code == OK
    for i in range(8, 12):
        assert put(service, f"k{i}") in (OK, ErrorCode.NO_AVAILABLE_HANDLE)
        service.evict_once(clock())
        run_tasks(service)
        service.check()
    assert service.stats()["disk_evicted_objects"] > 0
    assert "disk" in tiers_of(service, f"k{on_disk[0]}")  # its reader still holds it
    assert service.stats()["disk_used_bytes"] <= 24 * KIB


def test_a_read_of_a_disk_only_object_promotes_it_when_memory_has_room() -> None:
    service, clock = service_with_tier()
    fill(service, 8)
    service.evict_once(clock())
    run_tasks(service)
    victim = next(i for i in range(8) if tiers_of(service, f"k{i}") == ["disk"])
    for i in range(8):  # make room below the watermark
        if tiers_of(service, f"k{i}") == ["memory"] and i != victim:
            service.remove("", f"k{i}", force=True)
    found = service.reads.get_replica_list("", f"k{victim}", "r")
    assert found.replicas[0].disk
    assert run_tasks(service) == [DiskTaskKind.PROMOTE]
    assert tiers_of(service, f"k{victim}") == ["disk", "memory"]
    again = service.reads.get_replica_list("", f"k{victim}", "r")
    assert not again.replicas[0].disk  # memory first
    # Evicting it again costs nothing: its disk replica is already there.
    state = service.context.state
    meta = state.objects.get(("default", f"k{victim}"))
    assert meta is not None
    service.reads.end_reads("r", [found.read_id, again.read_id])
    assert service._evictor._disk is not None  # noqa: SLF001 - the hook under test
    assert service._evictor._disk.demote(meta, clock())  # noqa: SLF001
    assert tiers_of(service, f"k{victim}") == ["disk"]
    service.check()


def test_removal_during_a_spill_drops_the_file_it_was_writing() -> None:
    service, clock = service_with_tier()
    fill(service, 8)
    service.evict_once(clock())
    batch = service.disk.fetch_disk_tasks(OWNER, 256)
    task = batch.tasks[0]
    assert service.remove("", task.key, force=True) == OK
    service.disk.finish_disk_tasks(OWNER, [t.task_id for t in batch.tasks], [0] * len(batch.tasks))
    service.check()
    assert tiers_of(service, task.key) == []
    deletes = dict(service.disk.fetch_disk_tasks(OWNER, 0).deletes)
    assert task.disk_offset in deletes[DISK]


def test_an_upsert_of_a_disk_object_gets_memory_and_its_file_goes() -> None:
    service, clock = service_with_tier()
    fill(service, 8)
    service.evict_once(clock())
    run_tasks(service)
    key = next(f"k{i}" for i in range(8) if tiers_of(service, f"k{i}") == ["disk"])
    start = service.upsert_start("w", "", key, 8 * KIB, ReplicateConfig())
    if start.code == ErrorCode.NO_AVAILABLE_HANDLE:
        run_tasks(service)
        start = service.upsert_start("w", "", key, 8 * KIB, ReplicateConfig())
    assert start.code == OK
    assert not any(r.disk for r in start.replicas)
    assert service.put_end("w", "", key, start.write_id) == OK
    assert tiers_of(service, key) == ["memory"]
    assert service.disk.fetch_disk_tasks(OWNER, 0).deletes
    service.check()


def test_soft_pinned_objects_stay_in_memory_while_others_spill() -> None:
    service, clock = service_with_tier(allow_evict_soft_pinned_objects=False)
    pin = {"soft_pin_action": SoftPinAction.ENABLE, "soft_pin_ttl_ms": 600_000}
    assert [put(service, f"p{i}", **pin) for i in range(3)] == [OK] * 3
    fill(service, 5)
    service.evict_once(clock())
    run_tasks(service)
    assert all(tiers_of(service, f"p{i}") == ["memory"] for i in range(3))
    assert any(tiers_of(service, f"k{i}") == ["disk"] for i in range(5))


def test_registered_files_come_back_as_disk_objects() -> None:
    service, _ = service_with_tier()
    assert put(service, "taken") == OK
    entries = [
        DiskReplicaEntry("", "a", 0, 100),
        DiskReplicaEntry("", "b", 100, 200),
        DiskReplicaEntry("", "taken", 300, 10),
        DiskReplicaEntry("", "dup", 100, 5),  # the offset is held already
        DiskReplicaEntry("", "", 500, 5),
    ]
    codes = service.disk.register_disk_replicas(OWNER, DISK, entries)
    assert codes == [
        OK,
        OK,
        ErrorCode.OBJECT_ALREADY_EXISTS,
        ErrorCode.INVALID_PARAMS,
        ErrorCode.INVALID_PARAMS,
    ]
    assert tiers_of(service, "a") == ["disk"]
    # Registering the same file again (a remount of a tier the master kept) changes nothing.
    assert service.disk.register_disk_replicas(OWNER, DISK, entries[:1]) == [OK]
    # Only the tier's owner registers into it.
    assert service.disk.register_disk_replicas("other", DISK, entries[:1]) == [
        ErrorCode.SEGMENT_NOT_FOUND
    ]
    # A damaged file's replica is dropped; the object goes with its last replica.
    assert service.disk.drop_disk_replicas(OWNER, DISK, entries[:1]) == [OK]
    assert tiers_of(service, "a") == []
    assert service.disk.drop_disk_replicas(OWNER, DISK, entries[:1]) == [ErrorCode.OBJECT_NOT_FOUND]
    service.check()


def test_unmounting_the_tier_drops_disk_only_objects_and_ends_its_tasks() -> None:
    service, clock = service_with_tier()
    fill(service, 8)
    service.evict_once(clock())
    run_tasks(service)
    service.evict_once(clock())  # more spills in flight
    gone = [i for i in range(8) if tiers_of(service, f"k{i}") == ["disk"]]
    assert service.unmount_segment(OWNER, DISK) == OK
    service.check()
    assert all(tiers_of(service, f"k{i}") == [] for i in gone)
    assert service.stats()["disk_tasks"] == 0 or service.stats()["spills_in_flight"] == 0


def test_disk_tasks_not_finished_in_time_fail() -> None:
    service, clock = service_with_tier()
    fill(service, 8)
    service.evict_once(clock())
    batch = service.disk.fetch_disk_tasks(OWNER, 256)
    assert batch.tasks
    clock.advance(DISK_TASK_TIMEOUT_S + 1)
    service.sweep_expired_puts(clock())
    assert service.stats()["spills_in_flight"] == 0
    ids = [t.task_id for t in batch.tasks]
    late = service.disk.finish_disk_tasks(OWNER, ids, [0] * len(ids))
    assert late == [ErrorCode.TASK_NOT_FOUND] * len(ids)
    service.check()


def test_a_master_without_offload_refuses_disk_tiers() -> None:
    service = MasterService(MasterConfig(enable_offload=False))
    info = SegmentInfo("d", "host:1", 0, 1 << 20, "127.0.0.1:1", disk=True)
    assert service.mount_segment("c", info) == ErrorCode.UNABLE_OFFLOAD


@pytest.mark.parametrize("seed", range(10))
def test_seeded_stress_keeps_every_invariant(seed: int) -> None:
    rng = random.Random(seed)
    service, clock = service_with_tier(memory=48 * KIB, disk=rng.choice((24, 64)) * KIB)
    held: list[int] = []
    for _ in range(600):
        key = f"k{rng.randrange(30)}"
        roll = rng.random()
        if roll < 0.35:
            (service.upsert_start if rng.random() < 0.2 else service.put_start)(
                "w", "", key, rng.choice((1 * KIB, 5 * KIB, 9 * KIB)), ReplicateConfig()
            )
            meta = service.context.state.objects.get(("default", key))
            if meta is not None and meta.write_id:
                service.put_end("w", "", key, meta.write_id)
        elif roll < 0.5:
            batch = service.disk.fetch_disk_tasks(OWNER, rng.randrange(1, 8))
            codes = [rng.choice((0, 0, 0, -1103)) for _ in batch.tasks]
            service.disk.finish_disk_tasks(OWNER, [t.task_id for t in batch.tasks], codes)
        elif roll < 0.62:
            found = service.reads.get_replica_list("", key, "r")
            if found.code == OK:
                held.append(found.read_id)
        elif roll < 0.68 and held:
            service.reads.end_reads("r", [held.pop(rng.randrange(len(held)))])
        elif roll < 0.75:
            service.remove("", key, force=rng.random() < 0.5)
        elif roll < 0.85:
            service.evict_once(clock())
        elif roll < 0.9:
            clock.advance(rng.choice((1.0, 5.0, DISK_TASK_TIMEOUT_S)))
            service.sweep_expired_puts(clock())
        elif roll < 0.93:
            offset = rng.randrange(1 << 30)
            service.disk.register_disk_replicas(
                OWNER, DISK, [DiskReplicaEntry("", f"r{rng.randrange(10)}", offset, 700)]
            )
        elif roll < 0.94:
            service.remove_all("", force=True)
        service.check()
    assert service.stats()["spilled_objects"] > 0


def test_a_value_that_can_never_fit_is_not_told_to_retry() -> None:
    service, clock = service_with_tier()
    fill(service, 8)
    service.evict_once(clock())
    assert service.stats()["spills_in_flight"] > 0
    start = service.put_start("w", "", "huge", 1 << 20, ReplicateConfig())
    assert start.code == ErrorCode.NO_AVAILABLE_HANDLE
    assert start.retry_after_ms == 0


def test_a_write_drops_the_memory_of_objects_already_on_disk_at_once() -> None:
    service, clock = service_with_tier()
    fill(service, 8)
    service.evict_once(clock())
    run_tasks(service)
    # Promote every disk-only object while there is room, so each is in both tiers.
    for i in range(8):
        if tiers_of(service, f"k{i}") == ["disk"]:
            found = service.reads.get_replica_list("", f"k{i}", "r")
            service.reads.end_reads("r", [found.read_id])
            run_tasks(service)
    both = [i for i in range(8) if tiers_of(service, f"k{i}") == ["disk", "memory"]]
    assert both
    for i in range(8):  # only objects in both tiers are left as candidates
        if i not in both:
            service.remove("", f"k{i}", force=True)
    # Filling the segment, writes make room from those at once: no spill, no wait.
    for n in range(16):
        if put(service, f"new{n}") != OK:
            break  # only memory-only objects are left: they must spill first
    assert service.stats()["demoted_objects"] == len(both)
    assert all(tiers_of(service, f"k{i}") in (["disk"], ["disk", "memory"]) for i in both)
    service.check()


def test_an_operator_demotes_objects_to_disk() -> None:
    service, _ = service_with_tier()
    assert put(service, "cold") == OK and put(service, "busy") == OK
    found = service.reads.get_replica_list("", "busy", "r")
    codes = service.disk.demote_objects("", ["cold", "busy", "absent"])
    assert codes == [OK, ErrorCode.OBJECT_HAS_LEASE, ErrorCode.OBJECT_NOT_FOUND]
    assert run_tasks(service) == [DiskTaskKind.SPILL]
    assert tiers_of(service, "cold") == ["disk"]
    assert service.disk.demote_objects("", ["cold"]) == [OK]  # on disk already
    service.reads.end_reads("r", [found.read_id])
    service.check()
    # Without a tier nothing can take it.
    plain = MasterService(MasterConfig(), clock=FakeClock(1.0))
    info = SegmentInfo("m", "host:2", 0x1000, 1 << 20, "127.0.0.1:1")
    assert plain.mount_segment("c", info) == OK
    start = plain.put_start("w", "", "x", 100, ReplicateConfig())
    assert plain.put_end("w", "", "x", start.write_id) == OK
    assert plain.disk.demote_objects("", ["x"]) == [ErrorCode.UNABLE_OFFLOAD]


def test_a_hung_owner_stops_writers_waiting_and_its_tier_pauses_longer_each_time() -> None:
    service, clock = service_with_tier()
    fill(service, 8)
    start = service.put_start("w", "", "late", 8 * KIB, ReplicateConfig())
    assert start.retry_after_ms > 0  # a fresh spill: room is coming
    service.disk.fetch_disk_tasks(OWNER, 256)  # handed out, never reported
    waited = 0
    while start.retry_after_ms and waited < DISK_TASK_TIMEOUT_S:
        clock.advance(1)  # a write a second, each may spill one more object
        waited += 1
        start = service.put_start("w", "", "late", 8 * KIB, ReplicateConfig())
        service.disk.fetch_disk_tasks(OWNER, 256)
    # Every object is on its way and the spills are old: the owner looks hung, so writers
    # fail at once rather than wait for the tasks to time out.
    assert (start.code, start.retry_after_ms) == (ErrorCode.NO_AVAILABLE_HANDLE, 0)
    assert waited < DISK_TASK_TIMEOUT_S
    state = service.context.state
    pauses = []
    for _ in range(3):
        clock.advance(DISK_TASK_TIMEOUT_S + 1)
        service.sweep_expired_puts(clock())
        pauses.append(state.disk.failed_until[DISK] - clock())
        clock.advance(pauses[-1])
        service.evict_once(clock())  # spills again once the pause is over
        batch = service.disk.fetch_disk_tasks(OWNER, 256)
    assert pauses[0] < pauses[1] < pauses[2]
    # The owner is back: its last spills complete, and the tier is trusted again.
    ids = [t.task_id for t in batch.tasks]
    assert ids and service.disk.finish_disk_tasks(OWNER, ids, [0] * len(ids)) == [0] * len(ids)
    assert DISK not in state.disk.failed_until
    service.check()


def test_a_timed_out_promotion_holds_its_memory_for_a_late_copy() -> None:
    service, clock = service_with_tier()
    fill(service, 8)
    service.evict_once(clock())
    run_tasks(service)
    for i in range(8):
        if tiers_of(service, f"k{i}") == ["memory"]:
            service.remove("", f"k{i}", force=True)
    victim = next(i for i in range(8) if tiers_of(service, f"k{i}") == ["disk"])
    found = service.reads.get_replica_list("", f"k{victim}", "r")
    service.reads.end_reads("r", [found.read_id])
    batch = service.disk.fetch_disk_tasks(OWNER, 256)
    (promotion,) = [t for t in batch.tasks if t.kind is DiskTaskKind.PROMOTE]
    clock.advance(DISK_TASK_TIMEOUT_S + 1)
    service.sweep_expired_puts(clock())
    # Its range is not handed to anyone while the owner may still be copying into it.
    state = service.context.state
    assert state.segments.grant_holds.held_on(MEMORY) == 1
    for n in range(6):
        start = service.put_start("w", "", f"n{n}", 8 * KIB, ReplicateConfig())
        assert all(r.offset != promotion.memory_offset for r in start.replicas)
    service.check()


def test_unmounting_a_tier_puts_its_spilling_objects_back_among_candidates() -> None:
    service, clock = service_with_tier()
    fill(service, 8)
    service.evict_once(clock())
    assert service.stats()["spills_in_flight"] > 0
    assert service.unmount_segment(OWNER, DISK) == OK
    service.check()  # every object in memory is an eviction candidate again
    assert service.stats()["spills_in_flight"] == 0


def test_hard_pinned_objects_are_not_demoted() -> None:
    service, _ = service_with_tier()
    assert put(service, "pinned", with_hard_pin=True) == OK
    assert service.disk.demote_objects("", ["pinned"]) == [ErrorCode.OBJECT_REPLICA_BUSY]
    assert tiers_of(service, "pinned") == ["memory"]


def test_only_spills_on_the_writers_segments_make_it_wait() -> None:
    service, clock = service_with_tier(enable_multi_tenants=True)
    other = SegmentInfo(
        "mem-b", "host:2", 0x1000, 64 * KIB, "127.0.0.1:2", capability_key=bytes(32)
    )
    assert service.mount_segment("b", other, "tb") == OK
    for i in range(8):  # tenant tb fills its own segment
        start = service.put_start("wb", "tb", f"b{i}", 8 * KIB, ReplicateConfig())
        assert service.put_end("wb", "tb", f"b{i}", start.write_id) == OK
    fill(service, 8)  # the default tenant fills the segment with the tier, and spills start
    service.evict_once(clock())
    assert service.stats()["spills_in_flight"] > 0
    start = service.put_start("wb", "tb", "b-more", 8 * KIB, ReplicateConfig())
    assert start.retry_after_ms == 0  # nothing frees memory tb may use


def test_a_restarted_owner_takes_its_tier_over_with_its_new_quota() -> None:
    service, _ = service_with_tier()
    entries = [DiskReplicaEntry("", f"f{i}", i * 1000, 1000) for i in range(3)]
    assert service.disk.register_disk_replicas(OWNER, DISK, entries) == [OK] * 3
    key = bytes(range(32))

    def tier(size: int, client_key: bytes = key) -> SegmentInfo:
        return SegmentInfo(DISK, "host:9", 0, size, "127.0.0.1:9", capability_key=client_key)

    moved = dataclasses.replace(tier(2000), disk=True)
    assert service.mount_segment("restarted", moved) == ErrorCode.INVALID_PARAMS  # 3000 held
    forged = dataclasses.replace(tier(1 << 20, bytes(32)), disk=True)
    assert service.mount_segment("thief", forged) == ErrorCode.INVALID_PARAMS  # not its key
    bigger = dataclasses.replace(tier(1 << 20), disk=True)
    assert service.mount_segment("restarted", bigger) == OK
    mounted = service.segment_of(DISK)
    assert mounted is not None and mounted.client_id == "restarted"
    assert mounted.allocator.capacity == 1 << 20 and tiers_of(service, "f0") == ["disk"]
    service.check()


def test_a_master_without_offload_still_remounts_the_memory_segment() -> None:
    service = MasterService(MasterConfig(enable_offload=False), clock=FakeClock(1.0))
    memory = SegmentInfo("m", "host:1", 0x1000, 1 << 20, "127.0.0.1:1")
    disk = SegmentInfo("d", "host:1", 0, 1 << 20, "127.0.0.1:1", disk=True)
    assert service.remount_segments("c", [memory, disk]) == OK
    assert service.segment_of("m") is not None and service.segment_of("d") is None


def test_a_report_of_too_many_tasks_is_refused_whole() -> None:
    service, _ = service_with_tier()
    ids = list(range(1, 5000))
    codes = service.disk.finish_disk_tasks(OWNER, ids, [0] * len(ids))
    assert codes == [ErrorCode.INVALID_PARAMS] * len(ids)
    assert service.disk.finish_disk_tasks(OWNER, [1], [0, 0]) == [ErrorCode.INVALID_PARAMS]
