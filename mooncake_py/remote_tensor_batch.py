"""Metadata-only batches of tensors held in a Mooncake store, with lazy row selections, and
their materialization into local buffers (upstream's ``mooncake.remote_tensor_batch``).

A :class:`RemoteTensorBatch` names tensor fields (:class:`TensorFieldRef`: key, shape,
dtype, byte offset of the tensor inside its object) and records, without moving any byte,
the selections (index or mask, slice, repeat, concatenation; see
:mod:`mooncake_py.tensor_selection`) applied to their batch dimension. Its
:meth:`~RemoteTensorBatch.read_requests` turn into store calls
(``get_tensor_dim_selection_into``) through a :class:`RemoteTensorBatchMaterializer`, which
registers the destination memory, reads only the selected rows into it and unregisters it.

The store objects hold a field's tensor C-contiguous from ``data_offset`` on (0 for a value
written with ``put(key, array.tobytes())``, 304 for an object written by ``put_tensor``).

torch is never imported by this module except to size a torch dtype without an entry in
:data:`DTYPE_BYTE_SIZES`. The dataclasses are immutable; every method is thread-safe except
that a :class:`WritableBufferRegion` must not be closed by one thread while another uses it.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from mooncake_py.tensor_selection import (
    DTYPE_BYTE_SIZES,
    MAX_TENSOR_DIM_SELECTION_OUTPUT_BYTES,
    dtype_byte_size,
    normalize_dtype_name,
    normalize_indices,
    selection_group_length,
    selection_length,
    selection_output_shape,
    tensor_nbytes,
)


@dataclasses.dataclass(frozen=True)
class TensorFieldRef:
    """Where one fixed-shape tensor lies in the store.

    Attributes:
        key: the object's key.
        shape: the tensor's shape (C order).
        dtype: a dtype name (``"int64"``, ``"torch.int64"``) or a torch / numpy dtype.
        data_offset: the byte offset of the tensor's first element inside the object.
    """

    key: str
    shape: tuple[int, ...]
    dtype: Any
    data_offset: int = 0

    @classmethod
    def from_tensor(cls, key: str, tensor: Any, data_offset: int = 0) -> TensorFieldRef:
        """A reference to ``tensor`` (anything with ``shape`` and ``dtype``) stored under
        ``key``; the dtype is kept by its store name (:func:`normalize_dtype_name`)."""
        return cls(
            key=key,
            shape=tuple(int(d) for d in tensor.shape),
            dtype=normalize_dtype_name(tensor.dtype),
            data_offset=data_offset,
        )

    def nbytes(self) -> int:
        """The bytes of the whole stored tensor (raises as :func:`tensor_nbytes`)."""
        return tensor_nbytes(self.shape, self.dtype)


@dataclasses.dataclass(frozen=True)
class TensorDimSelection:
    """One lazy selection on a tensor dimension: ``op`` and its ``value`` (see
    :mod:`mooncake_py.tensor_selection`). Build one with the static constructors."""

    op: str
    value: Any

    @staticmethod
    def select_idxs(index: Any) -> TensorDimSelection:
        """Integer indices or a boolean mask (a list, numpy array or torch tensor)."""
        return TensorDimSelection("select_idxs", normalize_indices(index))

    @staticmethod
    def slice(
        start: int | None = None, end: int | None = None, step: int | None = None
    ) -> TensorDimSelection:
        """The Python slice ``start:end:step``."""
        return TensorDimSelection("slice", (start, end, step))

    @staticmethod
    def repeat(times: int = 2, interleave: bool = True) -> TensorDimSelection:
        """Each entry ``times`` times in a row (``interleave``), or the whole dimension
        ``times`` times over."""
        return TensorDimSelection("repeat", (times, interleave))

    @staticmethod
    def cat(selection_groups: Sequence[Sequence[TensorDimSelection]]) -> TensorDimSelection:
        """The dimension seen through each group of selections, one after the other."""
        return TensorDimSelection("cat", tuple(tuple(group) for group in selection_groups))

    def as_tuple(self) -> tuple[str, Any]:
        """``(op, value)`` as the store call takes it (a ``cat``'s groups as tuples of
        tuples)."""
        if self.op == "cat":
            groups = tuple(tuple(s.as_tuple() for s in group) for group in self.value)
            return self.op, groups
        return self.op, self.value


@dataclasses.dataclass(frozen=True)
class TensorReadRequest:
    """One field to materialize: its reference, the dimension the selections act on and the
    selections.

    Attributes:
        name: the field's name in its batch.
        ref: where the tensor lies.
        dim: the selected dimension (negative counts from the end).
        selections: applied in order.
        device: where the caller wants the result (kept, not acted on here).
    """

    name: str
    ref: TensorFieldRef
    dim: int = 0
    selections: tuple[TensorDimSelection, ...] = ()
    device: Any = None

    def output_shape(self) -> tuple[int, ...]:
        """The shape after the selections (raises as :func:`selection_output_shape`)."""
        return selection_output_shape(self.ref.shape, self.selections, self.dim)

    def output_nbytes(self) -> int:
        """The bytes the materialized output takes."""
        return tensor_nbytes(self.output_shape(), self.ref.dtype)

    def store_selections(self) -> list[tuple[str, Any]]:
        """The selections as ``get_tensor_dim_selection_into`` takes them."""
        return [selection.as_tuple() for selection in self.selections]


@dataclasses.dataclass(frozen=True)
class RemoteTensorBatch:
    """Tensor fields sharing a batch dimension, with the selections recorded on it so far.

    Every operation returns a new batch (nothing is read). ``batch_size`` is the extent of
    the batch dimension after the recorded selections.

    Attributes:
        fields: field name -> reference, in insertion order.
        batch_size: the current extent of the batch dimension.
        dim: the batch dimension of every field.
        selections: recorded so far, in order.
        device: where materialized tensors should go (metadata only).
    """

    fields: Mapping[str, TensorFieldRef]
    batch_size: int
    dim: int = 0
    selections: tuple[TensorDimSelection, ...] = ()
    device: Any = None

    def __len__(self) -> int:
        return self.batch_size

    def keys(self) -> list[str]:
        """The field names, in insertion order."""
        return list(self.fields)

    def clone(self) -> RemoteTensorBatch:
        """A copy with its own field mapping."""
        return dataclasses.replace(self, fields=dict(self.fields), selections=self.selections)

    def to(self, device: Any) -> RemoteTensorBatch:
        """The batch with ``device`` as its materialization target."""
        return dataclasses.replace(self, device=device)

    def select_fields(self, fields: Sequence[str] | None) -> RemoteTensorBatch:
        """Only the named fields (all of them for None), in the order given.

        Raises:
            KeyError: a name that is not a field.
        """
        if fields is None:
            return self.clone()
        return dataclasses.replace(self, fields={name: self.fields[name] for name in fields})

    def select_indices(self, index: Any) -> RemoteTensorBatch:
        """Record rows picked by integer indices or a boolean mask.

        Raises:
            IndexError: a mask whose length is not ``batch_size``.
        """
        selection = TensorDimSelection.select_idxs(index)
        return self._with(selection, selection_length(self.batch_size, selection))

    def slice(self, start: int | None, end: int | None, step: int | None) -> RemoteTensorBatch:
        """Record the slice ``start:end:step`` of the rows.

        Raises:
            ValueError: a zero step.
        """
        selection = TensorDimSelection.slice(start, end, step)
        return self._with(selection, selection_length(self.batch_size, selection))

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> RemoteTensorBatch:
        """Record each row repeated ``repeat_times`` times (in a row when ``interleave``).

        Raises:
            ValueError: a negative ``repeat_times``.
        """
        if repeat_times < 0:
            raise ValueError("repeat_times must be non-negative")
        selection = TensorDimSelection.repeat(repeat_times, interleave)
        return self._with(selection, self.batch_size * repeat_times)

    def union(self, rhs: RemoteTensorBatch) -> RemoteTensorBatch:
        """The fields of both batches, which must have the same batch size, dimension and
        selections.

        Raises:
            ValueError: different batch metadata, or a field name in both.
        """
        if (self.batch_size, self.dim, self.selections) != (
            rhs.batch_size,
            rhs.dim,
            rhs.selections,
        ):
            raise ValueError("RemoteTensorBatch union requires matching batch metadata")
        shared = sorted(set(self.fields) & set(rhs.fields))
        if shared:
            raise ValueError(f"RemoteTensorBatch union has duplicate fields: {shared}")
        return dataclasses.replace(self, fields={**self.fields, **rhs.fields})

    @staticmethod
    def cat(batches: Sequence[RemoteTensorBatch]) -> RemoteTensorBatch:
        """The batches' rows one after the other, as one ``cat`` selection whose groups are
        each batch's selections. The batches must share fields, dimension and device.

        Raises:
            ValueError: no batches, or batches that do not match.
        """
        if not batches:
            raise ValueError("RemoteTensorBatch.cat requires non-empty batches")
        first = batches[0]
        for batch in batches[1:]:
            if (batch.fields, batch.dim, batch.device) != (first.fields, first.dim, first.device):
                raise ValueError("RemoteTensorBatch.cat requires matching fields, dim, and device")
        selection = TensorDimSelection.cat([batch.selections for batch in batches])
        return dataclasses.replace(
            first,
            batch_size=sum(batch.batch_size for batch in batches),
            selections=(selection,),
        )

    def read_requests(self, fields: Sequence[str] | None = None) -> list[TensorReadRequest]:
        """One request per named field (every field for None), carrying this batch's
        dimension, selections and device.

        Raises:
            KeyError: a name that is not a field.
        """
        names = self.keys() if fields is None else list(fields)
        return [
            TensorReadRequest(name, self.fields[name], self.dim, self.selections, self.device)
            for name in names
        ]

    def _with(self, selection: TensorDimSelection, batch_size: int) -> RemoteTensorBatch:
        return dataclasses.replace(
            self, batch_size=batch_size, selections=(*self.selections, selection)
        )


@dataclasses.dataclass
class WritableBufferRegion:
    """The address and size of a writable Python buffer, holding its export open until
    :meth:`close` (so the memory cannot move or be resized while the store writes into it).

    Attributes:
        buffer: the object the region was made from (kept alive, still valid after close).
        view: the byte view exported from it.
        c_buffer: a ctypes array over ``view`` (None once closed).
        ptr: the address of the first byte.
        size: the bytes.
        closed: whether :meth:`close` ran.
    """

    buffer: Any
    view: memoryview
    c_buffer: Any
    ptr: int
    size: int
    closed: bool = False

    def close(self) -> None:
        """Release the exported view (idempotent); ``buffer`` stays usable."""
        if self.closed:
            return
        # The ctypes array holds an export of the view; it must go before the view is released.
        self.c_buffer = None
        self.view.release()
        self.closed = True

    def __enter__(self) -> WritableBufferRegion:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def writable_buffer_region(buffer: Any) -> WritableBufferRegion:
    """A :class:`WritableBufferRegion` over ``buffer`` (anything with the writable buffer
    protocol, C-contiguous: a ``bytearray``, a numpy array, a memoryview of any format).
    Every view made here is released again if this raises.

    Raises:
        ValueError: a read-only buffer.
        TypeError: an object without the buffer protocol, or a non-contiguous buffer.
    """
    view = memoryview(buffer)
    if view.readonly:
        view.release()
        raise ValueError("buffer must be writable")
    if view.format != "B" or view.ndim != 1:
        try:
            flat = view.cast("B")
        finally:
            # The byte view keeps its own export of the source; this one is no longer needed.
            view.release()
    else:
        flat = view
    try:
        c_buffer = (ctypes.c_ubyte * flat.nbytes).from_buffer(flat)
    except BaseException:
        flat.release()
        raise
    return WritableBufferRegion(
        buffer=buffer,
        view=flat,
        c_buffer=c_buffer,
        ptr=ctypes.addressof(c_buffer),
        size=flat.nbytes,
    )


class BytearrayBufferAllocator:
    """Allocates zero-filled ``bytearray`` regions for :meth:`RemoteTensorBatchMaterializer.
    materialize_buffers`. Thread-safe."""

    def allocate(self, size: int) -> WritableBufferRegion:
        """A region over a new ``bytearray`` of ``size`` bytes."""
        return writable_buffer_region(bytearray(size))


def checked_output_nbytes(request: TensorReadRequest) -> int:
    """``request.output_nbytes()``, refused above
    :data:`MAX_TENSOR_DIM_SELECTION_OUTPUT_BYTES`.

    Raises:
        ValueError: the output is too large (or the request is invalid).
    """
    nbytes = request.output_nbytes()
    if nbytes > MAX_TENSOR_DIM_SELECTION_OUTPUT_BYTES:
        raise ValueError(
            f"selected tensor output exceeds {MAX_TENSOR_DIM_SELECTION_OUTPUT_BYTES} bytes: "
            f"{nbytes}"
        )
    return nbytes


class RemoteTensorBatchMaterializer:
    """Reads :class:`TensorReadRequest` outputs into local memory through a store's
    ``register_buffer``, ``get_tensor_dim_selection_into`` and ``unregister_buffer``.

    Args:
        store: a :class:`~mooncake_py.MooncakeDistributedStore` after setup (or anything with
            those three calls).
        buffer_allocator: makes the regions :meth:`materialize_buffers` fills (an object with
            ``allocate(size) -> WritableBufferRegion``); :class:`BytearrayBufferAllocator` by
            default. Its regions' ``buffer`` must stay valid after ``close()``.

    Thread-safety: as the store; two calls must not fill the same memory at once.
    """

    def __init__(self, store: Any, buffer_allocator: Any = None) -> None:
        self.store = store
        self.buffer_allocator = buffer_allocator or BytearrayBufferAllocator()

    def materialize_buffers(
        self, remote_batch: RemoteTensorBatch, fields: Sequence[str] | None = None
    ) -> dict[str, tuple[Any, tuple[int, ...], Any]]:
        """Read the named fields (all for None) into newly allocated buffers.

        Every output size is checked before anything is allocated or read.

        Returns:
            field name -> ``(buffer, output shape, dtype as the field names it)``.

        Raises:
            ValueError: an output above :data:`MAX_TENSOR_DIM_SELECTION_OUTPUT_BYTES` (nothing
                allocated, no store call) or an invalid request.
            RuntimeError: a store call failed (its code in the message).
        """
        requests = remote_batch.read_requests(fields)
        sizes = [checked_output_nbytes(request) for request in requests]
        regions: dict[str, WritableBufferRegion] = {}
        try:
            for request, size in zip(requests, sizes, strict=True):
                regions[request.name] = self.buffer_allocator.allocate(size)
            for request in requests:
                self.materialize_request_into_region(request, regions[request.name])
            return {
                request.name: (
                    regions[request.name].buffer,
                    request.output_shape(),
                    request.ref.dtype,
                )
                for request in requests
            }
        finally:
            for region in regions.values():
                region.close()

    def materialize_requests_into(
        self, requests: Sequence[TensorReadRequest], buffers: Mapping[str, Any]
    ) -> dict[str, int]:
        """:meth:`materialize_request_into` for each request, into ``buffers[request.name]``;
        request name -> bytes written. Raises as that method (and ``KeyError`` for a request
        without a buffer)."""
        return {
            request.name: self.materialize_request_into(request, buffers[request.name])
            for request in requests
        }

    def materialize_request_into(self, request: TensorReadRequest, buffer: Any) -> int:
        """Read one request's output into ``buffer`` (any writable buffer); the bytes written.
        Raises as :meth:`materialize_request_into_region` and :func:`writable_buffer_region`."""
        with writable_buffer_region(buffer) as region:
            return self.materialize_request_into_region(request, region)

    def materialize_request_into_region(
        self, request: TensorReadRequest, region: WritableBufferRegion
    ) -> int:
        """Read one request's output into the start of ``region``: register the whole region,
        read, unregister (also when the read failed). A zero-byte output makes no store call.

        Returns:
            the bytes written (the store call's result).

        Raises:
            ValueError: the region is smaller than the output, the output is too large, or
                the request is invalid.
            RuntimeError: ``register_buffer``, ``get_tensor_dim_selection_into`` or
                ``unregister_buffer`` returned an error code (an unregister failure after a
                failed read is chained to the read's error).
        """
        required = checked_output_nbytes(request)
        if region.size < required:
            raise ValueError(f"buffer too small: need {required} bytes, got {region.size}")
        if required == 0:
            return 0
        code = self.store.register_buffer(region.ptr, region.size)
        if code != 0:
            raise RuntimeError(f"register_buffer failed with retcode {code}")
        failure: BaseException | None = None
        try:
            result = self.store.get_tensor_dim_selection_into(
                request.ref.key,
                region.ptr,
                required,
                list(request.ref.shape),
                normalize_dtype_name(request.ref.dtype),
                request.dim,
                request.store_selections(),
                request.ref.data_offset,
            )
            if result < 0:
                raise RuntimeError(f"get_tensor_dim_selection_into failed with retcode {result}")
            return int(result)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            code = self.store.unregister_buffer(region.ptr)
            if code != 0:
                error = RuntimeError(f"unregister_buffer failed with retcode {code}")
                if failure is not None:
                    raise error from failure
                raise error


__all__ = [
    "DTYPE_BYTE_SIZES",
    "MAX_TENSOR_DIM_SELECTION_OUTPUT_BYTES",
    "BytearrayBufferAllocator",
    "RemoteTensorBatch",
    "RemoteTensorBatchMaterializer",
    "TensorDimSelection",
    "TensorFieldRef",
    "TensorReadRequest",
    "WritableBufferRegion",
    "checked_output_nbytes",
    "dtype_byte_size",
    "normalize_dtype_name",
    "normalize_indices",
    "selection_group_length",
    "selection_length",
    "selection_output_shape",
    "tensor_nbytes",
    "writable_buffer_region",
]
