"""``Client``: the typed store API. Single-key calls return values and raise; batches return
per-key results.

Errors are exceptions rooted at :class:`~mooncake_py.MooncakeError`, one class per family of
codes (:class:`~mooncake_py.errors.NotFoundError`, ``NoSpaceError``, ``LeaseExpiredError``,
``InvalidParamsError``, ``UnavailableError``, ...), each carrying ``code`` and, where there is
one, ``key``. A batch call returns a :class:`~mooncake_py.BatchResult` (one outcome per key,
in order) and raises only when the call as a whole failed: the master unreachable, a malformed
request (keys and values of different lengths, a bad key), a closed client.

Write rules are upstream Mooncake's: a ``put`` of an existing key succeeds and keeps the old
bytes (first writer wins); ``upsert`` replaces. A read holds a lease on what it reads for as
long as its copy takes, and ends it right after (see :mod:`mooncake_py.client.core`): while
it is held the bytes stay put (a remove, eviction or upsert meanwhile retires the memory
instead of reusing it). A copy that outlived the lease TTL is trusted only when the master
vouches that nothing touched the bytes; otherwise it raises ``LeaseExpiredError`` rather than
return bytes that may have been overwritten.

Existence checks: ``is_exist`` / ``batch_is_exist`` keep upstream's contract (a key found now
can still be read next): each found key gets an *existence hold* for this client, which its
next read of the key takes over. ``probe_key`` / ``batch_probe_key`` hold nothing.

Zero-copy calls (``*_from``, ``*_into``, and the ``*_multi_buffers`` batches, whose values are
gathered from or scattered over several buffers per key) take raw addresses, which must lie
inside a buffer registered with :meth:`Client.register_buffer`.

Thread-safety: every method may be called from several threads at once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from mooncake_py.errors import (
    ErrorCode,
    InternalError,
    raise_for,
)
from mooncake_py.types import (
    ReplicaListResult,
    ReplicateConfig,
)

from .api_queries import QueryCalls, check_keys, invalid_params
from .api_sessions import KvSessionCalls
from .api_tasks import TaskCalls
from .buffer_handle import BufferHandle
from .buffers import RegisteredBuffers, bytes_view, parts_views
from .config import ClientConfig
from .core import ClientCore, config_for_keys
from .replica_desc import SegmentDirectory
from .results import BatchResult, SegmentStatus

if TYPE_CHECKING:
    from typing_extensions import Buffer

OK = 0
INVALID = int(ErrorCode.INVALID_PARAMS)
LEASE_EXPIRED = int(ErrorCode.LEASE_EXPIRED)

B = TypeVar("B", bound="Buffer")  # what a read may allocate: any writable buffer type


class Client(QueryCalls, KvSessionCalls, TaskCalls):
    """A joined client of a mooncake-py store.

    The queries and removals (``is_exist``, ``probe_key``, ``get_size``,
    ``get_replica_desc``, ``remove``, ...) come from
    :class:`~mooncake_py.client.api_queries.QueryCalls`, the KV-session calls
    (``attach_kv_session``, ..., ``release_kv_cache``) from
    :class:`~mooncake_py.client.api_sessions.KvSessionCalls`.

    Args:
        config: how to join; ``ClientConfig.from_env()`` when omitted.
        clock: monotonic seconds, used to tell whether a copy outlived its read lease (tests
            inject one; the default is :func:`time.monotonic`).

    Raises:
        UnavailableError: the master cannot be reached.
        AuthenticationError: the master requires a token and ``config.auth_token`` is not one.
        InvalidParamsError: the master refused the segment.
        InternalError: the shared-memory segment could not be created.
    """

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config if config is not None else ClientConfig.from_env()
        self._clock = clock
        self._buffers = RegisteredBuffers()
        self._segments = SegmentDirectory()
        try:
            self._core: ClientCore | None = ClientCore(self.config, clock)
        except OSError as exc:
            raise InternalError(ErrorCode.INTERNAL_ERROR, f"cannot join the store: {exc}") from exc

    @classmethod
    def connect(cls, **settings: Any) -> Client:
        """Join with setup keys (``master_server_addr``, ``global_segment_size``, ...), the
        same keys as upstream's ``setup`` dict; unknown keys are ignored."""
        return cls(ClientConfig.from_mapping(settings))

    # ------------------------------------------------------------------------------------------
    # Lifecycle

    def close(self) -> None:
        """Leave the store: unmount the segment (its objects are dropped) and stop. Idempotent."""
        core, self._core = self._core, None
        if core is not None:
            core.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._core is None

    @property
    def master_reachable(self) -> bool:
        """Whether the last heartbeat reached the master (False once closed)."""
        core = self._core
        return core is not None and core.heartbeat.master_reachable

    @property
    def hostname(self) -> str:
        """The name of this client's segment (``host:port``)."""
        return self._joined().hostname

    @property
    def disk_reads(self) -> int:
        """Objects this client has read from a disk tier's replica."""
        return self._joined().data.disk_reads

    def _joined(self) -> ClientCore:
        core = self._core
        if core is None:
            raise invalid_params("the client is closed")
        return core

    # ------------------------------------------------------------------------------------------
    # Buffer registration

    def register_buffer(self, buffer_ptr: int, size: int) -> None:
        """Allow zero-copy calls on ``[buffer_ptr, buffer_ptr + size)``.

        Raises:
            InvalidParamsError: a non-positive address or size, or a closed client.
        """
        self._joined()
        if not self._buffers.register(buffer_ptr, size):
            raise invalid_params(f"cannot register {size} bytes at {buffer_ptr:#x}")

    def unregister_buffer(self, buffer_ptr: int) -> None:
        """Forget a registered buffer.

        Raises:
            InvalidParamsError: no buffer starts at ``buffer_ptr``.
        """
        if not self._buffers.unregister(buffer_ptr):
            raise invalid_params(f"no registered buffer at {buffer_ptr:#x}")

    # ------------------------------------------------------------------------------------------
    # Writes

    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> None:
        """Store ``value`` (any C-contiguous buffer) under ``key``; an existing key keeps its
        bytes and this succeeds (first writer wins).

        Raises:
            NoSpaceError: nothing can be evicted to make room.
            InvalidParamsError: a bad key, an empty value, or a bad config.
            TransferError, UnavailableError: the bytes or the master could not be reached.
        """
        raise_for(self._write([key], [[bytes_view(value)]], config, False)[0], key=key)

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> None:
        """Store the concatenation of ``parts`` without joining them first; see :meth:`put`.

        Raises:
            InvalidParamsError: a part is not a one-dimensional buffer; as :meth:`put`.
        """
        raise_for(self._write([key], [parts_views(parts)], config, False)[0], key=key)

    def put_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> None:
        """Store ``size`` bytes of registered memory at ``buffer_ptr``; see :meth:`put`."""
        raise_for(self._write_from([key], [buffer_ptr], [size], config, False).codes[0], key=key)

    def put_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> BatchResult[None]:
        """Store each value under its key; per-key outcomes.

        Raises:
            InvalidParamsError: keys and values differ in length, or a key is bad.
        """
        return self._write_values(keys, values, config, False)

    def batch_put_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> BatchResult[None]:
        """Store ``sizes[i]`` bytes of registered memory at ``buffer_ptrs[i]`` under
        ``keys[i]``; an unregistered range fails its key with INVALID_PARAMS."""
        return self._write_from(keys, buffer_ptrs, sizes, config, False)

    def batch_put_from_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        config: ReplicateConfig | None = None,
    ) -> BatchResult[None]:
        """Store under ``keys[i]`` the concatenation of the registered memory ranges
        ``(all_buffer_ptrs[i][j], all_sizes[i][j])``, in order (one object gathered from
        several buffers, e.g. one block per layer), without joining them first.

        Per key: ok, or INVALID_PARAMS when its two lists differ in length, a size is negative,
        a part is not inside a registered buffer, or it has no byte at all (parts of size 0
        are skipped); otherwise as :meth:`batch_put_from`.

        Raises:
            InvalidParamsError: ``keys``, ``all_buffer_ptrs`` and ``all_sizes`` differ in
                length, or a key is bad.
        """
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes):
            raise invalid_params("keys, all_buffer_ptrs and all_sizes differ in length")
        parts = [
            self._buffers.views(ptrs, sizes)
            for ptrs, sizes in zip(all_buffer_ptrs, all_sizes, strict=True)
        ]
        return self._write_registered(keys, parts, config, False)

    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> None:
        """Create or replace ``key``.

        Readers copying the old value meanwhile finish on the old bytes; later reads get the
        new ones.

        Raises:
            InvalidParamsError: INVALID_WRITE when a concurrent write of the key preempted
                this one; as :meth:`put`.
        """
        raise_for(self._write([key], [[bytes_view(value)]], config, True)[0], key=key)

    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> None:
        """Create or replace ``key`` with the concatenation of ``parts``."""
        raise_for(self._write([key], [parts_views(parts)], config, True)[0], key=key)

    def upsert_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> None:
        """Create or replace ``key`` from registered memory."""
        raise_for(self._write_from([key], [buffer_ptr], [size], config, True).codes[0], key=key)

    def upsert_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> BatchResult[None]:
        """Create or replace each key; per-key outcomes."""
        return self._write_values(keys, values, config, True)

    def batch_upsert_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> BatchResult[None]:
        """Create or replace each key from registered memory; per-key outcomes."""
        return self._write_from(keys, buffer_ptrs, sizes, config, True)

    def _write_values(
        self,
        keys: Sequence[str],
        values: Sequence[Any],
        config: ReplicateConfig | None,
        upsert: bool,
    ) -> BatchResult[None]:
        if len(keys) != len(values):
            raise invalid_params(f"{len(keys)} keys but {len(values)} values")
        views = [[bytes_view(v)] for v in values]
        return BatchResult.of_codes(keys, self._write(keys, views, config, upsert))

    def _write_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None,
        upsert: bool,
    ) -> BatchResult[None]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            raise invalid_params("keys, buffer_ptrs and sizes differ in length")
        views = self._buffers.view_each(buffer_ptrs, sizes)
        return self._write_registered(
            keys, [None if v is None else [v] for v in views], config, upsert
        )

    def _write_registered(
        self,
        keys: Sequence[str],
        parts: Sequence[list[memoryview] | None],
        config: ReplicateConfig | None,
        upsert: bool,
    ) -> BatchResult[None]:
        """Write ``parts[i]`` (concatenated) under ``keys[i]``; a None entry (memory that is not
        registered, or bad sizes) fails its key with INVALID_PARAMS."""
        given = config or ReplicateConfig()
        config = _resolved(given, len(keys))
        if config is None:
            if given.kv_sessions or given.session_ids:
                raise invalid_params("keys and kv_sessions (or session_ids) differ in length")
            config = given  # empty lists: each key fails with INVALID_PARAMS in the write
        valid = [i for i, views in enumerate(parts) if views is not None]
        codes = [INVALID] * len(keys)
        values = [views for views in parts if views is not None]
        subset = config if len(valid) == len(keys) else config_for_keys(config, valid)
        written = self._write([keys[i] for i in valid], values, subset, upsert)
        for i, code in zip(valid, written, strict=True):
            codes[i] = code
        return BatchResult.of_codes(keys, codes)

    def _write(
        self,
        keys: Sequence[str],
        values: list[list[memoryview]],
        config: ReplicateConfig | None,
        upsert: bool,
    ) -> list[int]:
        core = self._joined()
        check_keys(keys)
        resolved = _resolved(config or ReplicateConfig(), len(keys))
        if resolved is None or resolved.nof_replica_num or resolved.dfs_replica_num:
            # No NVMe-oF or DFS tier here: refuse rather than store fewer copies than asked.
            return [INVALID] * len(keys)
        return core.put_many(keys, values, resolved, upsert)

    # ------------------------------------------------------------------------------------------
    # Reads

    def get(self, key: str) -> bytes:
        """The value of ``key``.

        Raises:
            NotFoundError: no such key. BusyError: its first write is still in flight.
            LeaseExpiredError: the copy outlived its read lease and the bytes may have
                changed under it. TransferError, ...
        """
        result = self.get_batch([key])
        return result[0].unwrap()

    def get_batch(self, keys: Sequence[str]) -> BatchResult[bytes]:
        """Values of ``keys`` (one lookup; same-host replicas copied straight out of the
        mapped segment, others over TCP; the read leases end right after); per-key outcomes."""
        core = self._joined()
        check_keys(keys)
        started = self._clock()
        located = core.locate(keys)
        codes = [loc.code for loc in located]
        values: list[bytes | None] = [None] * len(keys)
        try:
            remote: list[int] = []
            for i, loc in enumerate(located):
                if loc.code != OK:
                    continue
                mapped = next(filter(None, map(core.data.memory_of, loc.replicas)), None)
                if mapped is None:
                    remote.append(i)
                else:
                    values[i] = bytes(mapped[: loc.size])  # one copy, straight out of the segment
            for i, copied in _read_copies(core, located, remote, codes):
                values[i] = bytes(copied)
        except BaseException:
            core.drop_reads(located)
            raise
        _end_reads(core, located, started, codes, values)
        return BatchResult(keys, codes, values)

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Read ``key`` into registered memory; returns the bytes read.

        Raises:
            InvalidParamsError: the buffer is not registered or smaller than the value; as
                :meth:`get`.
        """
        return self.batch_get_into([key], [buffer_ptr], [size])[0].unwrap()

    def batch_get_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> BatchResult[int]:
        """Read each key into its buffer; per key the bytes read. A buffer smaller than its
        object fails the key with INVALID_PARAMS. The read leases end right after the copies
        (also those of keys that failed)."""
        self._joined()
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            raise invalid_params("keys, buffer_ptrs and sizes differ in length")
        views = self._buffers.view_each(buffer_ptrs, sizes)
        return self._read_registered(keys, [None if v is None else [v] for v in views])

    def batch_get_into_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> BatchResult[int]:
        """Read each key's object scattered over the registered memory ranges
        ``(all_buffer_ptrs[i][j], all_sizes[i][j])``, in order; per key the bytes read (the
        object's size).

        The parts are filled in order until the object ends: parts adding up to more than the
        object leave the rest untouched. A key whose parts add up to less than its object, or
        whose two lists differ in length, with a negative size, a part outside registered
        memory, or no byte at all, fails with INVALID_PARAMS (parts of size 0 are skipped).
        ``prefer_alloc_in_same_node`` is accepted for upstream's sake: replicas on this host
        are always read first. The read leases end right after the copies, as
        :meth:`batch_get_into`.

        Raises:
            InvalidParamsError: ``keys``, ``all_buffer_ptrs`` and ``all_sizes`` differ in
                length, or a key is bad.
        """
        del prefer_alloc_in_same_node  # same-host replicas are always preferred
        self._joined()
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes):
            raise invalid_params("keys, all_buffer_ptrs and all_sizes differ in length")
        parts = [
            self._buffers.views(ptrs, sizes)
            for ptrs, sizes in zip(all_buffer_ptrs, all_sizes, strict=True)
        ]
        return self._read_registered(keys, parts)

    def _read_registered(
        self, keys: Sequence[str], parts: Sequence[list[memoryview] | None]
    ) -> BatchResult[int]:
        """Read ``keys[i]`` scattered over ``parts[i]``; a None entry, or parts smaller than
        the object, fails the key with INVALID_PARAMS. Ends every read lease."""
        core = self._joined()
        check_keys(keys)
        started = self._clock()
        located = core.locate(keys)
        codes = [loc.code for loc in located]
        values: list[int | None] = [None] * len(keys)
        try:
            readable: list[int] = []
            destinations: list[list[memoryview]] = []
            for i, loc in enumerate(located):
                if loc.code != OK:
                    continue
                views = parts[i]
                target = None if views is None else _prefix(views, loc.size)
                if target is None:
                    codes[i] = INVALID
                    continue
                readable.append(i)
                destinations.append(target)
            read = core.read_located_parts([located[i] for i in readable], destinations)
            for i, code in zip(readable, read, strict=True):
                if code == OK:
                    values[i] = located[i].size
                else:
                    codes[i] = code
        except BaseException:
            core.drop_reads(located)
            raise
        _end_reads(core, located, started, codes, values)
        return BatchResult(keys, codes, values)

    def get_buffer(self, key: str) -> pa.Buffer:
        """The value as a ``pyarrow.Buffer`` of its own (one copy, from the mapped segment or
        over TCP, so it stays valid after the read lease ended). Raises as :meth:`get`."""
        return self.batch_get_buffer([key])[0].unwrap()

    def batch_get_buffer(self, keys: Sequence[str]) -> BatchResult[pa.Buffer]:
        """:meth:`get_buffer` for each key, with one lookup; per-key outcomes.

        Each value is copied once into a new (64-byte aligned) ``pyarrow`` buffer. It is not a
        view of the segment: the read lease ends when this call returns, and the memory
        behind an ended lease may be reused.
        """
        return self._read_fresh(keys, pa.allocate_buffer)

    def get_buffer_handle(self, key: str) -> BufferHandle:
        """The value as a :class:`~mooncake_py.BufferHandle` (upstream's ``get_buffer`` type:
        ``ptr()``, ``size()`` and a writable buffer protocol, so ``torch.frombuffer`` and
        ``numpy.frombuffer`` take it). One copy, as :meth:`get_buffer`. Raises as :meth:`get`."""
        return self.batch_get_buffer_handle([key])[0].unwrap()

    def batch_get_buffer_handle(self, keys: Sequence[str]) -> BatchResult[BufferHandle]:
        """:meth:`get_buffer_handle` for each key, with one lookup; per-key outcomes. The read
        leases end when this call returns (the handles are copies)."""
        return self._read_fresh(keys, BufferHandle)

    def _read_fresh(self, keys: Sequence[str], allocate: Callable[[int], B]) -> BatchResult[B]:
        """Read each found key into a new buffer ``allocate(size)``, then end every lease."""
        core = self._joined()
        check_keys(keys)
        started = self._clock()
        located = core.locate(keys)
        codes = [loc.code for loc in located]
        values: list[B | None] = [None] * len(keys)
        try:
            found = [i for i, loc in enumerate(located) if loc.code == OK]
            buffers = [allocate(located[i].size) for i in found]
            read = core.read_located(
                [located[i] for i in found], [memoryview(b).cast("B") for b in buffers]
            )
            for i, buffer, code in zip(found, buffers, read, strict=True):
                if code == OK:
                    values[i] = buffer
                else:
                    codes[i] = code
        except BaseException:
            core.drop_reads(located)
            raise
        _end_reads(core, located, started, codes, values)
        return BatchResult(keys, codes, values)

    # ------------------------------------------------------------------------------------------
    # Introspection

    def stats(self) -> dict[str, int]:
        """Store-wide counts and bytes (objects, segments, capacity, allocation, sessions,
        eviction and release counters)."""
        return self._joined().master.get_stats()

    def segments(self) -> list[SegmentStatus]:
        """Every mounted segment with its usage."""
        return [
            SegmentStatus(segment, client_id, used, allocations)
            for segment, client_id, used, allocations in self._joined().master.list_segments()
        ]


def _resolved(config: ReplicateConfig, count: int) -> ReplicateConfig | None:
    """``config`` for a write of ``count`` keys with ``session_ids`` folded into
    ``kv_sessions`` (what the core sends); None when either list has the wrong length.

    Raises:
        TypeError: ``config`` is no :class:`ReplicateConfig` (as upstream's binding does).
    """
    if not isinstance(config, ReplicateConfig):
        raise TypeError(f"config must be a ReplicateConfig, not {type(config).__name__}")
    if config.session_ids is None:
        tags = config.kv_sessions
        return config if tags is None or len(tags) == count else None
    try:
        tags = config.session_tags(count)
    except ValueError:
        return None
    return dataclasses.replace(config, kv_sessions=tags, session_ids=None)


def _read_copies(
    core: ClientCore,
    located: Sequence[ReplicaListResult],
    indices: Sequence[int],
    codes: list[int],
) -> list[tuple[int, bytearray]]:
    """Read ``located[i]`` for each ``i`` in ``indices`` into a new buffer of its size.

    Returns (index, buffer) for the reads that succeeded; a failed read's code goes to
    ``codes[i]``.
    """
    if not indices:
        return []
    buffers = [bytearray(located[i].size) for i in indices]
    read = core.read_located([located[i] for i in indices], [memoryview(b) for b in buffers])
    copied = []
    for i, buffer, code in zip(indices, buffers, read, strict=True):
        if code == OK:
            copied.append((i, buffer))
        else:
            codes[i] = code
    return copied


def _prefix(views: Sequence[memoryview], size: int) -> list[memoryview] | None:
    """The first ``size`` bytes of the concatenation of ``views``, as views in order; None when
    they hold fewer bytes."""
    target: list[memoryview] = []
    left = size
    for view in views:
        if left <= 0:
            break
        part = view[:left] if len(view) > left else view
        target.append(part)
        left -= len(part)
    return target if left <= 0 else None


def _end_reads(
    core: ClientCore,
    located: Sequence[ReplicaListResult],
    started: float,
    codes: list[int],
    values: list[Any],
) -> None:
    """End the read leases of ``located``; a copy the master does not vouch for (it outlived
    its lease and the bytes may have changed) fails its key with LEASE_EXPIRED."""
    for i in core.end_reads(located, started):
        if codes[i] == OK:
            codes[i], values[i] = LEASE_EXPIRED, None
