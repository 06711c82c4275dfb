"""Replica copy and move tasks end to end: the client owning the source copies the bytes into
the target segment, the master attaches them (a move retires the source), and every read
afterwards is byte-exact; on shared memory and forced TCP."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator

import pytest

from mooncake_py import (
    AsyncMooncakeStore,
    ErrorCode,
    MooncakeDistributedStore,
    ReplicateConfig,
    TaskStatus,
    TaskType,
)
from mooncake_py.testing import InProcessMaster, wait_until

MIB = 1 << 20


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def master() -> Iterator[InProcessMaster]:
    with InProcessMaster() as running:
        yield running
        running.service.check()


def _setup(master: InProcessMaster, segment: int, force_tcp: bool) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    config = {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": segment,
        "master_server_address": master.address,
        "force_tcp": force_tcp,
    }
    assert store.setup(config) == 0
    return store


@pytest.fixture(params=["shm", "tcp"])
def pair(
    request: pytest.FixtureRequest, master: InProcessMaster
) -> Iterator[tuple[MooncakeDistributedStore, MooncakeDistributedStore]]:
    tcp = request.param == "tcp"
    a, b = _setup(master, 16 * MIB, tcp), _setup(master, 16 * MIB, tcp)
    yield a, b
    a.close()
    b.close()


def _finished(store: MooncakeDistributedStore, task_id: tuple[int, int]) -> TaskStatus:
    def done() -> bool:
        info, code = store.query_task(task_id)
        return code == 0 and info is not None and info.status >= TaskStatus.FAILED

    wait_until(done, 10.0, what="the task to finish")
    info, _ = store.query_task(task_id)
    assert info is not None
    return info.status


def _segments_of(master: InProcessMaster, key: str) -> set[str]:
    meta = master.service.object_of("default", key)
    assert meta is not None
    names = set()
    for replica in meta.replicas:
        mounted = master.service.segment_of(replica.segment_id)
        assert mounted is not None
        names.add(mounted.info.name)
    return names


def test_copy_then_read_the_copy_alone(
    master: InProcessMaster, pair: tuple[MooncakeDistributedStore, MooncakeDistributedStore]
) -> None:
    a, b = pair
    value = bytes(range(251)) * 8000  # 2 MB, not a multiple of a page
    assert a.put("obj", value, ReplicateConfig(preferred_segment=a.get_hostname())) == 0
    assert _segments_of(master, "obj") == {a.get_hostname()}
    task_id, code = b.create_copy_task("obj", [b.get_hostname()])
    assert code == 0 and task_id != (0, 0)
    info, code = b.query_task(task_id)
    assert code == 0 and info is not None and info.type == TaskType.REPLICA_COPY
    assert _finished(b, task_id) == TaskStatus.SUCCESS
    assert _segments_of(master, "obj") == {a.get_hostname(), b.get_hostname()}
    # Drop the original: what is left is the copy, and it reads back byte-exact.
    assert a.batch_replica_clear(["obj"], segment_name=a.get_hostname()) == ["obj"]
    assert _segments_of(master, "obj") == {b.get_hostname()}
    assert _sha(a.get("obj")) == _sha(value) == _sha(b.get("obj"))
    stats = master.service.stats()
    assert stats["replicated_objects"] == 1 and stats["replicated_bytes"] == len(value)


def test_move_frees_the_source(
    master: InProcessMaster, pair: tuple[MooncakeDistributedStore, MooncakeDistributedStore]
) -> None:
    a, b = pair
    value = b"\xa5" * (3 * MIB + 17)
    assert a.put("m", value, ReplicateConfig(preferred_segment=a.get_hostname())) == 0
    used_before = master.service.stats()["allocated_bytes"]
    task_id, code = a.create_move_task("m", a.get_hostname(), b.get_hostname())
    assert code == 0
    assert _finished(a, task_id) == TaskStatus.SUCCESS
    assert _segments_of(master, "m") == {b.get_hostname()}
    assert master.service.stats()["allocated_bytes"] == used_before  # moved, not doubled
    assert _sha(a.get("m")) == _sha(value)


def test_refusals(
    master: InProcessMaster, pair: tuple[MooncakeDistributedStore, MooncakeDistributedStore]
) -> None:
    a, b = pair
    bad = ErrorCode.INVALID_PARAMS
    assert a.put("k", b"v" * 1000) == 0
    assert a.create_copy_task("k", []) == ((0, 0), bad)
    assert a.create_copy_task("k", ["no-such-segment"]) == ((0, 0), bad)
    assert a.create_copy_task("missing", [b.get_hostname()]) == ((0, 0), ErrorCode.OBJECT_NOT_FOUND)
    assert a.create_copy_task("k", "not-a-list") == ((0, 0), bad)  # type: ignore[arg-type]
    host = a.get_hostname()
    assert a.create_move_task("k", host, host) == ((0, 0), bad)
    assert a.create_move_task("k", "no-such-segment", host) == ((0, 0), bad)
    assert a.query_task((1, 2)) == (None, ErrorCode.TASK_NOT_FOUND)
    assert a.query_task((-1, 2)) == (None, bad)
    assert a.query_task("nonsense") == (None, bad)  # type: ignore[arg-type]
    never = MooncakeDistributedStore()
    assert never.create_copy_task("k", [host]) == ((0, 0), bad)
    assert never.query_task((1, 2)) == (None, bad)


def test_one_task_per_object_at_a_time(
    master: InProcessMaster, pair: tuple[MooncakeDistributedStore, MooncakeDistributedStore]
) -> None:
    a, b = pair
    assert a.put("k", b"x" * MIB, ReplicateConfig(preferred_segment=a.get_hostname())) == 0
    first, code = a.create_copy_task("k", [b.get_hostname()])
    assert code == 0
    second = a.create_copy_task("k", [b.get_hostname()])
    # Unless the first finished in between (the worker polls every 0.2 s), it is refused.
    if second[1] != 0:
        assert second == ((0, 0), ErrorCode.OBJECT_HAS_REPLICATION_TASK)
    assert _finished(a, first) == TaskStatus.SUCCESS


def test_a_target_without_room_fails_the_task_and_leaks_nothing(
    master: InProcessMaster,
) -> None:
    a = _setup(master, 16 * MIB, False)
    small = _setup(master, 1 * MIB, False)
    try:
        assert (
            a.put("big", b"z" * (4 * MIB), ReplicateConfig(preferred_segment=a.get_hostname())) == 0
        )
        used = master.service.stats()["allocated_bytes"]
        task_id, code = a.create_copy_task("big", [small.get_hostname()])
        assert code == 0
        assert _finished(a, task_id) == TaskStatus.FAILED
        info, _ = a.query_task(task_id)
        assert info is not None and "no room" in info.message
        assert master.service.stats()["allocated_bytes"] == used
        assert _segments_of(master, "big") == {a.get_hostname()}
    finally:
        a.close()
        small.close()


def test_async_twins(master: InProcessMaster) -> None:
    owner = _setup(master, 16 * MIB, False)
    other = _setup(master, 16 * MIB, False)

    async def run() -> int:
        store = AsyncMooncakeStore()
        config = {
            "local_hostname": "127.0.0.1",
            "metadata_server": "P2PHANDSHAKE",
            "global_segment_size": 0,
            "master_server_address": master.address,
        }
        assert await store.setup(config) == 0
        try:
            assert (
                await store.put(
                    "k", b"payload", ReplicateConfig(preferred_segment=owner.get_hostname())
                )
                == 0
            )
            task_id, code = await store.create_copy_task("k", [other.get_hostname()])
            assert code == 0
            for _ in range(100):
                info, code = await store.query_task(task_id)
                if info is not None and info.status == TaskStatus.SUCCESS:
                    return code
                await asyncio.sleep(0.1)
            raise AssertionError("the task did not finish")
        finally:
            await store.close()

    try:
        assert asyncio.run(run()) == 0
    finally:
        owner.close()
        other.close()
