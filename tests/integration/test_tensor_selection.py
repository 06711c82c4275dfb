"""``get_tensor_dim_selection_into`` and the remote tensor batch materializer against a real
in-process master and real stores.

The readers have no segment of their own: the selected rows come from a third client's
segment, over its mapped shared-memory file (``shm``) or its TCP transfer service (``tcp``).
Every output is compared with the same selection done by torch on the source tensor.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from mooncake_py import Client, ClientConfig, ErrorCode, MooncakeDistributedStore
from mooncake_py.client.compat_tensor_selection import MAX_DIRECT_RANGES, plan_selection
from mooncake_py.client.tensors import METADATA_SIZE
from mooncake_py.remote_tensor_batch import (
    RemoteTensorBatch,
    RemoteTensorBatchMaterializer,
    TensorDimSelection,
    TensorFieldRef,
    TensorReadRequest,
)
from mooncake_py.testing import InProcessMaster

torch = pytest.importorskip("torch")

MIB = 1 << 20
INVALID = int(ErrorCode.INVALID_PARAMS)
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)


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


@pytest.fixture
def store(master: InProcessMaster, owner: Client, force_tcp: bool) -> Iterator[Any]:
    made = MooncakeDistributedStore()
    assert made.setup_with_config(_config(master.address, 0, force_tcp=force_tcp)) == 0
    yield made
    made.close()


class Output:
    """A registered output tensor of ``shape`` and ``dtype`` (filled with a marker byte, so
    bytes left unwritten show)."""

    def __init__(self, store: Any, shape: Sequence[int], dtype: Any) -> None:
        self.store = store
        self.tensor = torch.empty(tuple(shape), dtype=dtype)
        self.tensor.view(torch.uint8).fill_(0xA5)
        self.ptr = self.tensor.data_ptr()
        self.size = self.tensor.numel() * self.tensor.element_size()
        assert store.register_buffer(self.ptr, self.size) == 0

    def close(self) -> None:
        assert self.store.unregister_buffer(self.ptr) == 0


def _expected(source: Any, dim: int, selections: Sequence[Any]) -> Any:
    """torch's result of ``selections`` on ``dim`` of ``source`` (the reference)."""
    axis = dim % source.dim()
    moved = source.movedim(axis, 0)
    return moved[_torch_positions(moved.shape[0], selections)].movedim(0, axis).contiguous()


def _torch_positions(length: int, selections: Sequence[Any]) -> Any:
    positions = torch.arange(length)
    for op, value in selections:
        if op == "select_idxs":
            positions = positions[torch.tensor(value)]
        elif op == "slice":
            start, end, step = value
            if step is not None and step < 0:  # torch slices have no negative step
                positions = torch.tensor(positions.tolist()[start:end:step], dtype=torch.int64)
            else:
                positions = positions[start:end:step]
        elif op == "repeat":
            times, interleave = value
            positions = (
                positions.repeat_interleave(times) if interleave else positions.repeat(times)
            )
        else:  # cat
            positions = torch.cat(
                [positions[_torch_positions(len(positions), group)] for group in value]
            )
    return positions


def _select(store: Any, key: str, source: Any, dim: int, selections: Any, offset: int) -> Any:
    expected = _expected(source, dim, selections)
    out = Output(store, expected.shape, source.dtype)
    try:
        code = store.get_tensor_dim_selection_into(
            key,
            out.ptr,
            out.size,
            list(source.shape),
            str(source.dtype),
            dim,
            selections,
            offset,
        )
        assert code == out.size, code
        return out.tensor.clone(), expected
    finally:
        out.close()


def _no_read_leases(master: InProcessMaster, store: Any) -> bool:
    store.probe_key("missing")  # the same thread's next call runs after the reads' ends
    stats = master.service.stats()
    return stats["read_holds"] == 0 and stats["reads_in_flight"] == 0


CASES = [
    ("rows", (6, 3), 0, [("select_idxs", [5, 0, 0, -1])]),
    ("mask", (4, 2), 0, [("select_idxs", [True, False, True, True])]),
    ("slice-step", (2, 7, 3), 1, [("slice", (1, None, 3))]),
    ("slice-negative-step", (8,), 0, [("slice", (6, 1, -2))]),
    ("repeat-interleave", (3, 2), 0, [("repeat", (3, True))]),
    ("repeat-tile", (3, 2), -2, [("repeat", (2, False))]),
    ("last-dim", (2, 3, 5), -1, [("select_idxs", [4, 1]), ("repeat", (2, True))]),
    (
        "cat-of-chains",
        (6, 2),
        0,
        [
            ("slice", (1, 5, None)),
            ("cat", [[("select_idxs", [2, 0])], [("slice", (1, 3, None)), ("repeat", (2, False))]]),
        ],
    ),
    ("nested-cat", (5,), 0, [("cat", [[("cat", [[("select_idxs", [4])], []])], []])]),
    ("identity", (3, 4), 1, []),
]


@pytest.mark.parametrize("dtype", [torch.int64, torch.float16, torch.bool, torch.uint8])
@pytest.mark.parametrize(("name", "shape", "dim", "selections"), CASES, ids=[c[0] for c in CASES])
def test_selections_match_torch(
    master: InProcessMaster,
    store: Any,
    dtype: Any,
    name: str,
    shape: tuple[int, ...],
    dim: int,
    selections: Any,
) -> None:
    source = torch.arange(torch.Size(shape).numel()).reshape(shape).to(dtype)
    key = f"raw-{name}"
    assert store.put(key, source.numpy().tobytes()) == 0
    got, expected = _select(store, key, source, dim, selections, 0)
    assert got.view(torch.uint8).tolist() == expected.view(torch.uint8).tolist()
    assert _no_read_leases(master, store)


def test_reads_tensor_objects_after_their_metadata(store: Any) -> None:
    source = torch.randn(5, 4, 3)
    assert store.put_tensor("object", source) == 0
    selections = [("select_idxs", [True, False, True, False, True]), ("repeat", (2, True))]
    got, expected = _select(store, "object", source, 0, selections, METADATA_SIZE)
    assert torch.equal(got, expected)


def test_many_ranges_are_gathered_from_one_read(master: InProcessMaster, store: Any) -> None:
    source = torch.arange(100 * 64 * 4, dtype=torch.int32).reshape(100, 64, 4)
    selections = [("select_idxs", [3, 1])]
    # The plan has more ranges than the direct path takes: one whole read, gathered locally.
    plan = plan_selection(list(source.shape), "int32", -1, selections, 0)
    assert len(plan.ranges) > MAX_DIRECT_RANGES
    assert store.put("wide", source.numpy().tobytes()) == 0
    got, expected = _select(store, "wide", source, -1, selections, 0)
    assert torch.equal(got, expected)
    assert _no_read_leases(master, store)


def test_a_larger_buffer_gets_only_the_output(store: Any) -> None:
    source = torch.arange(8, dtype=torch.int64)
    assert store.put("small", source.numpy().tobytes()) == 0
    out = Output(store, (6,), torch.int64)
    try:
        code = store.get_tensor_dim_selection_into(
            "small", out.ptr, out.size, [8], "int64", 0, [("select_idxs", [7, 2])]
        )
        assert code == 16
        assert out.tensor[:2].tolist() == [7, 2]
        assert out.tensor.view(torch.uint8)[16:].tolist() == [0xA5] * 32
    finally:
        out.close()


def test_codes_for_bad_calls(store: Any) -> None:
    source = torch.arange(8, dtype=torch.int64).reshape(4, 2)
    assert store.put("codes", source.numpy().tobytes()) == 0
    out = Output(store, (4, 2), torch.int64)
    ptr, size = out.ptr, out.size

    def call(key: str = "codes", **changes: Any) -> int:
        args = {
            "buffer_ptr": ptr,
            "size": size,
            "shape": [4, 2],
            "dtype": "int64",
            "dim": 0,
            "selections": [("select_idxs", [3, 1])],
            "data_offset": 0,
            **changes,
        }
        return int(store.get_tensor_dim_selection_into(key, **args))

    try:
        assert call() == 32
        assert call("absent") == NOT_FOUND
        assert call(size=31, selections=[]) == INVALID  # smaller than the output
        assert call(selections=[("select_idxs", [4])]) == INVALID  # out of range
        assert call(selections=[("select_idxs", [True])]) == INVALID  # mask too short
        assert call(selections=[("shuffle", 1)]) == INVALID
        assert call(selections=[("slice", (0, 4, 0))]) == INVALID
        assert call(selections=[("repeat", (-1, True))]) == INVALID
        assert call(dim=2) == INVALID
        assert call(shape=[]) == INVALID
        assert call(shape=[4, -2]) == INVALID
        assert call(dtype="complex32") == INVALID
        assert call(data_offset=-1) == INVALID
        assert call(shape=[5, 2]) == INVALID  # the object is shorter than the tensor
        assert call(data_offset=8) == INVALID  # likewise, from that offset on
        assert call(buffer_ptr=ptr + size) == INVALID  # not registered
        with pytest.raises(TypeError):
            call(selections=[("select_idxs", ["3"])])
        # An empty selection reads nothing but still answers for the key.
        assert call(selections=[("repeat", (0, True))]) == 0
        assert call("absent", selections=[("repeat", (0, True))]) == NOT_FOUND
    finally:
        out.close()
    unset = MooncakeDistributedStore()  # before setup
    assert (
        unset.get_tensor_dim_selection_into("codes", ptr, size, [4, 2], "int64", 0, []) == INVALID
    )


def test_materializer_reads_a_remote_batch(store: Any) -> None:
    tokens = torch.arange(6 * 3, dtype=torch.int64).reshape(6, 3)
    mask = torch.rand(6, 3) > 0.5
    assert store.put_tensor("batch/tokens", tokens) == 0
    assert store.put_tensor("batch/mask", mask) == 0
    remote = RemoteTensorBatch(
        {
            "tokens": TensorFieldRef.from_tensor("batch/tokens", tokens, METADATA_SIZE),
            "mask": TensorFieldRef.from_tensor("batch/mask", mask, METADATA_SIZE),
        },
        batch_size=6,
    )
    chosen = remote.select_indices(torch.tensor([5, 2, 0])).repeat(2, interleave=False)
    merged = RemoteTensorBatch.cat([chosen, remote.slice(4, None, None)])
    assert len(merged) == 8
    outputs = RemoteTensorBatchMaterializer(store).materialize_buffers(merged)
    rows = [5, 2, 0, 5, 2, 0, 4, 5]
    for name, source in (("tokens", tokens), ("mask", mask)):
        buffer, shape, dtype = outputs[name]
        assert shape == (8, 3) and dtype == str(source.dtype).removeprefix("torch.")
        got = torch.frombuffer(buffer, dtype=source.dtype).reshape(shape)
        assert torch.equal(got, source[rows])


def test_materializer_reports_a_miss_and_unregisters(store: Any) -> None:
    request = TensorReadRequest(
        "absent", TensorFieldRef("no/such/key", (4,), "int32"), 0, (TensorDimSelection.slice(1),)
    )
    target = bytearray(request.output_nbytes())
    address = ctypes.addressof((ctypes.c_ubyte * len(target)).from_buffer(target))
    with pytest.raises(RuntimeError, match=str(NOT_FOUND)):
        RemoteTensorBatchMaterializer(store).materialize_request_into(request, target)
    # The materializer registered the buffer and unregistered it on the way out.
    assert store.unregister_buffer(address) == INVALID
    assert store.register_buffer(address, len(target)) == 0
    assert store.unregister_buffer(address) == 0
