"""The upsert forms of the tensor-parallel writes replace every shard a key's earlier write
left, and batch reads of mismatched lists answer codes; on shared memory and forced TCP (needs
torch: ``make test-tensors``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from mooncake_py import AsyncMooncakeStore, MooncakeDistributedStore, ReplicateConfig
from mooncake_py.testing import InProcessMaster

torch = pytest.importorskip("torch")


@pytest.fixture
def master() -> Iterator[InProcessMaster]:
    with InProcessMaster() as running:
        yield running
        running.service.check()


def _config(address: str, force_tcp: bool, segment: int = 32 << 20) -> dict[str, object]:
    return {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": segment,
        "master_server_address": address,
        "force_tcp": force_tcp,
    }


@pytest.fixture(params=["shm", "tcp"])
def stores(
    request: pytest.FixtureRequest, master: InProcessMaster
) -> Iterator[tuple[MooncakeDistributedStore, MooncakeDistributedStore]]:
    owner, reader = MooncakeDistributedStore(), MooncakeDistributedStore()
    assert owner.setup(_config(master.address, False)) == 0
    assert reader.setup(_config(master.address, request.param == "tcp", 0)) == 0
    yield owner, reader
    reader.close()
    owner.close()


def test_upserts_replace_every_shard(
    stores: tuple[MooncakeDistributedStore, MooncakeDistributedStore],
) -> None:
    owner, reader = stores
    first = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    second = first * -1
    assert owner.put_tensor_with_tp("w", first, tp_size=2) == 0
    assert owner.put_tensor_with_tp("w", second, tp_size=2) == 0  # a put keeps the old bytes
    assert torch.equal(reader.get_tensor_with_tp("w", 1, 2), first.chunk(2)[1])
    assert owner.upsert_tensor_with_tp("w", second, tp_size=2) == 0
    for rank in range(2):
        assert torch.equal(reader.get_tensor_with_tp("w", rank, 2), second.chunk(2)[rank])
    third = second + 100
    config = ReplicateConfig(kv_sessions=[["s"]])
    assert owner.upsert_pub_tensor_with_tp("w", third, config, tp_size=2) == 0
    assert torch.equal(reader.get_tensor_with_tp("w", 0, 2), third.chunk(2)[0])
    keys = ["a", "b"]
    tensors = [torch.ones(4, 6), torch.zeros(4, 6, dtype=torch.int64)]
    assert owner.batch_put_tensor_with_tp(keys, tensors, tp_size=2, split_dim=1) == [0, 0]
    flipped = [t + 7 for t in tensors]
    assert owner.batch_upsert_tensor_with_tp(keys, flipped, tp_size=2, split_dim=1) == [0, 0]
    again = [t * 3 for t in flipped]
    tags = ReplicateConfig(kv_sessions=[["s"], ["s"]])
    assert owner.batch_upsert_pub_tensor_with_tp(keys, again, tags, tp_size=2, split_dim=1) == [
        0,
        0,
    ]
    for key, tensor in zip(keys, again, strict=True):
        assert torch.equal(reader.get_tensor_with_tp(key, 1, 2), tensor.chunk(2, dim=1)[1])
    # A dimension that does not divide: refused, nothing replaced.
    assert owner.upsert_tensor_with_tp("w", torch.ones(3, 3), tp_size=2) == -600
    assert torch.equal(reader.get_tensor_with_tp("w", 0, 2), third.chunk(2)[0])


def test_async_twin(master: InProcessMaster) -> None:
    async def run() -> bool:
        store = AsyncMooncakeStore()
        assert await store.setup(_config(master.address, False)) == 0
        try:
            tensor = torch.arange(12).reshape(4, 3)
            assert await store.upsert_tensor_with_tp("t", tensor, tp_size=2) == 0
            got = await store.get_tensor_with_tp("t", 1, 2)
            return bool(torch.equal(got, tensor.chunk(2)[1]))
        finally:
            await store.close()

    assert asyncio.run(run())


def test_batch_reads_into_mismatched_lists_answer_codes(
    stores: tuple[MooncakeDistributedStore, MooncakeDistributedStore],
) -> None:
    owner, _ = stores
    assert owner.put_tensor("m", torch.ones(4)) == 0
    assert owner.batch_get_tensor_into(["m", "n"], [0], [0]) == [-600, -600]
