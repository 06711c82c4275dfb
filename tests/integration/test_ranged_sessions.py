"""Ranged transfer sessions (upstream's ``batch_put_session_*``, ``batch_get_session_*``, the
``*_multi_buffer_ranges`` transfers and ``get_into_ranges``) against a real master and real
clients.

Writers and readers have no segment of their own: the bytes go to and come from a third
client's segment, over its mapped shared-memory file (``shm``) or its TCP transfer service
(``tcp``). The layouts are an engine's layer-wise ones: each object holds one page per layer, and
each call moves one layer of every object.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mooncake_py import (
    AsyncMooncakeStore,
    Client,
    ClientConfig,
    ErrorCode,
    InvalidParamsError,
    MooncakeDistributedStore,
    ReplicateConfig,
)
from mooncake_py.client.compat_ranged import AsyncRangedTransfers, RangedTransfers
from mooncake_py.client.ranged import RangedSessions
from mooncake_py.master.clock import FakeClock
from mooncake_py.testing import InProcessMaster, MasterProcess
from tests.conftest import ClientProcess, client_config
from tests.integration.client_worker import value_for

MIB = 1 << 20
OK = 0
INVALID = int(ErrorCode.INVALID_PARAMS)
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
EXISTS = int(ErrorCode.OBJECT_ALREADY_EXISTS)
HAS_LEASE = int(ErrorCode.OBJECT_HAS_LEASE)
LEASE_EXPIRED = int(ErrorCode.LEASE_EXPIRED)
TENANT = "default"


# The faces themselves carry the ranged calls.
Store = MooncakeDistributedStore
AsyncStore = AsyncMooncakeStore
assert issubclass(Store, RangedTransfers) and issubclass(AsyncStore, AsyncRangedTransfers)


def _config(address: str, segment_bytes: int, **extra: object) -> ClientConfig:
    return ClientConfig.from_mapping(
        {"master_server_addr": address, "global_segment_size": segment_bytes, **extra}
    )


def _sha(data: bytes | bytearray | memoryview | np.ndarray) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


class Arena:
    """A registered numpy buffer."""

    def __init__(self, store: MooncakeDistributedStore, size: int, fill: int = 0) -> None:
        self.array = np.full(size, fill, np.uint8)
        self.base = int(self.array.ctypes.data)
        assert store.register_buffer(self.base, size) == 0

    def ptr(self, offset: int) -> int:
        return self.base + offset

    def fill_random(self, seed: int) -> None:
        self.array[:] = np.random.default_rng(seed).integers(0, 256, self.array.size, np.uint8)


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


def _store(master: InProcessMaster, force_tcp: bool) -> Store:
    store = Store()
    assert store.setup_with_config(_config(master.address, 0, force_tcp=force_tcp)) == 0
    return store


@pytest.fixture
def writer(master: InProcessMaster, owner: Client, force_tcp: bool) -> Iterator[Store]:
    store = _store(master, force_tcp)
    yield store
    store.close()


@pytest.fixture
def reader(master: InProcessMaster, owner: Client, force_tcp: bool) -> Iterator[Store]:
    store = _store(master, force_tcp)
    yield store
    store.close()


def _no_read_leases(master: InProcessMaster) -> bool:
    stats = master.service.stats()
    return (
        stats["read_holds"] == 0 and stats["reads_in_flight"] == 0 and stats["retired_buffers"] == 0
    )


_LOOKUPS_AND_WRITES = re.compile(
    r"master_(batch_)?(get_replica_list|put_start\w*|put_end|put_revoke)_requests_total"
)


def _lookup_and_write_calls(master: InProcessMaster) -> int:
    """GetReplicaList / PutStart / PutEnd / PutRevoke calls the master served, in any form."""
    port = master.metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return int(
        sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if _LOOKUPS_AND_WRITES.fullmatch(sample.name)
        )
    )


# Four objects of eight layers; the layer pages have different sizes per object (one odd, one
# above the memmove threshold, one above the two-thread copy size).
LAYERS = 8
PAGES = [4096, 100_003, 70_000, 5 * MIB // LAYERS]
KEYS = [f"layered-{i}" for i in range(len(PAGES))]


def _layer_layout(layer: int) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """For one layer: per key the arena offsets of its page, its size, and its offset inside
    the object. Each key's pages sit in the arena layer by layer with 4 KiB gaps."""
    offsets, sizes, inside = [], [], []
    base = 0
    for page in PAGES:
        offsets.append([base + layer * (page + 4096)])
        sizes.append([page])
        inside.append(layer * page)
        base += LAYERS * (page + 4096)
    return offsets, sizes, inside


ARENA_BYTES = sum(LAYERS * (page + 4096) for page in PAGES)


def _expected(arena: Arena) -> list[bytes]:
    values = []
    for i in range(len(PAGES)):
        layers = []
        for layer in range(LAYERS):
            offsets, sizes, _ = _layer_layout(layer)
            start = offsets[i][0]
            layers.append(bytes(arena.array[start : start + sizes[i][0]]))
        values.append(b"".join(layers))
    return values


def _put_layer_by_layer(store: Store, arena: Arena) -> None:
    assert store.batch_put_session_start(KEYS, [p * LAYERS for p in PAGES]) == [OK] * len(KEYS)
    # Layers out of order: completeness, not order, decides the end.
    for layer in reversed(range(LAYERS)):
        offsets, sizes, inside = _layer_layout(layer)
        ptrs = [[arena.ptr(o[0])] for o in offsets]
        written = store.batch_put_from_multi_buffer_ranges(KEYS, ptrs, sizes, [[d] for d in inside])
        assert written == PAGES


def test_put_session_writes_layers_and_publishes_at_end(
    master: InProcessMaster, writer: Store, reader: Store
) -> None:
    source = Arena(writer, ARENA_BYTES)
    source.fill_random(1)
    calls = _lookup_and_write_calls(master)
    _put_layer_by_layer(writer, source)
    # One start for all keys, none per range.
    assert _lookup_and_write_calls(master) == calls + 1
    # Reserved and written, but not visible before the end.
    assert reader.batch_probe_key(KEYS) == [0] * len(KEYS)
    assert reader.get(KEYS[0]) == b""
    calls = _lookup_and_write_calls(master)
    assert writer.batch_put_session_end(KEYS) == [OK] * len(KEYS)
    assert _lookup_and_write_calls(master) == calls + 1
    expected = _expected(source)
    assert [_sha(v) for v in reader.get_batch(KEYS)] == [_sha(v) for v in expected]
    # The session is over: a second end finds none, a new start finds the object.
    assert writer.batch_put_session_end(KEYS[:1]) == [NOT_FOUND]
    assert writer.batch_put_session_start(KEYS[:1], [PAGES[0] * LAYERS]) == [EXISTS]


def test_get_session_reads_layers_on_one_lookup_and_holds_the_bytes(
    master: InProcessMaster, writer: Store, reader: Store
) -> None:
    source = Arena(writer, ARENA_BYTES)
    source.fill_random(2)
    expected = _expected(source)
    assert writer.put_batch(KEYS, expected) == OK
    target = Arena(reader, ARENA_BYTES, fill=0xEE)
    calls = _lookup_and_write_calls(master)
    assert reader.batch_get_session_start(KEYS) == [OK] * len(KEYS)
    assert all(master.service.is_leased(TENANT, k) for k in KEYS)
    # While the session holds the leases a plain remove refuses, and a forced one retires the
    # memory instead of reusing it: the ranged reads still get the bytes written.
    assert writer.remove(KEYS[0]) == HAS_LEASE
    assert writer.remove(KEYS[0], force=True) == OK
    for layer in range(LAYERS):
        offsets, sizes, inside = _layer_layout(layer)
        ptrs = [[target.ptr(o[0])] for o in offsets]
        read = reader.batch_get_into_multi_buffer_ranges(KEYS, ptrs, sizes, [[s] for s in inside])
        assert read == PAGES
    assert _lookup_and_write_calls(master) == calls + 1  # the start's lookup only
    assert [_sha(v) for v in _expected(target)] == [_sha(v) for v in expected]
    assert master.service.stats()["retired_buffers"] == 1
    assert reader.batch_get_session_end(KEYS) == OK
    assert reader.probe_key("missing") == 0  # runs on the master after the end
    assert _no_read_leases(master)
    # Ended: no more ranged reads of these keys.
    one = reader.batch_get_into_multi_buffer_ranges(KEYS[1:2], [[target.ptr(0)]], [[1]], [[0]])
    assert one == [NOT_FOUND]


def test_ranges_split_objects_and_gather_them_back(
    master: InProcessMaster, writer: Store, reader: Store
) -> None:
    """Several ranges per key per call, in both directions, at arbitrary offsets."""
    value = np.random.default_rng(3).integers(0, 256, 300_000, np.uint8)
    source = Arena(writer, MIB)
    source.array[: value.size] = value
    cuts = [(0, 1), (1, 99_999), (100_000, 150_000), (250_000, 50_000)]
    assert writer.batch_put_session_start(["split"], [value.size]) == [OK]
    # Two calls, two ranges each, the later one first.
    for part in (cuts[2:], cuts[:2]):
        ptrs = [[source.ptr(o) for o, _ in part]]
        assert writer.batch_put_from_multi_buffer_ranges(
            ["split"], ptrs, [[n for _, n in part]], [[o for o, _ in part]]
        ) == [sum(n for _, n in part)]
    assert writer.batch_put_session_end(["split"]) == [OK]
    target = Arena(reader, MIB, fill=0xEE)
    # Read the halves swapped into the target, plus ten bytes again from offset 10.
    src = [[150_000, 0, 10]]
    dst = [[target.ptr(0), target.ptr(150_000), target.ptr(400_000)]]
    assert reader.batch_get_session_start(["split", "split"]) == [OK, OK]
    assert reader.batch_get_into_multi_buffer_ranges(
        ["split"], dst, [[150_000, 150_000, 10]], src
    ) == [300_010]
    assert reader.batch_get_session_end(["split"]) == OK
    assert _sha(target.array[:150_000]) == _sha(value[150_000:])
    assert _sha(target.array[150_000:300_000]) == _sha(value[:150_000])
    assert bytes(target.array[400_000:400_010]) == bytes(value[10:20])
    assert bytes(target.array[300_000:400_000]) == b"\xee" * 100_000
    assert reader.probe_key("missing") == 0
    assert _no_read_leases(master)


def test_incomplete_put_is_refused_and_revoke_frees_the_reservation(
    master: InProcessMaster, writer: Store, reader: Store
) -> None:
    source = Arena(writer, MIB)
    source.fill_random(4)
    used = master.service.stats()["allocated_bytes"]
    assert writer.batch_put_session_start(["half", "whole"], [200_000, 1000]) == [OK, OK]
    assert master.service.stats()["allocated_bytes"] > used
    ranges = writer.batch_put_from_multi_buffer_ranges(
        ["half", "whole"],
        [[source.ptr(0)], [source.ptr(0), source.ptr(500)]],
        [[100_000], [600, 400]],
        [[0], [0, 600]],
    )
    assert ranges == [100_000, 1000]
    # Not every byte of "half" was written: its end is refused and it stays open.
    assert writer.batch_put_session_end(["half", "whole"]) == [INVALID, OK]
    assert reader.batch_probe_key(["half", "whole"]) == [0, 1]
    assert writer.batch_put_session_revoke(["half", "whole"]) == [OK, NOT_FOUND]
    assert reader.probe_key("half") == 0
    assert writer.remove("whole") == OK
    assert master.service.stats()["allocated_bytes"] == used
    # The key is free again for an ordinary put.
    assert writer.put("half", b"x" * 10) == OK


def test_close_ends_reads_and_revokes_writes_at_once(
    master: InProcessMaster, owner: Client, force_tcp: bool
) -> None:
    owner.put("held", b"h" * 50_000)
    used = master.service.stats()["allocated_bytes"]
    store = _store(master, force_tcp)
    assert store.batch_get_session_start(["held"]) == [OK]
    assert store.batch_put_session_start(["reserved"], [300_000]) == [OK]
    assert master.service.is_leased(TENANT, "held")
    assert master.service.stats()["allocated_bytes"] > used
    store.close()
    owner.probe_key("missing")
    master.wait_for_leases_to_end(["held"])
    assert _no_read_leases(master)
    assert master.service.stats()["allocated_bytes"] == used
    assert owner.probe_key("reserved") is False
    # Closed: every call answers INVALID_PARAMS, nothing raises.
    assert store.batch_get_session_start(["held"]) == [INVALID]
    assert store.batch_get_session_end(["held"]) == INVALID
    assert store.batch_put_session_start(["x"], [1]) == [INVALID]
    assert store.get_into_ranges([1], [["held"]], [[[0]]], [[[0]]], [[[1]]]) == [[[INVALID]]]
    # Set up again: a new client, new sessions.
    assert store.setup_with_config(_config(master.address, 0, force_tcp=force_tcp)) == 0
    assert store.batch_get_session_start(["held"]) == [OK]
    assert store.close() == OK
    master.wait_for_leases_to_end(["held"])


def test_bad_input_answers_codes(master: InProcessMaster, writer: Store, reader: Store) -> None:
    arena = Arena(writer, 4096)
    assert writer.put("exists", b"e" * 100) == OK
    not_set_up = Store()
    assert not_set_up.batch_put_session_start(["a"], [1]) == [INVALID]
    assert not_set_up.batch_put_from_multi_buffer_ranges(["a"], [[1]], [[1]], [[0]]) == [INVALID]
    assert not_set_up.batch_put_session_end(["a"]) == [INVALID]
    assert not_set_up.batch_put_session_revoke(["a"]) == [INVALID]
    assert not_set_up.batch_get_session_start(["a"]) == [INVALID]
    assert not_set_up.batch_get_into_multi_buffer_ranges(["a"], [[1]], [[1]], [[0]]) == [INVALID]
    assert not_set_up.batch_get_session_end(["a"]) == INVALID
    assert not_set_up.close() == OK

    # Starts: sizes that are not positive, lists of different lengths, bad keys, existing or
    # repeated keys.
    assert writer.batch_put_session_start(["z", "n"], [0, -5]) == [INVALID, INVALID]
    assert writer.batch_put_session_start(["a", "b"], [10]) == [INVALID, INVALID]
    assert writer.batch_put_session_start(["", "b"], [10, 10]) == [INVALID, INVALID]
    assert writer.batch_put_session_start(["exists", "new", "new"], [100, 64, 64]) == [
        EXISTS,
        OK,
        EXISTS,
    ]
    assert writer.batch_get_session_start(["exists", "missing", ""]) == [INVALID] * 3
    assert writer.batch_get_session_start(["exists", "missing"]) == [OK, NOT_FOUND]

    # Ranged transfers: no session, mismatched lists, past the end, unregistered or negative.
    for call in (
        writer.batch_put_from_multi_buffer_ranges,
        writer.batch_get_into_multi_buffer_ranges,
    ):
        key = "new" if call == writer.batch_put_from_multi_buffer_ranges else "exists"
        p = arena.ptr(0)
        assert call(["nosession"], [[p]], [[1]], [[0]]) == [NOT_FOUND]
        assert call([key, key], [[p]], [[1]], [[0]]) == [INVALID, INVALID]
        assert call([key], [[p, p]], [[1]], [[0]]) == [INVALID]
        assert call([key], [[p]], [[1]], [[100]]) == [INVALID]  # past the object's end
        assert call([key], [[p]], [[-1]], [[0]]) == [INVALID]
        assert call([key], [[p]], [[8]], [[-1]]) == [INVALID]
        assert call([key], [[12345]], [[8]], [[0]]) == [INVALID]  # not registered
        assert call([key], [[p]], [[5000]], [[0]]) == [INVALID]  # beyond the registration
        assert call([key], [[p]], [["x"]], [[0]]) == [INVALID]  # type: ignore[list-item]
        assert call([key], [[p]], [[0]], [[0]]) == [0]  # nothing to move
    # Nothing was written by the refused calls: "new" is still incomplete.
    assert writer.batch_put_session_end(["new", "nosession"]) == [INVALID, NOT_FOUND]
    assert writer.batch_put_session_revoke(["new"]) == [OK]
    assert writer.batch_get_session_end(["exists", "nosession"]) == OK
    assert writer.batch_get_session_end([""]) == INVALID

    # Empty calls answer empty lists (and 0).
    assert writer.batch_put_session_start([], []) == []
    assert writer.batch_put_from_multi_buffer_ranges([], [], [], []) == []
    assert writer.batch_put_session_end([]) == []
    assert writer.batch_put_session_revoke([]) == []
    assert writer.batch_get_session_start([]) == []
    assert writer.batch_get_into_multi_buffer_ranges([], [], [], []) == []
    assert writer.batch_get_session_end([]) == OK
    assert writer.get_into_ranges([], [], [], [], []) == []

    # get_into_ranges: shapes and codes.
    target = Arena(reader, 4096, fill=0)
    with pytest.raises(TypeError):  # a missing argument, as upstream's binding
        reader.get_into_ranges([target.base], [["exists"]], [[[0]]], [[[0]]])  # type: ignore[call-arg]
    assert reader.get_into_ranges([target.base], [["exists"]], [[[0, 8]]], [[[0]]], [[[4]]]) == [
        [[INVALID]]
    ]
    assert reader.get_into_ranges(
        [target.base, target.base], [["exists"]], [[[0]]], [[[0]]], [[[4]]]
    ) == [[[INVALID]]]
    result = reader.get_into_ranges(
        [target.base],
        [["exists", "missing", "exists"]],
        [[[0, 10], [0, 4], [5000]]],
        [[[0, 99], [0, 0], [0]]],
        [[[4, 2], [4, 4], [4]]],
    )
    assert result == [[[4, INVALID], [NOT_FOUND, NOT_FOUND], [INVALID]]]
    assert bytes(target.array[:4]) == b"eeee"
    assert reader.probe_key("missing") == 0
    assert _no_read_leases(master)


def test_get_into_ranges_gathers_many_objects_with_one_lookup(
    master: InProcessMaster, writer: Store, reader: Store
) -> None:
    values = {f"row-{i}": value_for(f"row-{i}", 20_000 + 777 * i) for i in range(6)}
    assert writer.put_batch(list(values), list(values.values())) == OK
    first, second = Arena(reader, 256 * 1024, 0xEE), Arena(reader, 256 * 1024, 0xEE)
    calls = _lookup_and_write_calls(master)
    # Buffer one: the second half of every row, back to back; buffer two: rows 0 and 5, each
    # in three ranges, repeated keys across buffers.
    keys_one = list(values)
    dst_one, src_one, size_one, at = [], [], [], 0
    for key in keys_one:
        half = len(values[key]) // 2
        dst_one.append([at])
        src_one.append([half])
        size_one.append([len(values[key]) - half])
        at += len(values[key]) - half
    keys_two = ["row-0", "row-5"]
    dst_two = [[0, 100, 200], [10_000, 60_000, 10_001]]
    src_two = [[0, 1000, 19_999], [0, 1, 2]]
    size_two = [[100, 100, 1], [1, 1, 1]]
    result = reader.get_into_ranges(
        [first.base, second.base],
        [keys_one, keys_two],
        [dst_one, dst_two],
        [src_one, src_two],
        [size_one, size_two],
    )
    assert result == [size_one, size_two]
    assert _lookup_and_write_calls(master) == calls + 1
    halves = b"".join(v[len(v) // 2 :] for v in values.values())
    assert _sha(first.array[: len(halves)]) == _sha(halves)
    assert bytes(first.array[len(halves) : len(halves) + 8]) == b"\xee" * 8
    row0, row5 = values["row-0"], values["row-5"]
    assert bytes(second.array[:100]) == row0[:100]
    assert bytes(second.array[100:200]) == row0[1000:1100]
    assert bytes(second.array[200:201]) == row0[19_999:20_000]
    assert bytes(second.array[[10_000, 60_000, 10_001]]) == row5[:3]
    assert reader.probe_key("missing") == 0
    assert _no_read_leases(master)


def test_typed_sessions_and_expired_leases(master: InProcessMaster, owner: Client) -> None:
    """The typed face: BatchResult outcomes, InvalidParamsError for malformed calls, and a
    session outliving its lease TTL (on the reader's clock) answering LEASE_EXPIRED."""
    clock = FakeClock()
    owner.put("typed", b"t" * 10_000)
    with Client(_config(master.address, 0), clock=clock) as client:
        sessions = RangedSessions(client)
        buffer = np.zeros(10_000, np.uint8)
        ptr = int(buffer.ctypes.data)
        client.register_buffer(ptr, buffer.nbytes)
        assert sessions.batch_get_session_start(["typed", "absent"]).codes == [OK, NOT_FOUND]
        assert sessions.open_reads == 1
        with pytest.raises(InvalidParamsError):
            sessions.batch_get_into_multi_buffer_ranges(["typed"], [[ptr]], [[1]], [])
        with pytest.raises(InvalidParamsError):
            sessions.batch_put_session_start(["a", "b"], [1])
        with pytest.raises(InvalidParamsError):
            sessions.batch_put_session_start(["a"], [1], ReplicateConfig(session_ids=["s", "t"]))
        read = sessions.batch_get_into_multi_buffer_ranges(["typed"], [[ptr]], [[5000]], [[10]])
        assert read.values == [5000] and read.ok
        clock.advance(master.config.default_kv_lease_ttl / 1000.0)
        late = sessions.batch_get_into_multi_buffer_ranges(["typed"], [[ptr]], [[1]], [[0]])
        assert late.codes == [LEASE_EXPIRED]
        # A fresh session reads again.
        assert sessions.batch_get_session_start(["typed"]).ok
        assert sessions.batch_get_into_multi_buffer_ranges(
            ["typed"], [[ptr]], [[10_000]], [[0]]
        ).values == [10_000]
        assert bytes(buffer) == b"t" * 10_000
        assert sessions.batch_put_session_start(["typed-w"], [10]).ok
        assert sessions.open_writes == 1
        sessions.close()
        assert sessions.open_reads == 0 and sessions.open_writes == 0
        with pytest.raises(InvalidParamsError):
            sessions.batch_get_session_start(["typed"])
        client.probe_key("missing")
        assert _no_read_leases(master)
        assert client.probe_key("typed-w") is False


def test_async_twin_runs_the_same_sessions(
    master: InProcessMaster, owner: Client, force_tcp: bool
) -> None:
    store = _store(master, force_tcp)
    arena = Arena(store, MIB)
    arena.fill_random(5)
    value = bytes(arena.array[:300_000])

    async def run() -> None:
        async with AsyncStore(store) as twin:
            assert await twin.batch_put_session_start(["async"], [300_000]) == [OK]
            for offset in (0, 150_000):
                assert await twin.batch_put_from_multi_buffer_ranges(
                    ["async"], [[arena.ptr(offset)]], [[150_000]], [[offset]]
                ) == [150_000]
            assert await twin.batch_put_session_end(["async"]) == [OK]
            assert await twin.batch_put_session_start(["gone"], [10]) == [OK]
            assert await twin.batch_put_session_revoke(["gone"]) == [OK]
            arena.array[:] = 0
            assert await twin.batch_get_session_start(["async"]) == [OK]
            assert await twin.batch_get_into_multi_buffer_ranges(
                ["async"], [[arena.ptr(0)]], [[300_000]], [[0]]
            ) == [300_000]
            assert await twin.batch_get_session_end(["async"]) == OK
            assert await twin.get_into_ranges(
                [arena.ptr(400_000)], [["async"]], [[[0]]], [[[299_990]]], [[[10]]]
            ) == [[[10]]]

    asyncio.run(run())
    assert _sha(arena.array[:300_000]) == _sha(value)
    assert bytes(arena.array[400_000:400_010]) == value[-10:]
    assert owner.probe_key("gone") is False
    master.wait_for_leases_to_end(["async"])
    assert _no_read_leases(master)


@pytest.mark.parametrize("force_tcp", ["0", "1"], ids=["shm", "tcp"])
def test_ranged_sessions_across_processes(
    master_process: MasterProcess, client_processes: list[ClientProcess], force_tcp: str
) -> None:
    """Another process hosts the segment and writes and reads plainly; this one moves ranges."""
    other = ClientProcess({"MOONCAKE_PY_FORCE_TCP": force_tcp})
    client_processes.append(other)
    assert other.call("setup", config=client_config(master_process.address, 64 * MIB)) == 0
    store = Store()
    config = _config(master_process.address, 0, force_tcp=force_tcp == "1")
    assert store.setup_with_config(config) == 0
    try:
        page, layers = 64 * 1024 + 5, 6
        size = page * layers
        keys = [f"xp-{i}" for i in range(3)]
        assert other.call("put_from", keys=keys, size=size) == [OK] * 3
        arena = Arena(store, 3 * size, fill=0)
        assert store.batch_get_session_start(keys) == [OK] * 3
        for layer in range(layers):
            ptrs = [[arena.ptr(i * size + layer * page)] for i in range(3)]
            offsets = [[layer * page]] * 3
            assert (
                store.batch_get_into_multi_buffer_ranges(keys, ptrs, [[page]] * 3, offsets)
                == [page] * 3
            )
        assert store.batch_get_session_end(keys) == OK
        for i, key in enumerate(keys):
            assert _sha(arena.array[i * size : (i + 1) * size]) == _sha(value_for(key, size))

        # The other way: ranged writes here, plain zero-copy reads there.
        mine = [f"xp-mine-{i}" for i in range(3)]
        for i, key in enumerate(mine):
            arena.array[i * size : (i + 1) * size] = np.frombuffer(value_for(key, size), np.uint8)
        assert store.batch_put_session_start(mine, [size] * 3) == [OK] * 3
        for layer in range(layers):
            ptrs = [[arena.ptr(i * size + layer * page)] for i in range(3)]
            offsets = [[layer * page]] * 3
            assert (
                store.batch_put_from_multi_buffer_ranges(mine, ptrs, [[page]] * 3, offsets)
                == [page] * 3
            )
        assert store.batch_put_session_end(mine) == [OK] * 3
        expected = [_sha(value_for(k, size)) for k in mine]
        assert other.call("get_into_digests", keys=mine, size=size) == expected
    finally:
        store.close()


def test_concurrent_ranged_transfers_and_an_end_meanwhile(
    master: InProcessMaster, writer: Store, reader: Store
) -> None:
    """Threads write disjoint layers of one put session and read layers of one get session,
    while another thread ends the get session: every read answers its bytes or
    OBJECT_NOT_FOUND, none returns bytes it does not hold a lease for, and the lease ends once
    the last copy is done."""
    page, layers = 32 * 1024, 16
    source = Arena(writer, page * layers)
    source.fill_random(6)
    assert writer.batch_put_session_start(["shared"], [page * layers]) == [OK]

    def write(layer: int) -> list[int]:
        return writer.batch_put_from_multi_buffer_ranges(
            ["shared"], [[source.ptr(layer * page)]], [[np.int64(page)]], [[layer * page]]
        )

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(write, range(layers))) == [[page]] * layers
    assert writer.batch_put_session_end(["shared"]) == [OK]

    target = Arena(reader, page * layers * 4)
    assert reader.batch_get_session_start(["shared"]) == [OK]

    def read(slot: int) -> tuple[int, int]:
        layer = slot % layers
        dst = target.ptr(slot * page)
        got = reader.batch_get_into_multi_buffer_ranges(
            ["shared"], [[dst]], [[page]], [[layer * page]]
        )
        return slot, got[0]

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(read, slot) for slot in range(layers * 4)]
        ended = pool.submit(reader.batch_get_session_end, ["shared"])
        results = [f.result() for f in futures]
    assert ended.result() == OK
    for slot, got in results:
        assert got in (page, NOT_FOUND)
        if got == page:
            layer = slot % layers
            want = source.array[layer * page : (layer + 1) * page]
            assert _sha(target.array[slot * page : (slot + 1) * page]) == _sha(want)
    reader.probe_key("missing")
    master.wait_for_leases_to_end(["shared"])
    assert _no_read_leases(master)


def test_put_sessions_carry_the_replicate_config(
    master: InProcessMaster, owner: Client, writer: Store, reader: Store
) -> None:
    """Tags, per-key lists and replica counts reach the master as with ``put_from``: only the
    keys that start are sent, each with its own entries."""
    with Client(_config(master.address, 64 * MIB)):  # a second segment for the second replica
        arena = Arena(writer, 4096)
        arena.fill_random(7)
        config = ReplicateConfig(replica_num=2, session_ids=["conv-a", "", "conv-b"])
        assert writer.put("taken", b"x") == OK
        starts = writer.batch_put_session_start(["t-a", "taken", "t-b"], [100, 100, 200], config)
        assert starts == [OK, EXISTS, OK]
        for key, size in (("t-a", 100), ("t-b", 200)):
            ptrs = [[arena.ptr(0)]]
            assert writer.batch_put_from_multi_buffer_ranges([key], ptrs, [[size]], [[0]]) == [size]
        assert writer.batch_put_session_end(["t-b", "t-a"]) == [OK, OK]
        for key, size in (("t-a", 100), ("t-b", 200)):
            replicas = master.service.object_of(TENANT, key).replicas  # type: ignore[union-attr]
            assert len({r.segment_id for r in replicas}) == 2
            assert _sha(reader.get(key)) == _sha(arena.array[:size])
        assert writer.get_kv_session("conv-a").member_count == 1
        assert writer.get_kv_session("conv-b").member_count == 1
