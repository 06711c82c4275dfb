"""Tensor objects over a typed :class:`~mooncake_py.Client`: writes, reads, zero-copy forms
and tensor-parallel shards, with upstream's per-key int / tensor-or-None results.

The format is :mod:`mooncake_py.client.tensors`. Every call here goes through the typed
client's public calls, so reads hold their read leases only while copying (a tensor returned
by :meth:`TensorIO.read` views a :class:`~mooncake_py.BufferHandle` of its own; one returned
by :meth:`TensorIO.read_into` views the caller's registered memory).

KV-session tags and groups follow the physical objects: when one logical key is written as
several objects (its tensor-parallel shards, a manifest), each object gets the logical key's
``kv_sessions`` / ``session_ids`` / ``group_ids`` entry, so pinning, releasing or evicting a
session or group acts on every shard of its tensors.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mooncake_py.errors import ErrorCode, MooncakeError
from mooncake_py.types import ReplicateConfig

from .data_plane import view_of_address
from .tensors import (
    AXIS_TP,
    EncodedTensor,
    decode,
    encode,
    is_tensor,
    parse_metadata,
    shard_axis,
)

if TYPE_CHECKING:
    from .api import Client

OK = int(ErrorCode.OK)
INVALID = int(ErrorCode.INVALID_PARAMS)


def tp_key(base_key: str, rank: int) -> str:
    """The key of a tensor-parallel shard, as upstream names it: ``<base>_tp_<rank>``."""
    return f"{base_key}_tp_{rank}"


def first_errors(codes: Sequence[int], sources: Sequence[int], count: int) -> list[int]:
    """Per logical key the first non-zero code of its physical keys (``sources[j]`` is the
    logical key of physical key ``j``); 0 when all of them succeeded."""
    out = [OK] * count
    for code, source in zip(codes, sources, strict=True):
        if out[source] == OK and code != OK:
            out[source] = code
    return out


def physical_config(
    config: ReplicateConfig | None, logical: int, sources: Sequence[int]
) -> ReplicateConfig:
    """``config`` (for ``logical`` keys) for the physical keys whose logical keys are
    ``sources``: each per-key entry (KV sessions, writer session, group) repeated for every
    object of its key; ``session_ids`` folded into ``kv_sessions``.

    Raises:
        ValueError: a per-key list of ``config`` does not have ``logical`` entries.
        TypeError: ``config`` is no :class:`ReplicateConfig`.
    """
    given = ReplicateConfig() if config is None else config
    if not isinstance(given, ReplicateConfig):
        raise TypeError(f"config must be a ReplicateConfig, not {type(given).__name__}")
    tags = given.session_tags(logical)
    groups = given.group_ids
    if groups is not None and len(groups) != logical:
        raise ValueError(f"{logical} keys but {len(groups)} group_ids")
    return dataclasses.replace(
        given,
        kv_sessions=None if tags is None else [list(tags[i]) for i in sources],
        session_ids=None,
        group_ids=None if groups is None else [groups[i] for i in sources],
    )


def placement_ok(config: ReplicateConfig | None) -> bool:
    """Upstream's check of the ``pub_*`` calls: ``preferred_segments``, when given, names one
    segment per replica."""
    if config is None:
        return True
    segments = config.preferred_segments
    return not segments or len(segments) == config.replica_num


@dataclasses.dataclass(frozen=True, slots=True)
class RawObject:
    """An object that is not a tensor (a parallelism manifest), written as is."""

    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)

    def parts(self) -> list[memoryview]:
        return [memoryview(self.data)]


StoredObject = EncodedTensor | RawObject


@dataclasses.dataclass(frozen=True, slots=True)
class Shards:
    """The objects one call writes: ``keys[j]`` holds ``objects[j]``, which belongs to logical
    key ``sources[j]``; a None object fails its logical key with INVALID_PARAMS."""

    keys: list[str]
    objects: list[StoredObject | None]
    sources: list[int]


def tp_shards(tensor: Any, tp_size: int, split_dim: int) -> list[EncodedTensor] | None:
    """``tensor`` cut into ``tp_size`` equal shards along ``split_dim`` (upstream supports
    only uniform sharding), each encoded with its tp axis; None when that is impossible."""
    if not is_tensor(tensor) or tp_size <= 0:
        return None
    ndim = tensor.dim()
    if not 0 <= split_dim < ndim or tensor.shape[split_dim] % tp_size:
        return None
    shape = tuple(int(d) for d in tensor.shape)
    out = []
    for rank, chunk in enumerate(tensor.chunk(tp_size, split_dim)):
        axis = shard_axis(AXIS_TP, 0, rank, tp_size, split_dim, chunk.shape)
        encoded = encode(chunk, shape, [axis])
        if encoded is None:
            return None
        out.append(encoded)
    return out if len(out) == tp_size else None


class TensorIO:
    """Tensor writes and reads over one typed client; see the module docstring.

    Nothing raises for a failed key: writes answer per key 0 or a negative code, reads a
    tensor or None. Arguments of the wrong type raise ``TypeError``.

    Thread-safety: as the typed client, every method may be called from several threads.
    """

    def __init__(self, client: Client) -> None:
        self.client = client

    # ------------------------------------------------------------------------------------------
    # Writes

    def write(
        self, shards: Shards, logical: int, config: ReplicateConfig | None, upsert: bool
    ) -> list[int]:
        """Write every object of ``shards``; per logical key the first error, or 0.

        One object is written from its parts (no join); several go in one batch, each joined
        into one buffer first (a transient copy of the payload).
        """
        try:
            physical = physical_config(config, logical, shards.sources)
        except ValueError:
            return [INVALID] * logical
        codes = [INVALID] * len(shards.keys)
        valid = [j for j, o in enumerate(shards.objects) if o is not None]
        if valid:
            sub = physical if len(valid) == len(codes) else _subset(physical, valid)
            for j, code in zip(valid, self._write_objects(shards, valid, sub, upsert), strict=True):
                codes[j] = code
        return first_errors(codes, shards.sources, logical)

    def _write_objects(
        self, shards: Shards, valid: list[int], config: ReplicateConfig, upsert: bool
    ) -> list[int]:
        client = self.client
        objects = [shards.objects[j] for j in valid]
        keys = [shards.keys[j] for j in valid]
        try:
            if len(valid) == 1:
                obj = objects[0]
                assert obj is not None
                write = client.upsert_parts if upsert else client.put_parts
                write(keys[0], *obj.parts(), config=config)
                return [OK]
            values = [_joined(o) for o in objects if o is not None]
            batch = client.upsert_batch if upsert else client.put_batch
            return list(batch(keys, values, config).codes)
        except MooncakeError as exc:
            return [exc.code] * len(valid)

    def write_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None,
        upsert: bool,
    ) -> list[int]:
        """Write registered ranges that each hold a whole tensor object (metadata, then
        payload), checked before writing; zero copy. Per key 0 or a negative code
        (INVALID_PARAMS for a range that is not registered or not a valid object)."""
        count = len(keys)
        if not count == len(buffer_ptrs) == len(sizes):
            return [INVALID] * count
        valid = [i for i in range(count) if self.object_at(buffer_ptrs[i], sizes[i]) is not None]
        codes = [INVALID] * count
        if not valid:
            return codes
        try:
            physical = physical_config(config, count, valid)
            write = self.client.batch_upsert_from if upsert else self.client.batch_put_from
            result = write(
                [keys[i] for i in valid],
                [buffer_ptrs[i] for i in valid],
                [sizes[i] for i in valid],
                physical,
            )
        except ValueError:
            return [INVALID] * count
        except MooncakeError as exc:
            return [exc.code] * count
        for i, code in zip(valid, result.codes, strict=True):
            codes[i] = code
        return codes

    def object_at(self, buffer_ptr: int, size: int) -> memoryview | None:
        """A view of the registered range ``[buffer_ptr, + size)`` when it holds a valid
        tensor object of exactly ``size`` bytes, else None."""
        view = self.registered(buffer_ptr, size)
        if view is None or parse_metadata(view, size) is None:
            return None
        return view

    def registered(self, buffer_ptr: int, size: int) -> memoryview | None:
        """A writable view of ``[buffer_ptr, + size)`` when it lies in registered memory."""
        # Any integer type (numpy's too) is an address, as for upstream's binding; other
        # types raise TypeError here.
        address, length = operator.index(buffer_ptr), operator.index(size)
        # The client's registry is the only judge of which addresses may be touched.
        return self.client._buffers.view(address, length)

    # ------------------------------------------------------------------------------------------
    # Reads

    def read(self, keys: Sequence[str]) -> list[Any]:
        """Per key its tensor, or None (a miss, any error, or not a tensor object). One lookup;
        each tensor views a buffer of its own (the leases ended when this returned)."""
        handles = self.read_raw(keys)
        return [None if h is None else decode(h) for h in handles]

    def read_raw(self, keys: Sequence[str]) -> list[Any]:
        """Per key a :class:`~mooncake_py.BufferHandle` of its bytes, or None."""
        if not keys:
            return []
        try:
            return list(self.client.batch_get_buffer_handle(keys).values)
        except MooncakeError:
            return [None] * len(keys)

    def read_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[Any]:
        """Read each object into its registered buffer; per key a tensor viewing that buffer
        (its payload, after the metadata), or None (a miss, a buffer too small or not
        registered, not a tensor object, lists of different lengths)."""
        count = len(keys)
        if not count or not count == len(buffer_ptrs) == len(sizes):
            return [None] * count
        try:
            result = self.client.batch_get_into(keys, buffer_ptrs, sizes)
        except MooncakeError:
            return [None] * count
        out: list[Any] = []
        for code, length, ptr in zip(result.codes, result.values, buffer_ptrs, strict=True):
            if code != OK or not length:
                out.append(None)
            else:
                out.append(decode(view_of_address(ptr, length), length))
        return out


def _subset(config: ReplicateConfig, indices: Sequence[int]) -> ReplicateConfig:
    """A physical config restricted to the objects at ``indices``."""
    tags, groups = config.kv_sessions, config.group_ids
    return dataclasses.replace(
        config,
        kv_sessions=None if tags is None else [tags[i] for i in indices],
        group_ids=None if groups is None else [groups[i] for i in indices],
    )


def _joined(obj: StoredObject) -> bytearray:
    """Metadata and payload in one buffer (a batch write takes one buffer per key)."""
    out = bytearray(obj.size)
    offset = 0
    for part in obj.parts():
        out[offset : offset + len(part)] = part
        offset += len(part)
    return out
