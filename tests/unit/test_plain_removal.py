"""Removal in bulk (:mod:`mooncake_py.master.service.plain_removal`): the allocator gives back
many ranges as one (``free_many`` ends where freeing one by one ends), and batch removal,
remove-all and removal by pattern answer and leave exactly what removing key by key does,
whatever holds the objects (reads, existence checks, writes in flight, groups, sessions,
pins, several replicas)."""

from __future__ import annotations

import random

import pytest

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.state.allocator import OffsetAllocator
from mooncake_py.types import ReplicateConfig, SegmentInfo

OK = ErrorCode.OK
KIB = 1024


def free_ranges(allocator: OffsetAllocator) -> list[tuple[int, int]]:
    return allocator.free_ranges()


@pytest.mark.parametrize("seed", range(8))
def test_free_many_ends_where_single_frees_end(seed: int) -> None:
    rng = random.Random(seed)
    many, single = OffsetAllocator(1 << 20), OffsetAllocator(1 << 20)
    live: list[int] = []
    for _ in range(60):
        if rng.random() < 0.6:
            sizes = [rng.choice((64, 100, 4096, 9000)) for _ in range(rng.randint(1, 12))]
            if rng.random() < 0.5:
                got, want = many.allocate_run(sizes), single.allocate_run(sizes)
            else:
                got = [many.allocate(s) for s in sizes]  # type: ignore[misc]
                want = [single.allocate(s) for s in sizes]  # type: ignore[misc]
            assert got == want
            if got is not None:
                live += [o for o in got if o is not None]
        elif live:
            doomed = rng.sample(live, rng.randint(1, len(live)))
            for offset in doomed:
                live.remove(offset)
            rng.shuffle(doomed)
            released = many.free_many(doomed)
            assert released == sum(single.free(o) for o in doomed)
        assert free_ranges(many) == free_ranges(single)
        assert many.used_bytes == single.used_bytes
        many.check()


def test_free_many_of_an_unknown_offset_raises_and_keeps_the_rest_consistent() -> None:
    allocator = OffsetAllocator(1 << 16)
    offsets = allocator.allocate_run([64, 64, 64])
    assert offsets is not None
    with pytest.raises(KeyError):
        allocator.free_many([offsets[0], 12345 * 64])
    allocator.check()
    assert allocator.allocation_count == 2
    assert allocator.free_many(offsets[1:]) == 128
    assert allocator.used_bytes == 0
    allocator.check()


# --- the service: bulk removal against removal key by key --------------------------------


def twin(seed: int) -> tuple[MasterService, FakeClock]:
    clock = FakeClock(1000.0)
    service = MasterService(
        MasterConfig(enable_multi_tenants=True), clock=clock, rng=random.Random(seed)
    )
    for i, shared in enumerate((False, False, True)):
        info = SegmentInfo(
            id=f"s{i}",
            name=f"h{i}",
            base=4096,
            size=4 << 20,
            te_endpoint=f"e:{i + 1}",
            capability_key=b"k" * 32,
            shared=shared,
        )
        assert service.mount_segment("owner", info) == OK
    return service, clock


def populate(service: MasterService, rng: random.Random) -> list[str]:
    """The same objects on each twin (same seed): plain ones written in batches, and ones
    that something holds."""
    names = [f"k{i}" for i in range(120)]
    for tenant in ("t1", "t2"):
        for start in range(0, 80, 20):
            keys = names[start : start + 20]
            starts = service.batch_put_start("w", tenant, keys, [100] * 20, ReplicateConfig())
            ends = service.batch_put_end("w", tenant, keys, [s.write_id for s in starts])
            assert ends == [OK] * 20
    special = {
        "k80": ReplicateConfig(replica_num=2),
        "k81": ReplicateConfig(group_ids=["g"]),
        "k82": ReplicateConfig(with_hard_pin=True),
        "k83": ReplicateConfig(kv_sessions=[["conv"]]),
        "k84": ReplicateConfig(),  # left in flight
    }
    for key, config in special.items():
        start = service.put_start("w", "t1", key, 100, config)
        assert start.code == OK, key
        if key != "k84":
            assert service.put_end("w", "t1", key, start.write_id) == OK
    reads = service.reads
    read = reads.batch_get_replica_list("t1", [names[rng.randrange(80)] for _ in range(5)], "r")
    assert all(r.code == OK for r in read)
    assert reads.batch_exist_key("t1", [names[rng.randrange(80)] for _ in range(5)], "r")
    return names


def state_of(service: MasterService) -> tuple[object, ...]:
    state = service._state  # noqa: SLF001
    objects = sorted((m.tenant, m.key, len(m.replicas)) for m in state.objects.snapshot())
    ranges = {
        m.info.id: m.allocator.free_ranges()  # type: ignore[union-attr]
        for m in state.segments.all_segments()
    }
    tallies = sorted((t, v.objects, v.bytes) for t, v in state.objects.tallies.items())
    return objects, ranges, tallies, service.stats()["objects"], len(state.policy)


@pytest.mark.parametrize("seed", range(6))
def test_batch_remove_answers_and_leaves_what_single_removes_do(seed: int) -> None:
    rng = random.Random(seed)
    bulk, _ = twin(seed)
    single, _ = twin(seed)
    names = populate(bulk, random.Random(seed))
    populate(single, random.Random(seed))
    assert state_of(bulk) == state_of(single)
    for _ in range(6):
        tenant = rng.choice(("t1", "t2"))
        keys = rng.sample(names, rng.randint(1, 50)) + ["", "x" * 5000, "never"]
        keys += rng.sample(keys, 3)  # repeats, after or before their first removal
        rng.shuffle(keys)
        force = rng.random() < 0.5
        got = bulk.batch_remove(tenant, keys, force)
        want = [single.remove(tenant, key, force) for key in keys]
        assert got == want
        assert state_of(bulk) == state_of(single)
        bulk.check()
    assert any(code == OK for code in got)


def test_remove_all_and_by_pattern_leave_what_single_removes_do() -> None:
    bulk, _ = twin(1)
    single, _ = twin(1)
    names = populate(bulk, random.Random(1))
    populate(single, random.Random(1))
    code, count = bulk.remove_by_regex("t1", r"[13579]$")
    assert code == OK
    matching = [k for k in names if k[-1] in "13579"]
    assert count == sum(single.remove("t1", k) == OK for k in matching)
    assert state_of(bulk) == state_of(single)
    removed = bulk.remove_all("t2")
    assert removed == sum(single.remove("t2", k) == OK for k in names)
    assert state_of(bulk) == state_of(single)
    bulk.check()
    assert bulk.remove_all("t1", force=True) == sum(
        single.remove("t1", k, force=True) == OK for k in names
    )
    assert state_of(bulk) == state_of(single)
    bulk.check()


def test_objects_written_side_by_side_go_back_as_one_range() -> None:
    """A batch put places a part side by side; removing the batch gives the whole part back
    at once, and the segment ends with one free range."""
    service, _ = twin(2)
    keys = [f"p{i}" for i in range(64)]
    starts = service.batch_put_start("w", "t1", keys, [4 * KIB] * 64, ReplicateConfig())
    service.batch_put_end("w", "t1", keys, [s.write_id for s in starts])
    assert service.batch_remove("t1", keys) == [OK] * 64
    for mounted in service._state.segments.all_segments():  # noqa: SLF001
        if mounted.info.shared:
            continue  # its freed ranges wait for their capabilities to expire
        assert mounted.allocator.used_bytes == 0
        assert len(free_ranges(mounted.allocator)) == 1  # type: ignore[arg-type]
    service.check()
