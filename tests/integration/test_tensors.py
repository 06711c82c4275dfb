"""Upstream's tensor calls (``put_tensor`` / ``get_tensor`` and their batch, zero-copy,
tensor-parallel, parallelism, ``pub`` and ``upsert`` forms) against a real in-process master
and real stores.

Writers and readers have no segment of their own: the bytes go to and come from a third
client's segment, over its mapped shared-memory file (``shm``) or its TCP transfer service
(``tcp``). One test reads tensors a child process wrote into its own segment. The objects
are compared byte for byte with digests of the objects upstream's wheel
(mooncake-transfer-engine-non-cuda 0.3.13.post1) stored for the same calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_py import (
    AsyncMooncakeStore,
    Client,
    ClientConfig,
    ErrorCode,
    MooncakeDistributedStore,
    MooncakeError,
    ReplicateConfig,
)
from mooncake_py.client.compat_tensor import TENSOR_CALLS, TensorCalls
from mooncake_py.client.compat_tensor_async import AsyncTensorCalls
from mooncake_py.client.tensor_parallel import ParallelAxis, ReadTarget, TensorParallelism
from mooncake_py.client.tensors import METADATA_SIZE
from mooncake_py.testing import InProcessMaster

torch = pytest.importorskip("torch")

MIB = 1 << 20
INVALID = int(ErrorCode.INVALID_PARAMS)

# The store class under test: MooncakeDistributedStore once it has the tensor calls among its
# bases, until then the same class with them mixed in first.
Store: type[Any] = (
    MooncakeDistributedStore
    if issubclass(MooncakeDistributedStore, TensorCalls)
    else type("Store", (TensorCalls, MooncakeDistributedStore), {})
)
AsyncStore: type[Any] = (
    AsyncMooncakeStore
    if issubclass(AsyncMooncakeStore, AsyncTensorCalls)
    else type("AsyncStore", (AsyncTensorCalls, AsyncMooncakeStore), {})
)

DTYPES = [
    torch.float32,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.uint16,
    torch.int32,
    torch.uint32,
    torch.int64,
    torch.uint64,
    torch.bool,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


def _config(address: str, segment_bytes: int, **extra: object) -> ClientConfig:
    return ClientConfig.from_mapping(
        {"master_server_addr": address, "global_segment_size": segment_bytes, **extra}
    )


@pytest.fixture(params=["shm", "tcp"])
def force_tcp(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "tcp")


@pytest.fixture
def owner(master: InProcessMaster) -> Iterator[Client]:
    with Client(_config(master.address, 128 * MIB)) as client:
        yield client


def _store(master: InProcessMaster, force_tcp: bool) -> Any:
    store = Store()
    assert store.setup_with_config(_config(master.address, 0, force_tcp=force_tcp)) == 0
    return store


@pytest.fixture
def writer(master: InProcessMaster, owner: Client, force_tcp: bool) -> Iterator[Any]:
    store = _store(master, force_tcp)
    yield store
    store.close()


@pytest.fixture
def reader(master: InProcessMaster, owner: Client, force_tcp: bool) -> Iterator[Any]:
    store = _store(master, force_tcp)
    yield store
    store.close()


def _sample(dtype: Any, shape: tuple[int, ...], seed: int = 0) -> Any:
    """Deterministic content of every dtype (random bits for floats, also NaN-free)."""
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=generator) * 4).to(dtype)
    info = torch.iinfo(dtype)
    low, high = max(info.min, -1000), min(info.max, 1000)
    return torch.randint(low, high, shape, generator=generator, dtype=torch.int64).to(dtype)


def _same(a: Any, b: Any) -> bool:
    """Same dtype, shape and bytes (torch.equal for dtypes it compares; float8 by bits)."""
    if a is None or b is None or a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))
    return bool(torch.equal(a, b))


def _no_read_leases(master: InProcessMaster, store: Any) -> bool:
    # The same thread's next call runs on the master after the reads' one-way ends.
    store.probe_key("missing")
    stats = master.service.stats()
    return stats["read_holds"] == 0 and stats["reads_in_flight"] == 0


def _tp(rank: int, size: int, split_dim: int) -> TensorParallelism:
    return TensorParallelism([ParallelAxis("tp", rank, size, split_dim)])


# ----------------------------------------------------------------------------------------------
# Whole tensors


@pytest.mark.parametrize(
    "shape", [(), (7,), (3, 5), (2, 3, 4), (1, 2, 1, 3, 1, 2, 1, 2)], ids=lambda s: f"{len(s)}d"
)
def test_round_trip_every_dtype(
    master: InProcessMaster, writer: Any, reader: Any, shape: tuple[int, ...]
) -> None:
    keys = [f"t-{str(d)}-{len(shape)}" for d in DTYPES]
    tensors = [_sample(d, shape, seed=i) for i, d in enumerate(DTYPES)]
    assert writer.batch_put_tensor(keys, tensors) == [0] * len(keys)
    got = reader.batch_get_tensor([*keys, "missing"])
    assert got[-1] is None
    for tensor, back in zip(tensors, got[:-1], strict=True):
        assert _same(back, tensor), tensor.dtype
    assert _same(reader.get_tensor(keys[0]), tensors[0])
    assert _no_read_leases(master, reader)


def test_layouts_are_stored_in_c_order(writer: Any, reader: Any) -> None:
    base = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    views = {
        "transposed": base.transpose(0, 2),
        "sliced": base[:, ::2, 1:],
        "big": _sample(torch.float16, (1024, 1536), seed=9),
    }
    for name, tensor in views.items():
        assert writer.put_tensor(name, tensor) == 0
        back = reader.get_tensor(name)
        assert _same(back, tensor) and back.is_contiguous()
    # The payload is the C-order bytes after the 304-byte header.
    raw = reader.get("transposed")
    assert raw[METADATA_SIZE:] == views["transposed"].contiguous().numpy().tobytes()
    assert reader.get_size("big") == METADATA_SIZE + 1024 * 1536 * 2


# The objects upstream 0.3.13.post1 stores for these calls: (length, sha256) per key.
UPSTREAM_OBJECTS = {
    "full": (400, "d602672f0868c9bd5406656f0e19c619ca303a277ee4a5d4d3ef1bfade4261d8"),
    "tp_tp_0": (352, "5a2dabde7a0ceef4cb321f35e07b40b198888a584df57f93be39a424ef97c5dd"),
    "tp_tp_1": (352, "7553d3ac0f90fcf3d96ac5b19a3846b222aaa6b980bb4e5fbe2328198cdab6f5"),
    "bf16": (324, "ba7b78d89485421209c38ac9f61c68f0301c6b4995e7dedf68059ce2f2815587"),
    "scalar": (308, "b95b6a52410be2724732b24e122ad34559f70974aeeae50e4cfc1d4b95aa6a80"),
    "noncontig": (400, "82f8490d06cd0a224296e6eb52cdcb42b095200d309940a232211e90e592ce4b"),
    "eight": (352, "197cd70fc04e76a93d1739d800561d0b8077814d0211b18a52b520c669f13312"),
    "bool": (307, "0e441ec49eb2750a3495b080c56d4ea69ca6accd24082c4fa754ef6f65d85cbb"),
    "fp8": (312, "2d16c89831cd49c6ad966a30279bccddf2a1afa10c46983580777651433075d5"),
    "par_tp_0": (352, "5a2dabde7a0ceef4cb321f35e07b40b198888a584df57f93be39a424ef97c5dd"),
    "par_tp_1": (352, "7553d3ac0f90fcf3d96ac5b19a3846b222aaa6b980bb4e5fbe2328198cdab6f5"),
    "par__parallelism_manifest": (
        96,
        "be901b35ba3bc6ac628e7ec27df76e0e0dfb1d678018c13111b07ec540a0a504",
    ),
    "mx__dp_1of2__tp_0of2_sd0": (
        328,
        "02f7e1856ecf917afedd9ffe4fceebbf1ccfcc8295663221b3dbc03474441cc7",
    ),
    "mx__parallelism_manifest": (
        96,
        "66d70fd4abc4570a7d9412131de81afa5cc39d7d30b5f55faf369a41ec5957ef",
    ),
    "ep__ep_0of2_eid5": (400, "8f16da7c873b9ebabfae29f3e189c2c53092fdc9061348e41999d33349a45974"),
    "pp__pp_1of3_sid2": (400, "6cbabb9976c25ffe2135e0cb54fa2d45c14a3dbe284a652b9a320b176448ea6e"),
}


def test_objects_are_upstreams_bytes(writer: Any, reader: Any) -> None:
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    assert writer.put_tensor("full", t) == 0
    assert writer.put_tensor_with_tp("tp", t, 0, 2, 1) == 0
    assert writer.put_tensor("bf16", torch.arange(10).to(torch.bfloat16).reshape(2, 5)) == 0
    assert writer.put_tensor("scalar", torch.tensor(3.5)) == 0
    assert writer.put_tensor("noncontig", t.t()) == 0
    eight = torch.arange(6, dtype=torch.int64).reshape(2, 1, 1, 1, 1, 1, 1, 3)
    assert writer.put_tensor("eight", eight) == 0
    assert writer.put_tensor("bool", torch.tensor([True, False, True])) == 0
    assert writer.put_tensor("fp8", torch.linspace(-2, 2, 8).to(torch.float8_e4m3fn)) == 0
    for rank in range(2):
        shard = t.chunk(2, 1)[rank].contiguous()
        assert writer.put_tensor_with_parallelism("par", shard, _tp(rank, 2, 1)) == 0
    mixed = TensorParallelism([ParallelAxis("dp", 1, 2), ParallelAxis("tp", 0, 2, 0)])
    assert writer.put_tensor_with_parallelism("mx", t.chunk(2, 0)[0].contiguous(), mixed) == 0
    expert = TensorParallelism([ParallelAxis("ep", 0, 2, expert_id=5)])
    assert writer.put_tensor_with_parallelism("ep", t, expert) == 0
    stage = TensorParallelism([ParallelAxis("pp", 1, 3, stage_id=2)])
    assert writer.put_tensor_with_parallelism("pp", t, stage) == 0
    for key, (length, digest) in UPSTREAM_OBJECTS.items():
        raw = reader.get(key)
        assert (len(raw), hashlib.sha256(raw).hexdigest()) == (length, digest), key
    # And they read back as what was written (a 0-d tensor stays 0-d).
    assert _same(reader.get_tensor("scalar"), torch.tensor(3.5))
    assert _same(reader.get_tensor("eight"), eight)
    assert _same(reader.get_tensor_with_parallelism("ep", ReadTarget("shard", expert)), t)


def test_put_keeps_and_upsert_replaces(writer: Any, reader: Any) -> None:
    first, second = torch.ones(4, 4), torch.full((2, 8), 7.0)
    assert writer.put_tensor("k", first) == 0
    assert writer.put_tensor("k", second) == 0  # first writer wins, as upstream
    assert _same(reader.get_tensor("k"), first)
    assert writer.upsert_tensor("k", second) == 0
    assert _same(reader.get_tensor("k"), second)
    assert writer.batch_upsert_tensor(["k", "k2"], [first, second]) == [0, 0]
    assert _same(reader.get_tensor("k"), first) and _same(reader.get_tensor("k2"), second)
    config = ReplicateConfig(replica_num=1)
    assert writer.upsert_pub_tensor("k", second, config) == 0
    assert writer.batch_upsert_pub_tensor(["k2"], [first], config) == [0]
    assert _same(reader.get_tensor("k"), second) and _same(reader.get_tensor("k2"), first)


def test_bad_values_answer_codes(master: InProcessMaster, writer: Any, reader: Any) -> None:
    t = torch.ones(3)
    assert writer.put_tensor("not-a-tensor", b"abc") == INVALID
    assert writer.put_tensor("complex", torch.ones(2, dtype=torch.complex64)) == INVALID
    assert writer.put_tensor("nine", torch.ones((1,) * 8 + (2,))) == INVALID
    assert writer.batch_put_tensor(["a", "b"], [t]) == [INVALID, INVALID]
    assert writer.batch_put_tensor([], []) == []
    assert writer.batch_put_tensor(["ok", "bad"], [t, "x"]) == [0, INVALID]
    assert _same(reader.get_tensor("ok"), t)
    bad = ReplicateConfig(replica_num=2, preferred_segments=["only-one"])
    assert writer.pub_tensor("p", t, bad) == INVALID
    assert writer.batch_pub_tensor(["p"], [t], bad) == [INVALID]
    # A value that is not a tensor object reads as None.
    assert writer.put("raw", b"x" * 400) == 0
    assert reader.get_tensor("raw") is None
    assert reader.get_tensor("missing") is None
    with pytest.raises(TypeError):
        writer.put_tensor_with_tp("k", t, 0, "2")
    # Before setup (and after close) nothing raises.
    idle = Store()
    assert idle.put_tensor("k", t) == INVALID
    assert idle.get_tensor("k") is None
    assert idle.batch_get_tensor(["k"]) == [None]
    assert idle.get_tensor_with_parallelism("k") is None
    assert _no_read_leases(master, reader)


def test_device_reads_into_a_host_tensor(writer: Any) -> None:
    # Upstream's tests read into a host tensor through these calls too: the bytes copied.
    assert writer.put_tensor("c", torch.arange(4, dtype=torch.float64)) == 0
    target = torch.empty(4, dtype=torch.float64)
    assert writer.get_tensor_into_cuda("c", target) == 32
    assert torch.equal(target, torch.arange(4, dtype=torch.float64))
    assert writer.batch_get_tensor_into_cuda(
        ["c", "d"], [torch.empty(4, dtype=torch.float64)] * 2
    ) == [
        32,
        -704,
    ]
    assert writer.get_tensor_into_cuda("c", torch.empty(4)) == INVALID  # another dtype
    assert writer.get_tensor_into_cuda("c", "not a tensor") == INVALID


def test_empty_tensors(writer: Any, reader: Any) -> None:
    # Upstream stores these as a header alone and reads them back.
    for key, tensor in (("e1", torch.zeros(0)), ("e2", torch.zeros(3, 0, dtype=torch.int16))):
        assert writer.put_tensor(key, tensor) == 0
        assert reader.get_size(key) == METADATA_SIZE
        assert _same(reader.get_tensor(key), tensor)
    digests = {
        "e1": "96e1119ed0d67b5b73dad0b29dffb20778515e7e8b4ae69e779cff9df4e9cdab",
        "e2": "fb458148a54353e30620f84599557f77d46c254ea3daf41221df2fbfe869feb9",
    }
    assert {k: hashlib.sha256(reader.get(k)).hexdigest() for k in digests} == digests


# ----------------------------------------------------------------------------------------------
# Zero copy


class Arena:
    """A registered host buffer of bytes."""

    def __init__(self, store: Any, size: int) -> None:
        self.tensor = torch.full((size,), 0xEE, dtype=torch.uint8)
        self.base = int(self.tensor.data_ptr())
        assert store.register_buffer(self.base, size) == 0


def test_into_and_from_registered_buffers(
    master: InProcessMaster, writer: Any, reader: Any
) -> None:
    tensors = [_sample(torch.bfloat16, (64, 96), 1), _sample(torch.int32, (3, 7, 5), 2)]
    assert writer.batch_put_tensor(["z0", "z1"], tensors) == [0, 0]
    arena = Arena(reader, 1 * MIB)
    got = reader.batch_get_tensor_into(
        ["z0", "z1", "missing"], [arena.base, arena.base + 65536, arena.base + 131072], [65536] * 3
    )
    assert got[2] is None
    for tensor, back, offset in zip(tensors, got[:2], (0, 65536), strict=True):
        assert _same(back, tensor)
        # A view of the caller's memory, just past the header.
        assert back.data_ptr() == arena.base + offset + METADATA_SIZE
    one = reader.get_tensor_into("z1", arena.base + 200_000, 4096)
    assert _same(one, tensors[1])
    assert reader.get_tensor_into("z0", arena.base, 100) is None  # too small
    assert _no_read_leases(master, reader)

    # The buffer now holds whole objects: write them back from there, zero copy.
    size0 = METADATA_SIZE + tensors[0].nbytes
    assert reader.put_tensor_from("copy0", arena.base, size0) == 0
    size1 = METADATA_SIZE + tensors[1].nbytes
    assert reader.batch_put_tensor_from(
        ["copy1", "short"], [arena.base + 65536, arena.base + 65536], [size1, size1 - 1]
    ) == [0, INVALID]
    assert _same(writer.get_tensor("copy0"), tensors[0])
    assert _same(writer.get_tensor("copy1"), tensors[1])
    assert reader.upsert_tensor_from("copy0", arena.base + 65536, size1) == 0
    assert reader.batch_upsert_tensor_from(["copy1"], [arena.base], [size0]) == [0]
    assert _same(writer.get_tensor("copy0"), tensors[1])
    assert _same(writer.get_tensor("copy1"), tensors[0])
    # Not registered, or not an object, is refused before anything is written.
    outside = torch.zeros(size0, dtype=torch.uint8)
    assert reader.put_tensor_from("x", int(outside.data_ptr()), size0) == INVALID
    assert reader.put_tensor_from("x", arena.base + 1, size0) == INVALID
    assert writer.get_tensor("x") is None


# ----------------------------------------------------------------------------------------------
# Tensor parallelism


def test_tensor_parallel_shards(master: InProcessMaster, writer: Any, reader: Any) -> None:
    weight = _sample(torch.float16, (8, 12), 3)
    assert writer.put_tensor_with_tp("w", weight, 0, 4, 1) == 0
    chunks = weight.chunk(4, 1)
    for rank in range(4):
        assert _same(reader.get_tensor(f"w_tp_{rank}"), chunks[rank])
        assert _same(reader.get_tensor_with_tp("w", rank, 4, 1), chunks[rank])
    assert reader.get_tensor("w") is None  # only the shards are stored
    assert writer.put_tensor_with_tp("odd", weight, 0, 5, 1) == INVALID  # not uniform
    assert writer.put_tensor_with_tp("one", weight, 0, 1, 1) == 0
    assert _same(reader.get_tensor_with_tp("one"), weight)

    # Parallelism reads of these shards (no manifest): whole, as stored, re-cut.
    whole = reader.get_tensor_with_parallelism("w", ReadTarget("full", _tp(0, 2, 1)))
    assert _same(whole, weight)
    for rank, size in ((3, 4), (1, 2), (5, 6)):
        got = reader.get_tensor_with_parallelism("w", ReadTarget("shard", _tp(rank, size, 1)))
        assert _same(got, weight.chunk(size, 1)[rank])

    others = [_sample(torch.float32, (6, 4), 4), _sample(torch.int64, (6,), 5)]
    assert writer.batch_put_tensor_with_tp(["b0", "b1"], others, 0, 3, 0) == [0, 0]
    for rank in range(3):
        got = reader.batch_get_tensor_with_tp(["b0", "b1", "none"], rank, 3)
        assert got[2] is None
        assert all(_same(g, o.chunk(3, 0)[rank]) for g, o in zip(got, others, strict=False))
    arena = Arena(reader, 65536)
    one = reader.get_tensor_with_tp_into("w", arena.base, 4096, 2, 4, 1)
    assert _same(one, chunks[2]) and one.data_ptr() == arena.base + METADATA_SIZE
    both = reader.batch_get_tensor_with_tp_into(
        ["b0", "b1"], [arena.base + 8192, arena.base + 16384], [4096, 4096], 1, 3
    )
    assert _same(both[0], others[0].chunk(3, 0)[1]) and _same(both[1], others[1].chunk(3, 0)[1])

    # From a registered full object: cut into shards.
    size = METADATA_SIZE + weight.nbytes
    assert reader.get_tensor_into("one", arena.base + 32768, size) is not None
    assert reader.put_tensor_with_tp_from("wf", arena.base + 32768, size, 0, 2, 0) == 0
    assert reader.batch_put_tensor_with_tp_from(["wg"], [arena.base + 32768], [size], 0, 3, 1) == [
        0
    ]
    assert _same(writer.get_tensor_with_tp("wf", 1, 2), weight.chunk(2, 0)[1])
    assert _same(writer.get_tensor_with_tp("wg", 2, 3), weight.chunk(3, 1)[2])
    assert _no_read_leases(master, reader)


def test_parallelism_writes_and_reads(master: InProcessMaster, writer: Any, reader: Any) -> None:
    full = _sample(torch.bfloat16, (6, 12), 6)
    # Two writers, one shard each (the second store plays the other rank).
    for rank, store in enumerate((writer, reader)):
        shard = full.chunk(2, 1)[rank].contiguous()
        assert store.put_tensor_with_parallelism("p", shard, _tp(rank, 2, 1)) == 0
    whole = reader.get_tensor_with_parallelism("p", ReadTarget("full", _tp(0, 2, 1)))
    assert _same(whole, full)
    for size in (2, 3, 4):  # as stored, and re-cut for other tp sizes
        for rank in range(size):
            got = reader.get_tensor_with_parallelism("p", ReadTarget("shard", _tp(rank, size, 1)))
            assert _same(got, full.chunk(size, 1)[rank]), (rank, size)
    assert reader.get_tensor_with_parallelism("p", ReadTarget("shard", _tp(0, 5, 1))) is None
    assert reader.get_tensor_with_parallelism("p", ReadTarget("as_stored", _tp(0, 2, 1))) is None
    assert reader.get_tensor_with_parallelism("p", ReadTarget("shard")) is None

    arena = Arena(reader, 65536)
    into = reader.get_tensor_with_parallelism_into(
        "p", arena.base, 65536, ReadTarget("full", _tp(1, 2, 1))
    )
    assert _same(into, full) and into.data_ptr() == arena.base + METADATA_SIZE
    shard = reader.get_tensor_with_parallelism_into(
        "p", arena.base + 32768, 4096, ReadTarget("shard", _tp(1, 2, 1))
    )
    assert _same(shard, full.chunk(2, 1)[1])
    assert (
        reader.get_tensor_with_parallelism_into(
            "p", arena.base, 100, ReadTarget("full", _tp(0, 2, 1))
        )
        is None
    )

    # Batches, whole tensors (no parallelism), multi-axis and expert shards.
    plain = _sample(torch.float32, (4, 4), 7)
    mixed = TensorParallelism([ParallelAxis("dp", 0, 2), ParallelAxis("tp", 1, 2, 0)])
    expert = TensorParallelism([ParallelAxis("ep", 1, 4, expert_id=3)])
    assert writer.batch_put_tensor_with_parallelism(
        ["plain", "mixed", "expert"], [plain, plain, plain], [None, mixed, expert]
    ) == [0, 0, 0]
    got = reader.batch_get_tensor_with_parallelism(
        ["plain", "mixed", "expert"],
        [None, ReadTarget("shard", mixed), ReadTarget("shard", expert)],
    )
    assert _same(got[0], plain) and _same(got[1], plain.chunk(2, 0)[1]) and _same(got[2], plain)
    assert _same(reader.get_tensor("mixed__dp_0of2__tp_1of2_sd0"), plain.chunk(2, 0)[1])
    # Batch forms take lists (or None), as upstream.
    single = ReadTarget("shard", expert)
    assert reader.batch_get_tensor_with_parallelism(["expert"], single) == [None]
    assert writer.batch_put_tensor_with_parallelism(["x"], [plain], expert) == [INVALID]
    # A shard with other axes than asked for is not an answer.
    other = TensorParallelism([ParallelAxis("ep", 1, 4, expert_id=4)])
    assert reader.get_tensor_with_parallelism("expert", ReadTarget("shard", other)) is None
    # Writer partitions are not supported here; invalid axes are refused.
    assert writer.put_tensor_with_parallelism("wp", plain, None, None, {"rank": 0}) == INVALID
    bad = TensorParallelism([ParallelAxis("tp", 2, 2, 0)])
    assert writer.put_tensor_with_parallelism("bad", plain, bad) == INVALID
    assert writer.put_tensor_with_parallelism("bad", plain, TensorParallelism()) == INVALID

    # From registered memory, and upserts.
    size = METADATA_SIZE + plain.nbytes
    assert reader.get_tensor_into("plain", arena.base, size) is not None
    assert reader.put_tensor_with_parallelism_from("pf", arena.base, size, _tp(0, 2, 0)) == 0
    assert _same(writer.get_tensor("pf_tp_0"), plain)
    assert reader.upsert_tensor_with_parallelism_from("pf", arena.base, size, _tp(0, 2, 1)) == 0
    assert reader.batch_upsert_tensor_with_parallelism(["p"], [plain], [_tp(0, 2, 0)]) == [0]
    assert _same(writer.get_tensor("p_tp_0"), plain)
    assert reader.batch_put_tensor_with_parallelism_from(["pg"], [arena.base], [size], None) == [0]
    assert reader.batch_upsert_tensor_with_parallelism_from(["pg"], [arena.base], [size]) == [0]
    assert _same(writer.get_tensor("pg"), plain)
    assert _no_read_leases(master, reader)


def test_session_tags_follow_the_shards(writer: Any, reader: Any) -> None:
    weight = _sample(torch.float32, (4, 8), 8)
    tagged = ReplicateConfig(kv_sessions=[["conv-1"]])
    assert writer.pub_tensor_with_tp("kv", weight, tagged, 0, 4, 1) == 0
    by_writer = ReplicateConfig(session_ids=["conv-2", ""])
    assert writer.batch_pub_tensor_with_tp(["a", "b"], [weight, weight], by_writer, 0, 2, 0) == [
        0,
        0,
    ]
    assert writer.pub_tensor("whole", weight, ReplicateConfig(kv_sessions=[["conv-2"]])) == 0
    for rank in range(2):
        shard = weight.chunk(2, 0)[rank].contiguous()
        cfg = ReplicateConfig(session_ids=["conv-3"])
        assert writer.put_tensor_with_parallelism("p", shard, _tp(rank, 2, 0), cfg) == 0
    assert writer.pub_tensor("mismatch", weight, ReplicateConfig(kv_sessions=[[], []])) == INVALID

    assert set(reader.list_kv_session_keys("conv-1").keys) == {f"kv_tp_{r}" for r in range(4)}
    assert set(reader.list_kv_session_keys("conv-2").keys) == {"a_tp_0", "a_tp_1", "whole"}
    assert set(reader.list_kv_session_keys("conv-3").keys) == {
        "p_tp_0",
        "p_tp_1",
        "p__parallelism_manifest",
    }
    assert _same(reader.get_tensor_with_tp("b", 1, 2), weight.chunk(2, 0)[1])  # untagged
    # Per-key groups go with the sessions, shard by shard.
    grouped = ReplicateConfig(kv_sessions=[["conv-4"], ["conv-5"]], group_ids=["g1", "g2"])
    assert writer.batch_pub_tensor_with_tp(["ga", "gb"], [weight] * 2, grouped, 0, 2, 1) == [0, 0]
    assert set(reader.list_kv_session_keys("conv-4").keys) == {"ga_tp_0", "ga_tp_1"}
    assert set(reader.list_kv_session_keys("conv-5").keys) == {"gb_tp_0", "gb_tp_1"}
    # A key that fails before writing takes its tags and group with it, not its neighbour's.
    filtered = ReplicateConfig(kv_sessions=[["conv-6"], ["conv-7"]], group_ids=["bad", "good"])
    result = writer.batch_pub_tensor(["bad", "good"], [None, weight], filtered)
    assert result[0] != 0 and result[1] == 0
    assert reader.list_kv_session_keys("conv-7").keys == ["good"]
    with pytest.raises(MooncakeError, match="SESSION_NOT_FOUND"):
        reader.get_kv_session("conv-6")
    # Releasing a session takes its tensors whole.
    reader.release_kv_session("conv-3")
    assert reader.get_tensor_with_parallelism("p", ReadTarget("full", _tp(0, 2, 0))) is None
    assert reader.batch_get_tensor(["p_tp_0", "p_tp_1"]) == [None, None]
    assert reader.get("p__parallelism_manifest") == b""
    reader.release_kv_session("conv-1")
    assert all(reader.get_tensor_with_tp("kv", r, 4) is None for r in range(4))
    assert _same(reader.get_tensor("a_tp_0"), weight.chunk(2, 0)[0])


def test_async_twin_has_every_tensor_call() -> None:
    assert len(TENSOR_CALLS) == 44
    for name in TENSOR_CALLS:
        call = getattr(AsyncStore, name)
        assert inspect.iscoroutinefunction(call), name
        assert inspect.signature(call) == inspect.signature(getattr(TensorCalls, name)), name


def test_async_store(master: InProcessMaster, owner: Client, force_tcp: bool) -> None:
    async def run() -> None:
        async with AsyncStore(_store(master, force_tcp)) as store:
            tensor = _sample(torch.int16, (5, 5), 10)
            assert await store.put_tensor_with_tp("a", tensor, 0, 5, 0) == 0
            assert await store.batch_put_tensor(["b"], [tensor]) == [0]
            got = await store.batch_get_tensor_with_tp(["a"], 3, 5)
            assert _same(got[0], tensor.chunk(5, 0)[3])
            assert _same(await store.get_tensor("b"), tensor)

    asyncio.run(run())


# ----------------------------------------------------------------------------------------------
# Across processes

CHILD = textwrap.dedent(
    """
    import sys
    import torch
    from mooncake_py import ClientConfig, MooncakeDistributedStore, ReplicateConfig
    from mooncake_py.client.compat_tensor import TensorCalls

    Store = (
        MooncakeDistributedStore
        if issubclass(MooncakeDistributedStore, TensorCalls)
        else type("Store", (TensorCalls, MooncakeDistributedStore), {})
    )
    address, force_tcp = sys.argv[1], sys.argv[2] == "1"
    store = Store()
    config = {"master_server_addr": address, "global_segment_size": 64 << 20,
              "force_tcp": force_tcp}
    assert store.setup_with_config(ClientConfig.from_mapping(config)) == 0
    g = torch.Generator().manual_seed(11)
    weight = torch.randn((16, 32), generator=g).to(torch.bfloat16)
    ids = torch.randint(0, 1 << 30, (1000,), generator=g, dtype=torch.int64)
    local = ReplicateConfig(preferred_segment=store.get_hostname())
    assert store.pub_tensor_with_tp("child-w", weight, local, 0, 4, 1) == 0
    assert store.pub_tensor("child-ids", ids, local) == 0
    print("ready", flush=True)
    sys.stdin.readline()
    store.close()
    """
)


def test_tensors_written_by_another_process(master: InProcessMaster, force_tcp: bool) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, master.address, "1" if force_tcp else "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        reader = _store(master, force_tcp)
        try:
            g = torch.Generator().manual_seed(11)
            weight = torch.randn((16, 32), generator=g).to(torch.bfloat16)
            ids = torch.randint(0, 1 << 30, (1000,), generator=g, dtype=torch.int64)
            for rank in range(4):
                assert _same(
                    reader.get_tensor_with_tp("child-w", rank, 4, 1), weight.chunk(4, 1)[rank]
                )
            assert _same(reader.get_tensor("child-ids"), ids)
            arena = Arena(reader, 65536)
            into = reader.get_tensor_into("child-ids", arena.base, 65536)
            assert _same(into, ids)
            assert _no_read_leases(master, reader)
        finally:
            reader.close()
        child.stdin.write("done\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
