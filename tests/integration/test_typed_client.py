"""The typed Client against a real in-process master: values and typed exceptions for single
keys, per-key results for batches, the asyncio twin, and late reads measured on an injected
clock."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from mooncake_py import (
    AsyncClient,
    BatchResult,
    BusyError,
    Client,
    ClientConfig,
    ErrorCode,
    InvalidParamsError,
    MooncakeDistributedStore,
    MooncakeError,
    NotFoundError,
    ReplicateConfig,
    UnavailableError,
)
from mooncake_py.testing import InProcessMaster

MIB = 1 << 20


def _config(address: str, segment_bytes: int = 16 * MIB, **extra: object) -> ClientConfig:
    return ClientConfig.from_mapping(
        {"master_server_addr": address, "global_segment_size": segment_bytes, **extra}
    )


@pytest.fixture
def master() -> Iterator[InProcessMaster]:
    with InProcessMaster() as running:
        yield running


def test_single_keys_return_values_and_raise_typed_errors(master: InProcessMaster) -> None:
    with Client(_config(master.address)) as client:
        client.put("a", b"alpha")
        client.put("a", b"other")  # first writer wins, and that is success
        assert client.get("a") == b"alpha"
        assert client.get_size("a") == 5 and client.is_exist("a") is True
        assert client.is_exist("missing") is False
        with pytest.raises(NotFoundError) as missing:
            client.get("missing")
        assert missing.value.code == ErrorCode.OBJECT_NOT_FOUND
        assert missing.value.key == "missing"
        assert isinstance(missing.value, MooncakeError)
        with pytest.raises(InvalidParamsError):
            client.put("", b"x")
        with pytest.raises(BusyError) as leased:
            client.remove("a")  # is_exist's existence hold lasts until this client reads "a"
        assert leased.value.code == ErrorCode.OBJECT_HAS_LEASE
        assert client.get("a") == b"alpha"  # takes the hold over; its end gives it back
        client.remove("a")
        assert client.probe_key("a") is False
        with pytest.raises(NotFoundError):
            client.remove("a")
        with pytest.raises(NotFoundError) as session:
            client.pin_kv_session("nobody")
        assert session.value.code == ErrorCode.SESSION_NOT_FOUND
        assert session.value.key == "nobody"


def test_batches_return_one_result_per_key(master: InProcessMaster) -> None:
    with Client(_config(master.address)) as client:
        written = client.put_batch(["k1", "k2"], [b"one", b"two"])
        assert isinstance(written, BatchResult) and written.ok and len(written) == 2
        read = client.get_batch(["k1", "nope", "k2"])
        assert read.codes == [0, ErrorCode.OBJECT_NOT_FOUND, 0]
        assert [r.key for r in read.failed()] == ["nope"]
        assert read[0].unwrap() == b"one" and read[2].value == b"two"
        assert isinstance(read.errors()["nope"], NotFoundError)
        with pytest.raises(NotFoundError) as first_failure:
            read.unwrap()
        assert first_failure.value.key == "nope"
        assert client.batch_is_exist(["k1", "nope"]).values == [True, False]
        with pytest.raises(InvalidParamsError):
            client.put_batch(["k1"], [b"1", b"2"])  # a malformed call raises as a whole
        buffer = np.zeros(8, np.uint8)
        client.register_buffer(buffer.ctypes.data, buffer.nbytes)
        into = client.batch_get_into(["k1", "k2"], [buffer.ctypes.data, 0], [8, 8])
        assert into.codes == [0, ErrorCode.INVALID_PARAMS] and into.values[0] == 3
        assert bytes(buffer[:3]) == b"one"
        attached = client.attach_kv_session("s", ["k1", "absent"])
        assert attached.codes == [0, ErrorCode.OBJECT_NOT_FOUND]
        client.pin_kv_session("s")
        assert client.get_kv_session("s").pinned
        listing = client.list_kv_sessions()
        assert [i.session_id for i in listing.sessions] == ["s"] and listing.next_cursor == ""
        assert client.release_kv_session("s").sessions == 1
        assert {s.segment.id for s in client.segments()} and client.stats()["objects"] >= 1


def test_joining_an_unreachable_master_raises_unavailable() -> None:
    with pytest.raises(UnavailableError):
        Client(_config("127.0.0.1:1", 0, rpc_timeout_s=0.5))
    store = MooncakeDistributedStore()
    assert store.setup_with_config(_config("127.0.0.1:1", 0, rpc_timeout_s=0.5)) == (
        ErrorCode.RPC_FAIL
    )


def _slow_clock(step_s: float) -> Callable[[], float]:
    """A clock on which every reading is ``step_s`` after the previous one: any copy between
    two readings takes ``step_s``, however fast the machine."""
    ticks = itertools.count()
    return lambda: next(ticks) * step_s


def test_a_read_that_outlives_its_lease_is_kept_when_the_master_vouches_for_it() -> None:
    # A copy that outlived its lease is checked with a synchronous EndReads: nothing touched
    # the bytes here, so it succeeds (tests/integration/test_read_leases.py has the opposite).
    with InProcessMaster(default_kv_lease_ttl=5) as master:  # 5 ms leases
        owner = Client(_config(master.address))
        owner.put("v", b"x" * MIB)
        for force_tcp in (False, True):  # a copy out of the mapped segment, then over TCP
            reader = Client(_config(master.address, 0, force_tcp=force_tcp), clock=_slow_clock(1))
            assert reader.get("v") == b"x" * MIB
            store = MooncakeDistributedStore()
            store.client = reader  # the drop-in face reports the same outcome its own way
            assert store.get("v") == b"x" * MIB
            target = np.zeros(MIB, np.uint8)
            assert store.register_buffer(target.ctypes.data, target.nbytes) == 0
            assert store.get_into("v", target.ctypes.data, MIB) == MIB
            assert store.remove("v") == 0 and store.put("v", b"x" * MIB) == 0
            store.close()
        master.service.check()
        assert master.service.stats()["read_holds"] == 0
        owner.close()


async def test_async_client_mirrors_the_client(master: InProcessMaster) -> None:
    async with await AsyncClient.connect(_config(master.address)) as client:
        await client.put("a", b"1", ReplicateConfig())
        assert await client.get("a") == b"1"
        assert (await client.batch_is_exist(["a", "b"])).values == [True, False]
        assert await client.probe_key("a") is True
        assert (await client.batch_probe_key(["a", "b"])).values == [True, False]
        with pytest.raises(NotFoundError):
            await client.get("b")
        assert client.master_reachable
