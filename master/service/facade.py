"""The master service facade: every master operation, with no transport in it.

The facade composes the services that do the work and keeps the operations that are neither
KV sessions nor release: segments and liveness, the data path (put, upsert, end, revoke, read,
exist, remove), the background steps and introspection.

- :class:`~mooncake_py.master.state.store.StoreState` holds every piece of state and the
  mutations that keep its parts consistent.
- :class:`~mooncake_py.master.service.context.ServiceContext` bundles that state with the one
  lock, the clock and the :class:`~mooncake_py.master.service.context.TenantResolver`; the
  facade builds it and hands it to :attr:`MasterService.sessions`
  (:class:`~mooncake_py.master.service.kv_sessions.SessionService`) and
  :attr:`MasterService.releases`
  (:class:`~mooncake_py.master.service.release.ReleaseService`).
- :class:`~mooncake_py.master.service.writes.WritePath` (puts and upserts, including the
  admission of writes tagged with KV sessions) and
  :class:`~mooncake_py.master.service.eviction.Evictor` work on the state under the lock the
  facade holds.

Background work is exposed as plain synchronous steps that take ``now``
(:meth:`MasterService.reap_expired_clients`, :meth:`MasterService.sweep_expired_puts`); timers in
:mod:`background` only call them, and tests call them directly with a fake clock.

Thread-safety: every public method, here and in the composed services, takes the context's one
lock, so calls are atomic with respect to each other (session updates and releases once per
page). Lock order: only this lock exists.
"""

from __future__ import annotations

import dataclasses
import random
import re
import threading
from collections.abc import Callable, Sequence

from mooncake_py.errors import ErrorCode
from mooncake_py.types import (
    ClientStatus,
    PutStartResult,
    ReplicaListResult,
    ReplicateConfig,
    SegmentInfo,
)

from ..clock import monotonic_clock
from ..config import MasterConfig
from ..state.objects import ObjectMetadata, valid_key
from ..state.segments import MountedSegment
from ..state.store import StoreState
from .context import DEFAULT_TENANT, ServiceContext, TenantResolver
from .eviction import EvictionPass, Evictor
from .kv_sessions import SessionService
from .release import ReleaseService
from .writes import WritePath

SERVICE_VERSION = "mooncake-py/0.1.0"
MAX_REPLICA_NUM = 64
# A value can be no larger than a segment; this bound only rejects nonsense early.
MAX_VALUE_BYTES = 1 << 50


@dataclasses.dataclass(frozen=True, slots=True)
class PingResult:
    """Answer to a heartbeat."""

    code: int
    client_status: ClientStatus
    view_version: int


class MasterService:
    """All master state and operations.

    Args:
        config: validated master configuration.
        clock: returns seconds; inject a ``FakeClock`` in tests.
        rng: random source for placement.
        view_version: identifies this master incarnation in ping answers; clients see it change
            across a restart.

    Attributes:
        sessions: the KV session operations (attach, pin, update, close, get, list).
        releases: the release operations (of a session, of stale or all sessions, of the
            KV cache).
    """

    def __init__(
        self,
        config: MasterConfig,
        clock: Callable[[], float] = monotonic_clock,
        rng: random.Random | None = None,
        view_version: int = 0,
    ) -> None:
        self.config = config
        # Tokens bind callers to tenants, which only means something with separate key spaces.
        tenants = TenantResolver(config.enable_multi_tenants or bool(config.auth_tokens_file))
        context = ServiceContext(threading.Lock(), StoreState(config, rng), clock, tenants)
        self._lock = context.lock
        self._state = context.state
        self._clock = clock
        self._tenants = tenants
        self._resolve_tenant = tenants.resolve
        self._objects = self._state.objects
        self._segments = self._state.segments
        self._clients = self._state.clients
        self._evictor = Evictor(self._state)
        self._writes = WritePath(self._state, self._evictor)
        self._view_version = view_version
        self.sessions = SessionService(context)
        self.releases = ReleaseService(context)

    # ------------------------------------------------------------------------------------------
    # Segments and liveness

    def mount_segment(self, client_id: str, segment: SegmentInfo) -> ErrorCode:
        """Contribute ``segment`` to the store; idempotent for the same client.

        Returns:
            OK; INVALID_PARAMS for a malformed segment or one owned by another client.
        """
        with self._lock:
            code = self._mount_locked(client_id, segment)
            if code == ErrorCode.OK:
                self._clients.touch(client_id, self._clock())
            return code

    def remount_segments(self, client_id: str, segments: Sequence[SegmentInfo]) -> ErrorCode:
        """Re-register every segment a client holds and put it in good standing.

        All segments are validated before any is mounted.

        Returns:
            OK, or INVALID_PARAMS (nothing mounted) when one segment is malformed.
        """
        with self._lock:
            if not client_id:
                return ErrorCode.INVALID_PARAMS
            for segment in segments:
                if self._validate_segment(client_id, segment) != ErrorCode.OK:
                    return ErrorCode.INVALID_PARAMS
            for segment in segments:
                self._mount_locked(client_id, segment)
            self._clients.touch(client_id, self._clock())
            self._clients.mark_ok(client_id)
            return ErrorCode.OK

    def unmount_segment(self, client_id: str, segment_id: str) -> ErrorCode:
        """Withdraw a segment; objects left without a replica are deleted. Idempotent.

        Returns:
            OK; INVALID_PARAMS when another client owns the segment.
        """
        with self._lock:
            mounted = self._segments.get(segment_id)
            if mounted is None:
                return ErrorCode.OK
            if mounted.client_id != client_id:
                return ErrorCode.INVALID_PARAMS
            self._unmount_locked(segment_id)
            return ErrorCode.OK

    def ping(self, client_id: str) -> PingResult:
        """Heartbeat: refresh the client's deadline and tell it whether to remount."""
        with self._lock:
            if not client_id:
                return PingResult(ErrorCode.INVALID_PARAMS, ClientStatus.UNDEFINED, 0)
            self._clients.touch(client_id, self._clock())
            status = (
                ClientStatus.OK if self._clients.is_ok(client_id) else ClientStatus.NEED_REMOUNT
            )
            return PingResult(ErrorCode.OK, status, self._view_version)

    def _validate_segment(self, client_id: str, segment: SegmentInfo) -> ErrorCode:
        if not client_id or not segment.id or not segment.name:
            return ErrorCode.INVALID_PARAMS
        if segment.base <= 0 or segment.size <= 0:
            return ErrorCode.INVALID_PARAMS
        existing = self._segments.get(segment.id)
        if existing is not None and existing.client_id != client_id:
            return ErrorCode.INVALID_PARAMS
        return ErrorCode.OK

    def _mount_locked(self, client_id: str, segment: SegmentInfo) -> ErrorCode:
        code = self._validate_segment(client_id, segment)
        if code == ErrorCode.OK and self._segments.get(segment.id) is None:
            self._segments.mount(client_id, segment)
        return code

    def _unmount_locked(self, segment_id: str) -> None:
        self._state.unmount(segment_id)

    # ------------------------------------------------------------------------------------------
    # Write path

    def put_start(
        self, client_id: str, tenant: str, key: str, size: int, config: ReplicateConfig
    ) -> PutStartResult:
        """Reserve replicas for a new object; see :meth:`batch_put_start`."""
        return self.batch_put_start(client_id, tenant, [key], [size], config)[0]

    def batch_put_start(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        config: ReplicateConfig,
    ) -> list[PutStartResult]:
        """Reserve replicas for each key; the object stays invisible until PutEnd.

        Per key: OK with PROCESSING replica descriptors; OBJECT_ALREADY_EXISTS when the key has
        a readable replica or a write younger than the discard timeout (first writer wins);
        NO_AVAILABLE_HANDLE when no segment can hold it even after evicting what may be
        evicted; INVALID_PARAMS for a bad key or size. A malformed request (length mismatch,
        ``group_ids`` not one per key, bad config, too many keys) fails every key with
        INVALID_PARAMS.

        Complexity: O(keys × placement), plus bounded eviction when memory is full.
        """
        return self._start_writes(client_id, tenant, keys, sizes, config, upsert=False)

    def upsert_start(
        self, client_id: str, tenant: str, key: str, size: int, config: ReplicateConfig
    ) -> PutStartResult:
        """Reserve replicas to create or replace one object; see :meth:`batch_upsert_start`."""
        return self.batch_upsert_start(client_id, tenant, [key], [size], config)[0]

    def batch_upsert_start(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        config: ReplicateConfig,
    ) -> list[PutStartResult]:
        """Create or replace each key (finish with PutEnd / PutRevoke, as for a put).

        Per key, beyond :meth:`batch_put_start`'s codes: OBJECT_REPLICA_BUSY while a reader
        holds the object (live read lease); INVALID_PARAMS when ``group_ids`` would move an
        existing object to another group. An unfinished put or upsert of the key is preempted.
        """
        return self._start_writes(client_id, tenant, keys, sizes, config, upsert=True)

    def _start_writes(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        config: ReplicateConfig,
        upsert: bool,
    ) -> list[PutStartResult]:
        invalid = [PutStartResult(ErrorCode.INVALID_PARAMS)] * len(keys)
        resolved = self._resolve_tenant(tenant)
        groups = config.group_ids
        if (
            resolved is None
            or len(keys) != len(sizes)
            or not self._batch_size_ok(keys)
            or (groups is not None and len(groups) != len(keys))
            or not 1 <= config.replica_num <= MAX_REPLICA_NUM
        ):
            return invalid
        pin = self._writes.resolve_soft_pin(config)
        tags = config.kv_sessions
        if pin is None or (tags is not None and len(tags) != len(keys)):
            return invalid
        results: list[PutStartResult] = []
        with self._lock:
            now = self._clock()
            for i, (key, size) in enumerate(zip(keys, sizes, strict=True)):
                if not valid_key(key) or not 0 < size <= MAX_VALUE_BYTES:
                    results.append(PutStartResult(ErrorCode.INVALID_PARAMS))
                    continue
                group = groups[i] if groups is not None else None
                key_tags = tags[i] if tags is not None else []
                results.append(
                    self._writes.start(
                        client_id, resolved, key, size, config, group, key_tags, pin, now, upsert
                    )
                )
        return results

    def put_end(self, client_id: str, tenant: str, key: str) -> ErrorCode:
        """Make a written object visible; see :meth:`batch_put_end`."""
        return self.batch_put_end(client_id, tenant, [key])[0]

    def batch_put_end(self, client_id: str, tenant: str, keys: Sequence[str]) -> list[ErrorCode]:
        """Mark each key's in-flight replicas COMPLETE, atomically making the object readable.

        Per key: OK (also when every replica is already COMPLETE, so a retry is harmless);
        OBJECT_NOT_FOUND; ILLEGAL_CLIENT when another client started the write; INVALID_WRITE
        when nothing is in flight. Ends upserts too.
        """
        return self._per_key(tenant, keys, lambda t, k, now: self._writes.end(client_id, t, k, now))

    def put_revoke(self, client_id: str, tenant: str, key: str) -> ErrorCode:
        """Abandon a write; see :meth:`batch_put_revoke`."""
        return self.batch_put_revoke(client_id, tenant, [key])[0]

    def batch_put_revoke(self, client_id: str, tenant: str, keys: Sequence[str]) -> list[ErrorCode]:
        """Free each key's in-flight replicas; an object left with none disappears.

        Per key: OK; OBJECT_NOT_FOUND; ILLEGAL_CLIENT; INVALID_WRITE when nothing is in flight.
        """
        return self._per_key(
            tenant, keys, lambda t, k, now: self._writes.revoke(client_id, t, k, now)
        )

    # ------------------------------------------------------------------------------------------
    # Read path

    def get_replica_list(self, tenant: str, key: str) -> ReplicaListResult:
        """Readable replicas of one key; see :meth:`batch_get_replica_list`."""
        return self.batch_get_replica_list(tenant, [key])[0]

    def batch_get_replica_list(self, tenant: str, keys: Sequence[str]) -> list[ReplicaListResult]:
        """Where to read each key, granting a read lease of ``default_kv_lease_ttl``.

        Per key: OK with the COMPLETE replicas; OBJECT_NOT_FOUND; REPLICA_IS_NOT_READY while
        the first write is in flight; INVALID_PARAMS for a bad key.
        """
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not self._batch_size_ok(keys):
            return [ReplicaListResult(ErrorCode.INVALID_PARAMS)] * len(keys)
        with self._lock:
            now = self._clock()
            return [self._replica_list_locked(resolved, key, now) for key in keys]

    def _replica_list_locked(self, tenant: str, key: str, now: float) -> ReplicaListResult:
        if not valid_key(key):
            return ReplicaListResult(ErrorCode.INVALID_PARAMS)
        meta = self._objects.get((tenant, key))
        if meta is None:
            return ReplicaListResult(ErrorCode.OBJECT_NOT_FOUND)
        readable = meta.complete_replicas()
        if not readable:
            return ReplicaListResult(ErrorCode.REPLICA_IS_NOT_READY)
        self._state.grant_lease(meta, now)
        return ReplicaListResult(
            ErrorCode.OK,
            tuple(self._state.describe(meta, r) for r in readable),
            self.config.default_kv_lease_ttl,
            meta.size,
        )

    def exist_key(self, tenant: str, key: str) -> int:
        """1 when the key is readable (granting a read lease), 0 when not, negative on error."""
        return self.batch_exist_key(tenant, [key])[0]

    def batch_exist_key(self, tenant: str, keys: Sequence[str]) -> list[int]:
        """Per key: 1 readable (lease granted), 0 absent or not yet written, or INVALID_PARAMS."""
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not self._batch_size_ok(keys):
            return [int(ErrorCode.INVALID_PARAMS)] * len(keys)
        results: list[int] = []
        append = results.append
        invalid = int(ErrorCode.INVALID_PARAMS)
        lookup = self._objects.get
        grant = self._state.grant_lease
        ttl = self._state.lease_ttl_s
        with self._lock:
            now = self._clock()
            # Leases with over half their TTL left only get extended (see grant_lease).
            fresh_after, renewed = now + ttl / 2, now + ttl
            for key in keys:
                meta = lookup((resolved, key))
                if meta is None or not meta.readable:
                    # Stored keys were valid when written; only misses need the check.
                    append(0 if valid_key(key) else invalid)
                elif meta.lease_timeout > fresh_after and not meta.group_id:
                    if renewed > meta.lease_timeout:
                        meta.lease_timeout = renewed
                    append(1)
                else:
                    grant(meta, now)
                    append(1)
        return results

    # ------------------------------------------------------------------------------------------
    # Remove family

    def remove(self, tenant: str, key: str, force: bool = False) -> ErrorCode:
        """Delete one key; see :meth:`batch_remove`."""
        return self.batch_remove(tenant, [key], force)[0]

    def batch_remove(
        self, tenant: str, keys: Sequence[str], force: bool = False
    ) -> list[ErrorCode]:
        """Delete each key and free its memory.

        Per key: OK; OBJECT_NOT_FOUND; REPLICA_IS_NOT_READY while a write is in flight (even
        with ``force``); OBJECT_HAS_LEASE when a read lease is live and ``force`` is false.
        """
        return self._per_key(tenant, keys, lambda t, k, now: self._remove_locked(t, k, force, now))

    def _remove_locked(self, tenant: str, key: str, force: bool, now: float) -> ErrorCode:
        meta = self._objects.get((tenant, key))
        if meta is None:
            return ErrorCode.OBJECT_NOT_FOUND
        if meta.is_writing():
            return ErrorCode.REPLICA_IS_NOT_READY
        if not force and meta.has_live_lease(now):
            return ErrorCode.OBJECT_HAS_LEASE
        self._state.release_replicas(meta, list(meta.replicas), now)
        return ErrorCode.OK

    def remove_by_regex(
        self, tenant: str, pattern: str, force: bool = False
    ) -> tuple[ErrorCode, int]:
        """Delete every key of the tenant that ``re.search`` matches; others are skipped.

        Returns:
            (OK, count removed), or (INVALID_PARAMS, 0) for a pattern that does not compile.
            Keys that cannot be removed (leased, being written) are skipped silently.
        """
        resolved = self._resolve_tenant(tenant)
        try:
            compiled = re.compile(pattern)
        except (re.error, RecursionError, OverflowError):
            return ErrorCode.INVALID_PARAMS, 0
        if resolved is None:
            return ErrorCode.INVALID_PARAMS, 0
        with self._lock:
            now = self._clock()
            matching = [
                m.key for m in self._objects.items_of_tenant(resolved) if compiled.search(m.key)
            ]
            removed = [self._remove_locked(resolved, k, force, now) for k in matching]
        return ErrorCode.OK, sum(1 for code in removed if code == ErrorCode.OK)

    def remove_all(self, tenant: str, force: bool = False) -> int:
        """Delete every removable object of the tenant; returns how many were removed.

        With multi-tenancy on, an empty ``tenant`` means every tenant (as upstream). Objects
        that cannot be removed (leased without ``force``, being written) are skipped.
        """
        everyone = self._tenants.multi_tenant and tenant == ""
        resolved = self._resolve_tenant(tenant)
        if resolved is None:
            return 0
        with self._lock:
            now = self._clock()
            doomed = list(self._objects) if everyone else self._objects.items_of_tenant(resolved)
            codes = [self._remove_locked(m.tenant, m.key, force, now) for m in doomed]
        return sum(1 for code in codes if code == ErrorCode.OK)

    # ------------------------------------------------------------------------------------------
    # Background steps

    def reap_expired_clients(self, now: float) -> list[str]:
        """Expire clients silent for ``client_ttl``: unmount their segments, drop lost objects.

        Returns:
            The expired client ids. Complexity: O(expired clients × their objects).
        """
        with self._lock:
            expired = self._clients.pop_expired(now)
            for client_id in expired:
                for mounted in self._segments.segments_of(client_id):
                    self._unmount_locked(mounted.info.id)
            return expired

    def sweep_expired_puts(self, now: float) -> int:
        """Free writes that never ended within the release timeout, and due discarded buffers.

        Returns:
            The number of replicas and discarded buffers freed.
        """
        with self._lock:
            return self._state.free_due_discards(now) + self._writes.sweep_expired(now)

    def evict_once(self, now: float) -> EvictionPass | None:
        """Run one whole watermark eviction pass (None when memory use does not call for one).

        Holds the lock for the whole pass; the background loop uses :meth:`start_eviction`
        and :meth:`continue_eviction` instead, to let other calls in between slices.
        """
        with self._lock:
            return self._evictor.evict_once(now)

    def start_eviction(self) -> EvictionPass | None:
        """Begin a watermark pass if memory use calls for one. O(segments)."""
        with self._lock:
            return self._evictor.plan(self._clock())

    def continue_eviction(self, work: EvictionPass, now: float) -> bool:
        """Run one bounded slice of ``work``; returns True when the pass is finished."""
        with self._lock:
            return self._evictor.run_slice(work, now).done

    # ------------------------------------------------------------------------------------------
    # Introspection

    def stats(self) -> dict[str, int]:
        """Counts and bytes for metrics and tests."""
        with self._lock:
            counters = dataclasses.asdict(self._state.counters)
            return {
                "objects": len(self._objects),
                "segments": len(self._segments.all_segments()),
                "capacity_bytes": self._segments.capacity_bytes(),
                "allocated_bytes": self._segments.used_bytes(),
                "clients": len(self._clients),
                "active_clients": self._clients.active_count,
                "discarded_buffers": len(self._state.discarded),
                "eviction_candidates": len(self._state.policy),
                "sessions": len(self._state.sessions),
                "pinned_sessions": self._state.sessions.pinned_count(),
                "memberships": self._state.sessions.memberships,
                **counters,
            }

    def segment_usage(self) -> list[tuple[SegmentInfo, str, int, int]]:
        """(segment, owning client, used bytes, allocations) for every mounted segment."""
        with self._lock:
            return [
                (m.info, m.client_id, m.allocator.used_bytes, m.allocator.allocation_count)
                for m in self._segments.all_segments()
            ]

    def check(self) -> None:
        """Verify every invariant across the state modules. O(state).

        Raises:
            AssertionError: state is inconsistent.
        """
        with self._lock:
            self._state.check()

    # ------------------------------------------------------------------------------------------
    # Helpers

    def _per_key(
        self, tenant: str, keys: Sequence[str], step: Callable[[str, str, float], ErrorCode]
    ) -> list[ErrorCode]:
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not self._batch_size_ok(keys):
            return [ErrorCode.INVALID_PARAMS] * len(keys)
        with self._lock:
            now = self._clock()
            return [
                step(resolved, k, now) if valid_key(k) else ErrorCode.INVALID_PARAMS for k in keys
            ]

    def _batch_size_ok(self, keys: Sequence[str]) -> bool:
        return len(keys) <= self.config.max_batch_keys

    def segment_of(self, segment_id: str) -> MountedSegment | None:
        """The mounted segment with this id (for tests and introspection)."""
        with self._lock:
            return self._segments.get(segment_id)

    def object_of(self, tenant: str, key: str) -> ObjectMetadata | None:
        """The metadata of one object (for tests and introspection); do not mutate it."""
        with self._lock:
            return self._objects.get((self._resolve_tenant(tenant) or DEFAULT_TENANT, key))
