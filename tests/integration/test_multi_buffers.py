"""Multi-buffer batch calls (upstream's ``batch_put_from_multi_buffers`` /
``batch_get_into_multi_buffers``) against a real in-process master and real clients.

One object is gathered from, or scattered over, several registered buffers (one block per layer
in the engines' KV layouts). Writers and readers have no segment of their own: the bytes go to
and come from a third client's segment, over its mapped shared-memory file (``shm``) or its TCP
transfer service (``tcp``), so both data paths are exercised on one host.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator

import numpy as np
import pytest

from mooncake_py import (
    AsyncClient,
    AsyncMooncakeStore,
    Client,
    ClientConfig,
    ErrorCode,
    InvalidParamsError,
    MooncakeDistributedStore,
)
from mooncake_py.testing import InProcessMaster

MIB = 1 << 20
INVALID = int(ErrorCode.INVALID_PARAMS)
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)


def _config(address: str, segment_bytes: int, **extra: object) -> ClientConfig:
    return ClientConfig.from_mapping(
        {"master_server_addr": address, "global_segment_size": segment_bytes, **extra}
    )


def _sha(data: bytes | bytearray | memoryview | np.ndarray) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


class Arena:
    """A registered numpy buffer handing out parts at chosen offsets."""

    def __init__(self, store: MooncakeDistributedStore, size: int, fill: int = 0) -> None:
        self.array = np.full(size, fill, np.uint8)
        self.base = int(self.array.ctypes.data)
        assert store.register_buffer(self.base, size) == 0

    def ptr(self, offset: int) -> int:
        return self.base + offset

    def gather(self, layout: list[tuple[int, int]]) -> bytes:
        return b"".join(bytes(self.array[o : o + n]) for o, n in layout)


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


def _store(master: InProcessMaster, force_tcp: bool) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    assert store.setup_with_config(_config(master.address, 0, force_tcp=force_tcp)) == 0
    return store


@pytest.fixture
def writer(
    master: InProcessMaster, owner: Client, force_tcp: bool
) -> Iterator[MooncakeDistributedStore]:
    store = _store(master, force_tcp)
    yield store
    store.close()


@pytest.fixture
def reader(
    master: InProcessMaster, owner: Client, force_tcp: bool
) -> Iterator[MooncakeDistributedStore]:
    store = _store(master, force_tcp)
    yield store
    store.close()


def _no_read_leases(master: InProcessMaster) -> bool:
    stats = master.service.stats()
    return stats["read_holds"] == 0 and stats["reads_in_flight"] == 0


# Per key, (offset, size) of each part in the writer's arena: uneven sizes, gaps between parts,
# parts below and above the memmove threshold, and one object above the two-thread copy size.
WRITE_LAYOUTS: list[list[tuple[int, int]]] = [
    [(0, 4096), (8192, 100_000), (300_000, 1), (400_000, 70_000)],
    [(1 * MIB, 3 * MIB), (5 * MIB, 2 * MIB + 17)],
    [(9 * MIB, 12_345)],
    [(10 * MIB + i * 10_000, 4_000) for i in range(20)],
]


def _fill(arena: Arena, seed: int) -> None:
    rng = np.random.default_rng(seed)
    arena.array[:] = rng.integers(0, 256, arena.array.size, dtype=np.uint8)


def _split(total: int, pieces: int, base: int) -> list[tuple[int, int]]:
    """``pieces`` parts adding up to ``total``, laid out with 4 KiB gaps from ``base``."""
    sizes = [total // pieces] * pieces
    sizes[-1] += total - sum(sizes)
    layout, offset = [], base
    for size in sizes:
        layout.append((offset, size))
        offset += size + 4096
    return layout


def test_cross_client_round_trip_with_multi_buffers(
    master: InProcessMaster,
    writer: MooncakeDistributedStore,
    reader: MooncakeDistributedStore,
) -> None:
    source = Arena(writer, 12 * MIB)
    _fill(source, 1)
    keys = [f"mb-{i}" for i in range(len(WRITE_LAYOUTS))]
    expected = [source.gather(layout) for layout in WRITE_LAYOUTS]
    ptrs = [[source.ptr(o) for o, _ in layout] for layout in WRITE_LAYOUTS]
    sizes = [[n for _, n in layout] for layout in WRITE_LAYOUTS]
    assert writer.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0] * len(keys)

    # The reader scatters each object over a different layout: 3 parts with gaps.
    target = Arena(reader, 20 * MIB, fill=0xEE)
    layouts, base = [], 0
    for data in expected:
        layout = _split(len(data), 3 if len(data) >= 3 else 1, base)
        layouts.append(layout)
        base = layout[-1][0] + layout[-1][1] + 4096
    read = reader.batch_get_into_multi_buffers(
        keys,
        [[target.ptr(o) for o, _ in layout] for layout in layouts],
        [[n for _, n in layout] for layout in layouts],
    )
    assert read == [len(d) for d in expected]
    for data, layout in zip(expected, layouts, strict=True):
        assert _sha(target.gather(layout)) == _sha(data)
    # The gaps between parts were not touched.
    assert bytes(target.array[layouts[0][0][1] : layouts[0][1][0]]) == b"\xee" * 4096

    # Plain reads see the concatenation, from either client.
    assert [_sha(v) for v in reader.get_batch(keys)] == [_sha(d) for d in expected]
    assert _sha(writer.get(keys[1])) == _sha(expected[1])
    # The same thread's next call runs on the master after the reads' ends.
    assert reader.probe_key("missing") == 0
    assert _no_read_leases(master)


def test_plain_writes_read_back_with_multi_buffers(
    master: InProcessMaster,
    writer: MooncakeDistributedStore,
    reader: MooncakeDistributedStore,
) -> None:
    value = np.random.default_rng(2).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    assert writer.put("plain", value) == 0
    target = Arena(reader, MIB)
    layout = [(0, 1000), (2000, 150_000), (200_000, 149_000)]
    read = reader.batch_get_into_multi_buffers(
        ["plain"], [[target.ptr(o) for o, _ in layout]], [[n for _, n in layout]]
    )
    assert read == [len(value)]
    assert _sha(target.gather(layout)) == _sha(value)
    assert reader.probe_key("missing") == 0
    assert _no_read_leases(master)


def test_buffers_larger_than_the_object_are_filled_in_order_up_to_its_end(
    master: InProcessMaster,
    writer: MooncakeDistributedStore,
    reader: MooncakeDistributedStore,
) -> None:
    value = bytes(range(256)) * 400  # 102,400 bytes
    assert writer.put("big-enough", value) == 0
    target = Arena(reader, MIB, fill=0xEE)
    # 60,000 + 60,000 + 60,000: the object ends inside the second part; the third is untouched.
    layout = [(0, 60_000), (100_000, 60_000), (200_000, 60_000)]
    read = reader.batch_get_into_multi_buffers(
        ["big-enough"], [[target.ptr(o) for o, _ in layout]], [[n for _, n in layout]]
    )
    assert read == [len(value)]  # the object's size, as upstream
    assert target.gather([(0, 60_000), (100_000, 42_400)]) == value
    assert bytes(target.array[142_400:160_000]) == b"\xee" * (160_000 - 142_400)
    assert bytes(target.array[200_000:260_000]) == b"\xee" * 60_000
    assert reader.probe_key("missing") == 0
    assert _no_read_leases(master)


def test_bad_input_gives_codes_and_never_raises(
    master: InProcessMaster,
    writer: MooncakeDistributedStore,
    reader: MooncakeDistributedStore,
) -> None:
    source = Arena(writer, MIB)
    _fill(source, 3)
    p = source.ptr
    stray = np.zeros(4096, np.uint8)  # never registered
    stray_ptr = int(stray.ctypes.data)

    # The three lists differ in length: every key fails.
    assert writer.batch_put_from_multi_buffers(["a", "b"], [[p(0)]], [[10], [10]]) == [INVALID] * 2
    assert reader.batch_get_into_multi_buffers(["a", "b"], [[p(0)], [p(0)]], [[1]]) == [INVALID] * 2

    codes = writer.batch_put_from_multi_buffers(
        ["ok", "lengths", "stray", "empty", "zero-only", "negative", "with-zero"],
        [
            [p(0), p(100)],
            [p(0), p(10)],
            [p(0), stray_ptr],
            [],
            [p(0)],
            [p(0)],
            [p(0), p(50), p(60)],
        ],
        [[100, 200], [10], [10, 10], [], [0], [-1], [50, 0, 40]],
    )
    assert codes == [0, INVALID, INVALID, INVALID, INVALID, INVALID, 0]
    found = reader.batch_is_exist(["ok", "lengths", "stray", "empty", "with-zero"])
    assert found == [1, 0, 0, 0, 1]
    assert _sha(reader.get("with-zero")) == _sha(source.gather([(0, 50), (60, 40)]))

    target = Arena(reader, MIB)
    t = target.ptr
    read = reader.batch_get_into_multi_buffers(
        ["ok", "ok", "ok", "ok", "ok", "missing", "ok"],
        [[t(0), t(1000)], [t(0)], [t(0), stray_ptr], [], [t(0), t(500)], [t(0)], [t(0), t(0)]],
        [[150, 150], [299], [200, 200], [], [300], [300], [300, 0]],
    )
    # Enough room in two parts; too small; a part outside registered memory; no parts; the
    # two lists differ in length; a miss; a part of size 0 skipped.
    assert read == [300, INVALID, INVALID, INVALID, INVALID, NOT_FOUND, 300]
    assert bytes(target.array[0:300]) == source.gather([(0, 100), (100, 200)])
    # Keys that failed after their lookup ended their leases too.
    assert reader.probe_key("missing") == 0
    assert _no_read_leases(master)
    assert reader.remove("ok") == 0  # no lease left behind

    idle = MooncakeDistributedStore()  # never set up
    assert idle.batch_put_from_multi_buffers(["k"], [[p(0)]], [[1]]) == [INVALID]
    assert idle.batch_get_into_multi_buffers(["k"], [[t(0)]], [[1]]) == [INVALID]


def test_typed_client_raises_for_malformed_batches_and_reports_per_key(
    master: InProcessMaster, owner: Client, force_tcp: bool
) -> None:
    with Client(_config(master.address, 0, force_tcp=force_tcp)) as client:
        data = np.arange(10_000, dtype=np.uint8)
        ptr = int(data.ctypes.data)
        client.register_buffer(ptr, data.nbytes)
        with pytest.raises(InvalidParamsError):
            client.batch_put_from_multi_buffers(["a"], [[ptr], [ptr]], [[1]])
        with pytest.raises(InvalidParamsError):
            client.batch_get_into_multi_buffers(["a"], [], [])
        put = client.batch_put_from_multi_buffers(
            ["t1", "t2"], [[ptr, ptr + 5000], [1]], [[1000, 1000], [10]]
        )
        assert put.codes == [0, INVALID]
        out = np.zeros(4000, np.uint8)
        out_ptr = int(out.ctypes.data)
        client.register_buffer(out_ptr, out.nbytes)
        got = client.batch_get_into_multi_buffers(
            ["t1", "t2"],
            [[out_ptr + 3000, out_ptr], [out_ptr]],
            [[500, 1500], [10]],
            prefer_alloc_in_same_node=True,
        )
        assert got.codes == [0, NOT_FOUND] and got.values[0] == 2000
        assert bytes(out[3000:3500]) + bytes(out[0:1500]) == bytes(data[0:1000]) + bytes(
            data[5000:6000]
        )
        assert client.probe_key("missing") is False
        assert _no_read_leases(master)


def test_async_twins(master: InProcessMaster, owner: Client, force_tcp: bool) -> None:
    settings: dict[str, object] = {"master_server_addr": master.address, "force_tcp": force_tcp}
    settings["global_segment_size"] = 0
    config = ClientConfig.from_mapping(settings)

    async def scenario() -> None:
        data = np.random.default_rng(4).integers(0, 256, 200_000, dtype=np.uint8)
        out = np.zeros(200_000, np.uint8)
        async with AsyncMooncakeStore(MooncakeDistributedStore()) as store:
            assert await store.setup(settings) == 0
            ptr, out_ptr = int(data.ctypes.data), int(out.ctypes.data)
            assert store.register_buffer(ptr, data.nbytes) == 0
            assert store.register_buffer(out_ptr, out.nbytes) == 0
            codes = await store.batch_put_from_multi_buffers(
                ["as"], [[ptr, ptr + 150_000]], [[100_000, 50_000]]
            )
            assert codes == [0]
            read = await store.batch_get_into_multi_buffers(
                ["as"], [[out_ptr + 100_000, out_ptr]], [[75_000, 75_000]]
            )
            assert read == [150_000]
            expected = bytes(data[:100_000]) + bytes(data[150_000:])
            assert bytes(out[100_000:175_000]) + bytes(out[:75_000]) == expected
        async with await AsyncClient.connect(config) as client:
            client.register_buffer(out_ptr, out.nbytes)
            result = await client.batch_get_into_multi_buffers(["as"], [[out_ptr]], [[150_000]])
            assert result.values == [150_000] and bytes(out[:150_000]) == expected
            put = await client.batch_put_from_multi_buffers(["as2"], [[out_ptr]], [[10]])
            assert put.ok

    asyncio.run(scenario())
