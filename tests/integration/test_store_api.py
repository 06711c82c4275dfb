"""The drop-in API against a real master: return conventions, leases, preemption, zero copy."""

from __future__ import annotations

import numpy as np
import pytest

from mooncake_py import (
    AsyncMooncakeStore,
    BufferHandle,
    ErrorCode,
    MooncakeDistributedStore,
    MooncakeError,
)
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.master.clock import FakeClock
from mooncake_py.testing import InProcessMaster
from mooncake_py.types import ReplicateConfig


def test_return_conventions(master: InProcessMaster, make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store(master.address)
    assert store.put("k", b"v1") == 0
    assert store.put("k", b"other") == 0  # first writer wins, reported as success
    assert store.get("k") == b"v1"
    assert store.get("missing") == b""
    assert store.get_batch(["k", "missing"]) == [b"v1", b""]
    assert store.get_batch([]) == [b""]
    assert store.put("empty", b"") == ErrorCode.INVALID_PARAMS
    assert store.put_batch(["a", "b"], [b"1"]) == ErrorCode.INVALID_PARAMS
    assert store.put_batch(["a", "b"], [b"1", bytearray(b"22")]) == 0
    assert store.put_parts("parts", b"ab", memoryview(b"cd"), np.frombuffer(b"ef", np.uint8)) == 0
    assert store.get("parts") == b"abcdef"
    with pytest.raises(MooncakeError, match="INVALID_PARAMS"):
        store.put_parts("bad", np.zeros((2, 2), np.uint8))
    assert store.get_size("parts") == 6
    assert store.get_size("missing") == ErrorCode.OBJECT_NOT_FOUND
    assert store.is_exist("k") == 1 and store.is_exist("missing") == 0
    assert store.batch_is_exist(["k", "missing", "a"]) == [1, 0, 1]
    assert store.remove("missing") == ErrorCode.OBJECT_NOT_FOUND
    assert store.remove("k") == ErrorCode.OBJECT_HAS_LEASE  # is_exist leased it
    assert store.remove("k", force=True) == 0
    assert store.batch_remove(["a", "missing"], force=True) == [0, ErrorCode.OBJECT_NOT_FOUND]
    assert store.remove_by_regex("[") == ErrorCode.INVALID_PARAMS
    assert store.remove_by_regex("^par", force=True) == 1
    assert store.remove_all(force=True) == 1  # "b"
    assert store.health_check() == 0
    assert store.get_hostname().startswith("127.0.0.1:")
    assert store.close() == 0
    assert store.health_check() == 1
    assert store.put("after-close", b"x") == ErrorCode.INVALID_PARAMS
    assert store.get("after-close") == b""


def test_numpy_and_zero_copy(master: InProcessMaster, make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store(master.address)
    source = np.arange(1 << 20, dtype=np.uint8)
    target = np.zeros(2 << 20, dtype=np.uint8)
    assert (
        store.put_from("unregistered", source.ctypes.data, source.nbytes)
        == ErrorCode.INVALID_PARAMS
    )
    assert store.register_buffer(source.ctypes.data, source.nbytes) == 0
    assert store.register_buffer(target.ctypes.data, target.nbytes) == 0
    assert store.put_from("zc", source.ctypes.data, source.nbytes) == 0
    assert store.get_into("zc", target.ctypes.data, target.nbytes) == source.nbytes
    assert np.array_equal(target[: source.nbytes], source)
    assert store.get_into("zc", target.ctypes.data, 100) == ErrorCode.INVALID_PARAMS  # too small
    assert store.get_into("nope", target.ctypes.data, 100) == ErrorCode.OBJECT_NOT_FOUND
    half = source.nbytes // 2
    codes = store.batch_put_from(
        ["h1", "h2"], [source.ctypes.data, source.ctypes.data + half], [half, half]
    )
    assert codes == [0, 0]
    codes = store.batch_get_into(
        ["h2", "h1", "x"], [target.ctypes.data, target.ctypes.data + half, 0], [half] * 3
    )
    assert codes == [half, half, ErrorCode.OBJECT_NOT_FOUND]
    assert np.array_equal(target[:half], source[half:])
    assert store.unregister_buffer(target.ctypes.data) == 0
    assert store.unregister_buffer(target.ctypes.data) == ErrorCode.INVALID_PARAMS
    assert store.get_into("zc", target.ctypes.data, target.nbytes) == ErrorCode.INVALID_PARAMS

    buffer = store.get_buffer("zc")
    assert isinstance(buffer, BufferHandle) and buffer.size() == source.nbytes
    assert np.array_equal(np.frombuffer(buffer, np.uint8), source)
    assert store.get_buffer("absent") is None
    assert [b is not None for b in store.batch_get_buffer(["h1", "absent"])] == [True, False]


@pytest.mark.parametrize("force_tcp", [False, True], ids=["shm", "tcp"])
def test_get_buffer_is_a_copy_that_outlives_its_read(  # type: ignore[no-untyped-def]
    master: InProcessMaster, make_store, force_tcp: bool
) -> None:
    owner = make_store(master.address)
    reader = make_store(master.address, 0, force_tcp=force_tcp)
    assert owner.put("shared", b"abc" * 1000) == 0
    one = reader.get_buffer("shared")
    two = reader.get_buffer("shared")
    assert one is not None and two is not None
    assert one.ptr() != two.ptr()  # each its own copy, not a view of the segment
    # The read lease ended with the call: the object goes, its memory is reused...
    assert reader.remove("shared") == 0
    assert owner.put("shared", b"xyz" * 1000) == 0
    # ...and the buffers still hold what was read.
    assert one == two == b"abc" * 1000
    assert reader.batch_get_buffer(["shared", "missing"])[0] == b"xyz" * 1000


def test_tcp_get_buffer_is_a_copy(master: InProcessMaster, make_store) -> None:  # type: ignore[no-untyped-def]
    owner = make_store(master.address)
    reader = make_store(master.address, 0, force_tcp=True)
    assert owner.put("copied", b"xyz" * 10) == 0
    buffer = reader.get_buffer("copied")
    assert buffer is not None and buffer == b"xyz" * 10


def test_reads_end_their_leases_and_existence_holds_last_until_the_next_read(make_store) -> None:  # type: ignore[no-untyped-def]
    clock = FakeClock()
    with InProcessMaster(clock=clock, background=False, default_kv_lease_ttl=5000) as master:
        store = make_store(master.address)
        assert store.put("read", b"data") == 0
        assert store.get("read") == b"data"
        assert store.remove("read") == 0  # the get ended its lease once its copy was done
        assert store.put("checked", b"data") == 0
        assert store.is_exist("checked") == 1  # an existence hold, until this client reads it
        assert store.remove("checked") == ErrorCode.OBJECT_HAS_LEASE
        assert store.remove_all() == 0
        clock.advance(4.9)
        assert store.remove("checked") == ErrorCode.OBJECT_HAS_LEASE
        clock.advance(0.2)  # an unconsumed hold lapses at the TTL
        assert store.remove("checked") == 0
        assert store.put("probed", b"data") == 0
        assert store.probe_key("probed") == 1
        assert store.remove("probed") == 0  # a probe holds nothing
        assert store.put("fresh", b"unread") == 0
        assert store.remove("fresh") == 0  # a write grants no lease
        master.service.check()


# A read that outlives its lease: tests/integration/test_typed_client.py, on an injected clock.


def test_unfinished_put_is_preempted_after_discard_timeout(make_store) -> None:  # type: ignore[no-untyped-def]
    clock = FakeClock()
    with InProcessMaster(clock=clock, background=False) as master:
        store = make_store(master.address, 4 << 20)
        stuck = MasterClient(master.address)
        started = stuck.put_start("stuck-writer", "default", "key", 1 << 20, ReplicateConfig())
        assert started.code == 0 and len(started.replicas) == 1
        assert store.put("key", b"new") == 0  # reported as success: first writer wins...
        assert store.get("key") == b""  # ...but the stuck write is still invisible
        clock.advance(master.config.put_start_discard_timeout_sec + 1)
        assert store.put("key", b"new") == 0
        assert store.get("key") == b"new"
        # The stuck writer's buffer is still reserved: it may be mid-transfer.
        assert master.service.stats()["preempted_buffers"] == 1
        # The stuck write was preempted: its end fails, and its buffer comes back at once.
        assert (
            stuck.put_end("stuck-writer", "default", "key", started.write_id)
            == ErrorCode.INVALID_WRITE
        )
        assert master.service.stats()["preempted_buffers"] == 0
        clock.advance(master.config.put_start_release_timeout_sec)
        assert master.service.sweep_expired_puts(clock()) == 0
        master.service.check()
        stuck.close()


def test_revoked_and_expired_writes_leave_nothing(make_store) -> None:  # type: ignore[no-untyped-def]
    clock = FakeClock()
    with InProcessMaster(clock=clock, background=False) as master:
        store = make_store(master.address, 4 << 20)
        writer = MasterClient(master.address)
        revoked = writer.put_start("w", "default", "revoked", 1000, ReplicateConfig())
        assert revoked.code == 0 and revoked.write_id > 0
        assert writer.put_revoke("w", "default", "revoked", revoked.write_id) == 0
        assert store.is_exist("revoked") == 0
        assert writer.put_start("w", "default", "abandoned", 1000, ReplicateConfig()).code == 0
        assert store.remove("abandoned", force=True) == ErrorCode.REPLICA_IS_NOT_READY
        clock.advance(master.config.put_start_release_timeout_sec + 1)
        assert master.service.sweep_expired_puts(clock()) == 1
        assert master.service.stats()["allocated_bytes"] == 0
        writer.close()


async def test_async_store_round_trip(master: InProcessMaster) -> None:
    async with AsyncMooncakeStore() as store:
        config = {
            "local_hostname": "127.0.0.1",
            "metadata_server": "P2PHANDSHAKE",
            "global_segment_size": 8 << 20,
            "master_server_address": master.address,
        }
        assert await store.setup(config) == 0
        assert await store.put("async", b"value") == 0
        assert await store.get("async") == b"value"
        assert await store.batch_is_exist(["async", "nope"]) == [1, 0]
        assert store.health_check() == 0
        assert await store.remove("async", force=True) == 0


def test_async_store_has_every_data_method() -> None:
    public = {n for n in dir(MooncakeDistributedStore) if not n.startswith("_")}
    public.discard("setup_with_config")
    assert public <= set(dir(AsyncMooncakeStore))


def test_setup_forms_and_env(
    master: InProcessMaster, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    positional = MooncakeDistributedStore()
    assert (
        positional.setup("127.0.0.1", "P2PHANDSHAKE", 1 << 20, 1 << 20, "tcp", "", master.address)
        == 0
    )
    assert positional.setup({"local_hostname": "x"}) == ErrorCode.INVALID_PARAMS  # already set up
    positional.close()

    monkeypatch.setenv("MOONCAKE_MASTER", master.address)
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "2mb")
    from_env = MooncakeDistributedStore()
    assert from_env.setup() == 0
    assert master.service.stats()["capacity_bytes"] == 2 << 20
    from_env.close()

    config_file = tmp_path / "mooncake.json"
    config_file.write_text(
        '{"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", '
        f'"master_server_address": "{master.address}", "global_segment_size": "3MB"}}'
    )
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(config_file))
    from_file = MooncakeDistributedStore()
    assert from_file.setup() == 0
    assert master.service.stats()["capacity_bytes"] == 3 << 20
    from_file.close()

    bad = MooncakeDistributedStore()
    assert (
        bad.setup({"global_segment_size": 10, "master_server_address": master.address})
        == ErrorCode.INVALID_PARAMS
    )
    unreachable = MooncakeDistributedStore()
    assert (
        unreachable.setup({"master_server_address": "127.0.0.1:1", "rpc_timeout_s": 1})
        == ErrorCode.RPC_FAIL
    )
