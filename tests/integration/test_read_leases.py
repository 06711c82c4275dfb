"""Read leases held by their readers, against a real master: every read ends its leases right
after its copy, so nothing stays leased behind a read; existence holds last until the same
client reads; probes hold nothing; a copy that outlived its lease is trusted only when the
master vouches for it.

Reads go from a client without a segment to the owner's segment, over the mapped shared-memory
file (``shm``) or the owner's TCP transfer service (``tcp``). The ordering the checks rely on:
a read ends its leases one-way, and the same thread's next call over the stream channel runs
on the master after that end (so "right after a get" is deterministic); over gRPC only, the end
is a call nobody waits for, and the checks wait for it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from mooncake_py import (
    BusyError,
    Client,
    ClientConfig,
    ErrorCode,
    InvalidParamsError,
    LeaseExpiredError,
    MooncakeDistributedStore,
)
from mooncake_py.testing import InProcessMaster, wait_until
from mooncake_py.types import ProbeLeaseMode

MIB = 1 << 20
TENANT = "default"


def _config(address: str, segment_bytes: int, **extra: object) -> ClientConfig:
    return ClientConfig.from_mapping(
        {"master_server_addr": address, "global_segment_size": segment_bytes, **extra}
    )


@pytest.fixture
def master() -> Iterator[InProcessMaster]:
    with InProcessMaster() as running:  # 10 s leases: only their ends free objects soon
        yield running
        running.service.check()


@pytest.fixture(params=["shm", "tcp"])
def force_tcp(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "tcp")


@pytest.fixture
def owner(master: InProcessMaster) -> Iterator[Client]:
    with Client(_config(master.address, 32 * MIB)) as client:
        yield client


@pytest.fixture
def reader(master: InProcessMaster, force_tcp: bool) -> Iterator[Client]:
    with Client(_config(master.address, 0, force_tcp=force_tcp)) as client:
        yield client


def _no_read_leases(master: InProcessMaster, keys: list[str]) -> bool:
    stats = master.service.stats()
    return (
        stats["read_holds"] == 0
        and stats["reads_in_flight"] == 0
        and stats["retired_buffers"] == 0
        and not any(master.service.is_leased(TENANT, k) for k in keys)
    )


def test_no_read_lease_outlives_a_read(
    master: InProcessMaster, owner: Client, reader: Client
) -> None:
    keys = ["a", "b", "c"]
    owner.put_batch(keys, [b"A" * 1000, b"B" * MIB, b"C" * 10]).unwrap()
    target = np.zeros(2 * MIB, np.uint8)
    ptr = int(target.ctypes.data)
    reader.register_buffer(ptr, target.nbytes)
    reads: list[Callable[[], object]] = [
        lambda: reader.get("a"),
        lambda: reader.get_batch(["a", "b", "missing", "a"]),
        lambda: reader.get_into("b", ptr, MIB),
        # Keys that fail after their lookup (buffer too small, not registered) end too.
        lambda: reader.batch_get_into(["a", "b", "c"], [ptr, ptr, 1], [1000, 10, 10]),
        lambda: reader.get_buffer("b"),
        lambda: reader.batch_get_buffer(["c", "missing", "b"]),
        lambda: reader.get_size("b"),
    ]
    for read in reads:
        read()
        # This thread's next call runs on the master after the read's end.
        assert reader.probe_key("missing") is False
        assert _no_read_leases(master, keys)
    assert bytes(target[:1000]) == b"A" * 1000 and bytes(target[1000:MIB]) == b"B" * (MIB - 1000)
    assert master.service.stats()["existence_holds"] == 0


def test_over_grpc_only_reads_end_their_leases_too(master: InProcessMaster, owner: Client) -> None:
    owner.put("k", b"v" * 1000)
    with Client(_config(master.address, 0, master_transport="grpc")) as reader:
        assert reader.get("k") == b"v" * 1000
        assert reader.get_batch(["k", "k"]).values == [b"v" * 1000] * 2
        wait_until(lambda: _no_read_leases(master, ["k"]), 5.0, what="the reads ended")
        reader.remove("k")


def test_remove_right_after_a_get_succeeds(
    master: InProcessMaster, owner: Client, reader: Client
) -> None:
    owner.put_batch(["one", "two"], [b"1" * 5000, b"2" * 5000]).unwrap()
    assert reader.get("one") == b"1" * 5000
    reader.remove("one")  # no force: the get's lease has ended
    assert reader.get_batch(["two"]).values == [b"2" * 5000]
    assert reader.batch_remove(["two"]).ok


def test_forced_batch_remove_after_gets_frees_the_memory_at_once(
    master: InProcessMaster, owner: Client, reader: Client
) -> None:
    before = master.service.stats()["allocated_bytes"]
    keys = [f"page-{i}" for i in range(8)]
    owner.put_batch(keys, [bytes([i]) * (256 << 10) for i in range(8)]).unwrap()
    assert master.service.stats()["allocated_bytes"] > before
    for key in keys[:4]:
        reader.get(key)
    reader.get_batch(keys[4:]).unwrap()
    assert reader.batch_remove(keys, force=True).ok
    stats = master.service.stats()
    # Nobody reads them any more: nothing is retired, all the memory is back.
    assert stats["allocated_bytes"] == before
    assert stats["retired_buffers"] == 0 and stats["retired_bytes"] == 0


class _ScriptedClock:
    """A client clock: each reading takes the next ``(time, hook)`` of the script, running the
    hook (if any) before returning the time; real monotonic time once the script ran out.

    A read reads the clock twice: before its lookup, and after its copies when it ends its
    leases. A hook on the second reading therefore runs while the read still holds its leases.
    """

    def __init__(self) -> None:
        self.script: list[tuple[float, Callable[[], object] | None]] = []

    def __call__(self) -> float:
        if not self.script:
            return time.monotonic()
        now, hook = self.script.pop(0)
        if hook is not None:
            hook()
        return now


def test_upsert_under_a_reader_succeeds_and_the_reader_keeps_the_old_bytes(
    master: InProcessMaster, owner: Client, force_tcp: bool
) -> None:
    owner.put("doc", b"old" * 1000)
    clock = _ScriptedClock()
    seen: dict[str, object] = {}

    def upsert_while_leased() -> None:
        assert master.service.is_leased(TENANT, "doc")
        owner.upsert("doc", b"new" * 1000)  # 0, not OBJECT_REPLICA_BUSY: new replicas
        seen["retired"] = master.service.stats()["retired_buffers"]

    with Client(_config(master.address, 0, force_tcp=force_tcp), clock=clock) as reader:
        clock.script = [(0.0, None), (0.0, upsert_while_leased)]  # within the lease
        assert reader.get("doc") == b"old" * 1000  # copied before the upsert, and trusted
        assert seen["retired"] == 1  # the old bytes stayed put for the reader
        assert reader.get("doc") == b"new" * 1000
        assert owner.get("doc") == b"new" * 1000
        # Each thread's next call runs on the master after its reads' ends.
        assert reader.probe_key("doc") is True and owner.probe_key("doc") is True
        assert _no_read_leases(master, ["doc"])


def test_remove_all_right_after_reads_removes_everything(
    master: InProcessMaster, owner: Client, reader: Client
) -> None:
    keys = [f"r{i}" for i in range(20)]
    owner.put_batch(keys, [b"x" * 4096] * 20).unwrap()
    reader.get_batch(keys).unwrap()
    reader.get(keys[0])
    assert reader.remove_all() == 20
    assert master.service.stats()["objects"] == 0


def test_probes_hold_nothing(master: InProcessMaster, owner: Client, reader: Client) -> None:
    owner.put_batch(["p1", "p2"], [b"1", b"2"]).unwrap()
    assert reader.probe_key("p1") is True and reader.probe_key("nope") is False
    assert reader.batch_probe_key(["p1", "nope", "p2"]).values == [True, False, True]
    assert master.service.stats()["existence_holds"] == 0
    reader.remove("p1")  # no force needed
    assert reader.batch_remove(["p2"]).ok
    with pytest.raises(InvalidParamsError):
        reader.probe_key("")


def test_last_hit_only_selects_and_holds_the_last_complete_candidate(
    master: InProcessMaster, owner: Client, reader: Client
) -> None:
    owner.put_batch(["a1", "a2", "b1", "b2", "c1"], [b"x"] * 5).unwrap()
    candidates = ["a1", "a2", "b1", "b2", "c1", "c2"]  # c2 is missing: c is incomplete
    last = ProbeLeaseMode.LAST_HIT_ONLY
    found = reader.batch_probe_key(candidates, last, 2)
    assert found.values == [False, False, True, True, False, False] and found.ok
    assert master.service.stats()["existence_holds"] == 2
    with pytest.raises(BusyError):
        owner.remove("b1")  # held for the reader, until it reads
    owner.remove("a1")  # not selected: not held
    reader.get_batch(["b1", "b2"]).unwrap()  # the reads take the holds over and end them
    assert reader.probe_key("missing") is False
    assert master.service.stats()["existence_holds"] == 0
    owner.remove("b1")
    nothing = reader.batch_probe_key(["x1", "x2", "a2", "x3"], last, 2)
    assert nothing.values == [False] * 4 and master.service.stats()["existence_holds"] == 0
    assert reader.batch_probe_key([], last, 0).values == []
    for bad in (0, 4, -1):
        with pytest.raises(InvalidParamsError):
            reader.batch_probe_key(candidates, last, bad)
    assert reader.batch_probe_key(["a2"], ProbeLeaseMode.NONE, 0).values == [True]


def test_the_drop_in_probes_follow_upstream(
    master: InProcessMaster, owner: Client, reader: Client
) -> None:
    owner.put_batch(["k1", "k2", "k3", "k4"], [b"v"] * 4).unwrap()
    store = MooncakeDistributedStore()
    store.client = reader
    assert store.probe_key("k1") == 1 and store.probe_key("gone") == 0
    assert store.probe_key("") == ErrorCode.INVALID_PARAMS
    keys = ["k1", "k2", "k3", "k4", "k5", "k6"]
    assert store.batch_probe_key(keys) == [1, 1, 1, 1, 0, 0]
    assert store.batch_probe_key(keys, "None") == [1, 1, 1, 1, 0, 0]
    assert store.batch_probe_key(keys, candidate_size=0) == [1, 1, 1, 1, 0, 0]
    assert store.batch_probe_key(keys[:4], "LastHitOnly", 2) == [0, 0, 1, 1]
    assert store.batch_probe_key(keys, "LastHitOnly", 3) == [1, 1, 1, 0, 0, 0]
    assert store.batch_probe_key([]) == [] and store.batch_probe_key([], "LastHitOnly", 0) == []
    with pytest.raises(ValueError):
        store.batch_probe_key(keys, "last_hit_only")
    with pytest.raises(ValueError):
        store.batch_probe_key(keys, "LastHitOnly", 0)
    with pytest.raises(ValueError):
        store.batch_probe_key(keys, "LastHitOnly", 4)
    with pytest.raises(TypeError):
        store.batch_probe_key(keys, "none", -1)
    store.client = None  # the reader fixture closes it
    assert MooncakeDistributedStore().batch_probe_key(["k"]) == [ErrorCode.INVALID_PARAMS]


def test_is_exist_holds_until_this_client_reads(
    master: InProcessMaster, owner: Client, reader: Client
) -> None:
    owner.put("held", b"h" * 100)
    assert reader.is_exist("held") is True
    assert master.service.is_leased(TENANT, "held")
    store = MooncakeDistributedStore()
    store.client = owner
    assert store.remove("held") == ErrorCode.OBJECT_HAS_LEASE
    assert owner.get("held") == b"h" * 100  # another client's read leaves the hold alone
    assert store.remove("held") == ErrorCode.OBJECT_HAS_LEASE
    assert reader.get("held") == b"h" * 100  # this client's read takes it over, then ends
    assert reader.probe_key("missing") is False
    assert store.remove("held") == 0
    store.client = None


def _slow_clock(step_s: float) -> Callable[[], float]:
    ticks = itertools.count()
    return lambda: next(ticks) * step_s


def test_a_copy_outliving_a_tiny_lease_succeeds_when_nothing_touched_it(
    force_tcp: bool,
) -> None:
    with InProcessMaster(default_kv_lease_ttl=1) as master:  # 1 ms leases
        with Client(_config(master.address, 32 * MIB)) as owner:
            value = bytes(range(256)) * (8 * MIB // 256)
            owner.put("big", value)
            config = _config(master.address, 0, force_tcp=force_tcp)
            # Every copy "takes" a second on this clock: far beyond its lease.
            with Client(config, clock=_slow_clock(1.0)) as reader:
                assert reader.get("big") == value
                target = np.zeros(8 * MIB, np.uint8)
                reader.register_buffer(int(target.ctypes.data), target.nbytes)
                assert reader.get_into("big", int(target.ctypes.data), target.nbytes) == 8 * MIB
                assert target.tobytes() == value
                assert reader.get_buffer("big").to_pybytes() == value
            # The ends were synchronous: the master holds nothing for them.
            assert _no_read_leases(master, ["big"])
        master.service.check()


def test_a_copy_outliving_its_lease_over_bytes_reused_meanwhile_fails_alone(
    force_tcp: bool,
) -> None:
    # The owner's segment holds exactly two values: once "v" is force-removed, the next write
    # of that size lands where "v" was.
    with InProcessMaster(default_kv_lease_ttl=1, background=False) as master:
        with Client(_config(master.address, 2 * MIB)) as owner:
            owner.put_batch(["v", "u"], [b"V" * MIB, b"U" * MIB]).unwrap()
            assert master.service.stats()["allocated_bytes"] == 2 * MIB

            def reuse_v_while_the_read_is_late() -> None:
                time.sleep(0.02)  # the read's 1 ms leases run out on the master's clock
                owner.remove("v", force=True)  # expires the leases, then frees v's range
                owner.put("w", b"W" * MIB)  # handed out again: the late read is clobbered

            clock = _ScriptedClock()
            config = _config(master.address, 0, force_tcp=force_tcp)
            with Client(config, clock=clock) as reader:
                clock.script = [(0.0, None), (1.0, reuse_v_while_the_read_is_late)]
                result = reader.get_batch(["v", "u"])
                # The master cannot vouch for "v"'s copy; "u"'s bytes were never touched.
                assert result.codes == [ErrorCode.LEASE_EXPIRED, 0]
                assert result.values == [None, b"U" * MIB]
                clock.script = [(0.0, None), (1.0, None)]
                assert reader.get("u") == b"U" * MIB  # late, untouched: trusted
                # The typed single-key call raises for such a copy.
                clock.script = [(0.0, None), (1.0, reuse_v_while_the_read_is_late)]
                owner.remove("w", force=True)
                owner.put("v", b"V" * MIB)
                with pytest.raises(LeaseExpiredError) as expired:
                    reader.get("v")
                assert expired.value.key == "v"
                assert reader.get("w") == b"W" * MIB  # in time: trusted without asking
            # Closing wrote the last one-way end; the master runs it moments later.
            wait_until(lambda: _no_read_leases(master, ["u", "w"]), 5.0, what="the reads ended")
        master.service.check()
