"""KV sessions end to end: real master, in-process and child-process clients."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from mooncake_py import (
    ErrorCode,
    MooncakeError,
    ReplicateConfig,
)
from mooncake_py.testing import InProcessMaster
from tests.conftest import ClientProcess, client_config

MIB = 1 << 20


def tagged(*sessions: str, keys: int = 1) -> ReplicateConfig:
    return ReplicateConfig(kv_sessions=[list(sessions)] * keys)


def test_prefix_written_by_one_client_is_attached_by_another(
    master: InProcessMaster, make_store, client_processes: list[ClientProcess]
) -> None:  # type: ignore[no-untyped-def]
    writer = ClientProcess()
    client_processes.append(writer)
    assert writer.call("setup", config=client_config(master.address, 32 * MIB)) == 0
    prefix = [f"prefix-{i}" for i in range(4)]
    assert writer.call("put_from", keys=prefix, size=4096) == [0] * 4
    engine = make_store(master.address, 0)
    assert engine.attach_kv_session("conv-1", [*prefix, prefix[0], "absent"]) == [
        0,
        0,
        0,
        0,
        0,
        -704,
    ]
    info = engine.get_kv_session("conv-1")
    assert (info.session_id, info.pinned, info.member_count) == ("conv-1", False, 4)
    assert info.bytes == info.exclusive_bytes == 4 * 4096
    assert abs(info.created_at - time.time()) < 60 and info.idle_ms < 60_000
    other = make_store(master.address, 0)
    assert other.attach_kv_session("conv-2", prefix[:2]) == [0, 0]  # shared prefix
    assert engine.get_kv_session("conv-1").exclusive_bytes == 2 * 4096
    assert other.update_kv_session("conv-1", prefix[:1]) == 0  # update across clients
    assert engine.get_kv_session("conv-1").member_count == 1
    assert engine.close_kv_session("conv-1") == 0
    assert engine.close_kv_session("conv-1") == 0  # idempotent
    with pytest.raises(MooncakeError, match="SESSION_NOT_FOUND"):
        engine.get_kv_session("conv-1")
    assert engine.batch_is_exist(prefix) == [1] * 4  # close keeps shared data
    assert other.get_kv_session("conv-2").member_count == 2


def test_every_write_form_tags_its_keys(master: InProcessMaster, make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store(master.address, 32 * MIB)
    buffer = np.arange(64 * 1024, dtype=np.uint8)
    store.register_buffer(buffer.ctypes.data, buffer.nbytes)
    ptr = buffer.ctypes.data
    assert store.put("p", b"v", tagged("s")) == 0
    assert store.put_batch(["b1", "b2"], [b"1", b"2"], tagged("s", keys=2)) == 0
    assert store.put_parts("parts", b"a", b"b", config=tagged("s")) == 0
    assert store.put_from("from", ptr, 1000, tagged("s")) == 0
    assert store.batch_put_from(["f1", "f2"], [ptr, ptr + 1000], [10, 10], tagged("s", keys=2)) == [
        0,
        0,
    ]
    assert store.upsert("up", b"x", tagged("s")) == 0
    assert store.batch_upsert_from(["u1", "u2"], [ptr, ptr], [5, 5], tagged("s", keys=2)) == [0, 0]
    page = store.list_kv_session_keys("s")
    assert page.keys == sorted(["p", "b1", "b2", "parts", "from", "f1", "f2", "up", "u1", "u2"])
    assert page.next_cursor == ""
    # A duplicate put adds membership and keeps the data.
    assert store.put("p", b"different", tagged("t")) == 0
    assert store.get("p") == b"v"
    assert store.get_kv_session("t").member_count == 1
    # Upsert keeps memberships, same size or not (b1 has not been read, so it is not leased).
    assert store.upsert("b1", b"replaced") == 0
    assert store.upsert("b2", b"9") == 0
    assert store.get_batch(["b1", "b2"]) == [b"replaced", b"9"]
    assert store.get_kv_session("s").member_count == 10
    # Mismatched tag lists are refused and add nothing.
    assert (
        store.put_batch(["x1", "x2"], [b"1", b"2"], tagged("bad", keys=1))
        == ErrorCode.INVALID_PARAMS
    )
    with pytest.raises(MooncakeError, match="SESSION_NOT_FOUND"):
        store.get_kv_session("bad")
    # Removing the last member ends the session and its pin.
    assert store.pin_kv_session("t") == 0
    assert store.remove("p", force=True) == 0
    with pytest.raises(MooncakeError, match="SESSION_NOT_FOUND"):
        store.pin_kv_session("t")
    master.service.check()


def test_paging_with_limit_one(master: InProcessMaster, make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store(master.address, 8 * MIB)
    keys = [f"k{i:02d}" for i in range(7)]
    assert store.put_batch(keys, [b"v"] * 7, tagged("paged", keys=7)) == 0
    seen, cursor = [], ""
    while True:
        page = store.list_kv_session_keys("paged", cursor, limit=1)
        seen += page.keys
        cursor = page.next_cursor
        if not cursor:
            break
    assert seen == keys
    with pytest.raises(MooncakeError, match="INVALID_PARAMS"):
        store.list_kv_session_keys("paged", limit=0)


def test_pinned_session_survives_pressure_that_evicts_unpinned(make_store) -> None:  # type: ignore[no-untyped-def]
    with InProcessMaster() as master:
        store = make_store(master.address, 16 * MIB)
        assert store.put_batch(["live-0", "live-1"], [b"L" * MIB] * 2, tagged("live", keys=2)) == 0
        assert store.pin_kv_session("live") == 0
        for i in range(40):
            assert store.put(f"cold-{i}", bytes([i]) * MIB) == 0
        assert store.get("live-0") == b"L" * MIB and store.get("live-1") == b"L" * MIB
        assert store.get("cold-0") == b""
        assert master.service.stats()["evicted_soft_pinned"] == 0
        # Unpinned, they are ordinary cache again: the gets ended their leases (long before
        # the 10 s TTL), and this thread's next call runs after those ends.
        assert store.unpin_kv_session("live") == 0
        assert not master.service.is_leased("default", "live-0")
        assert not master.service.is_leased("default", "live-1")
        for i in range(40, 80):
            assert store.put(f"cold-{i}", bytes([i]) * MIB) == 0
        assert store.get("live-0") == b""


def test_pinned_sessions_survive_everything_without_soft_pin_eviction(make_store) -> None:  # type: ignore[no-untyped-def]
    # No background pass: at 100% use it would evict the newest unpinned object between the
    # puts and the check below (the writes' own evictions are what this test is about).
    with InProcessMaster(allow_evict_soft_pinned_objects=False, background=False) as master:
        store = make_store(master.address, 8 * MIB)
        keys = [f"pinned-{i}" for i in range(7)]
        assert store.put_batch(keys, [b"P" * MIB] * 7, tagged("keep", keys=7)) == 0
        assert store.pin_kv_session("keep") == 0
        # Only the last free MiB turns over: each newcomer evicts the previous one.
        assert [store.put(f"more-{i}", b"m" * MIB) for i in range(4)] == [0] * 4
        assert store.batch_is_exist([f"more-{i}" for i in range(4)]) == [0, 0, 0, 1]
        # Room for 2 MiB would need a pinned object to go: the write fails instead.
        assert store.put("big", b"b" * 2 * MIB) == ErrorCode.NO_AVAILABLE_HANDLE
        assert store.batch_is_exist(keys) == [1] * 7
        assert master.service.stats()["evicted_soft_pinned"] == 0


def test_update_races_removes_and_close_races_attaches(master: InProcessMaster, make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store(master.address, 64 * MIB)
    other = make_store(master.address, 0)
    keys = [f"race-{i:04d}" for i in range(2000)]
    assert store.put_batch(keys, [b"r"] * 2000, tagged("racing", keys=2000)) == 0
    remover = threading.Thread(target=lambda: other.batch_remove(keys[::3], force=True))
    remover.start()
    assert store.update_kv_session("racing", keys[::2]) == 0
    remover.join()
    members = set(store.list_kv_session_keys("racing", limit=4096).keys)
    assert members == set(keys[::2]) - set(keys[::3])
    master.service.check()

    attacher = threading.Thread(
        target=lambda: [
            other.attach_kv_session("racing", keys[i : i + 50]) for i in range(0, 2000, 50)
        ]
    )
    attacher.start()
    assert store.close_kv_session("racing") == 0
    attacher.join()
    master.service.check()  # whatever interleaving happened, the indexes agree
    assert store.close_kv_session("racing") == 0
    with pytest.raises(MooncakeError, match="SESSION_NOT_FOUND"):
        store.get_kv_session("racing")


def test_long_ids_and_one_object_in_many_sessions(master: InProcessMaster, make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store(master.address, 8 * MIB)
    long_id = "L" * 2000
    assert store.put("shared", b"s", tagged(long_id)) == 0
    assert store.get_kv_session(long_id).member_count == 1
    for i in range(1024):
        assert store.attach_kv_session(f"s-{i}", ["shared"]) == [0]
    assert store.get_kv_session("s-1023").member_count == 1
    assert store.remove("shared", force=True) == 0
    assert master.service.stats()["objects"] == 0
    with pytest.raises(MooncakeError, match="SESSION_NOT_FOUND"):
        store.get_kv_session("s-0")
    master.service.check()


def test_bad_input_changes_nothing(make_store) -> None:  # type: ignore[no-untyped-def]
    with InProcessMaster(kv_session_max_members=3, kv_session_max_batch=8) as master:
        store = make_store(master.address, 8 * MIB)
        assert store.put_batch(["a", "b", "c", "d"], [b"1"] * 4) == 0
        for bad in ("", "x\0y", "y" * 5000):
            with pytest.raises(MooncakeError, match="INVALID_PARAMS"):
                store.attach_kv_session(bad, ["a"])
            with pytest.raises(MooncakeError, match="INVALID_PARAMS"):
                store.pin_kv_session(bad)
        with pytest.raises(MooncakeError, match="INVALID_PARAMS"):
            store.attach_kv_session("s", ["a"] * 9)  # more than max_batch
        assert store.attach_kv_session("s", ["a", "b", "c", "d"]) == [-1802] * 4
        with pytest.raises(MooncakeError, match="SESSION_NOT_FOUND"):
            store.get_kv_session("s")  # the refused attach published nothing
        assert store.attach_kv_session("s", ["a", "b", "c"]) == [0, 0, 0]
        with pytest.raises(MooncakeError, match="SESSION_LIMIT_EXCEEDED"):
            store.update_kv_session("s", ["a", "b", "c", "d"])
        assert store.put("e", b"5", tagged("s")) == ErrorCode.SESSION_LIMIT_EXCEEDED
        assert store.is_exist("e") == 0  # the refused write left nothing
        assert store.get_kv_session("s").member_count == 3
        with pytest.raises(MooncakeError, match="SESSION_NOT_FOUND"):
            store.unpin_kv_session("nope")
        assert store.update_kv_session("nope", ["a"]) == 0
        master.service.check()
