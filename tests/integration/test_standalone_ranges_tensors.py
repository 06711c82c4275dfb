"""Standalone mode: ``get_into_ranges`` and the tensor calls' zero-copy forms on stores
attached with ``setup_dummy``.

Everything is real: a master in this process, the standalone service (``python -m
mooncake_py.client.standalone``) as a child process, and the engines as stores of this
process attached to it over its socket (each store a connection of its own, with memory of
its own from ``alloc_from_mem_pool``). The tensor tests need torch and are skipped without it.
"""

from __future__ import annotations

import ctypes
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy
import pytest

from mooncake_py import ErrorCode
from mooncake_py.client.compat_standalone import MooncakeHostMemAllocator
from mooncake_py.testing import InProcessMaster
from tests.integration.test_standalone import Service, Store

INVALID = int(ErrorCode.INVALID_PARAMS)
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
DATA1 = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
DATA2 = b"abcdefghijklmnopqrstuvwxyz0123456789"


@pytest.fixture
def service(master: InProcessMaster) -> Iterator[Service]:
    runtime = Path(tempfile.mkdtemp(prefix="mcsa-", dir="/tmp"))
    running = Service(master.address, runtime)
    yield running
    status = running.stop()
    shutil.rmtree(runtime, ignore_errors=True)
    assert status == 0


@pytest.fixture
def attach(service: Service) -> Iterator[Callable[[], Any]]:
    stores: list[Any] = []

    def start() -> Any:
        store = Store()
        assert store.setup_dummy(64 << 20, 16 << 20, f"unix:{service.socket}") == 0
        stores.append(store)
        return store

    yield start
    for store in stores:
        assert store.close() == 0


def _pool(store: Any, size: int, fill: bytes = b"_") -> tuple[int, Any]:
    """``size`` bytes from the store's pool, filled with ``fill``, and a ctypes view of them."""
    ptr = store.alloc_from_mem_pool(size)
    assert ptr != 0
    assert store.register_buffer(ptr, size) == 0
    ctypes.memset(ptr, fill[0], size)
    return ptr, (ctypes.c_ubyte * size).from_address(ptr)


# -- get_into_ranges ---------------------------------------------------------------------------


def test_get_into_ranges_copies_ranges_of_many_objects(attach: Callable[[], Any]) -> None:
    writer, reader = attach(), attach()
    assert writer.put("k1", DATA1) == 0 and writer.put("k2", DATA2) == 0
    ptr0, buf0 = _pool(reader, 32)
    ptr1, buf1 = _pool(reader, 32)
    results = reader.get_into_ranges(
        [ptr0, ptr1],
        [["k1", "k2"], ["k2", "k1"]],
        [[[0, 20], [8]], [[4], [16]]],
        [[[2, 30], [10]], [[0], [12]]],
        [[[4, 3], [6]], [[6], [4]]],
    )
    assert results == [[[4, 3], [6]], [[6], [4]]]
    want0 = bytearray(b"_" * 32)
    want0[0:4], want0[8:14], want0[20:23] = DATA1[2:6], DATA2[10:16], DATA1[30:33]
    want1 = bytearray(b"_" * 32)
    want1[4:10], want1[16:20] = DATA2[0:6], DATA1[12:16]
    assert bytes(buf0) == bytes(want0) and bytes(buf1) == bytes(want1)
    # Integers of any kind are addresses and offsets, as in-process.
    ctypes.memset(ptr0, ord("_"), 32)
    assert reader.get_into_ranges(
        [numpy.uint64(ptr0)], [["k2"]], [[[numpy.int32(1)]]], [[[0]]], [[[numpy.int64(3)]]]
    ) == [[[3]]]
    assert bytes(buf0[0:5]) == b"_abc_"


def test_get_into_ranges_refusals_match_in_process(attach: Callable[[], Any]) -> None:
    store = attach()
    assert store.put("k1", DATA1) == 0
    ptr, buf = _pool(store, 32)
    # A key whose range lists differ in length: -600 per range; an empty key: no ranges.
    assert store.get_into_ranges(
        [ptr], [["k1", "k1"]], [[[0], []]], [[[0, 1], []]], [[[4, 4], []]]
    ) == [[[INVALID, INVALID], []]]
    # Past the object's end, past the buffer's end, a negative size: -600 for that range only.
    assert store.get_into_ranges(
        [ptr], [["k1"]], [[[0, 30, 4, 8]]], [[[len(DATA1) - 1, 0, 0, 0]]], [[[4, 4, -1, 2]]]
    ) == [[[INVALID, INVALID, INVALID, 2]]]
    assert bytes(buf[8:10]) == DATA1[0:2] and bytes(buf[0:8]) == b"_" * 8
    # A key not found: its ranges answer -704, the other key's are copied.
    assert store.get_into_ranges(
        [ptr], [["missing", "k1"]], [[[0], [12]]], [[[0], [0]]], [[[4], [4]]]
    ) == [[[NOT_FOUND], [4]]]
    # Top-level lists of different lengths: -600 for every range whose place is known.
    assert store.get_into_ranges([ptr, ptr], [["k1"]], [[[0]]], [[[0]]], [[[4]]]) == [[[INVALID]]]
    with pytest.raises(TypeError):
        store.get_into_ranges(7, [["k1"]], [[[0]]], [[[0]]], [[[4]]])


def test_get_into_ranges_reaches_only_memory_of_its_own_connection(
    attach: Callable[[], Any],
) -> None:
    owner, other = attach(), attach()
    assert owner.put("k1", DATA1) == 0
    owned, owned_view = _pool(owner, 4096)
    unregistered = MooncakeHostMemAllocator().alloc(4096)
    private = ctypes.create_string_buffer(4096)
    try:
        for base in (owned, unregistered, ctypes.addressof(private)):
            assert other.get_into_ranges([base], [["k1"]], [[[0]]], [[[0]]], [[[4]]]) == [
                [[INVALID]]
            ]
        # The base is the other engine's own, the offset aims at the owner's memory.
        mine, _ = _pool(other, 4096)
        assert other.get_into_ranges([mine], [["k1"]], [[[owned - mine]]], [[[0]]], [[[4]]]) == [
            [[INVALID]]
        ]
        assert bytes(owned_view[0:4]) == b"____"
        # The owner's own read of the same range lands.
        assert owner.get_into_ranges([owned], [["k1"]], [[[0]]], [[[0]]], [[[4]]]) == [[[4]]]
        assert bytes(owned_view[0:4]) == DATA1[0:4]
    finally:
        MooncakeHostMemAllocator().free(unregistered)


# -- tensors -----------------------------------------------------------------------------------


def test_tensor_zero_copy_forms_through_the_service(attach: Callable[[], Any]) -> None:
    torch = pytest.importorskip("torch")
    writer, reader = attach(), attach()
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert writer.put_tensor("t", tensor) == 0
    size = writer.get_size("t")
    ptr, _ = _pool(writer, size, b"\0")
    into = writer.get_tensor_into("t", ptr, size)
    assert into is not None and torch.equal(into, tensor)
    assert into.data_ptr() == ptr + size - tensor.nbytes  # it views the pool memory
    # The pool now holds a whole tensor object: the *_from forms write it zero copy.
    assert writer.put_tensor_from("t-from", ptr, size) == 0
    into.add_(1)  # the pool's object now holds tensor + 1
    assert writer.upsert_tensor_from("t-from", ptr, size) == 0
    assert writer.batch_put_tensor_from(["t-b0", "t-b1"], [ptr, ptr], [size, size - 1]) == [
        0,
        INVALID,  # not exactly one object
    ]
    assert writer.put_tensor_with_parallelism_from("t-par", ptr, size) == 0
    assert writer.batch_upsert_tensor_with_parallelism_from(["t-upar"], [ptr], [size]) == [0]
    for key in ("t-from", "t-b0", "t-par", "t-upar"):
        got = reader.get_tensor(key)  # another engine: the objects live in the service
        assert got is not None and torch.equal(got, tensor + 1), key
    # The reader's own pool: get_tensor_into there, and the batch's length check.
    rptr, _ = _pool(reader, size, b"\0")
    got = reader.batch_get_tensor_into(["t", "absent"], [rptr, rptr], [size, size])
    assert torch.equal(got[0], tensor) and got[1] is None
    assert reader.batch_get_tensor_into(["t", "t"], [rptr], [size]) == [INVALID, INVALID]
    par = reader.get_tensor_with_parallelism_into("t-par", rptr, size)
    assert par is not None and torch.equal(par, tensor + 1)


def test_tensor_from_refuses_memory_the_store_does_not_share(attach: Callable[[], Any]) -> None:
    torch = pytest.importorskip("torch")
    owner, other = attach(), attach()
    tensor = torch.ones(4, 4, dtype=torch.float16)
    assert owner.put_tensor("src", tensor) == 0
    size = owner.get_size("src")
    ptr, _ = _pool(owner, size, b"\0")
    assert owner.get_tensor_into("src", ptr, size) is not None
    # The other engine cannot publish or fill the owner's pool memory, nor unshared memory.
    assert other.put_tensor_from("stolen", ptr, size) == INVALID
    assert other.get_tensor_into("src", ptr, size) is None
    unregistered = MooncakeHostMemAllocator().alloc(size)
    try:
        ctypes.memmove(unregistered, ptr, size)
        assert owner.put_tensor_from("unregistered", unregistered, size) == INVALID
    finally:
        MooncakeHostMemAllocator().free(unregistered)
    assert other.batch_is_exist(["stolen", "unregistered"]) == [0, 0]
    # Freed pool memory stops being shared at once.
    assert MooncakeHostMemAllocator().free(ptr) == 0
    assert owner.put_tensor_from("after-free", ptr, size) == INVALID
    assert owner.is_exist("src") == 1 and owner.is_exist("after-free") == 0
