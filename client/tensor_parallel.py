"""Upstream's ``*_tensor_with_parallelism`` calls: shards described by parallel axes
(``ParallelAxis``, ``TensorParallelism``) and reads by ``ReadTarget`` (as stored, one shard,
or the whole tensor put back together).

Where the objects go, as upstream 0.3.13 stores them:

- parallelism of one ``tp`` axis with a ``split_dim`` (rank ``r`` of ``n``): the tensor given
  *is* rank ``r``'s shard; it is stored under ``<key>_tp_<r>`` (the ``*_with_tp`` name) with
  a shard header whose whole shape is the shard's with ``split_dim`` times ``n``, and the
  manifest ``<key>__parallelism_manifest`` records the split;
- any other parallelism (several axes, or ``dp`` / ``ep`` / ``pp`` axes): the object's key is
  ``<key>__<kind>_<rank>of<size>[_sd<d>][_eid<e>][_sid<s>]`` per axis; when one axis is
  ``tp`` with a ``split_dim``, the tensor given is the whole tensor along it and this rank's
  chunk is stored (plus the manifest); otherwise the tensor is stored whole with the axes in
  its header.

Reads by ``ReadTarget.mode``: ``"as_stored"`` (no parallelism) reads the key as it is;
``"shard"`` reads the shard the parallelism names, re-cut from the whole tensor when it was
written with another ``tp`` size; ``"full"`` reads every ``tp`` shard and concatenates them
along the split dimension (``"full"`` with no parallelism reads the key as it is).
Anything else (``"as_stored"`` with a parallelism, ``"shard"`` without) answers None, as
upstream. ``writer_partition`` requests are not supported here: they answer -600.

KV-session tags and groups of the config apply to every object a call writes (shard and
manifest), so a session's pin, release and eviction take a tensor whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .tensor_io import RawObject, StoredObject, TensorIO, tp_key
from .tensors import (
    AXIS_EP,
    AXIS_KINDS,
    AXIS_PP,
    AXIS_TP,
    ParallelismManifest,
    TensorMetadata,
    decode,
    dtype_code,
    encode,
    is_tensor,
    parse_metadata,
    shard_axis,
)


@dataclasses.dataclass
class ParallelAxis:
    """One parallel axis, as upstream's ``mooncake.store.ParallelAxis``.

    Attributes:
        kind: ``"tp"``, ``"dp"``, ``"ep"`` or ``"pp"`` (any case).
        rank: this shard's rank on the axis, ``0 <= rank < size``.
        size: the number of ranks.
        split_dim: the tensor dimension the axis cuts (None: it cuts none).
        expert_id: an ``ep`` axis's expert (kept in the header and the key).
        stage_id: a ``pp`` axis's stage (kept in the header and the key).
    """

    kind: str = ""
    rank: int = 0
    size: int = 1
    split_dim: int | None = None
    expert_id: int | None = None
    stage_id: int | None = None


@dataclasses.dataclass
class TensorParallelism:
    """The axes of one shard (1 to 4), as upstream's ``TensorParallelism``."""

    axes: list[ParallelAxis] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ReadTarget:
    """What a parallelism read returns, as upstream's ``ReadTarget``.

    Attributes:
        mode: ``"as_stored"``, ``"shard"`` or ``"full"``.
        parallelism: the shard to read (``"shard"``) or any shard of the tensor (``"full"``).
    """

    mode: str = "as_stored"
    parallelism: TensorParallelism | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class _Axis:
    kind: int
    rank: int
    size: int
    split_dim: int | None
    expert_id: int | None
    stage_id: int | None

    def suffix(self) -> str:
        text = f"{AXIS_KINDS[self.kind]}_{self.rank}of{self.size}"
        for tag, value in (("sd", self.split_dim), ("eid", self.expert_id), ("sid", self.stage_id)):
            if value is not None:
                text += f"_{tag}{value}"
        return text

    def at(self, rank: int) -> _Axis:
        return dataclasses.replace(self, rank=rank)


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def parse_axes(parallelism: Any) -> list[_Axis] | None:
    """The axes of a ``TensorParallelism`` (or any object or mapping with ``axes`` whose
    entries have ``kind``, ``rank``, ``size`` and the optional ids), or None when they are
    missing or invalid: no axes, more than 4, an unknown kind, a rank outside ``[0, size)``,
    a negative ``split_dim``."""
    axes = _field(parallelism, "axes")
    if not axes or len(axes) > 4:
        return None
    out = []
    for axis in axes:
        kind = str(_field(axis, "kind") or "").lower()
        rank, size = _field(axis, "rank"), _field(axis, "size")
        split_dim = _field(axis, "split_dim")
        if kind not in AXIS_KINDS or not isinstance(rank, int) or not isinstance(size, int):
            return None
        if not 0 <= rank < size or (split_dim is not None and split_dim < 0):
            return None
        out.append(
            _Axis(
                AXIS_KINDS.index(kind),
                rank,
                size,
                split_dim,
                _field(axis, "expert_id"),
                _field(axis, "stage_id"),
            )
        )
    return out


def _pure_tp(axes: Sequence[_Axis]) -> bool:
    return len(axes) == 1 and axes[0].kind == AXIS_TP


def object_key(base_key: str, axes: Sequence[_Axis]) -> str:
    """Where the shard named by ``axes`` is stored (see the module docstring)."""
    if _pure_tp(axes):
        return tp_key(base_key, axes[0].rank)
    return base_key + "".join(f"__{axis.suffix()}" for axis in axes)


def manifest_key(base_key: str) -> str:
    """The key of a tensor's parallelism manifest."""
    return f"{base_key}__parallelism_manifest"


def _tp_index(axes: Sequence[_Axis]) -> int | None:
    return next(
        (i for i, a in enumerate(axes) if a.kind == AXIS_TP and a.split_dim is not None), None
    )


def plan_write(
    key: str, tensor: Any, axes: Sequence[_Axis]
) -> list[tuple[str, StoredObject | None]]:
    """The objects one parallelism write of ``tensor`` stores: ``(key, object)`` pairs, the
    shard first (None objects: the request cannot be met, e.g. a dimension that does not
    divide evenly)."""
    key_name = object_key(key, axes)
    tp = _tp_index(axes)
    if not is_tensor(tensor) or (_pure_tp(axes) and tp is None):
        return [(key_name, None)]
    ndim = tensor.dim()
    if any(a.split_dim is not None and a.split_dim >= ndim for a in axes):
        return [(key_name, None)]
    shape = [int(d) for d in tensor.shape]
    shard = tensor
    manifest = None
    if tp is not None:
        axis = axes[tp]
        assert axis.split_dim is not None
        if _pure_tp(axes):
            shape[axis.split_dim] *= axis.size  # the tensor given is this rank's shard
        elif shape[axis.split_dim] % axis.size:
            return [(key_name, None)]  # only uniform sharding, as upstream
        else:
            shard = tensor.chunk(axis.size, axis.split_dim)[axis.rank]
        code = dtype_code(tensor.dtype)
        if code is not None:
            manifest = ParallelismManifest(code, axis.split_dim, axis.size, tuple(shape)).pack()
    layout = [
        shard_axis(
            a.kind,
            i,
            a.rank,
            a.size,
            a.split_dim,
            shard.shape,
            (a.expert_id if a.kind == AXIS_EP else a.stage_id if a.kind == AXIS_PP else None) or 0,
        )
        for i, a in enumerate(axes)
    ]
    objects: list[tuple[str, StoredObject | None]] = [(key_name, encode(shard, shape, layout))]
    if manifest is not None:
        objects.append((manifest_key(key), RawObject(manifest)))
    return objects


def axis_matches(metadata: TensorMetadata, axes: Sequence[_Axis]) -> bool:
    """Whether a stored shard header carries ``axes`` (kind, rank, size, split dimension)."""
    if not metadata.is_shard or len(metadata.axes) != len(axes):
        return False
    return all(
        s.kind == a.kind
        and s.shard_rank == a.rank
        and s.shard_count == a.size
        and s.split_dim == (-1 if a.split_dim is None else a.split_dim)
        for s, a in zip(metadata.axes, axes, strict=True)
    )


@dataclasses.dataclass(frozen=True, slots=True)
class ReadPlan:
    """A read's answer: the object at ``key`` as stored (checked against ``axes`` when
    given), or a tensor ``build`` puts together from several objects."""

    key: str | None = None
    axes: tuple[_Axis, ...] | None = None
    build: Callable[[], Any] | None = None


def plan_read(io: TensorIO, key: str, target: Any) -> ReadPlan | None:
    """How to answer a read of ``key`` for ``target`` (None: a request upstream refuses)."""
    mode = "as_stored" if target is None else str(_field(target, "mode") or "as_stored").lower()
    parallelism = None if target is None else _field(target, "parallelism")
    if mode not in ("as_stored", "shard", "full"):
        return None
    if parallelism is None:
        return ReadPlan(key) if mode in ("as_stored", "full") else None
    axes = parse_axes(parallelism)
    if mode == "as_stored" or axes is None:
        return None
    tp = _tp_index(axes)
    if mode == "shard":
        if tp is None:
            return ReadPlan(object_key(key, axes), tuple(axes))
        return ReadPlan(build=lambda: _tp_shard(io, key, axes, tp))
    if tp is None:
        return ReadPlan(object_key(key, axes), tuple(axes))
    return ReadPlan(build=lambda: _whole(io, key, axes, tp))


def _whole(io: TensorIO, key: str, axes: Sequence[_Axis], tp: int) -> Any:
    """The tensor put back together from every tp shard it was written as, or None.

    How it was split (shard count, dimension, whole shape) comes from its manifest, else from
    the header of its shard 0 (``*_with_tp`` writes store no manifest); every shard's header
    must name its own rank of that split."""
    axis = axes[tp]

    def name(rank: int) -> str:
        return object_key(key, [*axes[:tp], axis.at(rank), *axes[tp + 1 :]])

    handles = io.read_raw([manifest_key(key), name(0)])
    manifest = None if handles[0] is None else ParallelismManifest.parse(handles[0])
    first = None if handles[1] is None else parse_metadata(handles[1], len(handles[1]))
    if manifest is not None:
        count, split_dim, shape = manifest.shard_count, manifest.split_dim, manifest.global_shape
    elif first is not None and (layout := _tp_layout(first)) is not None:
        (count, split_dim), shape = layout, first.global_shape
    else:
        return None
    rest = io.read_raw([name(r) for r in range(1, count)])
    shards = []
    for rank, handle in enumerate([handles[1], *rest]):
        metadata = None if handle is None else parse_metadata(handle, len(handle))
        if metadata is None or _tp_layout(metadata, rank) != (count, split_dim):
            return None
        shards.append(decode(handle))
    import torch  # only this call needs torch

    whole = torch.cat(shards, dim=split_dim)
    return whole if tuple(whole.shape) == tuple(shape) else None


def _tp_shard(io: TensorIO, key: str, axes: Sequence[_Axis], tp: int) -> Any:
    """Rank ``axes[tp].rank`` of ``axes[tp].size`` along its split: the stored shard when the
    tensor was written with that split, else cut from the whole tensor (None when the
    dimension does not divide evenly or the shards are missing)."""
    axis = axes[tp]
    handle = io.read_raw([object_key(key, axes)])[0]
    metadata = None if handle is None else parse_metadata(handle, len(handle))
    if metadata is not None and axis_matches(metadata, axes):
        return decode(handle)  # stored as asked
    stored = None if metadata is None else _tp_layout(metadata)
    if stored is not None and stored[0] == axis.size:
        return None  # written with this tp size, split along another dimension
    whole = _whole(io, key, axes, tp)
    if whole is None or axis.split_dim is None or whole.shape[axis.split_dim] % axis.size:
        return None
    return whole.chunk(axis.size, axis.split_dim)[axis.rank].contiguous()


def _tp_layout(metadata: TensorMetadata, rank: int | None = None) -> tuple[int, int] | None:
    """(shard count, split dimension) of a shard header's tp axis (None without one, or when
    its rank is not ``rank``)."""
    for axis in metadata.axes:
        if axis.kind == AXIS_TP and axis.split_dim >= 0:
            return (
                None if rank not in (None, axis.shard_rank) else (axis.shard_count, axis.split_dim)
            )
    return None
