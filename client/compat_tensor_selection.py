"""Upstream's ``get_tensor_dim_selection_into`` on the drop-in store: the rows of a stored
tensor picked by a chain of dimension selections, read straight into registered memory.

:class:`TensorSelectionCalls` is a base class of :class:`~mooncake_py.MooncakeDistributedStore`
and uses only the store's ``client`` (the typed client, None before setup). The stored object
holds a C-contiguous tensor of the given shape and dtype from ``data_offset`` on; the
selections (:mod:`mooncake_py.tensor_selection`) act on dimension ``dim`` and the output is
the selected tensor, C-contiguous, at ``buffer_ptr``. Only the selected bytes are read: the
output is planned as byte ranges of the object (neighbouring rows merged) and copied with one
lookup by the ranged read (:meth:`~mooncake_py.client.ranged.RangedSessions.get_into_ranges`),
straight from a replica into the caller's buffer. A plan of more than
:data:`MAX_DIRECT_RANGES` ranges (a selection on an inner dimension of a large tensor) reads
the object once instead and gathers the rows locally.

Thread-safety: the call may be made from several threads at once (on different output memory).
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mooncake_py.errors import ErrorCode, MooncakeError
from mooncake_py.tensor_selection import (
    ByteRange,
    dtype_byte_size,
    normalize_dim,
    selected_indices,
    selection_byte_ranges,
    tensor_nbytes,
)

from .compat_tensor import TensorCalls
from .ranged import RangedSessions

if TYPE_CHECKING:
    from .api import Client

INVALID = int(ErrorCode.INVALID_PARAMS)
OK = int(ErrorCode.OK)

# Above this many byte ranges one whole-object read and a local gather cost less than one
# transfer per range.
MAX_DIRECT_RANGES = 4096


@dataclasses.dataclass(frozen=True, slots=True)
class SelectionPlan:
    """What one selection read copies.

    Attributes:
        ranges: ``(output offset, object offset, bytes)`` in output order.
        output_nbytes: the bytes of the selected tensor.
        object_end: the object offset just past the whole stored tensor (the object must be
            at least this long).
    """

    ranges: list[ByteRange]
    output_nbytes: int
    object_end: int


def plan_selection(
    shape: Sequence[int], dtype: Any, dim: int, selections: Sequence[Any], data_offset: int
) -> SelectionPlan:
    """The copies that materialize ``selections`` on ``dim`` of a stored tensor.
    O(prod(shape[:dim]) * output extent of ``dim``).

    Raises:
        ValueError: an empty or negative shape, an unknown dtype, ``dim`` out of range, a
            negative ``data_offset``, a bad selection (unknown op, zero step, negative count).
        IndexError: an index out of range, or a mask of the wrong length.
        TypeError: a non-integer where an integer is needed.
    """
    dims = [operator.index(d) for d in shape]
    full = tensor_nbytes(dims, dtype)  # also rejects negative dimensions and unknown dtypes
    axis = normalize_dim(len(dims), operator.index(dim))
    if data_offset < 0:
        raise ValueError("data_offset must be non-negative")
    indices = selected_indices(dims[axis], selections)
    itemsize = dtype_byte_size(dtype)
    output = math.prod([*dims[:axis], len(indices), *dims[axis + 1 :]]) * itemsize
    ranges = selection_byte_ranges(dims, itemsize, axis, indices, data_offset)
    return SelectionPlan(ranges, output, data_offset + full)


class TensorSelectionCalls(TensorCalls):
    """Upstream's ``get_tensor_dim_selection_into``; see the module docstring."""

    def get_tensor_dim_selection_into(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        shape: Sequence[int],
        dtype: str,
        dim: int,
        selections: Sequence[Any],
        data_offset: int = 0,
    ) -> int:
        """Read the tensor under ``key`` (``shape``, ``dtype`` name, from byte ``data_offset``
        of the object on) with ``selections`` applied to dimension ``dim`` into the registered
        memory ``[buffer_ptr, + size)``, C-contiguous from ``buffer_ptr`` on.

        Returns:
            the bytes written (the selected tensor's size; ``size`` may be larger), or a
            negative code: INVALID_PARAMS (-600) before setup, for a bad shape, dtype, dim,
            offset or selection, a ``size`` smaller than the output, memory that is not
            registered, an object shorter than ``data_offset`` plus the whole tensor;
            OBJECT_NOT_FOUND (-704) and the other read codes (-800, -707). After a failure
            the output memory's content is unspecified.

        Raises:
            TypeError: a non-integer address, size, offset, dimension, index or bound, or a
                selection that is not an ``(op, value)`` pair.
        """
        client = self.client
        address, capacity = operator.index(buffer_ptr), operator.index(size)
        offset = operator.index(data_offset)
        if client is None:
            return INVALID
        try:
            plan = plan_selection(shape, dtype, dim, selections, offset)
        except (ValueError, IndexError, KeyError):
            return INVALID
        if capacity < plan.output_nbytes:
            return INVALID
        if len(plan.ranges) > MAX_DIRECT_RANGES:
            code = _gather_locally(client, key, address, plan)
        else:
            code = _read_ranges(client, key, address, plan)
        return plan.output_nbytes if code == OK else code


def _read_ranges(client: Client, key: str, address: int, plan: SelectionPlan) -> int:
    """Copy the plan's ranges from a replica into ``address`` (0, or the first error)."""
    # The first range is empty and ends where the whole tensor does: the ranged read refuses
    # it (-600) when the object is too short, and answers a miss for a key not found.
    dst = [0] + [r[0] for r in plan.ranges]
    src = [plan.object_end] + [r[1] for r in plan.ranges]
    sizes = [0] + [r[2] for r in plan.ranges]
    sessions = RangedSessions(client)
    try:
        results = sessions.get_into_ranges([address], [[key]], [[dst]], [[src]], [[sizes]])
    except MooncakeError as exc:
        return int(exc.code)
    finally:
        sessions.close()
    return next((code for code in results[0][0] if code < 0), OK)


def _gather_locally(client: Client, key: str, address: int, plan: SelectionPlan) -> int:
    """Read the whole object once and copy the plan's ranges out of it (0, or an error)."""
    output = client._buffers.view(address, plan.output_nbytes)
    if output is None:
        return INVALID
    try:
        stored = client.get_buffer_handle(key)
    except MooncakeError as exc:
        return int(exc.code)
    if len(stored) < plan.object_end:
        return INVALID
    source = memoryview(stored)
    for out, start, length in plan.ranges:
        output[out : out + length] = source[start : start + length]
    return OK


__all__ = ["MAX_DIRECT_RANGES", "SelectionPlan", "TensorSelectionCalls", "plan_selection"]
