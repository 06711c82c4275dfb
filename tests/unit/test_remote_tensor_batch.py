"""The remote tensor batch helpers and the selection arithmetic under them: dtype sizes,
output shapes, the source rows a selection chain picks, the byte ranges that copy them, the
lazy batch operations, writable buffer regions and the materializer's store protocol (driven
through a recording store object standing for any store)."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from mooncake_py.remote_tensor_batch import (
    MAX_TENSOR_DIM_SELECTION_OUTPUT_BYTES,
    BytearrayBufferAllocator,
    RemoteTensorBatch,
    RemoteTensorBatchMaterializer,
    TensorDimSelection,
    TensorFieldRef,
    TensorReadRequest,
    WritableBufferRegion,
    dtype_byte_size,
    normalize_dtype_name,
    normalize_indices,
    selection_output_shape,
    tensor_nbytes,
    writable_buffer_region,
)
from mooncake_py.tensor_selection import (
    normalize_dim,
    selected_indices,
    selection_byte_ranges,
    selection_length,
)

S = TensorDimSelection


# ----------------------------------------------------------------------------------------------
# dtypes and sizes


@pytest.mark.parametrize(
    ("dtype", "size"),
    [("bool", 1), ("torch.bfloat16", 2), ("Float32", 4), ("uint64", 8), ("float8_e5m2", 1)],
)
def test_dtype_sizes_by_name(dtype: str, size: int) -> None:
    assert dtype_byte_size(dtype) == size


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="Unsupported dtype"):
        dtype_byte_size("complex32")
    with pytest.raises(ValueError):
        tensor_nbytes((2,), object())


def test_torch_dtypes_and_ones_without_an_entry() -> None:
    torch = pytest.importorskip("torch")
    assert normalize_dtype_name(torch.int16) == "int16"
    assert dtype_byte_size(torch.float64) == 8
    assert dtype_byte_size(torch.complex64) == 8  # sized by torch itself


def test_numpy_dtypes_and_indices() -> None:
    np = pytest.importorskip("numpy")
    assert dtype_byte_size(np.dtype("int32")) == 4
    assert normalize_indices(np.array([3, 1])) == [3, 1]
    assert normalize_indices(np.array([True, False])) == [True, False]
    assert S.select_idxs(np.int64(2)).value == [2]


def test_tensor_nbytes() -> None:
    assert tensor_nbytes((4, 2), "int64") == 64
    assert tensor_nbytes((), "int32") == 4
    assert tensor_nbytes((3, 0), "float16") == 0
    with pytest.raises(ValueError, match="non-negative"):
        tensor_nbytes((2, -1), "int8")


def test_field_ref_from_a_tensor_like_object() -> None:
    class Like:
        shape = (3, 4)
        dtype = "torch.float16"

    ref = TensorFieldRef.from_tensor("k", Like(), data_offset=304)
    assert ref == TensorFieldRef("k", (3, 4), "float16", 304)
    assert ref.nbytes() == 24


# ----------------------------------------------------------------------------------------------
# Shapes and source rows


def test_each_op_in_each_form() -> None:
    assert selection_length(5, ("select_idxs", [0, 0, 4])) == 3
    assert selection_length(3, {"op": "select_idxs", "value": [True, False, True]}) == 2
    assert selection_length(10, S.slice(None, None, 3)) == 4
    assert selection_length(10, ["slice", (8, 2, -2)]) == 3
    assert selection_length(3, S.repeat(4, False)) == 12
    assert selection_length(4, S.cat([[S.slice(0, 1)], [S.repeat(2)], []])) == 13


@pytest.mark.parametrize(
    ("selection", "error"),
    [
        (S.select_idxs([True, False]), IndexError),
        (("repeat", (-1, True)), ValueError),
        (("slice", (0, 4, 0)), ValueError),
        (("gather", [1]), ValueError),
    ],
)
def test_bad_selections(selection: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        selection_length(4, selection)
    with pytest.raises(error):
        selected_indices(4, [selection])


def test_output_shape_on_any_dim() -> None:
    assert selection_output_shape((2, 3, 4), [S.select_idxs([0])], -1) == (2, 3, 1)
    assert selection_output_shape((2, 3, 4), [S.repeat(2), S.slice(1)], 1) == (2, 5, 4)
    assert selection_output_shape([4], []) == (4,)
    with pytest.raises(ValueError, match="at least one"):
        selection_output_shape((), [])
    with pytest.raises(ValueError, match="out of range"):
        selection_output_shape((2, 3), [], 2)
    with pytest.raises(ValueError, match="out of range"):
        selection_output_shape((2, 3), [], -3)
    assert normalize_dim(3, -1) == 2


def test_selected_indices_follow_python_semantics() -> None:
    rows = list(range(6))
    assert selected_indices(6, [("select_idxs", [5, -1, 0])]) == [5, 5, 0]
    assert selected_indices(6, [("slice", (4, None, -2))]) == rows[4::-2]
    assert selected_indices(4, [("select_idxs", [3, 1]), ("repeat", (2, True))]) == [3, 3, 1, 1]
    assert selected_indices(3, [("repeat", (2, False))]) == [0, 1, 2, 0, 1, 2]
    # Each step indexes what the previous one left, a cat's groups too.
    chain = [("slice", (1, 5, None)), ("cat", [[("select_idxs", [2, 0])], [("slice", (1, 3))]])]
    assert selected_indices(6, chain) == [3, 1, 2, 3]
    assert selected_indices(4, [("select_idxs", [True, False, False, True])]) == [0, 3]
    # ints and bools mixed are indices (True is 1), as upstream
    assert selected_indices(3, [("select_idxs", [2, True])]) == [2, 1]


def test_indices_are_checked_against_the_current_extent() -> None:
    with pytest.raises(IndexError):
        selected_indices(4, [("select_idxs", [4])])
    with pytest.raises(IndexError):
        selected_indices(4, [("slice", (0, 2)), ("select_idxs", [-3])])
    with pytest.raises(TypeError):
        selected_indices(4, [("select_idxs", [1.5])])
    # the shape helpers do not look at the values
    assert selection_output_shape((4,), [S.select_idxs([9])]) == (1,)


def test_byte_ranges_merge_contiguous_rows() -> None:
    # Rows 1..3 of a (5, 2) int32 tensor at offset 16: one range.
    assert selection_byte_ranges((5, 2), 4, 0, [1, 2, 3], 16) == [(0, 24, 24)]
    # Repeated and reversed rows are separate copies.
    assert selection_byte_ranges((3, 2), 1, 0, [2, 2, 0]) == [(0, 4, 2), (2, 4, 2), (4, 0, 2)]
    # An inner dimension: ranges per outer row, merged across rows where they touch; the
    # identity is one range overall.
    assert selection_byte_ranges((2, 3), 1, 1, [0, 2]) == [(0, 0, 1), (1, 2, 2), (3, 5, 1)]
    assert selection_byte_ranges((2, 3, 2), 2, 1, [0, 1, 2]) == [(0, 0, 24)]
    assert selection_byte_ranges((2, 0), 4, 0, [0, 1]) == []
    assert selection_byte_ranges((2, 3), 4, 0, []) == []


# ----------------------------------------------------------------------------------------------
# Lazy batches


def _batch() -> RemoteTensorBatch:
    return RemoteTensorBatch(
        {
            "a": TensorFieldRef("b/a", (4, 2), "int64"),
            "b": TensorFieldRef("b/b", (4,), "bool", 304),
        },
        batch_size=4,
    )


def test_operations_return_new_batches() -> None:
    batch = _batch()
    picked = batch.select_indices([3, 0]).repeat(2)
    assert len(batch) == 4 and batch.selections == ()
    assert len(picked) == 4 and [s.op for s in picked.selections] == ["select_idxs", "repeat"]
    moved = picked.to("cuda:1")
    assert moved.device == "cuda:1" and picked.device is None
    clone = batch.clone()
    assert clone == batch and clone.fields is not batch.fields
    assert batch.select_fields(None) == batch
    assert batch.select_fields(["b", "a"]).keys() == ["b", "a"]
    with pytest.raises(KeyError):
        batch.select_fields(["c"])
    with pytest.raises(ValueError):
        batch.repeat(-1)
    with pytest.raises(IndexError):
        batch.select_indices([True])
    assert len(batch.slice(None, None, -1)) == 4


def test_union_needs_matching_metadata() -> None:
    lhs = _batch().select_fields(["a"])
    rhs = _batch().select_fields(["b"])
    assert lhs.union(rhs).keys() == ["a", "b"]
    with pytest.raises(ValueError, match="matching batch metadata"):
        lhs.union(rhs.slice(0, 2, None))
    with pytest.raises(ValueError, match="duplicate fields"):
        lhs.union(lhs)


def test_cat_needs_matching_batches() -> None:
    batch = _batch()
    with pytest.raises(ValueError, match="non-empty"):
        RemoteTensorBatch.cat([])
    with pytest.raises(ValueError, match="matching fields"):
        RemoteTensorBatch.cat([batch, batch.select_fields(["a"])])
    with pytest.raises(ValueError, match="matching fields"):
        RemoteTensorBatch.cat([batch, batch.to("cpu")])
    joined = RemoteTensorBatch.cat([batch.slice(0, 1, None), batch.repeat(2, False)])
    assert len(joined) == 9
    assert joined.read_requests(["b"])[0].output_shape() == (9,)
    assert joined.selections[0].as_tuple() == (
        "cat",
        ((("slice", (0, 1, None)),), (("repeat", (2, False)),)),
    )


def test_read_requests_carry_the_batch_state() -> None:
    batch = RemoteTensorBatch(
        {"a": TensorFieldRef("b/a", (2, 6), "int32")}, batch_size=6, dim=-1, device="cpu"
    ).select_indices([5, 4, 3])
    (request,) = batch.read_requests()
    assert request == TensorReadRequest("a", batch.fields["a"], -1, batch.selections, "cpu")
    assert request.output_shape() == (2, 3)
    assert request.output_nbytes() == 24
    assert request.store_selections() == [("select_idxs", [5, 4, 3])]


# ----------------------------------------------------------------------------------------------
# Buffer regions


def test_region_points_at_the_buffer_and_holds_it() -> None:
    buffer = bytearray(b"abcdefgh")
    region = writable_buffer_region(buffer)
    assert region.size == 8
    assert ctypes.string_at(region.ptr, 8) == b"abcdefgh"
    ctypes.memset(region.ptr, ord("z"), 1)
    with pytest.raises(BufferError):
        buffer.append(0)  # exported: it may not move while the store writes into it
    region.close()
    assert region.closed and region.c_buffer is None
    buffer.append(0)
    assert buffer[:2] == b"zb"


def test_regions_over_typed_and_multidimensional_buffers() -> None:
    np = pytest.importorskip("numpy")
    array = np.zeros((3, 4), dtype=np.int64)
    with writable_buffer_region(array) as region:
        assert region.size == 96
        assert region.ptr == array.ctypes.data


def test_regions_refuse_read_only_and_strided_buffers() -> None:
    with pytest.raises(ValueError, match="writable"):
        writable_buffer_region(b"abc")
    source = memoryview(bytearray(8))
    with pytest.raises(TypeError):
        writable_buffer_region(source[::2])
    source.release()  # nothing made on the way still holds an export of it


def test_empty_regions() -> None:
    with writable_buffer_region(bytearray()) as region:
        assert region.size == 0


# ----------------------------------------------------------------------------------------------
# The materializer's store protocol


class RecordingStore:
    """Answers the three calls with fixed codes and records them; a selection read writes
    its bytes (0x5A) so the caller's buffer shows what was written."""

    def __init__(self, register: int = 0, read: int | None = None, unregister: int = 0) -> None:
        self.codes = (register, read, unregister)
        self.calls: list[tuple[Any, ...]] = []

    def register_buffer(self, ptr: int, size: int) -> int:
        self.calls.append(("register", ptr, size))
        return self.codes[0]

    def unregister_buffer(self, ptr: int) -> int:
        self.calls.append(("unregister", ptr))
        return self.codes[2]

    def get_tensor_dim_selection_into(self, *args: Any) -> int:
        self.calls.append(("read", *args))
        _, ptr, size, *_ = args
        ctypes.memset(ptr, 0x5A, size)
        return size if self.codes[1] is None else self.codes[1]


def _request(rows: int = 2) -> TensorReadRequest:
    return TensorReadRequest(
        "a",
        TensorFieldRef("b/a", (4, 2), "torch.int32", 304),
        0,
        (S.select_idxs(list(range(rows))),),
    )


def test_materializer_reads_into_a_buffer() -> None:
    store = RecordingStore()
    target = bytearray(20)
    assert RemoteTensorBatchMaterializer(store).materialize_request_into(_request(), target) == 16
    assert target == b"\x5a" * 16 + b"\x00" * 4
    register, read, unregister = store.calls
    assert register[0] == "register" and register[2] == 20
    assert read[1:] == ("b/a", register[1], 16, [4, 2], "int32", 0, [("select_idxs", [0, 1])], 304)
    assert unregister == ("unregister", register[1])


def test_materializer_errors() -> None:
    with pytest.raises(ValueError, match="buffer too small"):
        RemoteTensorBatchMaterializer(RecordingStore()).materialize_request_into(
            _request(), bytearray(15)
        )
    store = RecordingStore(register=-600)
    with pytest.raises(RuntimeError, match="register_buffer failed with retcode -600"):
        RemoteTensorBatchMaterializer(store).materialize_request_into(_request(), bytearray(16))
    assert [c[0] for c in store.calls] == ["register"]
    store = RecordingStore(read=-704)
    with pytest.raises(RuntimeError, match="retcode -704"):
        RemoteTensorBatchMaterializer(store).materialize_request_into(_request(), bytearray(16))
    assert [c[0] for c in store.calls] == ["register", "read", "unregister"]
    store = RecordingStore(unregister=-600)
    with pytest.raises(RuntimeError, match="unregister_buffer failed") as caught:
        RemoteTensorBatchMaterializer(store).materialize_request_into(_request(), bytearray(16))
    assert caught.value.__cause__ is None
    store = RecordingStore(read=-800, unregister=-600)
    with pytest.raises(RuntimeError, match="unregister_buffer failed") as caught:
        RemoteTensorBatchMaterializer(store).materialize_request_into(_request(), bytearray(16))
    assert "-800" in str(caught.value.__cause__)


class RecordingAllocator(BytearrayBufferAllocator):
    def __init__(self) -> None:
        self.regions: list[WritableBufferRegion] = []

    def allocate(self, size: int) -> WritableBufferRegion:
        region = super().allocate(size)
        self.regions.append(region)
        return region


def test_materialize_buffers_closes_every_region() -> None:
    allocator = RecordingAllocator()
    outputs = RemoteTensorBatchMaterializer(RecordingStore(), allocator).materialize_buffers(
        _batch().select_indices([1, 2, 3])
    )
    assert {name: (len(b), shape, dtype) for name, (b, shape, dtype) in outputs.items()} == {
        "a": (48, (3, 2), "int64"),
        "b": (3, (3,), "bool"),
    }
    assert outputs["b"][0] == b"\x5a" * 3
    assert [r.closed for r in allocator.regions] == [True, True]
    allocator = RecordingAllocator()
    with pytest.raises(RuntimeError):
        RemoteTensorBatchMaterializer(RecordingStore(read=-1), allocator).materialize_buffers(
            _batch()
        )
    assert len(allocator.regions) == 2 and all(r.closed for r in allocator.regions)


def test_oversized_outputs_are_refused_before_anything_is_allocated() -> None:
    allocator = RecordingAllocator()
    extent = MAX_TENSOR_DIM_SELECTION_OUTPUT_BYTES // 8 + 1
    batch = RemoteTensorBatch(
        {
            "small": TensorFieldRef("s", (extent,), "uint8"),
            "big": TensorFieldRef("b", (extent,), "int64"),
        },
        extent,
    )
    store = RecordingStore()
    with pytest.raises(ValueError, match="exceeds"):
        RemoteTensorBatchMaterializer(store, allocator).materialize_buffers(batch)
    assert allocator.regions == [] and store.calls == []


def test_materialize_requests_into_named_buffers() -> None:
    requests = _batch().repeat(0).read_requests()
    store = RecordingStore()
    got = RemoteTensorBatchMaterializer(store).materialize_requests_into(
        requests, {"a": bytearray(), "b": bytearray(4)}
    )
    assert got == {"a": 0, "b": 0} and store.calls == []
