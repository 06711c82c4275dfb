"""Dimension selections of fixed-shape tensors: dtype sizes, output shapes, the source indices
a chain of selections picks and the byte ranges that copy them.

A *selection* is one operation on one tensor dimension, written ``(op, value)``:

``("select_idxs", indices)``
    integer indices (negative ones count from the end) or, when every entry is a ``bool``, a
    mask as long as the current dimension;
``("slice", (start, end, step))``
    a Python slice;
``("repeat", (times, interleave))``
    every entry ``times`` times in a row (``interleave`` true, as ``repeat_interleave``) or the
    whole dimension ``times`` times over (false, as ``repeat``);
``("cat", groups)``
    the concatenation of the current dimension seen through each group (a sequence of
    selections) in turn.

A selection may also be any object with ``op`` and ``value`` attributes
(:class:`~mooncake_py.remote_tensor_batch.TensorDimSelection`) or a mapping with ``"op"`` and
``"value"`` keys. Selections apply in order, each to what the previous ones left.

Everything here is pure and thread-safe; torch is imported only to size a torch dtype this
module has no entry for.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

# The largest output one selection read may produce (64 GiB), as upstream.
MAX_TENSOR_DIM_SELECTION_OUTPUT_BYTES = 64 * 1024 * 1024 * 1024

# Element sizes by dtype name (torch's names, without the ``torch.`` prefix).
DTYPE_BYTE_SIZES: Mapping[str, int] = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int16": 2,
    "uint16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
}

SELECTION_OPS = ("select_idxs", "slice", "repeat", "cat")

ByteRange = tuple[int, int, int]  # (offset in the output, offset in the object, bytes)


def normalize_dtype_name(dtype: Any) -> str:
    """The store's name for ``dtype`` (a name such as ``"torch.int64"`` or ``"int64"``, a torch
    or numpy dtype): its text without the ``torch.`` prefix, lower case. O(1)."""
    return str(dtype).removeprefix("torch.").lower()


def dtype_byte_size(dtype: Any) -> int:
    """The size in bytes of one element of ``dtype`` (see :func:`normalize_dtype_name`).

    Raises:
        ValueError: a dtype that is neither in :data:`DTYPE_BYTE_SIZES` nor a torch dtype.
    """
    size = DTYPE_BYTE_SIZES.get(normalize_dtype_name(dtype))
    if size is not None:
        return size
    if type(dtype).__module__ == "torch":
        # Only a torch dtype object can reach here with torch already imported by the caller.
        import torch

        if isinstance(dtype, torch.dtype):
            return int(dtype.itemsize)
    raise ValueError(f"Unsupported dtype for remote tensor batch: {dtype}")


def tensor_nbytes(shape: Sequence[int], dtype: Any) -> int:
    """The bytes of a C-contiguous tensor of ``shape`` and ``dtype``.

    Raises:
        ValueError: a negative dimension, or an unsupported dtype.
    """
    dims = [operator.index(d) for d in shape]
    if any(d < 0 for d in dims):
        raise ValueError("shape dimensions must be non-negative")
    return math.prod(dims) * dtype_byte_size(dtype)


def normalize_indices(index: Any) -> list[Any]:
    """``index`` (an int or bool, a sequence, a numpy array, a torch tensor on any device) as
    a plain list of Python ints and bools. O(len)."""
    if hasattr(index, "detach") and hasattr(index, "cpu"):
        index = index.detach().cpu()  # a tensor: its values, wherever it lives
    if hasattr(index, "tolist"):
        index = index.tolist()
    if isinstance(index, (bool, int)):
        return [index]
    return list(index)


def selection_op_value(selection: Any) -> tuple[str, Any]:
    """``(op, value)`` of a selection in any of its forms (see the module docstring).

    Raises:
        ValueError: a tuple or list that is not a pair.
        KeyError: a mapping without ``"op"`` or ``"value"``.
    """
    if hasattr(selection, "op") and hasattr(selection, "value"):
        return str(selection.op), selection.value
    if isinstance(selection, Mapping):
        return str(selection["op"]), selection["value"]
    op, value = selection
    return str(op), value


def _is_mask(indices: Sequence[Any]) -> bool:
    return all(isinstance(i, bool) for i in indices)


def selection_length(length: int, selection: Any) -> int:
    """The extent of a dimension of ``length`` after ``selection``. Indices are not checked
    against ``length`` (:func:`selected_indices` does); O(size of the selection).

    Raises:
        IndexError: a boolean mask whose length is not ``length``.
        ValueError: a negative repeat count, a zero slice step, an unknown op.
    """
    op, value = selection_op_value(selection)
    if op == "select_idxs":
        indices = normalize_indices(value)
        if _is_mask(indices):
            if len(indices) != length:
                raise IndexError("bool mask length must match current dimension")
            return sum(indices)
        return len(indices)
    if op == "slice":
        return len(range(length)[slice(*value)])
    if op == "repeat":
        times = operator.index(value[0])
        if times < 0:
            raise ValueError("repeat_times must be non-negative")
        return length * times
    if op == "cat":
        return sum(selection_group_length(length, group) for group in value)
    raise ValueError(f"Unsupported tensor dimension selection op: {op}")


def selection_group_length(length: int, selections: Sequence[Any]) -> int:
    """The extent after every selection of ``selections`` in turn (raises as
    :func:`selection_length`)."""
    for selection in selections:
        length = selection_length(length, selection)
    return length


def normalize_dim(ndim: int, dim: int) -> int:
    """``dim`` of a tensor of ``ndim`` dimensions counted from 0 (negative counts from the end).

    Raises:
        ValueError: ``ndim`` is 0 or ``dim`` is out of range.
    """
    if ndim == 0:
        raise ValueError("shape must have at least one dimension")
    normalized = dim + ndim if dim < 0 else dim
    if not 0 <= normalized < ndim:
        raise ValueError("selection dim out of range")
    return normalized


def selection_output_shape(
    shape: Sequence[int], selections: Sequence[Any], dim: int = 0
) -> tuple[int, ...]:
    """``shape`` with dimension ``dim`` replaced by its extent after ``selections``.

    Raises:
        ValueError: an empty shape, ``dim`` out of range, or as :func:`selection_length`.
        IndexError: as :func:`selection_length`.
    """
    dims = tuple(int(d) for d in shape)
    axis = normalize_dim(len(dims), operator.index(dim))
    extent = selection_group_length(dims[axis], selections)
    return (*dims[:axis], extent, *dims[axis + 1 :])


def selected_indices(length: int, selections: Sequence[Any]) -> list[int]:
    """The source positions, in output order, that ``selections`` pick from a dimension of
    ``length``: entry ``k`` of the result is the source index of output position ``k``.
    O(output extent + size of the selections).

    Raises:
        IndexError: an index out of range of the dimension it applies to, or a mask of the
            wrong length.
        ValueError: a negative repeat count, a zero slice step, an unknown op.
        TypeError: an index, count or slice bound that is not an integer.
    """
    return _apply_group(list(range(length)), selections)


def _apply_group(current: list[int], selections: Sequence[Any]) -> list[int]:
    for selection in selections:
        current = _apply(current, selection)
    return current


def _apply(current: list[int], selection: Any) -> list[int]:
    op, value = selection_op_value(selection)
    length = len(current)
    if op == "select_idxs":
        indices = normalize_indices(value)
        if _is_mask(indices):
            if len(indices) != length:
                raise IndexError("bool mask length must match current dimension")
            return [source for source, keep in zip(current, indices, strict=True) if keep]
        picked = []
        for raw in indices:
            position = operator.index(raw)
            if not -length <= position < length:
                raise IndexError(f"index {position} out of range for dimension of {length}")
            picked.append(current[position])
        return picked
    if op == "slice":
        bounds = [None if v is None else operator.index(v) for v in value]
        return current[slice(*bounds)]
    if op == "repeat":
        times, interleave = operator.index(value[0]), bool(value[1])
        if times < 0:
            raise ValueError("repeat_times must be non-negative")
        if interleave:
            return [source for source in current for _ in range(times)]
        return current * times
    if op == "cat":
        return [source for group in value for source in _apply_group(current, group)]
    raise ValueError(f"Unsupported tensor dimension selection op: {op}")


def selection_byte_ranges(
    shape: Sequence[int], itemsize: int, dim: int, indices: Sequence[int], data_offset: int = 0
) -> list[ByteRange]:
    """The copies that gather ``indices`` along ``dim`` of a C-contiguous tensor of ``shape``
    (elements of ``itemsize`` bytes, starting ``data_offset`` bytes into the object) into a
    C-contiguous output: ``(output offset, object offset, bytes)``, in output order, with
    neighbours that are contiguous on both sides merged into one.

    ``dim`` must already be normalized (:func:`normalize_dim`) and the indices in range
    (:func:`selected_indices`). O(prod(shape[:dim]) * len(indices)) time and at most that many
    ranges (one for a selection of consecutive rows of the outermost dimension).
    """
    extent = shape[dim]
    row = math.prod(shape[dim + 1 :]) * itemsize  # bytes of one entry of ``dim``
    if row == 0 or not indices:
        return []
    ranges: list[ByteRange] = []
    out = 0
    for outer in range(math.prod(shape[:dim])):
        base = data_offset + outer * extent * row
        for index in indices:
            source = base + index * row
            if ranges:
                last_out, last_source, last_size = ranges[-1]
                if last_source + last_size == source:  # output is always contiguous
                    ranges[-1] = (last_out, last_source, last_size + row)
                    out += row
                    continue
            ranges.append((out, source, row))
            out += row
    return ranges


__all__ = [
    "DTYPE_BYTE_SIZES",
    "MAX_TENSOR_DIM_SELECTION_OUTPUT_BYTES",
    "SELECTION_OPS",
    "ByteRange",
    "dtype_byte_size",
    "normalize_dim",
    "normalize_dtype_name",
    "normalize_indices",
    "selected_indices",
    "selection_byte_ranges",
    "selection_group_length",
    "selection_length",
    "selection_op_value",
    "selection_output_shape",
    "tensor_nbytes",
]
