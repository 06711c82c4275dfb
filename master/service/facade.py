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

Work whose cost grows with the store (bulk removals, releases, session updates and listings)
is also offered as *sliced* operations (``*_sliced``, :mod:`.slices`): generators that do one
bounded slice per step and yield between slices; the transports run them one slice per step of
the event loop, so no call stalls the others. The plain methods run every slice back to back.

Thread-safety: every public method, here and in the composed services, takes the context's one
lock, so calls are atomic with respect to each other, except that sliced operations take it
once per slice. Lock order: only this lock exists.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence

from mooncake_py.errors import ErrorCode
from mooncake_py.types import (
    SegmentInfo,
)

from ..clock import monotonic_clock
from ..config import MasterConfig
from ..state.objects import ObjectMetadata, Replica, valid_key
from ..state.segments import MountedSegment
from ..state.store import StoreState
from . import tenant_views
from .batch_start import BatchStart
from .context import DEFAULT_TENANT, ServiceContext, TenantResolver
from .disk_calls import DiskTierService
from .disk_moves import DiskMoves
from .eviction import EvictionPass, Evictor
from .kv_sessions import SessionService
from .membership import MembershipService, PingResult
from .plain_removal import plain_replica, remove_plain
from .reads import ReadService
from .release import ReleaseService
from .removal import RemovalService
from .replicas import ReplicaService
from .slices import Steps, drive, map_runs_in_slices
from .tasks import TaskService
from .write_calls import MAX_VALUE_BYTES, WriteCalls
from .writes import WritePath

SERVICE_VERSION = "mooncake-py/0.1.0"


class MasterService(WriteCalls):
    """All master state and operations.

    Args:
        config: validated master configuration.
        clock: returns seconds; inject a ``FakeClock`` in tests.
        rng: random source for placement.
        view_version: identifies this master incarnation in ping answers; clients see it change
            across a restart.

    Attributes:
        reads: the read operations (lookups that lease, existence checks, probes, ends of
            reads).
        sessions: the KV session operations (attach, pin, update, close, get, list).
        releases: the release operations (of a session, of stale or all sessions, of the
            KV cache).
        replicas: replica management (clearing a client's own replicas).
        tasks: replica copy and move tasks.
        disk: the disk tier owners' calls (disk tasks, re-registered files).
        context: what the composed services share (lock, state, clock, tenant rule), for
            services built beside the facade (the HTTP admin queries).
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
        self.context = context
        self._lock = context.lock
        self._state = context.state
        self._clock = clock
        self._tenants = tenants
        self._resolve_tenant = tenants.resolve
        self._objects = self._state.objects
        self._segments = self._state.segments
        self._clients = self._state.clients
        disk_moves = DiskMoves(self._state)
        self._evictor = Evictor(self._state, disk_moves)
        self._writes = WritePath(self._state, self._evictor)
        self._batch_start = BatchStart(self._state, self._writes, MAX_VALUE_BYTES)
        self._view_version = view_version
        self.reads = ReadService(context, config.max_batch_keys)
        self.reads.disk = disk_moves
        self.disk = DiskTierService(context, disk_moves)
        self.sessions = SessionService(context)
        self.releases = ReleaseService(context)
        self.replicas = ReplicaService(context, config.max_batch_keys)
        self.tasks = TaskService(context)
        self.membership = MembershipService(context, view_version, self.tasks.drop_client)
        self._removals = RemovalService(context, self._remove_locked)

    # ------------------------------------------------------------------------------------------
    # Segments and liveness (:class:`~mooncake_py.master.service.membership.MembershipService`)

    def mount_segment(self, client_id: str, segment: SegmentInfo, tenant: str = "") -> ErrorCode:
        """See :meth:`MembershipService.mount_segment`."""
        return self.membership.mount_segment(client_id, segment, tenant)

    def remount_segments(
        self, client_id: str, segments: Sequence[SegmentInfo], tenant: str = ""
    ) -> ErrorCode:
        """See :meth:`MembershipService.remount_segments`."""
        return self.membership.remount_segments(client_id, segments, tenant)

    def bind_client(self, client_id: str, tenant: str) -> bool:
        """See :meth:`MembershipService.bind_client`."""
        return self.membership.bind_client(client_id, tenant)

    def unmount_segment(self, client_id: str, segment_id: str, tenant: str = "") -> ErrorCode:
        """:meth:`unmount_segment_sliced`, every slice back to back."""
        return drive(self.membership.unmount_segment_sliced(client_id, segment_id, tenant))

    def unmount_segment_sliced(
        self, client_id: str, segment_id: str, tenant: str = ""
    ) -> Steps[ErrorCode]:
        """See :meth:`MembershipService.unmount_segment_sliced`."""
        return (yield from self.membership.unmount_segment_sliced(client_id, segment_id, tenant))

    def ping(self, client_id: str) -> PingResult:
        """See :meth:`MembershipService.ping`."""
        return self.membership.ping(client_id)

    # ------------------------------------------------------------------------------------------
    # Remove family

    def remove(self, tenant: str, key: str, force: bool = False) -> ErrorCode:
        """Delete one key; see :meth:`batch_remove` (the same answers, without the slicing
        machinery)."""
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not self._batch_size_ok((key,)) or not valid_key(key):
            return ErrorCode.INVALID_PARAMS
        with self._lock:
            return self._remove_locked(resolved, key, force, self._begin_slice())

    def batch_remove(
        self, tenant: str, keys: Sequence[str], force: bool = False
    ) -> list[ErrorCode]:
        """Delete each key and free its memory.

        Per key: OK; OBJECT_NOT_FOUND; REPLICA_IS_NOT_READY while a write is in flight (even
        with ``force``); OBJECT_HAS_LEASE when a read lease is live and ``force`` is false.
        """
        return drive(self.batch_remove_sliced(tenant, keys, force))

    def batch_remove_sliced(
        self, tenant: str, keys: Sequence[str], force: bool = False
    ) -> Steps[list[ErrorCode]]:
        """:meth:`batch_remove` as a sliced operation."""
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not self._batch_size_ok(keys):
            return [ErrorCode.INVALID_PARAMS] * len(keys)
        scope: str = resolved  # narrowed for the closure

        def run(first: int, stop: int, now: float) -> list[ErrorCode]:
            return self._remove_run(scope, keys, force, first, stop, now)

        return (yield from map_runs_in_slices(self._lock, len(keys), self._begin_slice, run))

    def _remove_run(
        self, tenant: str, keys: Sequence[str], force: bool, first: int, stop: int, now: float
    ) -> list[ErrorCode]:
        """:meth:`_remove_locked` of ``keys[first:stop]`` in key order (INVALID_PARAMS for an
        invalid key), the plain objects removed together at the end of the run
        (:mod:`.plain_removal`): a key repeated after its plain object was taken answers
        OBJECT_NOT_FOUND, as it would once removed. O(stop - first)."""
        state = self._state
        get = self._objects.get
        results: list[ErrorCode] = []
        append = results.append
        plain: list[ObjectMetadata] = []
        replicas: list[Replica] = []
        taken: set[str] = set()
        for i in range(first, stop):
            key = keys[i]
            meta = get((tenant, key)) if key.__class__ is str else None
            if meta is None or key in taken:
                append(ErrorCode.OBJECT_NOT_FOUND if valid_key(key) else ErrorCode.INVALID_PARAMS)
                continue
            replica = plain_replica(state, meta)
            if replica is None:
                append(self._remove_locked(tenant, key, force, now))
                continue
            taken.add(key)
            plain.append(meta)
            replicas.append(replica)
            append(ErrorCode.OK)
        remove_plain(state, plain, replicas)
        return results

    def _remove_locked(self, tenant: str, key: str, force: bool, now: float) -> ErrorCode:
        meta = self._objects.get((tenant, key))
        if meta is None:
            return ErrorCode.OBJECT_NOT_FOUND
        if meta.is_writing():
            return ErrorCode.REPLICA_IS_NOT_READY
        if not force and self._state.is_leased(meta):
            return ErrorCode.OBJECT_HAS_LEASE
        self._state.release_replicas(meta, list(meta.replicas), now)
        return ErrorCode.OK

    def remove_by_regex(
        self, tenant: str, pattern: str, force: bool = False
    ) -> tuple[ErrorCode, int]:
        """Delete every key of the tenant that the RE2 ``pattern`` matches anywhere in.

        Works in slices, releasing the lock between them: see
        :mod:`~mooncake_py.master.service.removal` for the pattern syntax, the refusals and
        what the count means.

        Returns:
            (OK, count removed), or (INVALID_PARAMS, 0) for a pattern that is too long, does not
            compile or needs what RE2 leaves out (backreferences, lookaround), or a bad tenant.
            Keys that cannot be removed (leased, being written) are skipped silently.
        """
        return self._removals.remove_by_regex(tenant, pattern, force)

    def remove_by_regex_sliced(
        self, tenant: str, pattern: str, force: bool = False
    ) -> Steps[tuple[ErrorCode, int]]:
        """:meth:`remove_by_regex` as a sliced operation (what the transports run)."""
        return (yield from self._removals.remove_by_regex_sliced(tenant, pattern, force))

    def remove_all(self, tenant: str, force: bool = False) -> int:
        """Delete every removable object of the tenant; returns how many were removed.

        With multi-tenancy on, an empty ``tenant`` means every tenant (as upstream). Objects
        that cannot be removed (leased without ``force``, being written) are skipped. Works in
        slices, as :meth:`remove_by_regex`.
        """
        return self._removals.remove_all(tenant, force)

    def remove_all_sliced(self, tenant: str, force: bool = False) -> Steps[int]:
        """:meth:`remove_all` as a sliced operation (what the transports run)."""
        return (yield from self._removals.remove_all_sliced(tenant, force))

    # ------------------------------------------------------------------------------------------
    # Background steps

    def reap_expired_clients(self, now: float, drain: bool = True) -> list[str]:
        """See :meth:`MembershipService.reap_expired_clients`."""
        return self.membership.reap_expired_clients(now, drain)

    def continue_drains(self) -> bool:
        """See :meth:`MembershipService.continue_drains`."""
        return self.membership.continue_drains()

    def sweep_expired_puts(self, now: float) -> int:
        """Free writes that never ended within the release timeout and preempted writes whose
        time has come, end read leases whose TTL ran out (their readers died or hung), and
        give back the ranges of shared segments whose capabilities expired.

        Returns:
            The number of write replicas freed.
        """
        with self._lock:
            self._state.reads.expire_due(now)
            freed = self._writes.sweep_expired(now)
            self._state.segments.release_held_grants()
        self.tasks.sweep(now)  # replica tasks that overstayed fail, freeing their targets
        self.disk.expire_disk_tasks(now)
        return freed

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

    def stats(self, tenant: str = "", all_tenants: bool = True) -> dict[str, int]:
        """Counts and bytes for metrics and tests: store-wide with ``all_tenants``, else
        :func:`~.tenant_views.stats_of` ``tenant`` (its objects, usable segments, bytes,
        clients, sessions). O(segments) either way (and O(client bindings) for one tenant's
        clients): every figure is a kept counter."""
        with self._lock:
            if not all_tenants:
                return tenant_views.stats_of(self._state, self._resolve_tenant(tenant) or "")
            return tenant_views.store_stats(self._state)

    def tenant_figures(self) -> dict[str, dict[str, int]]:
        """Per-tenant figures for labelled gauges (see :func:`~.tenant_views.tenant_figures`):
        a new dict, consistent as of one hold of the lock. O(tenants with objects or
        sessions), never O(objects). Thread-safety: callable from any thread."""
        with self._lock:
            return tenant_views.tenant_figures(self._state)

    def segment_usage(
        self, tenant: str = "", all_tenants: bool = True
    ) -> list[tuple[SegmentInfo, str, int, int]]:
        """(segment, owning client, used bytes, allocations) for every mounted segment with
        ``all_tenants``, else for the segments ``tenant`` may use
        (:func:`~.tenant_views.segment_usage_of`)."""
        with self._lock:
            if not all_tenants:
                return tenant_views.segment_usage_of(
                    self._state, self._resolve_tenant(tenant) or ""
                )
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

    def kv_cache_state(self, tenant: str) -> str:
        """The tenant's KV-cache sleep state, ``"awake"`` or ``"kv_cache_released"`` (from a
        ``release_kv_cache`` that removed at least one of its objects until its next KV-cache
        write commits); see :meth:`~.release.ReleaseService.kv_cache_state`. O(1)."""
        return self.releases.kv_cache_state(tenant)

    # ------------------------------------------------------------------------------------------
    # Helpers

    def segment_of(self, segment_id: str) -> MountedSegment | None:
        """The mounted segment with this id (for tests and introspection)."""
        with self._lock:
            return self._segments.get(segment_id)

    def is_leased(self, tenant: str, key: str) -> bool:
        """Whether a read lease or existence hold protects the key (for tests and tools)."""
        with self._lock:
            meta = self._objects.get((self._resolve_tenant(tenant) or DEFAULT_TENANT, key))
            return meta is not None and self._state.is_leased(meta)

    def object_of(self, tenant: str, key: str) -> ObjectMetadata | None:
        """The metadata of one object (for tests and introspection); do not mutate it."""
        with self._lock:
            return self._objects.get((self._resolve_tenant(tenant) or DEFAULT_TENANT, key))
