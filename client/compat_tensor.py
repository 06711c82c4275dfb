"""Upstream's tensor calls of ``MooncakeDistributedStore`` (``put_tensor``, ``get_tensor``, their
batch, ``pub``, ``upsert``, zero-copy and tensor-parallel forms), with upstream's names,
argument order, defaults and returns.

:class:`TensorCalls` is a base class of :class:`~mooncake_py.MooncakeDistributedStore`; it
uses only the store's ``client`` (the typed client, None before setup). The objects are
upstream 0.3.13's tensor objects (:mod:`mooncake_py.client.tensors`), so either side reads
what the other wrote. Conventions, as upstream:

- writes return 0 or a negative ``ErrorCode`` (the batch forms one per key); a value that is
  not a tensor, has a dtype without a code (complex, ...) or more than 8 dimensions gives
  INVALID_PARAMS (-600), as do lists of different lengths (for every key) and calls before
  ``setup``;
- reads return a ``torch.Tensor`` or None (the batch forms one per key), never raise for a
  miss; ``get_tensor`` returns a tensor over memory of its own (the read lease ended when the
  call returned); ``get_tensor_into`` one viewing the caller's registered buffer, whose first
  304 bytes then hold the metadata;
- ``put`` forms keep an existing key's bytes (first writer wins), ``upsert`` forms replace;
  ``pub`` forms take a ``ReplicateConfig`` (``preferred_segments``, when given, must name one
  segment per replica, else -600);
- ``*_with_tp`` writes cut the tensor into ``tp_size`` equal chunks along ``split_dim`` and
  store chunk ``r`` under ``<key>_tp_<r>`` (``tp_rank`` is accepted and unused, as upstream);
  reads with ``tp_size > 1`` read ``<key>_tp_<tp_rank>``.

Tensors on a device are copied to the host for a write; non-contiguous ones are made
contiguous (the stored bytes are always C order). torch is imported only by these calls:
``mooncake_py`` itself imports without it.

Thread-safety: every method may be called from several threads at once.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from mooncake_py.errors import ErrorCode
from mooncake_py.types import ReplicateConfig

from .compat_tensor_parallel import ParallelTensorCalls
from .mixin_bases import StoreBase
from .tensor_io import INVALID, Shards, placement_ok, tp_key, tp_shards
from .tensors import decode, encode, is_tensor

NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)


class TensorCalls(ParallelTensorCalls, StoreBase):
    """Upstream's tensor calls; see the module docstring. The ``*_with_parallelism`` calls
    come from :class:`~mooncake_py.client.compat_tensor_parallel.ParallelTensorCalls`."""

    def _put_tensors(
        self,
        keys: Sequence[str],
        tensors: Sequence[Any],
        config: ReplicateConfig | None,
        upsert: bool,
        pub: bool = False,
    ) -> list[int]:
        io = self._tensor_io()
        if io is None or len(keys) != len(tensors):
            return [INVALID] * len(keys)
        if not keys:
            return []
        if pub and not placement_ok(config):
            return [INVALID] * len(keys)
        shards = Shards(list(keys), [encode(t) for t in tensors], list(range(len(keys))))
        return io.write(shards, len(keys), config, upsert)

    def _put_tp(
        self,
        keys: Sequence[str],
        tensors: Sequence[Any],
        config: ReplicateConfig | None,
        tp_size: int,
        split_dim: int,
        upsert: bool,
        pub: bool = False,
    ) -> list[int]:
        _check_ints(tp_size, split_dim)
        if tp_size <= 1:
            return self._put_tensors(keys, tensors, config, upsert, pub)
        io = self._tensor_io()
        if io is None or len(keys) != len(tensors):
            return [INVALID] * len(keys)
        if not keys:
            return []
        if pub and not placement_ok(config):
            return [INVALID] * len(keys)
        names: list[str] = []
        objects: list[Any] = []
        sources: list[int] = []
        for i, (key, tensor) in enumerate(zip(keys, tensors, strict=True)):
            parts = tp_shards(tensor, tp_size, split_dim)
            for rank in range(tp_size):
                names.append(tp_key(key, rank))
                objects.append(None if parts is None else parts[rank])
                sources.append(i)
        return io.write(Shards(names, objects, sources), len(keys), config, upsert)

    # ------------------------------------------------------------------------------------------
    # Whole tensors

    def put_tensor(self, key: str, tensor: Any) -> int:
        """Store ``tensor`` under ``key`` (default config); 0 or a negative code."""
        return self._put_tensors([key], [tensor], None, False)[0]

    def batch_put_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> list[int]:
        """Store ``tensors_list[i]`` under ``keys[i]``; per key 0 or a negative code."""
        return self._put_tensors(keys, tensors_list, None, False)

    def pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        """:meth:`put_tensor` with a ``ReplicateConfig`` (replicas, placement, sessions)."""
        return self._put_tensors([key], [tensor], config, False, pub=True)[0]

    def batch_pub_tensor(
        self,
        keys: Sequence[str],
        tensors_list: Sequence[Any],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """:meth:`batch_put_tensor` with a ``ReplicateConfig`` (per-key lists, such as
        ``kv_sessions``, have one entry per key)."""
        return self._put_tensors(keys, tensors_list, config, False, pub=True)

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        """Create or replace ``key`` with ``tensor``; 0 or a negative code."""
        return self._put_tensors([key], [tensor], None, True)[0]

    def batch_upsert_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> list[int]:
        """Create or replace each key; per key 0 or a negative code."""
        return self._put_tensors(keys, tensors_list, None, True)

    def upsert_pub_tensor(
        self, key: str, tensor: Any, config: ReplicateConfig | None = None
    ) -> int:
        """:meth:`upsert_tensor` with a ``ReplicateConfig``."""
        return self._put_tensors([key], [tensor], config, True, pub=True)[0]

    def batch_upsert_pub_tensor(
        self,
        keys: Sequence[str],
        tensors_list: Sequence[Any],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """:meth:`batch_upsert_tensor` with a ``ReplicateConfig``."""
        return self._put_tensors(keys, tensors_list, config, True, pub=True)

    def get_tensor(self, key: str) -> Any:
        """The tensor under ``key``, or None (a miss, any error, or not a tensor object)."""
        return self.batch_get_tensor([key])[0]

    def batch_get_tensor(self, keys: Sequence[str]) -> list[Any]:
        """Per key its tensor or None, with one lookup."""
        io = self._tensor_io()
        return [None] * len(keys) if io is None else io.read(keys)

    # ------------------------------------------------------------------------------------------
    # Zero copy: registered buffers holding [metadata][payload]

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Store the tensor object held by the registered range ``[buffer_ptr, + size)``
        (metadata then payload, as :meth:`get_tensor_into` leaves it); -600 when it is not
        registered or not exactly one valid object."""
        return self.batch_put_tensor_from([key], [buffer_ptr], [size])[0]

    def batch_put_tensor_from(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        """:meth:`put_tensor_from` for each key; per key 0 or a negative code."""
        io = self._tensor_io()
        if io is None:
            return [INVALID] * len(keys)
        return io.write_from(keys, buffer_ptrs, sizes, None, False)

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Create or replace ``key`` from a registered tensor object (see
        :meth:`put_tensor_from`)."""
        return self.batch_upsert_tensor_from([key], [buffer_ptr], [size])[0]

    def batch_upsert_tensor_from(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        """:meth:`upsert_tensor_from` for each key; per key 0 or a negative code."""
        io = self._tensor_io()
        if io is None:
            return [INVALID] * len(keys)
        return io.write_from(keys, buffer_ptrs, sizes, None, True)

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        """Read ``key``'s object into the registered buffer and return a tensor viewing its
        payload there (at ``buffer_ptr + 304``), or None (a miss, a buffer too small or not
        registered, not a tensor object). The tensor shares the caller's memory: valid while
        that memory is, and changed by later reads into it."""
        return self.batch_get_tensor_into([key], [buffer_ptr], [size])[0]

    def batch_get_tensor_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[Any]:
        """:meth:`get_tensor_into` for each key, with one lookup; per key a tensor or None,
        or -600 for every key when the three lists differ in length (as upstream)."""
        if len(buffer_ptrs) != len(keys) or len(sizes) != len(keys):
            return [INVALID] * len(keys)
        io = self._tensor_io()
        return [None] * len(keys) if io is None else io.read_into(keys, buffer_ptrs, sizes)

    # ------------------------------------------------------------------------------------------
    # Tensor parallelism: shards under <key>_tp_<rank>

    def put_tensor_with_tp(
        self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> int:
        """Cut ``tensor`` into ``tp_size`` equal chunks along ``split_dim`` and store chunk
        ``r`` under ``<key>_tp_<r>`` (every rank's, whatever ``tp_rank``); with ``tp_size``
        1 it is :meth:`put_tensor`. 0, or the first error; -600 when the dimension does not
        divide evenly."""
        del tp_rank  # every shard is written, as upstream
        return self._put_tp([key], [tensor], None, tp_size, split_dim, False)[0]

    def batch_put_tensor_with_tp(
        self,
        base_keys: Sequence[str],
        tensors_list: Sequence[Any],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """:meth:`put_tensor_with_tp` for each key, in one batch; per key 0 or the first
        error of its shards."""
        del tp_rank
        return self._put_tp(base_keys, tensors_list, None, tp_size, split_dim, False)

    def pub_tensor_with_tp(
        self,
        key: str,
        tensor: Any,
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        """:meth:`put_tensor_with_tp` with a ``ReplicateConfig``; its per-key entries
        (``kv_sessions``, ``session_ids``, ``group_ids``: one for the key) apply to every
        shard."""
        del tp_rank
        return self._put_tp([key], [tensor], config, tp_size, split_dim, False, pub=True)[0]

    def batch_pub_tensor_with_tp(
        self,
        base_keys: Sequence[str],
        tensors_list: Sequence[Any],
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """:meth:`batch_put_tensor_with_tp` with a ``ReplicateConfig`` (per-key entries, one per
        base key, apply to each of its shards)."""
        del tp_rank
        return self._put_tp(base_keys, tensors_list, config, tp_size, split_dim, False, pub=True)

    def upsert_tensor_with_tp(
        self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> int:
        """:meth:`put_tensor_with_tp` that replaces what each shard key holds (an upsert per
        shard); 0, or the first error."""
        del tp_rank
        return self._put_tp([key], [tensor], None, tp_size, split_dim, True)[0]

    def batch_upsert_tensor_with_tp(
        self,
        base_keys: Sequence[str],
        tensors_list: Sequence[Any],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """:meth:`upsert_tensor_with_tp` for each key, in one batch."""
        del tp_rank
        return self._put_tp(base_keys, tensors_list, None, tp_size, split_dim, True)

    def upsert_pub_tensor_with_tp(
        self,
        key: str,
        tensor: Any,
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        """:meth:`upsert_tensor_with_tp` with a ``ReplicateConfig`` (per-key entries apply to
        every shard)."""
        del tp_rank
        return self._put_tp([key], [tensor], config, tp_size, split_dim, True, pub=True)[0]

    def batch_upsert_pub_tensor_with_tp(
        self,
        base_keys: Sequence[str],
        tensors_list: Sequence[Any],
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """:meth:`batch_upsert_tensor_with_tp` with a ``ReplicateConfig``."""
        del tp_rank
        return self._put_tp(base_keys, tensors_list, config, tp_size, split_dim, True, pub=True)

    def put_tensor_with_tp_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        """:meth:`put_tensor_with_tp` of the full tensor object held by a registered range
        (see :meth:`put_tensor_from`); -600 when the range is not a valid object."""
        return self.batch_put_tensor_with_tp_from(
            [key], [buffer_ptr], [size], tp_rank, tp_size, split_dim
        )[0]

    def batch_put_tensor_with_tp_from(
        self,
        base_keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """:meth:`put_tensor_with_tp_from` for each key; per key 0 or a negative code."""
        del tp_rank
        _check_ints(tp_size, split_dim)
        io = self._tensor_io()
        if io is None or not len(base_keys) == len(buffer_ptrs) == len(sizes):
            return [INVALID] * len(base_keys)
        if tp_size <= 1:
            return io.write_from(base_keys, buffer_ptrs, sizes, None, False)
        views = [io.object_at(p, s) for p, s in zip(buffer_ptrs, sizes, strict=True)]
        # The tensors view the registered memory; the shards are copied out of it when cut.
        tensors = [None if v is None else decode(v) for v in views]
        return self._put_tp(base_keys, tensors, None, tp_size, split_dim, False)

    def get_tensor_with_tp(
        self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> Any:
        """Shard ``tp_rank`` (``<key>_tp_<tp_rank>``), or the whole tensor under ``key`` when
        ``tp_size`` is 1; None on a miss. ``split_dim`` is accepted, as upstream (the shard
        is read as stored)."""
        del split_dim
        _check_ints(tp_rank, tp_size)
        return self.get_tensor(key if tp_size <= 1 else tp_key(key, tp_rank))

    def batch_get_tensor_with_tp(
        self, base_keys: Sequence[str], tp_rank: int = 0, tp_size: int = 1
    ) -> list[Any]:
        """:meth:`get_tensor_with_tp` for each key, with one lookup."""
        _check_ints(tp_rank, tp_size)
        if tp_size <= 1:
            return self.batch_get_tensor(base_keys)
        return self.batch_get_tensor([tp_key(k, tp_rank) for k in base_keys])

    def get_tensor_with_tp_into(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> Any:
        """:meth:`get_tensor_with_tp` into a registered buffer (see :meth:`get_tensor_into`)."""
        del split_dim
        return self.batch_get_tensor_with_tp_into([key], [buffer_ptr], [size], tp_rank, tp_size)[0]

    def batch_get_tensor_with_tp_into(
        self,
        base_keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> list[Any]:
        """:meth:`get_tensor_with_tp_into` for each key, with one lookup."""
        _check_ints(tp_rank, tp_size)
        keys = list(base_keys) if tp_size <= 1 else [tp_key(k, tp_rank) for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    # ------------------------------------------------------------------------------------------
    # Device tensors

    def get_tensor_into_cuda(self, key: str, tensor: Any) -> int:
        """Copy the payload of ``key``'s tensor into ``tensor`` (contiguous, same dtype and
        element count; a CUDA tensor, or a host one as upstream also accepts, or an object
        standing for one); the bytes copied, or a negative code: OBJECT_NOT_FOUND (-704),
        INVALID_PARAMS (-600) for a mismatch or something that is not a tensor. The payload
        is read first: a write after the read does not reach ``tensor``."""
        return self.batch_get_tensor_into_cuda([key], [tensor])[0]

    def batch_get_tensor_into_cuda(
        self, keys: Sequence[str], tensors_list: Sequence[Any]
    ) -> list[int]:
        """:meth:`get_tensor_into_cuda` for each key, with one lookup."""
        if len(keys) != len(tensors_list):
            return [INVALID] * len(keys)
        sources = self.batch_get_tensor(keys)
        out = []
        for source, target in zip(sources, tensors_list, strict=True):
            if source is None:
                out.append(NOT_FOUND)
            elif not (
                _tensor_like(target)
                and target.is_contiguous()
                and target.dtype == source.dtype
                and target.numel() == source.numel()
            ):
                out.append(INVALID)
            else:
                # The payload was read (and its lease ended) before the destination is looked
                # at: what lands in it is the object as it was when read.
                target.view(-1).copy_(source.reshape(-1))  # one copy (host -> device on CUDA)
                out.append(source.numel() * source.element_size())
        return out


def _tensor_like(value: Any) -> bool:
    """A torch tensor, or an object standing for one as upstream's binding accepts (it asks
    for ``is_contiguous``, ``dtype``, ``numel`` and ``view``, nothing else)."""
    if is_tensor(value):
        return True
    return all(
        callable(getattr(value, name, None)) for name in ("is_contiguous", "numel", "view")
    ) and hasattr(value, "dtype")


def _check_ints(*values: Any) -> None:
    """Upstream's binding takes only ints here; anything else is a TypeError."""
    for value in values:
        operator.index(value)  # TypeError for anything that is not an integer


# Every tensor call of the store (what the asyncio twin offers as coroutines).
TENSOR_CALLS = tuple(
    sorted(
        name
        for name in dir(TensorCalls)
        if "tensor" in name and not name.startswith("_") and callable(getattr(TensorCalls, name))
    )
)

__all__ = ["TENSOR_CALLS", "TensorCalls"]
