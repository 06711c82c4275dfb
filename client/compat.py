"""``MooncakeDistributedStore``: drop-in for upstream's Python store class, over the typed
:class:`~mooncake_py.Client`.

Same method names, argument order, keyword names, defaults and return conventions as upstream
Mooncake's ``mooncake.store.MooncakeDistributedStore``:

- data calls return ints: 0 or a negative ``ErrorCode``; ``get_into``, ``batch_get_into`` and
  ``batch_get_into_multi_buffers`` return the bytes read;
- ``get`` returns ``b""`` on a miss or any error, never None; ``get_buffer`` returns a
  :class:`~mooncake_py.BufferHandle` or None (``batch_get_buffer`` one per key);
- ``get_replica_desc`` returns a list of :class:`~mooncake_py.ReplicaDescriptor` (``[]`` on a
  miss or error); ``batch_get_replica_desc`` a dict, in key order, of the keys found;
- ``put`` of an existing key returns 0 and keeps the old bytes (first writer wins);
- ``put_batch`` returns one int (the first error, or 0); the ``batch_*`` calls return lists;
- almost nothing raises: type errors raise ``TypeError`` and ``put_parts`` with a buffer that
  is not one-dimensional raises :class:`MooncakeError`, as upstream raises for those;
- the KV-session calls (upstream's session branch) return 0 or their result and raise
  :class:`MooncakeError` (whose message names the code) on failure.

Methods called before ``setup`` (or after ``close``) return INVALID_PARAMS (the session calls
raise it). Every method only converts: the :class:`~mooncake_py.Client` does the work, and its
typed exceptions become the codes upstream returns.

Thread-safety: every method may be called from several threads at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from mooncake_py.errors import ErrorCode, MooncakeError
from mooncake_py.types import (
    KvSessionInfo,
    KvSessionPage,
    ProbeLeaseMode,
    ReleaseResult,
    ReplicateConfig,
)

from .api import Client
from .buffer_handle import BufferHandle
from .buffers import bytes_view, parts_views
from .compat_ranged import RangedTransfers
from .compat_setup import join, open_client, setup_values
from .compat_standalone import StandaloneCalls
from .compat_tasks import TaskTransfers
from .compat_tensor_files import TensorFileCalls
from .compat_tensor_selection import TensorSelectionCalls
from .config import ClientConfig
from .embedded_master import EmbeddedMaster
from .replica_desc import ReplicaDescriptor
from .results import BatchResult

INVALID = int(ErrorCode.INVALID_PARAMS)
OK = int(ErrorCode.OK)

# Upstream's GrantLeasePolicy names, as ``batch_probe_key`` accepts them.
_PROBE_POLICIES = {
    "none": ProbeLeaseMode.NONE,
    "None": ProbeLeaseMode.NONE,
    "LastHitOnly": ProbeLeaseMode.LAST_HIT_ONLY,
}


def _first_error(codes: Sequence[int]) -> int:
    return next((code for code in codes if code != OK), OK)


def _counts(codes: list[int], values: Sequence[int | None]) -> list[int]:
    """Per key the value (bytes read) where the code is 0, else the code."""
    return [v if c == OK and v is not None else c for c, v in zip(codes, values, strict=True)]


class _DropInStore:
    """Every call of :class:`MooncakeDistributedStore` but the ranged transfers."""

    # Setup state beside ``client``, set by setup and cleared by close.
    _setup_failed: bool = False
    _embedded_master: EmbeddedMaster | None = None

    def __init__(self) -> None:
        self.client: Client | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------
    # Lifecycle

    def setup(self, *args: Any, **kwargs: Any) -> int:
        """Join the store; returns 0 or a negative code.

        Forms (as upstream): ``setup(local_hostname, metadata_server, global_segment_size,
        local_buffer_size, protocol, rdma_devices, master_server_addr, engine=None, ...,
        tenant_id="default", ..., enable_standalone=False)``; ``setup(config_dict)``; and
        ``setup()``, which reads ``MOONCAKE_CONFIG_PATH`` or the ``MOONCAKE_*`` variables.
        ``enable_standalone`` (or ``MOONCAKE_ENABLE_STANDALONE=true``) starts a master in this
        process (:mod:`~mooncake_py.client.compat_setup`), stopped by :meth:`close`.

        While set up, or after a failed setup, another setup returns INVALID_PARAMS (-600)
        until :meth:`close`, as upstream.

        Raises:
            TypeError: the positional form misses an argument or has too many.
        """
        with self._lock:
            if self.client is not None or self._setup_failed:
                return INVALID
            try:
                self.client, self._embedded_master = join(setup_values(args, kwargs))
            except MooncakeError as exc:
                self._setup_failed = True
                return exc.code
        return OK

    def setup_with_config(self, config: ClientConfig) -> int:
        """Join the store with an explicit :class:`ClientConfig` (its master address; no
        embedded master); returns 0 or a negative code, and refuses, as :meth:`setup`, while
        set up or after a failed setup until :meth:`close`."""
        with self._lock:
            if self.client is not None or self._setup_failed:
                return INVALID
            try:
                self.client = open_client(config)
            except MooncakeError as exc:
                self._setup_failed = True
                return exc.code
        return OK

    def close(self) -> int:
        """Leave the store: unmount the segment (its objects are dropped) and stop; then stop
        the embedded master, if setup started one. Clears a failed setup. Returns 0."""
        with self._lock:
            client, self.client = self.client, None
            master, self._embedded_master = self._embedded_master, None
            self._setup_failed = False
        if client is not None:
            client.close()
        if master is not None:
            master.stop()
        return OK

    def health_check(self) -> int:
        """0 healthy, 1 not set up or closed, 2 master unreachable (last ping failed)."""
        client = self.client
        if client is None:
            return 1
        return 0 if client.master_reachable else 2

    def get_hostname(self) -> str:
        """The name of this client's segment (``host:port``), or "" before setup."""
        client = self.client
        return client.hostname if client is not None else ""

    def get_offload_rpc_read_count(self) -> int:
        """How many objects this client has read from a disk tier's replica (upstream's
        count of reads served by offloaded objects); 0 before setup."""
        client = self.client
        return client.disk_reads if client is not None else 0

    # ------------------------------------------------------------------------------------------
    # Buffer registration

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Allow zero-copy calls on ``[buffer_ptr, buffer_ptr + size)``; returns 0 or -600."""
        return self._status(lambda c: c.register_buffer(buffer_ptr, size))

    def unregister_buffer(self, buffer_ptr: int) -> int:
        """Forget a registered buffer; returns 0, or -600 when it was not registered."""
        return self._status(lambda c: c.unregister_buffer(buffer_ptr))

    def _status(self, call: Callable[[Client], object]) -> int:
        """Run ``call(client)``; 0, or the code of its error (INVALID_PARAMS before setup)."""
        client = self.client
        if client is None:
            return INVALID
        try:
            call(client)
        except MooncakeError as exc:
            return exc.code
        return OK

    def _value(self, call: Callable[[Client], int]) -> int:
        """Run ``call(client)`` for an int result; the result, or the code of its error."""
        client = self.client
        if client is None:
            return INVALID
        try:
            return int(call(client))
        except MooncakeError as exc:
            return exc.code

    def _codes(self, count: int, call: Callable[[Client], BatchResult[Any]]) -> list[int]:
        """Run ``call(client)`` for a batch result; its codes, or its error's code per key."""
        client = self.client
        if client is None:
            return [INVALID] * count
        try:
            return list(call(client).codes)
        except MooncakeError as exc:
            return [exc.code] * count

    # ------------------------------------------------------------------------------------------
    # Writes

    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Store ``value`` under ``key``; 0 on success or when the key exists, else negative."""
        view = bytes_view(value)
        return self._status(lambda c: c.put(key, view, config))

    def put_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> int:
        """Store each value; returns 0 or the first per-key error."""
        return _first_error(self._codes(len(keys), lambda c: c.put_batch(keys, values, config)))

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        """Store the concatenation of ``parts`` without joining them first.

        Raises:
            MooncakeError: a part is not a one-dimensional buffer (as upstream).
        """
        parts_views(parts)  # raises for a part that is not one-dimensional, as upstream
        return self._status(lambda c: c.put_parts(key, *parts, config=config))

    def put_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        """Store ``size`` bytes read from registered memory at ``buffer_ptr``."""
        return self._status(lambda c: c.put_from(key, buffer_ptr, size, config))

    def batch_put_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Store each ``sizes[i]`` bytes at ``buffer_ptrs[i]`` under ``keys[i]``; per-key codes."""
        return self._codes(len(keys), lambda c: c.batch_put_from(keys, buffer_ptrs, sizes, config))

    def batch_put_from_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Store under ``keys[i]`` the concatenation of the registered ranges
        ``(all_buffer_ptrs[i][j], all_sizes[i][j])``; per key 0 or a negative code.

        INVALID_PARAMS (-600) for every key when the three lists differ in length; for one key
        when its two lists differ in length, a size is negative, a part is not inside a
        registered buffer, or it has no byte (parts of size 0 are skipped).
        """
        return self._codes(
            len(keys),
            lambda c: c.batch_put_from_multi_buffers(keys, all_buffer_ptrs, all_sizes, config),
        )

    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Create or replace ``key``; 0 or a negative code (INVALID_WRITE (-700) when a
        concurrent write of the key preempted this one). Readers copying the old value
        meanwhile finish on the old bytes."""
        view = bytes_view(value)
        return self._status(lambda c: c.upsert(key, view, config))

    def upsert_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> int:
        """Create or replace each key; returns 0 or the first per-key error."""
        return _first_error(self._codes(len(keys), lambda c: c.upsert_batch(keys, values, config)))

    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        """Create or replace ``key`` with the concatenation of ``parts``."""
        parts_views(parts)  # raises for a part that is not one-dimensional, as upstream
        return self._status(lambda c: c.upsert_parts(key, *parts, config=config))

    def upsert_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        """Create or replace ``key`` from registered memory."""
        return self._status(lambda c: c.upsert_from(key, buffer_ptr, size, config))

    def batch_upsert_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Create or replace each key from registered memory; per-key codes."""
        return self._codes(
            len(keys), lambda c: c.batch_upsert_from(keys, buffer_ptrs, sizes, config)
        )

    # ------------------------------------------------------------------------------------------
    # Reads

    def get(self, key: str) -> bytes:
        """The value of ``key``, or ``b""`` on a miss or any error."""
        return self.get_batch([key])[0] if isinstance(key, str) and key else b""

    def get_batch(self, keys: Sequence[str]) -> list[bytes]:
        """Values of ``keys``, ``b""`` for each miss; ``[b""]`` for an empty list (as upstream)."""
        client = self.client
        if client is None or not keys:
            return [b""]
        try:
            result = client.get_batch(keys)
        except MooncakeError:
            return [b""] * len(keys)
        return [v if v is not None else b"" for v in result.values]

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Read ``key`` into registered memory; returns the bytes read or a negative code."""
        return self.batch_get_into([key], [buffer_ptr], [size])[0]

    def batch_get_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        """Read each key into its buffer; per key the bytes read or a negative code.

        A buffer smaller than its object gives INVALID_PARAMS; a miss OBJECT_NOT_FOUND.
        """
        client = self.client
        if client is None:
            return [INVALID] * len(keys)
        try:
            result = client.batch_get_into(keys, buffer_ptrs, sizes)
        except MooncakeError as exc:
            return [exc.code] * len(keys)
        return _counts(result.codes, result.values)

    def batch_get_into_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> list[int]:
        """Read each key scattered over the registered ranges
        ``(all_buffer_ptrs[i][j], all_sizes[i][j])``, in order; per key the bytes read (the
        object's size) or a negative code.

        Parts adding up to more than the object are filled in order up to its end. INVALID_PARAMS
        (-600) for every key when the three lists differ in length; for one key when its parts
        add up to less than its object, its two lists differ in length, a size is negative, or
        a part is not inside a registered buffer; a miss gives OBJECT_NOT_FOUND (-704).
        ``prefer_alloc_in_same_node`` is accepted and ignored (same-host replicas are always
        read first).
        """
        client = self.client
        if client is None:
            return [INVALID] * len(keys)
        try:
            result = client.batch_get_into_multi_buffers(
                keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node
            )
        except MooncakeError as exc:
            return [exc.code] * len(keys)
        return _counts(result.codes, result.values)

    def get_buffer(self, key: str) -> BufferHandle | None:
        """The value as a :class:`~mooncake_py.BufferHandle` (``ptr()``, ``size()``, a
        writable buffer protocol), or None on a miss or any error, as upstream.

        The handle is a copy of its own: the read lease ends when this returns, so the
        store's memory is held only for the copy and the handle never changes under a later
        write of the key."""
        return self.batch_get_buffer([key])[0]

    def batch_get_buffer(self, keys: Sequence[str]) -> list[BufferHandle | None]:
        """:meth:`get_buffer` for each key, with one lookup: one handle or None per key."""
        client = self.client
        if client is None or not keys:
            return [None] * len(keys)
        try:
            return list(client.batch_get_buffer_handle(keys).values)
        except MooncakeError:
            return [None] * len(keys)

    # ------------------------------------------------------------------------------------------
    # Queries and removal

    def is_exist(self, key: str) -> int:
        """1 if ``key`` is readable, 0 if not, negative on error. A found key gets an
        existence hold for this client until its next read of the key (or the lease TTL):
        meanwhile a remove without ``force`` answers OBJECT_HAS_LEASE (-706). See
        :meth:`probe_key` for a check that holds nothing."""
        return self.batch_is_exist([key])[0]

    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        """Per key 1, 0 or a negative code, in one round trip (found keys get existence holds
        as with :meth:`is_exist`)."""
        client = self.client
        if client is None:
            return [INVALID] * len(keys)
        try:
            result = client.batch_is_exist(keys)
        except MooncakeError as exc:
            return [exc.code] * len(keys)
        found = result.values
        return [1 if hit else code for code, hit in zip(result.codes, found, strict=True)]

    def probe_key(self, key: str) -> int:
        """1 if ``key`` is readable, 0 if not, negative on error; holds nothing."""
        return self._value(lambda c: 1 if c.probe_key(key) else 0)

    def batch_probe_key(
        self, keys: Sequence[str], policy: str = "none", candidate_size: int = 1
    ) -> list[int]:
        """Per key 1, 0 or a negative code, in one round trip (upstream's ``batch_probe_key``).

        Args:
            keys: the keys to probe.
            policy: ``"none"`` (or ``"None"``): hold nothing. ``"LastHitOnly"``: the keys form
                consecutive candidates of ``candidate_size`` keys; only the last candidate
                whose every key is readable answers 1 (its keys get existence holds, as
                :meth:`is_exist`), every other key 0.
            candidate_size: keys per candidate for ``"LastHitOnly"``.

        Returns:
            One int per key; ``[]`` for no keys.

        Raises:
            ValueError: an unknown policy, or ``"LastHitOnly"`` with a ``candidate_size``
                that is 0 or does not divide ``len(keys)``.
            TypeError: a negative (or non-int) ``candidate_size``.
        """
        mode = _PROBE_POLICIES.get(policy) if isinstance(policy, str) else None
        if mode is None:
            raise ValueError(f"unknown probe lease policy {policy!r}: none or LastHitOnly")
        if isinstance(candidate_size, bool) or not isinstance(candidate_size, int):
            raise TypeError(f"candidate_size must be an int: {candidate_size!r}")
        if candidate_size < 0:
            raise TypeError(f"candidate_size must not be negative: {candidate_size}")
        if not keys:
            return []
        if mode == ProbeLeaseMode.LAST_HIT_ONLY and (
            candidate_size == 0 or len(keys) % candidate_size
        ):
            raise ValueError(
                f"LastHitOnly needs a candidate_size dividing {len(keys)} keys: {candidate_size}"
            )
        client = self.client
        if client is None:
            return [INVALID] * len(keys)
        try:
            result = client.batch_probe_key(keys, mode, candidate_size)
        except MooncakeError as exc:
            return [exc.code] * len(keys)
        found = result.values
        return [1 if hit else code for code, hit in zip(result.codes, found, strict=True)]

    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        """Descriptors of the replicas of ``key``; ``[]`` on a miss or any error, as upstream.

        A probe: the lookup's read lease ends at once, so nothing stays held (like
        :meth:`get_size`, it takes over this client's existence hold on the key)."""
        client = self.client
        if client is None:
            return []
        try:
            result = client.batch_get_replica_desc([key])
        except MooncakeError:
            return []
        return result.values[0] or []

    def batch_get_replica_desc(self, keys: Sequence[str]) -> dict[str, list[ReplicaDescriptor]]:
        """Descriptors per key, in one lookup, as upstream: a dict in key order holding the
        keys that were found (a miss, or a key that failed, is left out; ``{}`` when the
        whole call failed). Holds nothing, as :meth:`get_replica_desc`."""
        client = self.client
        if client is None:
            return {}
        try:
            result = client.batch_get_replica_desc(keys)
        except MooncakeError:
            return {}
        found = {r.key: r.value for r in result if r.ok and r.value is not None}
        return dict(sorted(found.items()))  # upstream's std::map iterates in key order

    def get_size(self, key: str) -> int:
        """The size of ``key`` in bytes, or a negative code (its read lease ends at once)."""
        return self._value(lambda c: c.get_size(key))

    def remove(self, key: str, force: bool = False) -> int:
        """Delete ``key``: 0, -704 missing, -706 being read or held by an ``is_exist`` (unless
        ``force``: readers then finish on the old bytes), -703 being written."""
        return self.batch_remove([key], force)[0]

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]:
        """Delete each key; per-key codes as :meth:`remove`."""
        return self._codes(len(keys), lambda c: c.batch_remove(keys, force))

    def batch_demote(self, keys: Sequence[str]) -> list[int]:
        """Move each key from memory to its owner's disk tier now; per-key codes as
        :meth:`~mooncake_py.Client.batch_demote` (0, or -704, -703/-706 while written/read,
        -714 hard pinned, -1300 when no disk tier may hold it)."""
        return self._codes(len(keys), lambda c: c.batch_demote(keys))

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Delete every key matching the pattern; the count removed, or -600 for a bad regex."""
        return self._value(lambda c: c.remove_by_regex(regex_pattern, force))

    def remove_all(self, force: bool = False) -> int:
        """Delete every removable key of this tenant; the count removed."""
        return self._value(lambda c: c.remove_all(force))

    def batch_replica_clear(self, keys: Sequence[str], segment_name: str = "") -> list[str]:
        """Drop this client's own unheld objects (or their replicas on ``segment_name``); the
        keys cleared, ``[]`` on error. See :meth:`~mooncake_py.Client.batch_replica_clear`."""
        client = self.client
        if client is None:
            return []
        try:
            return client.batch_replica_clear(keys, segment_name)
        except MooncakeError:
            return []

    # ------------------------------------------------------------------------------------------
    # KV sessions: these raise MooncakeError, as upstream's session branch does

    def _session_client(self) -> Client:
        client = self.client
        if client is None:
            raise MooncakeError(ErrorCode.INVALID_PARAMS, "the store is not set up")
        return client

    def attach_kv_session(self, session_id: str, keys: Sequence[str]) -> list[int]:
        """Add existing objects to a session; per key 0, -704 or -1802 (nothing added).

        Raises:
            MooncakeError: INVALID_PARAMS for a bad id or key or too many keys; RPC_FAIL.
        """
        return list(self._session_client().attach_kv_session(session_id, keys).codes)

    def pin_kv_session(self, session_id: str) -> int:
        """Protect the session's objects from ordinary eviction; returns 0.

        Raises:
            MooncakeError: SESSION_NOT_FOUND, INVALID_PARAMS, RPC_FAIL.
        """
        self._session_client().pin_kv_session(session_id)
        return OK

    def unpin_kv_session(self, session_id: str) -> int:
        """Remove this session's protection; returns 0. Raises as :meth:`pin_kv_session`."""
        self._session_client().unpin_kv_session(session_id)
        return OK

    def update_kv_session(self, session_id: str, keep_keys: Sequence[str]) -> int:
        """Keep only members in ``keep_keys``; returns 0.

        Raises:
            MooncakeError: SESSION_LIMIT_EXCEEDED, INVALID_PARAMS, RPC_FAIL.
        """
        self._session_client().update_kv_session(session_id, keep_keys)
        return OK

    def close_kv_session(self, session_id: str) -> int:
        """Drop the session's memberships and pin (data stays cached); returns 0. Idempotent."""
        self._session_client().close_kv_session(session_id)
        return OK

    def get_kv_session(self, session_id: str) -> KvSessionInfo:
        """The session's info. Raises MooncakeError (SESSION_NOT_FOUND, ...)."""
        return self._session_client().get_kv_session(session_id)

    def list_kv_session_keys(
        self, session_id: str, cursor: str = "", limit: int = 1024
    ) -> KvSessionPage:
        """One page of the session's keys after ``cursor`` (exclusive), in key order."""
        return self._session_client().list_kv_session_keys(session_id, cursor, limit)

    def list_kv_sessions(
        self,
        cursor: str = "",
        limit: int = 1024,
        pinned: bool | None = None,
        min_idle_ms: int = 0,
    ) -> tuple[list[KvSessionInfo], str]:
        """One page of this tenant's sessions and the next cursor ("" when done)."""
        listing = self._session_client().list_kv_sessions(cursor, limit, pinned, min_idle_ms)
        return listing.sessions, listing.next_cursor

    def release_kv_session(self, session_id: str, all_pages: bool = False) -> ReleaseResult:
        """Close the session and remove its members that nothing else needs (with
        ``all_pages``, those other sessions share too)."""
        return self._session_client().release_kv_session(session_id, all_pages)

    def release_stale_kv_sessions(
        self, max_idle_ms: int, include_pinned: bool = False
    ) -> ReleaseResult:
        """Release every session idle for longer than ``max_idle_ms``; returns the totals."""
        return self._session_client().release_stale_kv_sessions(max_idle_ms, include_pinned)

    def release_all_kv_sessions(self, confirm: bool = False) -> ReleaseResult:
        """Release every session of this tenant (INVALID_PARAMS unless ``confirm``)."""
        return self._session_client().release_all_kv_sessions(confirm)

    def release_kv_cache(self, keep_pinned: bool = True) -> ReleaseResult:
        """Remove every KV-cache object of this tenant while other data stays resident."""
        return self._session_client().release_kv_cache(keep_pinned)


class MooncakeDistributedStore(
    StandaloneCalls,
    RangedTransfers,
    TaskTransfers,
    TensorFileCalls,
    TensorSelectionCalls,
    _DropInStore,
):
    """A client of a mooncake-py store; see the module docstring for conventions.

    The ranged transfers (:class:`~mooncake_py.client.compat_ranged.RangedTransfers`) come
    first: their ``close`` ends the store's transfer sessions before the client leaves.

    Attributes:
        client: the typed :class:`~mooncake_py.Client` doing the work (None before ``setup``
            and after ``close``); use it directly for exceptions and typed results.
    """
