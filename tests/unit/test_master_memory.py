"""The master's memory per object stays bounded, and its records share what they can.

Measured with :mod:`tracemalloc`, which counts the bytes the interpreter allocates exactly (the
same on every run of one interpreter build), so a bound in bytes is a size check, not a timing.
"""

from __future__ import annotations

import gc
import random
import tracemalloc

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.types import ReplicateConfig, SegmentInfo

OBJECTS = 20_000
VALUE_BYTES = 4096
BATCH = 1_000
# Measured: 429 B per object (key string, record with its tenant and key, replica, object
# table filed by key, eviction stamp and order, allocator entry holding the segment index) on
# CPython 3.11; with a (tenant, key) tuple per object and the rare fields in the record it
# took 517 B, and with the policy's own id-to-stamp dict, a segment index of its own and
# one-replica tuples 637 B. The bound leaves 10% for interpreter differences and stays below
# the 517 B layout.
MAX_BYTES_PER_OBJECT = 475


def make_service() -> tuple[MasterService, FakeClock]:
    clock = FakeClock(1000.0)
    service = MasterService(MasterConfig(), clock=clock, rng=random.Random(0))
    for i in range(2):
        info = SegmentInfo(
            id=f"seg-{i}",
            name=f"node-{i}",
            base=0x10000,
            size=OBJECTS * VALUE_BYTES,
            te_endpoint=f"127.0.0.1:{20000 + i}",
        )
        assert service.mount_segment(f"client-{i}", info) == ErrorCode.OK
    return service, clock


def write(service: MasterService, clock: FakeClock, first: int, count: int) -> None:
    """Write ``count`` objects in batches, each batch with its own (decoded-like) strings."""
    config = ReplicateConfig()
    for start in range(first, first + count, BATCH):
        keys = [f"key-{i:010d}" for i in range(start, min(start + BATCH, first + count))]
        writer = b"writer-0".decode()  # a new string per request, as the wire gives
        results = service.batch_put_start(writer, "", keys, [VALUE_BYTES] * len(keys), config)
        assert all(r.code == ErrorCode.OK for r in results)
        ids = [r.write_id for r in results]
        assert service.batch_put_end(writer, "", keys, ids) == [ErrorCode.OK] * len(keys)
        clock.advance(0.001)


def test_memory_per_object_stays_under_the_bound() -> None:
    service, clock = make_service()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        write(service, clock, 0, OBJECTS)
        gc.collect()
        per_object = (tracemalloc.get_traced_memory()[0] - before) / OBJECTS
    finally:
        tracemalloc.stop()
    service.check()
    assert per_object <= MAX_BYTES_PER_OBJECT, f"{per_object:.0f} B per object"


def test_records_share_their_id_and_writer_strings() -> None:
    service, clock = make_service()
    write(service, clock, 0, 2 * BATCH)
    service.batch_remove("", [f"key-{i:010d}" for i in range(10)])
    service.check()
    first = service.object_of("", "key-0000000010")
    last = service.object_of("", f"key-{2 * BATCH - 1:010d}")
    assert first is not None and last is not None
    assert service.object_of("", "key-0000000000") is None
    # The object table files the record under its key (no id tuple per object); the segment
    # index and the eviction policy hold the record itself.
    table = service._state.objects  # noqa: SLF001 - the layout is what is under test
    assert table._objects[first.key] is first  # noqa: SLF001
    assert all(isinstance(k, str) for k in table._objects)  # noqa: SLF001
    # The segment index is the allocator's map: the record takes the place of the size.
    segment = service._state.segments.get(first.replicas[0].segment_id)  # noqa: SLF001
    assert segment is not None
    assert segment.allocator.owner_of(first.replicas[0].offset) is first
    assert first.object_id in table.objects_on_segment(segment.info.id)
    policy = service._state.policy  # noqa: SLF001
    assert [r for r in policy.records() if r.object_id == first.object_id] == [first]
    assert first.lru_stamp >= 0 and not hasattr(policy, "_stamp_of")
    # Writers of different requests are one string; a single replica is held by the record
    # itself, not in a container.
    assert first.client_id is last.client_id
    assert first._replicas is first.replicas[0]  # noqa: SLF001
    assert isinstance(first.replicas, tuple)
    assert not hasattr(first, "__dict__")
    # The allocator answers the aligned size as the same int the records hold.
    assert segment.allocator.size_of(first.replicas[0].offset) is first.replicas[0].size
    assert segment.allocator.size_of(first.replicas[0].offset) == VALUE_BYTES
