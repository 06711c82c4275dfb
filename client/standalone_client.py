"""``StandaloneClient``: the typed client of an engine attached to its host's standalone client
service (``MooncakeDistributedStore.setup_dummy``).

It has the :class:`~mooncake_py.Client` interface the drop-in store uses, and runs each call
in the service (:mod:`mooncake_py.client.standalone`), whose segment holds the objects. The
engine process holds no segment and no master connection: objects it wrote outlive it.

What runs in the service, with the in-process semantics and codes of each call:

- writes: ``put``, ``put_parts``, ``put_batch``, ``upsert``, ``upsert_parts``,
  ``upsert_batch`` (values sent inline), and the zero-copy ``put_from``, ``batch_put_from``,
  ``batch_put_from_multi_buffers``, ``upsert_from``, ``batch_upsert_from``;
- reads: ``get``, ``get_batch``, ``get_buffer``, ``batch_get_buffer``,
  ``get_buffer_handle``, ``batch_get_buffer_handle`` (values sent inline, one copy here), and
  the zero-copy ``get_into``, ``batch_get_into``, ``batch_get_into_multi_buffers`` and
  :meth:`StandaloneClient.get_into_ranges` (one lookup, byte ranges of many objects);
- queries: ``is_exist``, ``batch_is_exist``, ``probe_key``, ``batch_probe_key``,
  ``get_size``, ``remove``, ``batch_remove``, ``remove_by_regex``, ``remove_all``.

Zero-copy calls need memory from ``MooncakeHostMemAllocator`` or ``alloc_from_mem_pool``
registered with :meth:`register_buffer` (the service maps those pages; it cannot see other
memory). The client's registry (``_buffers``, an :class:`AttachedBuffers`) admits exactly
that memory, so the layers that read or lay out registered memory in this process (the
tensor calls' ``*_from`` / ``*_into`` forms) work on it unchanged. Anything else (KV-session
control, ranged sessions, replica descriptors, stats) raises
:class:`~mooncake_py.errors.InvalidParamsError` naming standalone mode, which the drop-in
store reports as INVALID_PARAMS, as upstream's dummy client refuses what it lacks.

A lost service raises :class:`~mooncake_py.errors.UnavailableError` (RPC_FAIL); the next call
reconnects and registers the engine's memory again.

Thread-safety: every method may be called from several threads at once (each call takes a
connection of its own from a small pool).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from mooncake_py.errors import MooncakeError, raise_for
from mooncake_py.types import ProbeLeaseMode, ReplicateConfig

from .api import Client
from .api_queries import invalid_params
from .buffer_handle import BufferHandle
from .buffers import RegisteredBuffers, bytes_view, parts_views
from .config import ClientConfig
from .core import ClientCore
from .data_plane import view_of_address
from .replica_desc import SegmentDirectory
from .results import BatchResult
from .standalone_attach import Attachment


def _addresses(values: Sequence[Any]) -> list[int]:
    """Ints from pointer-like values (numpy ints too); TypeError for anything else, as the
    upstream binding raises for an argument its ``uintptr_t`` cannot take."""
    return [operator.index(v) for v in values]


def _config(config: ReplicateConfig | None) -> ReplicateConfig | None:
    if config is not None and not isinstance(config, ReplicateConfig):
        raise TypeError(f"config must be a ReplicateConfig, not {type(config).__name__}")
    return config


def _index_or_none(value: Any) -> int | None:
    """An int for an integer of any kind (numpy's too), else None (which the service's
    ranged read refuses per key with INVALID_PARAMS, as the in-process read refuses a value
    that is not an integer)."""
    try:
        return operator.index(value)
    except TypeError:
        return None


def _nested_ints(value: Any, depth: int) -> Any:
    """``value`` as lists nested ``depth`` deep with :func:`_index_or_none` leaves; a level
    that is not iterable becomes None (refused by the service as in-process)."""
    if depth == 0:
        return _index_or_none(value)
    try:
        items = list(value)
    except TypeError:
        return None
    return [_nested_ints(v, depth - 1) for v in items]


class AttachedBuffers(RegisteredBuffers):
    """The registry of a :class:`StandaloneClient`: the memory its attachment shares with
    the service (whole allocations of ``MooncakeHostMemAllocator`` / ``alloc_from_mem_pool``
    with a registration in them, as the service maps whole allocations).

    Args:
        attachment: the link whose registrations this registry reflects; a freed
            allocation leaves it at once.

    Thread-safety: every method may be called from several threads at once.
    Complexity: a lookup O(log n) in live allocations.
    """

    def __init__(self, attachment: Attachment) -> None:
        super().__init__()
        self._attachment = attachment

    def register(self, buffer_ptr: int, size: int) -> bool:
        """Share the allocation holding ``[buffer_ptr, + size)`` with the service (see
        :meth:`Attachment.register`, whose errors it raises); True."""
        self._attachment.register(buffer_ptr, size)
        return True

    def unregister(self, buffer_ptr: int) -> bool:
        """Forget the registration starting at ``buffer_ptr``; False when there was none."""
        return self._attachment.unregister(buffer_ptr)

    def view(self, buffer_ptr: int, size: int) -> memoryview | None:
        """A writable view of ``size`` bytes at ``buffer_ptr``, or None unless the whole range
        lies inside one allocation shared with the service."""
        if not self._attachment.shares(buffer_ptr, size):
            return None
        return view_of_address(buffer_ptr, size)


class StandaloneClient(Client):
    """A :class:`~mooncake_py.Client` whose calls run in the host's standalone service.

    Args:
        attachment: the connected link to the service (closed by :meth:`close`).
    """

    def __init__(self, attachment: Attachment) -> None:  # joins nothing: the service has
        self.config = ClientConfig(global_segment_size=0)
        self._clock = time.monotonic
        self._buffers = AttachedBuffers(attachment)
        self._segments = SegmentDirectory()
        self._core = None
        self.attachment = attachment

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Detach: the service unmaps this process's memory; the objects stay. Idempotent."""
        self.attachment.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self.attachment.closed

    @property
    def master_reachable(self) -> bool:
        """Whether the service is reachable and its last heartbeat reached the master."""
        if self.attachment.closed:
            return False
        try:
            return bool(self.attachment.request({"op": "health"}))
        except MooncakeError:
            return False

    @property
    def hostname(self) -> str:
        """The name of the service's segment (``host:port``)."""
        if self.attachment.closed:
            raise invalid_params("the client is closed")
        return self.attachment.hostname

    def _joined(self) -> ClientCore:
        raise invalid_params("not available on a store attached with setup_dummy")

    def service_stats(self) -> dict[str, Any]:
        """The service's connection and mapped-memory counts (see ``StandaloneService.stats``)."""
        result: dict[str, Any] = self.attachment.request({"op": "stats"})
        return result

    # -- buffers -----------------------------------------------------------------------------

    def register_buffer(self, buffer_ptr: int, size: int) -> None:
        """Allow zero-copy calls on ``[buffer_ptr, buffer_ptr + size)``; the allocation
        holding it is shared with the service now.

        Raises:
            InvalidParamsError: the range is not inside one allocation of
                ``MooncakeHostMemAllocator`` / ``alloc_from_mem_pool`` (the service could not
                map it), or the client is closed.
            NoSpaceError: the service's ``--max_pool_size`` cap refused the allocation.
            UnavailableError: the service cannot be reached.
        """
        if self.attachment.closed:
            raise invalid_params("the client is closed")
        self._buffers.register(operator.index(buffer_ptr), operator.index(size))

    def unregister_buffer(self, buffer_ptr: int) -> None:
        """Forget a registered buffer.

        Raises:
            InvalidParamsError: no buffer starts at ``buffer_ptr``.
        """
        if not self._buffers.unregister(operator.index(buffer_ptr)):
            raise invalid_params(f"no registered buffer at {buffer_ptr:#x}")

    # -- writes ------------------------------------------------------------------------------

    def _batch(self, method: str, *args: Any) -> BatchResult[Any]:
        keys = args[0]
        answer = self.attachment.call(method, *args)
        return BatchResult(list(keys), list(answer["c"]), list(answer["v"]))

    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> None:
        """As :meth:`Client.put`, in the service."""
        raise_for(self.put_batch([key], [value], config).codes[0], key=key)

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> None:
        """As :meth:`Client.put_parts`, in the service."""
        self.attachment.call("put_parts", key, parts_views(parts), _config(config))

    def put_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> None:
        """As :meth:`Client.put_from`, from this process's registered pool memory."""
        raise_for(self.batch_put_from([key], [buffer_ptr], [size], config).codes[0], key=key)

    def put_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> BatchResult[None]:
        """As :meth:`Client.put_batch`, in the service."""
        views = [bytes_view(v) for v in values]
        return self._batch("put_batch", list(keys), views, _config(config))

    def batch_put_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> BatchResult[None]:
        """As :meth:`Client.batch_put_from`: the service copies from its mapping of the
        registered pool memory (a range outside it fails its key with INVALID_PARAMS)."""
        return self._batch(
            "batch_put_from",
            list(keys),
            _addresses(buffer_ptrs),
            _addresses(sizes),
            _config(config),
        )

    def batch_put_from_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        config: ReplicateConfig | None = None,
    ) -> BatchResult[None]:
        """As :meth:`Client.batch_put_from_multi_buffers`, from registered pool memory."""
        return self._batch(
            "batch_put_from_multi_buffers",
            list(keys),
            [_addresses(p) for p in all_buffer_ptrs],
            [_addresses(s) for s in all_sizes],
            _config(config),
        )

    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> None:
        """As :meth:`Client.upsert`, in the service."""
        raise_for(self.upsert_batch([key], [value], config).codes[0], key=key)

    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> None:
        """As :meth:`Client.upsert_parts`, in the service."""
        self.attachment.call("upsert_parts", key, parts_views(parts), _config(config))

    def upsert_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> None:
        """As :meth:`Client.upsert_from`, from registered pool memory."""
        raise_for(self.batch_upsert_from([key], [buffer_ptr], [size], config).codes[0], key=key)

    def upsert_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> BatchResult[None]:
        """As :meth:`Client.upsert_batch`, in the service."""
        views = [bytes_view(v) for v in values]
        return self._batch("upsert_batch", list(keys), views, _config(config))

    def batch_upsert_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> BatchResult[None]:
        """As :meth:`Client.batch_upsert_from`, from registered pool memory."""
        return self._batch(
            "batch_upsert_from",
            list(keys),
            _addresses(buffer_ptrs),
            _addresses(sizes),
            _config(config),
        )

    # -- reads -------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        """As :meth:`Client.get`, in the service."""
        return self.get_batch([key])[0].unwrap()

    def get_batch(self, keys: Sequence[str]) -> BatchResult[bytes]:
        """As :meth:`Client.get_batch`; the values come back over the socket."""
        result = self._batch("get_batch", list(keys))
        values = [None if v is None else bytes(v) for v in result.values]
        return BatchResult(result.keys, result.codes, values)

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """As :meth:`Client.get_into`, into registered pool memory."""
        return self.batch_get_into([key], [buffer_ptr], [size])[0].unwrap()

    def batch_get_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> BatchResult[int]:
        """As :meth:`Client.batch_get_into`: the service copies into its mapping of the
        registered pool memory (a range outside it fails its key with INVALID_PARAMS)."""
        return self._batch("batch_get_into", list(keys), _addresses(buffer_ptrs), _addresses(sizes))

    def batch_get_into_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> BatchResult[int]:
        """As :meth:`Client.batch_get_into_multi_buffers`, into registered pool memory."""
        return self._batch(
            "batch_get_into_multi_buffers",
            list(keys),
            [_addresses(p) for p in all_buffer_ptrs],
            [_addresses(s) for s in all_sizes],
            bool(prefer_alloc_in_same_node),
        )

    def get_into_ranges(
        self,
        buffer_ptrs: Sequence[int],
        all_keys: Sequence[Sequence[str]],
        all_dst_offsets: Sequence[Sequence[Sequence[int]]],
        all_src_offsets: Sequence[Sequence[Sequence[int]]],
        all_sizes: Sequence[Sequence[Sequence[int]]],
    ) -> list[list[list[int]]]:
        """As :meth:`~mooncake_py.client.ranged.RangedSessions.get_into_ranges`, in the
        service: one lookup there, the ranges copied straight into its mapping of this
        process's registered pool memory. A range whose destination is not inside one
        registered allocation answers INVALID_PARAMS (its key's other ranges are copied).

        Returns:
            ``result[b][i][j]``: the bytes copied, or a negative code (see the in-process
            call).

        Raises:
            InvalidParamsError: the lists' shapes differ (as in-process), a bad key.
            UnavailableError: the service cannot be reached.
            TypeError: a list level is not a list, as in-process.
        """
        keys = [list(k) for k in all_keys]
        answer = self.attachment.call(
            "get_into_ranges",
            _nested_ints(buffer_ptrs, 1),
            keys,
            _nested_ints(all_dst_offsets, 3),
            _nested_ints(all_src_offsets, 3),
            _nested_ints(all_sizes, 3),
        )
        return [[[int(v) for v in ranges] for ranges in per_key] for per_key in answer]

    def get_buffer(self, key: str) -> pa.Buffer:
        """As :meth:`Client.get_buffer`."""
        return self.batch_get_buffer([key])[0].unwrap()

    def batch_get_buffer(self, keys: Sequence[str]) -> BatchResult[pa.Buffer]:
        """As :meth:`Client.batch_get_buffer`."""
        result = self.get_batch(keys)
        values = [None if v is None else pa.py_buffer(v) for v in result.values]
        return BatchResult(result.keys, result.codes, values)

    def get_buffer_handle(self, key: str) -> BufferHandle:
        """As :meth:`Client.get_buffer_handle`."""
        return self.batch_get_buffer_handle([key])[0].unwrap()

    def batch_get_buffer_handle(self, keys: Sequence[str]) -> BatchResult[BufferHandle]:
        """As :meth:`Client.batch_get_buffer_handle` (each handle a copy of its own)."""
        result = self._batch("get_batch", list(keys))
        values: list[BufferHandle | None] = []
        for value in result.values:
            if value is None:
                values.append(None)
                continue
            handle = BufferHandle(len(value))
            memoryview(handle)[:] = value
            values.append(handle)
        return BatchResult(result.keys, result.codes, values)

    # -- queries -----------------------------------------------------------------------------

    def batch_is_exist(self, keys: Sequence[str]) -> BatchResult[bool]:
        """As :meth:`Client.batch_is_exist` (the existence holds belong to the service)."""
        return self._batch("batch_is_exist", list(keys))

    def probe_key(self, key: str) -> bool:
        """As :meth:`Client.probe_key`."""
        return bool(self.attachment.call("probe_key", key))

    def batch_probe_key(
        self,
        keys: Sequence[str],
        lease_mode: ProbeLeaseMode = ProbeLeaseMode.NONE,
        candidate_size: int = 1,
    ) -> BatchResult[bool]:
        """As :meth:`Client.batch_probe_key`."""
        try:
            mode = int(ProbeLeaseMode(lease_mode))
        except ValueError:
            raise invalid_params(f"unknown probe lease mode {lease_mode!r}") from None
        return self._batch("batch_probe_key", list(keys), mode, candidate_size)

    def get_size(self, key: str) -> int:
        """As :meth:`Client.get_size`."""
        return int(self.attachment.call("get_size", key))

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> BatchResult[None]:
        """As :meth:`Client.batch_remove`."""
        return self._batch("batch_remove", list(keys), bool(force))

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """As :meth:`Client.remove_by_regex`."""
        return int(self.attachment.call("remove_by_regex", regex_pattern, bool(force)))

    def remove_all(self, force: bool = False) -> int:
        """As :meth:`Client.remove_all`."""
        return int(self.attachment.call("remove_all", bool(force)))
