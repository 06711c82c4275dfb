"""The tensor object format of upstream Mooncake's tensor calls, and tensor <-> bytes.

A tensor object is a 304-byte metadata block followed by the tensor's bytes (C order, native
little-endian), exactly as upstream 0.3.13 stores it, so objects written by either side read
on the other. All integers are little-endian:

``header`` (40 bytes)
    ``u32 magic`` (0x4D4F4F4E, ``b"NOOM"`` on disk), ``u16 version`` (1), ``u16 header_size``
    (304), ``i32 dtype`` (:data:`DTYPE_NAMES` index), ``i32 ndim`` (0..8), ``u32 layout_kind``
    (0 full, 1 shard), ``u32 reserved_flags`` (0), ``u64 data_offset`` (304),
    ``u64 data_bytes`` (object size - data_offset).
``layout`` (264 bytes)
    ``i64 global_shape[8]`` and ``i64 local_shape[8]`` (unused dimensions -1; the payload has
    ``local_shape``), ``u32 axis_count`` (0..4), ``u32 reserved``, then four axes of 32 bytes:
    ``i32 kind`` (0 dp, 1 tp, 2 ep, 3 pp), ``i32 axis_index``, ``i32 shard_rank``,
    ``i32 shard_count``, ``i32 split_dim`` (-1 none), ``i32 reserved0`` (the expert id of an
    ep axis, the stage id of a pp axis), ``i64 reserved1`` (the local extent of
    ``split_dim``, else 0).

A full tensor has ``global_shape == local_shape`` and no axes. A shard (what the ``*_with_tp``
and ``*_with_parallelism`` writes store) names the whole tensor's shape and its axes.

A *parallelism manifest* (``<key>__parallelism_manifest``, 96 bytes) records how a tensor
written by its shards was split: ``u32 magic`` (0x574D414E), ``u16 version`` (1),
``u16 header_size`` (96), ``i32 dtype``, ``i32 ndim``, ``i32 split_dim``, ``i32 shard_count``,
``i32 reserved``, ``i64 global_shape[8]``.

torch is optional: this module imports it only inside the functions that need a tensor.
"""

from __future__ import annotations

import dataclasses
import math
import struct
import sys
from collections.abc import Sequence
from typing import Any

TENSOR_MAGIC = 0x4D4F4F4E
MANIFEST_MAGIC = 0x574D414E
FORMAT_VERSION = 1
MAX_DIMS = 8
MAX_AXES = 4
LAYOUT_FULL = 0
LAYOUT_SHARD = 1

_HEADER = struct.Struct("<IHHiiIIQQ")
_SHAPE = struct.Struct(f"<{MAX_DIMS}q")
_AXES_HEAD = struct.Struct("<II")
_AXIS = struct.Struct("<6iq")
_MANIFEST_HEAD = struct.Struct("<IHHiiiii4x")  # 4 bytes of padding: the shape is 8-aligned

METADATA_SIZE = _HEADER.size + 2 * _SHAPE.size + _AXES_HEAD.size + MAX_AXES * _AXIS.size
MANIFEST_SIZE = _MANIFEST_HEAD.size + _SHAPE.size
assert METADATA_SIZE == 304 and MANIFEST_SIZE == 96  # upstream's sizeof values

# torch dtype names by upstream's TensorDtype code (the index).
DTYPE_NAMES = (
    "float32",
    "float64",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "bool",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
)

# Parallel axis kinds by their code, as upstream's LayoutAxisKind.
AXIS_KINDS = ("dp", "tp", "ep", "pp")
AXIS_TP = 1
AXIS_EP = 2
AXIS_PP = 3


@dataclasses.dataclass(frozen=True, slots=True)
class LayoutAxis:
    """One parallel axis of a shard (see the module docstring for the fields)."""

    kind: int
    axis_index: int
    shard_rank: int
    shard_count: int
    split_dim: int = -1
    reserved0: int = 0
    reserved1: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class TensorMetadata:
    """The metadata block of one tensor object.

    Attributes:
        dtype: upstream's dtype code (an index of :data:`DTYPE_NAMES`).
        global_shape: the whole tensor's shape (equal to ``local_shape`` for a full tensor).
        local_shape: the shape of the payload.
        layout_kind: :data:`LAYOUT_FULL` or :data:`LAYOUT_SHARD`.
        axes: a shard's parallel axes (at most :data:`MAX_AXES`).
        data_bytes: the payload's size.
    """

    dtype: int
    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    layout_kind: int = LAYOUT_FULL
    axes: tuple[LayoutAxis, ...] = ()
    data_bytes: int = 0

    def pack(self) -> bytes:
        """The 304-byte block (header, layout, unused axes zeroed)."""
        ndim = len(self.local_shape)
        out = bytearray(METADATA_SIZE)
        _HEADER.pack_into(
            out,
            0,
            TENSOR_MAGIC,
            FORMAT_VERSION,
            METADATA_SIZE,
            self.dtype,
            ndim,
            self.layout_kind,
            0,
            METADATA_SIZE,
            self.data_bytes,
        )
        offset = _HEADER.size
        for shape in (self.global_shape, self.local_shape):
            _SHAPE.pack_into(out, offset, *_padded(shape))
            offset += _SHAPE.size
        _AXES_HEAD.pack_into(out, offset, len(self.axes), 0)
        offset += _AXES_HEAD.size
        for axis in self.axes:
            _AXIS.pack_into(
                out,
                offset,
                axis.kind,
                axis.axis_index,
                axis.shard_rank,
                axis.shard_count,
                axis.split_dim,
                axis.reserved0,
                axis.reserved1,
            )
            offset += _AXIS.size
        return bytes(out)

    @property
    def is_shard(self) -> bool:
        return self.layout_kind == LAYOUT_SHARD


def parse_metadata(data: Any, total_length: int) -> TensorMetadata | None:
    """The metadata of a tensor object of ``total_length`` bytes whose first bytes are
    ``data`` (any buffer of at least 304 bytes), or None unless it passes upstream's checks:
    magic, version, sizes, a known dtype, 0..8 dimensions, ``data_bytes ==
    total_length - data_offset``, non-negative extents, -1 in
    unused dimensions, and valid axes."""
    view = memoryview(data).cast("B")
    if total_length < METADATA_SIZE or len(view) < METADATA_SIZE:
        return None
    magic, version, size, dtype, ndim, kind, _, data_offset, data_bytes = _HEADER.unpack_from(
        view, 0
    )
    if (magic, version, size) != (TENSOR_MAGIC, FORMAT_VERSION, METADATA_SIZE):
        return None
    if not (0 <= dtype < len(DTYPE_NAMES) and 0 <= ndim <= MAX_DIMS and kind <= LAYOUT_SHARD):
        return None
    if not METADATA_SIZE <= data_offset <= total_length or data_bytes != total_length - data_offset:
        return None
    offset = _HEADER.size
    global_dims = _SHAPE.unpack_from(view, offset)
    local_dims = _SHAPE.unpack_from(view, offset + _SHAPE.size)
    offset += 2 * _SHAPE.size
    # Zero extents are valid (upstream 0.3.13 stores and reads empty tensors).
    if any(g < 0 or n < 0 for g, n in zip(global_dims[:ndim], local_dims[:ndim], strict=True)):
        return None
    if any(d != -1 for d in global_dims[ndim:] + local_dims[ndim:]):
        return None
    axis_count, _ = _AXES_HEAD.unpack_from(view, offset)
    offset += _AXES_HEAD.size
    if axis_count > MAX_AXES:
        return None
    axes = []
    for i in range(axis_count):
        axis = LayoutAxis(*_AXIS.unpack_from(view, offset + i * _AXIS.size))
        bad_kind = not 0 <= axis.kind <= len(AXIS_KINDS)  # 4 is upstream's RESERVED
        bad_rank = axis.shard_count <= 0 or not 0 <= axis.shard_rank < axis.shard_count
        if bad_kind or bad_rank or not -1 <= axis.split_dim < ndim:
            return None
        axes.append(axis)
    return TensorMetadata(
        dtype, global_dims[:ndim], local_dims[:ndim], kind, tuple(axes), data_bytes
    )


@dataclasses.dataclass(frozen=True, slots=True)
class ParallelismManifest:
    """How a tensor written by its shards was split (``<key>__parallelism_manifest``)."""

    dtype: int
    split_dim: int
    shard_count: int
    global_shape: tuple[int, ...]

    def pack(self) -> bytes:
        """The 96-byte manifest object."""
        head = _MANIFEST_HEAD.pack(
            MANIFEST_MAGIC,
            FORMAT_VERSION,
            MANIFEST_SIZE,
            self.dtype,
            len(self.global_shape),
            self.split_dim,
            self.shard_count,
            0,
        )
        return head + _SHAPE.pack(*_padded(self.global_shape))

    @classmethod
    def parse(cls, data: Any) -> ParallelismManifest | None:
        """The manifest in ``data``, or None unless it is a valid one."""
        view = memoryview(data).cast("B")
        if len(view) < MANIFEST_SIZE:
            return None
        magic, version, size, dtype, ndim, split_dim, count, _ = _MANIFEST_HEAD.unpack_from(view)
        if (magic, version, size) != (MANIFEST_MAGIC, FORMAT_VERSION, MANIFEST_SIZE):
            return None
        if not 0 <= ndim <= MAX_DIMS or count <= 0 or not 0 <= split_dim < ndim:
            return None
        shape = _SHAPE.unpack_from(view, _MANIFEST_HEAD.size)[:ndim]
        if any(d <= 0 for d in shape):
            return None
        return cls(dtype, split_dim, count, shape)


def _padded(shape: Sequence[int]) -> list[int]:
    return [*shape, *([-1] * (MAX_DIMS - len(shape)))]


# ----------------------------------------------------------------------------------------------
# torch <-> bytes (torch imported only here)


def _torch() -> Any:
    import torch  # optional dependency: only the tensor calls need it

    return torch


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor (False, without importing torch, when torch was
    never imported: then nothing can be one)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def dtype_code(dtype: Any) -> int | None:
    """Upstream's code of a torch dtype, or None for one the format has no code for."""
    name = str(dtype).removeprefix("torch.")
    try:
        return DTYPE_NAMES.index(name)
    except ValueError:
        return None


def torch_dtype(code: int) -> Any:
    """The torch dtype of an upstream dtype code."""
    return getattr(_torch(), DTYPE_NAMES[code])


@dataclasses.dataclass(frozen=True, slots=True)
class EncodedTensor:
    """A tensor ready to write: its metadata block and its payload.

    Attributes:
        metadata: the 304-byte block.
        payload: the tensor's bytes (a view of a host, contiguous copy or of the tensor itself;
            it keeps that memory alive).
        tensor: the host, contiguous tensor the payload views.
    """

    metadata: bytes
    payload: memoryview
    tensor: Any

    @property
    def size(self) -> int:
        return len(self.metadata) + len(self.payload)

    def parts(self) -> list[memoryview]:
        return [memoryview(self.metadata), self.payload]


def host_tensor(tensor: Any) -> Any:
    """``tensor`` detached, on the host and C-contiguous (itself when it already is)."""
    host = tensor.detach()
    if host.device.type != "cpu":
        host = host.cpu()  # device memory cannot be written from here: one copy to the host
    return host.contiguous()


def payload_view(host: Any) -> memoryview:
    """The bytes of a host, contiguous tensor, as a flat byte view (no copy)."""
    if host.numel() == 0:
        return memoryview(b"")
    return memoryview(host.reshape(-1).view(_torch().uint8).numpy()).cast("B")


def encode(
    tensor: Any,
    global_shape: Sequence[int] | None = None,
    axes: Sequence[LayoutAxis] = (),
) -> EncodedTensor | None:
    """``tensor`` as a tensor object: full, or (with ``axes``) a shard of a tensor of
    ``global_shape``. None when it is not a tensor, has a dtype without a code or more than 8
    dimensions."""
    if not is_tensor(tensor):
        return None
    code = dtype_code(tensor.dtype)
    if code is None or tensor.dim() > MAX_DIMS or len(axes) > MAX_AXES:
        return None
    host = host_tensor(tensor)
    payload = payload_view(host)
    local = tuple(int(d) for d in host.shape)
    metadata = TensorMetadata(
        dtype=code,
        global_shape=tuple(global_shape) if global_shape is not None else local,
        local_shape=local,
        layout_kind=LAYOUT_SHARD if axes else LAYOUT_FULL,
        axes=tuple(axes),
        data_bytes=len(payload),
    )
    return EncodedTensor(metadata.pack(), payload, host)


def decode(buffer: Any, length: int | None = None) -> Any:
    """The tensor stored in the first ``length`` bytes of ``buffer`` (all of it by default),
    as a tensor *viewing* ``buffer`` (no copy: it keeps ``buffer`` alive, and writes to
    either show in the other); None when the bytes are not a valid tensor object.

    ``buffer`` must be writable (a :class:`~mooncake_py.BufferHandle`, a registered range).
    """
    view = memoryview(buffer).cast("B")
    total = len(view) if length is None else length
    if total > len(view):
        return None
    metadata = parse_metadata(view, total)
    if metadata is None:
        return None
    torch = _torch()
    dtype = torch_dtype(metadata.dtype)
    shape = metadata.local_shape
    itemsize = torch.empty((), dtype=dtype).element_size()
    if math.prod(shape) * itemsize != metadata.data_bytes:
        return None
    if metadata.data_bytes == 0:
        return torch.empty(shape, dtype=dtype)
    offset = total - metadata.data_bytes  # the header's data_offset (checked by the parse)
    raw = torch.frombuffer(view, dtype=torch.uint8, count=metadata.data_bytes, offset=offset)
    return raw.view(dtype).reshape(shape)


def shard_axis(
    kind: int, index: int, rank: int, count: int, split_dim: int | None, local: Any, tag: int = 0
) -> LayoutAxis:
    """A :class:`LayoutAxis` for a shard of local shape ``local`` (``tag``: the expert or
    stage id of an ep or pp axis)."""
    extent = int(local[split_dim]) if split_dim is not None else 0
    return LayoutAxis(kind, index, rank, count, -1 if split_dim is None else split_dim, tag, extent)
