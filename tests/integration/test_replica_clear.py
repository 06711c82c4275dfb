"""batch_replica_clear: a client drops its own unheld objects, or their replicas on one
segment, and the memory comes back at once; on shared memory and forced TCP, with digests."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator

import pytest

from mooncake_py import (
    AsyncMooncakeStore,
    InvalidParamsError,
    MooncakeDistributedStore,
    ReplicateConfig,
)
from mooncake_py.testing import InProcessMaster

MIB = 1 << 20


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def master() -> Iterator[InProcessMaster]:
    with InProcessMaster() as running:
        yield running
        running.service.check()


@pytest.fixture(params=["shm", "tcp"])
def stores(
    request: pytest.FixtureRequest, master: InProcessMaster
) -> Iterator[tuple[MooncakeDistributedStore, MooncakeDistributedStore]]:
    made = []
    for _ in range(2):
        store = MooncakeDistributedStore()
        config = {
            "local_hostname": "127.0.0.1",
            "metadata_server": "P2PHANDSHAKE",
            "global_segment_size": 32 * MIB,
            "master_server_address": master.address,
            "force_tcp": request.param == "tcp",
        }
        assert store.setup(config) == 0
        made.append(store)
    yield made[0], made[1]
    for store in made:
        store.close()


def _allocated(master: InProcessMaster) -> int:
    return master.service.stats()["allocated_bytes"]


def test_only_the_writers_unheld_objects_are_cleared(
    master: InProcessMaster, stores: tuple[MooncakeDistributedStore, MooncakeDistributedStore]
) -> None:
    a, b = stores
    value = bytes(range(256)) * 4096  # 1 MiB
    assert a.put("a/1", value) == 0
    assert a.put("a/2", value) == 0
    assert b.put("b/1", value) == 0
    before = _allocated(master)
    # Not written by a, missing, empty: skipped; a/1 cleared and its memory back at once.
    assert a.batch_replica_clear(["a/1", "b/1", "missing", ""]) == ["a/1"]
    assert _allocated(master) == before - len(value)
    assert a.is_exist("a/1") == 0
    assert _sha(b.get("b/1")) == _sha(value)
    # An is_exist hold protects a/2 (upstream: an unexpired lease) until a reads it.
    assert a.is_exist("a/2") == 1
    assert a.batch_replica_clear(["a/2"]) == []
    assert _sha(a.get("a/2")) == _sha(value)
    assert a.batch_replica_clear(["a/2"]) == ["a/2"]
    assert master.service.stats()["objects"] == 1
    assert _allocated(master) == before - 2 * len(value)


def test_clearing_the_replicas_on_one_segment(
    master: InProcessMaster, stores: tuple[MooncakeDistributedStore, MooncakeDistributedStore]
) -> None:
    a, b = stores
    value = b"\x5a" * MIB + b"tail"
    assert a.put("two", value, ReplicateConfig(replica_num=2)) == 0
    meta = master.service.object_of("default", "two")
    assert meta is not None and len(meta.replicas) == 2
    assert a.batch_replica_clear(["two"], segment_name="no-such-segment") == []
    assert a.batch_replica_clear(["two"], segment_name=b.get_hostname()) == ["two"]
    meta = master.service.object_of("default", "two")
    assert meta is not None and len(meta.replicas) == 1
    # The replica left is a's own: both clients read it byte-exact.
    assert _sha(b.get("two")) == _sha(value) == _sha(a.get("two"))
    assert a.batch_replica_clear(["two"], segment_name=a.get_hostname()) == ["two"]
    assert master.service.object_of("default", "two") is None
    assert _allocated(master) == 0


def test_bad_input(
    master: InProcessMaster, stores: tuple[MooncakeDistributedStore, MooncakeDistributedStore]
) -> None:
    a, _ = stores
    assert a.batch_replica_clear("not-a-list") == []  # type: ignore[arg-type]
    assert a.batch_replica_clear([1, 2]) == []  # type: ignore[list-item]
    assert a.batch_replica_clear(["k"], segment_name=None) == []  # type: ignore[arg-type]
    assert a.batch_replica_clear([]) == []
    assert a.batch_replica_clear(["k"] * 100_001) == []  # beyond the batch limit
    with pytest.raises(InvalidParamsError):
        a.client.batch_replica_clear("not-a-list")  # type: ignore[union-attr]
    assert a.put("k", b"v") == 0
    assert a.get("k") == b"v"
    never = MooncakeDistributedStore()
    assert never.batch_replica_clear(["k"]) == []  # not set up


def test_async_twin(master: InProcessMaster) -> None:
    async def run() -> list[str]:
        store = AsyncMooncakeStore()
        config = {
            "local_hostname": "127.0.0.1",
            "metadata_server": "P2PHANDSHAKE",
            "global_segment_size": 8 * MIB,
            "master_server_address": master.address,
        }
        assert await store.setup(config) == 0
        try:
            assert await store.put("x", b"payload") == 0
            return await store.batch_replica_clear(["x"])
        finally:
            await store.close()

    assert asyncio.run(run()) == ["x"]
