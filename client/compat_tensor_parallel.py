"""Upstream's ``*_tensor_with_parallelism`` calls of ``MooncakeDistributedStore``, as the
mixin :class:`ParallelTensorCalls` (a base of
:class:`~mooncake_py.client.compat_tensor.TensorCalls`). Where the objects go and what each
``ReadTarget`` reads: :mod:`mooncake_py.client.tensor_parallel`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mooncake_py.types import ReplicateConfig

from .mixin_bases import StoreBase
from .tensor_io import INVALID, RawObject, Shards, StoredObject, TensorIO
from .tensor_parallel import ReadPlan, axis_matches, parse_axes, plan_read, plan_write
from .tensors import METADATA_SIZE, decode, encode, parse_metadata


def _per_key(value: Any, count: int) -> list[Any] | None:
    """One entry per key: a list or tuple of ``count`` entries, or None for all (upstream's
    forms); None for anything else (another length, a single object)."""
    if value is None:
        return [None] * count
    if isinstance(value, (list, tuple)) and len(value) == count:
        return list(value)
    return None


class ParallelTensorCalls(StoreBase):
    """The ``*_tensor_with_parallelism`` calls of
    :class:`~mooncake_py.client.compat_tensor.TensorCalls`; see the module docstring.

    Writes return 0 or a negative code per key (-600 for an invalid or unmet parallelism, a
    ``writer_partition``, lists of different lengths, before setup); reads a tensor or None.
    ``parallelisms`` / ``targets`` / ``writer_partitions`` of the batch forms are lists of one
    entry per key, or None (every key as stored / whole); anything else answers -600 (or
    None) for every key, as upstream.
    """

    def _tensor_io(self) -> TensorIO | None:
        client = self.client
        return None if client is None else TensorIO(client)

    def _put_parallel(
        self,
        keys: Sequence[str],
        tensors: Sequence[Any],
        parallelisms: Any,
        config: ReplicateConfig | None,
        writer_partitions: Any,
        upsert: bool,
    ) -> list[int]:
        count = len(keys)
        io = self._tensor_io()
        pars = _per_key(parallelisms, count)
        writers = _per_key(writer_partitions, count)
        if io is None or len(tensors) != count or pars is None or writers is None:
            return [INVALID] * count
        if not count:
            return []
        names: list[str] = []
        objects: list[StoredObject | None] = []
        sources: list[int] = []
        seen: set[str] = set()
        for i, (key, tensor) in enumerate(zip(keys, tensors, strict=True)):
            if writers[i] is not None:
                planned: list[tuple[str, StoredObject | None]] = [(key, None)]
            elif pars[i] is None:
                planned = [(key, encode(tensor))]
            else:
                axes = parse_axes(pars[i])
                planned = [(key, None)] if axes is None else plan_write(key, tensor, axes)
            for name, obj in planned:
                if isinstance(obj, RawObject) and name in seen:
                    continue  # several ranks of one tensor in a call: one manifest
                seen.add(name)
                names.append(name)
                objects.append(obj)
                sources.append(i)
        return io.write(Shards(names, objects, sources), count, config, upsert)

    def _put_parallel_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        parallelisms: Any,
        config: ReplicateConfig | None,
        writer_partitions: Any,
        upsert: bool,
    ) -> list[int]:
        io = self._tensor_io()
        if io is None or not len(keys) == len(buffer_ptrs) == len(sizes):
            return [INVALID] * len(keys)
        # Tensors viewing the registered memory: a shard is written straight from it.
        views = [io.object_at(p, s) for p, s in zip(buffer_ptrs, sizes, strict=True)]
        tensors = [None if v is None else decode(v) for v in views]
        return self._put_parallel(keys, tensors, parallelisms, config, writer_partitions, upsert)

    def put_tensor_with_parallelism(
        self,
        key: str,
        tensor: Any,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        """Store ``tensor`` as the shard ``parallelism`` names (a whole tensor with None); 0 or
        a negative code. See the module docstring for the keys written."""
        return self._put_parallel(
            [key], [tensor], [parallelism], config, [writer_partition], False
        )[0]

    def batch_put_tensor_with_parallelism(
        self,
        keys: Sequence[str],
        tensors_list: Sequence[Any],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        """:meth:`put_tensor_with_parallelism` for each key, in one batch."""
        return self._put_parallel(
            keys, tensors_list, parallelisms, config, writer_partitions, False
        )

    def upsert_tensor_with_parallelism(
        self,
        key: str,
        tensor: Any,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        """:meth:`put_tensor_with_parallelism` that replaces existing objects."""
        return self._put_parallel([key], [tensor], [parallelism], config, [writer_partition], True)[
            0
        ]

    def batch_upsert_tensor_with_parallelism(
        self,
        keys: Sequence[str],
        tensors_list: Sequence[Any],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        """:meth:`batch_put_tensor_with_parallelism` that replaces existing objects."""
        return self._put_parallel(keys, tensors_list, parallelisms, config, writer_partitions, True)

    def put_tensor_with_parallelism_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        """:meth:`put_tensor_with_parallelism` of the tensor object held by a registered range
        (metadata then payload); -600 when it is not one."""
        return self._put_parallel_from(
            [key], [buffer_ptr], [size], [parallelism], config, [writer_partition], False
        )[0]

    def batch_put_tensor_with_parallelism_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        """:meth:`put_tensor_with_parallelism_from` for each key."""
        return self._put_parallel_from(
            keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, False
        )

    def upsert_tensor_with_parallelism_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        """:meth:`put_tensor_with_parallelism_from` that replaces existing objects."""
        return self._put_parallel_from(
            [key], [buffer_ptr], [size], [parallelism], config, [writer_partition], True
        )[0]

    def batch_upsert_tensor_with_parallelism_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        """:meth:`batch_put_tensor_with_parallelism_from` that replaces existing objects."""
        return self._put_parallel_from(
            keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, True
        )

    # ------------------------------------------------------------------------------------------
    # Reads

    def get_tensor_with_parallelism(self, key: str, target: Any = None) -> Any:
        """The tensor ``target`` (a ``ReadTarget``; None: as stored) asks for, or None."""
        return self.batch_get_tensor_with_parallelism([key], [target])[0]

    def batch_get_tensor_with_parallelism(
        self, keys: Sequence[str], targets: Any = None
    ) -> list[Any]:
        """:meth:`get_tensor_with_parallelism` for each key (the stored objects asked for
        as they are in one lookup)."""
        io = self._tensor_io()
        per_key = _per_key(targets, len(keys))
        if io is None or per_key is None:
            return [None] * len(keys)
        plans = [plan_read(io, key, target) for key, target in zip(keys, per_key, strict=True)]
        direct = [(i, p) for i, p in enumerate(plans) if p is not None and p.key is not None]
        handles = io.read_raw([p.key for _, p in direct if p.key is not None])
        out: list[Any] = [None] * len(keys)
        for (i, plan), handle in zip(direct, handles, strict=True):
            out[i] = None if handle is None else _checked(handle, len(handle), plan)
        for i, maybe in enumerate(plans):
            if maybe is not None and maybe.build is not None:
                out[i] = maybe.build()
        return out

    def get_tensor_with_parallelism_into(
        self, key: str, buffer_ptr: int, size: int, target: Any = None
    ) -> Any:
        """:meth:`get_tensor_with_parallelism` into a registered buffer: it receives the
        object (metadata then payload; a full header for a tensor put together from shards)
        and the tensor returned views it there. None when it does not fit, on a miss, ..."""
        return self.batch_get_tensor_with_parallelism_into([key], [buffer_ptr], [size], [target])[0]

    def batch_get_tensor_with_parallelism_into(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        targets: Any = None,
    ) -> list[Any]:
        """:meth:`get_tensor_with_parallelism_into` for each key."""
        count = len(keys)
        io = self._tensor_io()
        per_key = _per_key(targets, count)
        if io is None or per_key is None or not count == len(buffer_ptrs) == len(sizes):
            return [None] * count
        out: list[Any] = []
        for key, target, ptr, size in zip(keys, per_key, buffer_ptrs, sizes, strict=True):
            plan = plan_read(io, key, target)
            if plan is None:
                out.append(None)
            elif plan.key is not None:
                tensor = io.read_into([plan.key], [ptr], [size])[0]
                view = None if tensor is None else io.registered(ptr, size)
                length = METADATA_SIZE + (0 if tensor is None else tensor.nbytes)
                out.append(None if view is None else _checked(view, length, plan))
            else:
                out.append(_materialized(io, plan, ptr, size))
        return out


def _checked(buffer: Any, length: int, plan: ReadPlan) -> Any:
    """The tensor object in ``buffer`` when it carries the axes ``plan`` asks for."""
    if plan.axes is not None:
        metadata = parse_metadata(buffer, length)
        if metadata is None or not axis_matches(metadata, plan.axes):
            return None
    return decode(buffer, length)


def _materialized(io: TensorIO, plan: ReadPlan, buffer_ptr: int, size: int) -> Any:
    """Build ``plan``'s tensor and lay it out in the registered buffer as a full tensor
    object; the tensor returned views it there."""
    assert plan.build is not None
    tensor = plan.build()
    encoded = None if tensor is None else encode(tensor)
    if encoded is None or encoded.size > size:
        return None
    view = io.registered(buffer_ptr, size)
    if view is None:
        return None
    view[: len(encoded.metadata)] = encoded.metadata
    view[len(encoded.metadata) : encoded.size] = encoded.payload
    return decode(view, encoded.size)
