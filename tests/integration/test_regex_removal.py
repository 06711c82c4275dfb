"""Bulk removals against a real in-process master: other callers keep being served while one
runs, and a pathological pattern over the wire is answered at once.

The removal below is called on the service from a thread of its own, as a transport that
dispatched heavy calls off the event loop would run it; meanwhile another client calls
``ExistKey`` over gRPC in a loop. Its worst call must stay far below the removal's length: the
removal gives up the lock every slice. (Over the wire today the removal itself runs on the
master's event loop, which serves every call, so there a removal still delays the calls behind
it; :func:`test_removal_over_the_wire` only checks the answers.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.errors import ErrorCode
from mooncake_py.master.state.objects import MAX_KEY_BYTES
from mooncake_py.testing import InProcessMaster
from mooncake_py.types import ReplicateConfig, SegmentInfo

KEYS = 20_000


@pytest.fixture
def master() -> Iterator[InProcessMaster]:
    # No timers: the filler "client" below never pings, and must not be reaped.
    with InProcessMaster(background=False) as running:
        yield running
        running.service.check()


def _fill(master: InProcessMaster, keys: list[str]) -> None:
    service = master.service
    segment = SegmentInfo(
        id="seg-fill",
        name="fill",
        base=0x1000,
        size=1 << 30,
        te_endpoint="127.0.0.1:1",
        host_id="host-fill",
        shm_path="",
    )
    assert service.mount_segment("filler", segment) == ErrorCode.OK
    for start in range(0, len(keys), 1000):
        batch = keys[start : start + 1000]
        results = service.batch_put_start("filler", "", batch, [64] * len(batch), ReplicateConfig())
        assert all(r.code == ErrorCode.OK for r in results)
        assert service.batch_put_end("filler", "", batch) == [ErrorCode.OK] * len(batch)


def _probe_until(stop: threading.Event, client: MasterClient, latencies: list[float]) -> None:
    while not stop.is_set():
        began = time.perf_counter()
        assert client.exist_key("", "probe/absent", "prober") == 0
        latencies.append(time.perf_counter() - began)


def test_other_callers_interleave_with_a_removal(master: InProcessMaster) -> None:
    keys = [f"layer/{i % 64}/block/{i:06d}" for i in range(KEYS)]
    _fill(master, keys)
    prober = MasterClient(master.address)
    latencies: list[float] = []
    stop = threading.Event()
    probing = threading.Thread(target=_probe_until, args=(stop, prober, latencies))
    probing.start()
    try:
        while len(latencies) < 20:  # warmed up: the channel is connected
            time.sleep(0.001)
        before = len(latencies)
        began = time.perf_counter()
        # A pattern that must look at the whole of every key, and matches every one.
        code, count = master.service.remove_by_regex("", r"^layer/\d+/block/\d+$")
        removal_s = time.perf_counter() - began
        during = latencies[before:]
    finally:
        stop.set()
        probing.join(timeout=30)
        prober.close()
    assert (code, count) == (ErrorCode.OK, KEYS)
    assert master.service.stats()["objects"] == 0
    assert len(during) >= 3, (removal_s, len(during))  # served all along, not once at the end
    worst = max(during)
    print(
        f"removal {removal_s * 1e3:.1f} ms, {len(during)} probes during it, "
        f"worst probe {worst * 1e3:.2f} ms (ratio {worst / removal_s:.3f})"
    )
    assert worst < removal_s / 4, (worst, removal_s)


def test_removal_over_the_wire(master: InProcessMaster) -> None:
    keys = ["a" * (MAX_KEY_BYTES - 1) + "!", "aaa", "bbb"]
    _fill(master, keys)
    client = MasterClient(master.address)
    try:
        # Exponential for a backtracking engine over this 4096-byte key; linear for RE2 (the
        # unit tests check the growth).
        assert client.remove_by_regex("", "(a+)+$", False) == 1  # "aaa"
        assert client.remove_by_regex("", r"(a)\1", False) == ErrorCode.INVALID_PARAMS
        assert client.remove_by_regex("", "x" * 4097, False) == ErrorCode.INVALID_PARAMS
        assert client.remove_all("", False) == 2
    finally:
        client.close()
