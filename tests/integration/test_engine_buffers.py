"""What engines read back besides bytes, against a real in-process master and real clients:
``get_buffer`` handles (LMCache's metadata mode wraps them with ``torch.frombuffer``), replica
descriptors (vLLM's tier logging) and the ``ReplicateConfig`` fields they set (SGLang's
``session_ids``).

Readers and writers have no segment of their own: the bytes live in a third client's segment
and are read over its mapped shared-memory file (``shm``) or its TCP transfer service
(``tcp``), so both data paths are exercised on one host.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from mooncake_py import (
    AsyncClient,
    AsyncMooncakeStore,
    BufferHandle,
    Client,
    ClientConfig,
    ErrorCode,
    InvalidParamsError,
    MooncakeDistributedStore,
    NotFoundError,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
)
from mooncake_py.testing import InProcessMaster, wait_until

MIB = 1 << 20
INVALID = int(ErrorCode.INVALID_PARAMS)
SIZES = [1, 4096, MIB + 17]


def _config(address: str, segment_bytes: int, **extra: object) -> ClientConfig:
    return ClientConfig.from_mapping(
        {"master_server_addr": address, "global_segment_size": segment_bytes, **extra}
    )


def _sha(data: Any) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


def _values(seed: int, sizes: list[int] = SIZES) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for size in sizes]


def _no_read_leases(master: InProcessMaster) -> bool:
    stats = master.service.stats()
    return stats["read_holds"] == 0 and stats["reads_in_flight"] == 0


def _assert_nothing_held(store: MooncakeDistributedStore, master: InProcessMaster) -> None:
    """The reads of ``store`` end one-way; its next call from this thread runs on the master
    after them, so once it answered, no read of this thread may still hold anything."""
    assert store.probe_key("missing") == 0
    assert _no_read_leases(master)


@pytest.fixture
def master() -> Iterator[InProcessMaster]:
    with InProcessMaster() as running:
        yield running
        running.service.check()


@pytest.fixture(params=["shm", "tcp"])
def force_tcp(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "tcp")


@pytest.fixture
def owner(master: InProcessMaster) -> Iterator[Client]:
    with Client(_config(master.address, 64 * MIB)) as client:
        yield client


@pytest.fixture
def store(
    master: InProcessMaster, owner: Client, force_tcp: bool
) -> Iterator[MooncakeDistributedStore]:
    store = MooncakeDistributedStore()
    assert store.setup_with_config(_config(master.address, 0, force_tcp=force_tcp)) == 0
    yield store
    store.close()


def _put(store: MooncakeDistributedStore, keys: list[str], values: list[bytes]) -> None:
    assert store.put_batch(keys, values) == 0


# -- get_buffer ------------------------------------------------------------------------------


def test_get_buffer_returns_writable_handles_of_their_own(
    master: InProcessMaster, store: MooncakeDistributedStore
) -> None:
    keys = [f"buf-{size}" for size in SIZES]
    values = _values(1)
    _put(store, keys, values)
    for key, value in zip(keys, values, strict=True):
        handle = store.get_buffer(key)
        assert isinstance(handle, BufferHandle)
        assert handle.size() == len(handle) == len(value)
        assert _sha(handle) == _sha(value)
        assert _sha(ctypes.string_at(handle.ptr(), handle.size())) == _sha(value)
        view = memoryview(handle)
        assert not view.readonly and view.format == "B" and view.ndim == 1
        array = np.frombuffer(handle, np.uint8)
        assert array.flags.writeable and array.ctypes.data == handle.ptr()
        array[0] ^= 0xFF  # the handle is the caller's copy: the stored value does not change
        assert handle[0] == value[0] ^ 0xFF
        assert _sha(store.get(key)) == _sha(value)
    _assert_nothing_held(store, master)
    assert store.remove(keys[0]) == 0  # nothing was left holding the object


def test_batch_get_buffer_answers_none_for_misses(
    master: InProcessMaster, store: MooncakeDistributedStore
) -> None:
    values = _values(2, [5000, 70_000])
    _put(store, ["b1", "b2"], values)
    handles = store.batch_get_buffer(["b2", "missing", "b1"])
    assert [h is None for h in handles] == [False, True, False]
    assert [_sha(h) for h in handles if h is not None] == [_sha(values[1]), _sha(values[0])]
    assert store.get_buffer("missing") is None
    assert store.batch_get_buffer([]) == []
    assert handles[0] is not None and handles[2] is not None
    assert handles[0].ptr() != handles[2].ptr()
    _assert_nothing_held(store, master)


def test_handles_keep_what_was_read_after_the_key_changes(
    store: MooncakeDistributedStore,
) -> None:
    old, new = _values(3, [MIB, MIB])
    assert store.put("changing", old) == 0
    handle = store.get_buffer("changing")
    assert store.upsert("changing", new) == 0
    assert handle is not None and _sha(handle) == _sha(old)
    assert _sha(store.get("changing")) == _sha(new)


def test_handles_have_a_fixed_size(store: MooncakeDistributedStore) -> None:
    assert store.put("fixed", b"abcdef") == 0
    handle = store.get_buffer("fixed")
    assert handle is not None
    ptr = handle.ptr()
    handle[0:2] = b"AB"  # same-length writes are fine
    with pytest.raises(BufferError):
        handle.extend(b"more")
    with pytest.raises(BufferError):
        handle[0:2] = b"A"
    assert bytes(handle) == b"ABcdef" and handle.ptr() == ptr


def test_torch_frombuffer_takes_a_handle(store: MooncakeDistributedStore) -> None:
    torch = pytest.importorskip("torch")
    (value,) = _values(4, [4096])
    assert store.put("tensor", value) == 0
    handle = store.get_buffer("tensor")
    assert handle is not None
    tensor = torch.frombuffer(handle, dtype=torch.uint8)
    assert tensor.numel() == len(value) and _sha(tensor.numpy()) == _sha(value)
    assert torch.frombuffer(handle, dtype=torch.int32).numel() == len(value) // 4
    # LMCache's metadata mode: a header, then the payload wrapped in place.
    payload = torch.frombuffer(handle, dtype=torch.uint8, offset=64, count=len(value) - 64)
    assert _sha(payload.numpy()) == _sha(value[64:])


def test_a_header_and_payload_can_be_wrapped_in_place(store: MooncakeDistributedStore) -> None:
    header, payload = _values(11, [64, 100_000])
    assert store.put_parts("with-meta", header, memoryview(payload)) == 0
    (handle,) = store.batch_get_buffer(["with-meta"])
    assert handle is not None
    view = memoryview(handle)
    assert bytes(view[:64]) == header and len(view) == 64 + len(payload)
    wrapped = np.frombuffer(handle, np.uint8, offset=64, count=len(payload))
    assert wrapped.flags.writeable and _sha(wrapped) == _sha(payload)


def test_typed_and_async_handles(master: InProcessMaster, owner: Client, force_tcp: bool) -> None:
    values = _values(5, [3000, 2 * MIB])
    owner.put_batch(["t1", "t2"], values).unwrap()
    with Client(_config(master.address, 0, force_tcp=force_tcp)) as client:
        handle = client.get_buffer_handle("t2")
        assert isinstance(handle, BufferHandle) and _sha(handle) == _sha(values[1])
        with pytest.raises(NotFoundError):
            client.get_buffer_handle("missing")
        result = client.batch_get_buffer_handle(["t1", "missing"])
        assert result.codes == [0, int(ErrorCode.OBJECT_NOT_FOUND)]
        assert _sha(result.values[0]) == _sha(values[0])

        async def run() -> None:
            typed = AsyncClient(client)
            handle = await typed.get_buffer_handle("t1")
            assert _sha(handle) == _sha(values[0])
            batch = await typed.batch_get_buffer_handle(["t2"])
            assert _sha(batch.values[0]) == _sha(values[1])
            drop_in = MooncakeDistributedStore()
            assert drop_in.setup_with_config(client.config) == 0
            async with AsyncMooncakeStore(drop_in) as wrapped:
                one = await wrapped.get_buffer("t2")
                assert isinstance(one, BufferHandle) and _sha(one) == _sha(values[1])
                many = await wrapped.batch_get_buffer(["t1", "missing"])
                assert many[1] is None and _sha(many[0]) == _sha(values[0])

        asyncio.run(run())
    # The async twins ran on other threads, whose one-way ends are ordered on their own.
    wait_until(lambda: _no_read_leases(master), what="every read ended")


# -- session_ids -----------------------------------------------------------------------------


class Arena:
    """A registered numpy buffer of random bytes."""

    def __init__(self, store: MooncakeDistributedStore, size: int, seed: int) -> None:
        self.array = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
        self.base = int(self.array.ctypes.data)
        assert store.register_buffer(self.base, size) == 0

    def bytes(self, offset: int, size: int) -> bytes:
        return self.array[offset : offset + size].tobytes()


def _session_keys(store: MooncakeDistributedStore, session_id: str) -> list[str]:
    return store.list_kv_session_keys(session_id).keys


def test_session_ids_tag_writes_with_their_sessions(store: MooncakeDistributedStore) -> None:
    arena = Arena(store, 4 * MIB, seed=6)
    keys = ["p0", "p1", "p2"]
    ptrs = [arena.base, arena.base + MIB, arena.base + 2 * MIB + 5]
    sizes = [4096, MIB, 700_001]
    config = ReplicateConfig(session_ids=["s1"] * len(keys))
    assert store.batch_put_from(keys, ptrs, sizes, config) == [0, 0, 0]
    assert _session_keys(store, "s1") == sorted(keys)
    for key, ptr, size in zip(keys, ptrs, sizes, strict=True):
        assert _sha(store.get(key)) == _sha(arena.bytes(ptr - arena.base, size))

    # Multi-buffer writes (SGLang's v2 path), per-key ids with "" untagged, and both fields.
    both = ReplicateConfig(session_ids=["s2", ""], kv_sessions=[["k1"], ["k1"]])
    parts = [[arena.base, arena.base + 3 * MIB], [arena.base + 100]]
    part_sizes = [[1000, 2000], [50_000]]
    assert store.batch_put_from_multi_buffers(["m0", "m1"], parts, part_sizes, both) == [0, 0]
    assert _session_keys(store, "s2") == ["m0"]
    assert _session_keys(store, "k1") == ["m0", "m1"]
    gathered = arena.bytes(0, 1000) + arena.bytes(3 * MIB, 2000)
    assert _sha(store.get("m0")) == _sha(gathered)

    # Single writes take exactly one entry.
    assert store.put("single", b"v" * 10, ReplicateConfig(session_ids=["s3"])) == 0
    assert store.put_from("single2", arena.base, 10, ReplicateConfig(session_ids=["s3"])) == 0
    assert _session_keys(store, "s3") == ["single", "single2"]


def test_session_ids_of_the_wrong_length_fail_every_key(
    master: InProcessMaster, store: MooncakeDistributedStore
) -> None:
    arena = Arena(store, MIB, seed=7)
    wrong = ReplicateConfig(session_ids=["s"])
    assert store.batch_put_from(["a", "b"], [arena.base, arena.base + 10], [10, 10], wrong) == [
        INVALID,
        INVALID,
    ]
    assert store.put_batch(["a", "b"], [b"1", b"2"], wrong) == INVALID
    assert store.batch_is_exist(["a", "b"]) == [0, 0]
    with Client(_config(master.address, 0)) as client, pytest.raises(InvalidParamsError):
        client.batch_put_from(["a", "b"], [arena.base, arena.base + 10], [10, 10], wrong)


def test_writes_asking_for_tiers_this_store_lacks_fail(store: MooncakeDistributedStore) -> None:
    assert store.put("nof", b"x", ReplicateConfig(nof_replica_num=1)) == INVALID
    config = ReplicateConfig()
    config.dfs_replica_num = 1
    assert store.put_batch(["dfs"], [b"x"], config) == INVALID
    assert store.batch_is_exist(["nof", "dfs"]) == [0, 0]


# -- replica descriptors ---------------------------------------------------------------------


def _owner_base(owner: Client) -> int:
    (mine,) = [s.segment for s in owner.segments() if s.segment.name == owner.hostname]
    return mine.base


def test_replica_descriptors_locate_the_bytes(
    master: InProcessMaster, owner: Client, store: MooncakeDistributedStore
) -> None:
    keys = ["r-small", "r-big"]
    values = _values(8, [123, 3 * MIB])
    _put(store, keys, values)
    base = _owner_base(owner)
    for key, value in zip(keys, values, strict=True):
        (replica,) = store.get_replica_desc(key)
        assert isinstance(replica, ReplicaDescriptor)
        assert replica.is_memory_replica() and not replica.is_disk_replica()
        assert not replica.is_local_disk_replica()
        assert replica.status == ReplicaStatus.COMPLETE
        buffer = replica.get_memory_descriptor().buffer_descriptor
        assert buffer.size == len(value)
        assert buffer.segment_name == owner.hostname and buffer.transport_endpoint
        # The owner lives in this process: its segment is mapped at ``base``.
        assert base <= buffer.buffer_address < base + 64 * MIB
        assert _sha(ctypes.string_at(buffer.buffer_address, buffer.size)) == _sha(value)
        with pytest.raises(RuntimeError):
            replica.get_disk_descriptor()
    assert store.get_replica_desc("missing") == []
    # A probe holds nothing: a plain remove succeeds right after it.
    _assert_nothing_held(store, master)
    assert store.remove("r-small") == 0


def test_batch_replica_descriptors_as_vllm_reads_them(
    master: InProcessMaster, store: MooncakeDistributedStore
) -> None:
    keys = ["z-page", "a-page", "m-page"]
    _put(store, keys, _values(9, [10, 20, 30]))
    found = store.batch_get_replica_desc(["z-page", "missing", "a-page", "m-page"])
    assert list(found) == ["a-page", "m-page", "z-page"]  # found keys only, in key order
    sizes = {k: d[0].get_memory_descriptor().buffer_descriptor.size for k, d in found.items()}
    assert sizes == {"a-page": 20, "m-page": 30, "z-page": 10}

    # vLLM's tier logging: the first descriptor of each key decides its tier.
    def tier(key: str) -> str:
        descriptors = found.get(key)
        if not descriptors:
            return "unknown"
        if descriptors[0].is_memory_replica():
            return "memory"
        return "disk" if descriptors[0].is_disk_replica() else "unknown"

    assert [tier(k) for k in ["a-page", "missing"]] == ["memory", "unknown"]
    assert store.batch_get_replica_desc([]) == {}
    _assert_nothing_held(store, master)
    assert store.batch_remove(keys) == [0, 0, 0]


def test_every_replica_is_described(master: InProcessMaster, force_tcp: bool) -> None:
    with (
        Client(_config(master.address, 16 * MIB)) as first,
        Client(_config(master.address, 16 * MIB)) as second,
        Client(_config(master.address, 0, force_tcp=force_tcp)) as reader,
    ):
        (value,) = _values(10, [MIB])
        reader.put("twice", value, ReplicateConfig(replica_num=2))
        replicas = reader.get_replica_desc("twice")
        names = sorted(r.get_memory_descriptor().buffer_descriptor.segment_name for r in replicas)
        assert names == sorted([first.hostname, second.hostname])
        for replica in replicas:
            buffer = replica.get_memory_descriptor().buffer_descriptor
            assert _sha(ctypes.string_at(buffer.buffer_address, buffer.size)) == _sha(value)
        with pytest.raises(NotFoundError):
            reader.get_replica_desc("missing")
        result = reader.batch_get_replica_desc(["twice", "missing"])
        assert result.codes == [0, int(ErrorCode.OBJECT_NOT_FOUND)]
        assert result.values[0] is not None and len(result.values[0]) == 2
        assert _sha(reader.get("twice")) == _sha(value)

        async def run() -> None:
            typed = AsyncClient(reader)
            assert len(await typed.get_replica_desc("twice")) == 2
            assert (await typed.batch_get_replica_desc(["twice"])).codes == [0]
            drop_in = MooncakeDistributedStore()
            assert drop_in.setup_with_config(reader.config) == 0
            async with AsyncMooncakeStore(drop_in) as wrapped:
                assert len(await wrapped.get_replica_desc("twice")) == 2
                assert list(await wrapped.batch_get_replica_desc(["missing", "twice"])) == ["twice"]

        asyncio.run(run())
    wait_until(lambda: _no_read_leases(master), what="every read ended")


def test_descriptor_calls_before_setup_answer_empty() -> None:
    store = MooncakeDistributedStore()
    assert store.get_replica_desc("k") == []
    assert store.batch_get_replica_desc(["k"]) == {}
    assert store.get_buffer("k") is None and store.batch_get_buffer(["k"]) == [None]
