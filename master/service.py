"""The master service facade: every master operation, with no transport in it.

State lives in small modules (:mod:`metadata`, :mod:`segments`, :mod:`liveness`,
:mod:`allocator`); this class validates requests, applies the store's rules (first writer wins,
read leases, put timeouts, client expiry) and keeps those modules consistent. The gRPC servicer
converts protobuf to the typed arguments here and back.

Background work is exposed as plain synchronous steps that take ``now``
(:meth:`MasterService.reap_expired_clients`, :meth:`MasterService.sweep_expired_puts`); timers in
:mod:`background` only call them, and tests call them directly with a fake clock.

Thread-safety: every public method takes ``self._lock``, one lock for all state, so calls are
atomic with respect to each other. Lock order: only this lock exists.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
import re
import threading
from collections.abc import Callable, Sequence

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import monotonic_clock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.liveness import ClientRegistry
from mooncake_py.master.metadata import (
    ObjectMetadata,
    ObjectTable,
    PendingSoftPin,
    Replica,
)
from mooncake_py.master.segments import MountedSegment, PlacementRequest, SegmentManager
from mooncake_py.types import (
    ClientStatus,
    PutStartResult,
    ReplicaDescriptor,
    ReplicaListResult,
    ReplicaStatus,
    ReplicateConfig,
    SegmentInfo,
    SoftPinAction,
)

SERVICE_VERSION = "mooncake-py/0.1.0"
DEFAULT_TENANT = "default"
MAX_KEY_BYTES = 4096
MAX_REPLICA_NUM = 64
# A value can be no larger than a segment; this bound only rejects nonsense early.
MAX_VALUE_BYTES = 1 << 50


@dataclasses.dataclass(frozen=True, slots=True)
class PingResult:
    """Answer to a heartbeat."""

    code: int
    client_status: ClientStatus
    view_version: int


@dataclasses.dataclass(order=True, slots=True)
class _DiscardedBuffer:
    """Memory of a preempted write, freed only when its old writer can no longer touch it."""

    release_at: float
    segment_id: str = dataclasses.field(compare=False)
    offset: int = dataclasses.field(compare=False)


class MasterService:
    """All master state and operations.

    Args:
        config: validated master configuration.
        clock: returns seconds; inject a ``FakeClock`` in tests.
        rng: random source for placement.
        view_version: identifies this master incarnation in ping answers; clients see it change
            across a restart.
    """

    def __init__(
        self,
        config: MasterConfig,
        clock: Callable[[], float] = monotonic_clock,
        rng: random.Random | None = None,
        view_version: int = 0,
    ) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._objects = ObjectTable()
        self._segments = SegmentManager(config.allocation_strategy, rng)
        self._clients = ClientRegistry(config.client_ttl)
        self._discarded: list[_DiscardedBuffer] = []
        self._replica_ids = itertools.count(1)
        self._view_version = view_version
        self._lease_ttl_s = config.default_kv_lease_ttl / 1000.0

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
        self._segments.unmount(segment_id)
        # Buffers waiting for release die with their segment; a remount of the same id starts
        # from an empty allocator that must not receive their frees.
        kept = [b for b in self._discarded if b.segment_id != segment_id]
        if len(kept) != len(self._discarded):
            heapq.heapify(kept)
            self._discarded = kept
        for object_id in self._objects.objects_on_segment(segment_id):
            meta = self._objects.get(object_id)
            if meta is None:
                continue
            lost = [r for r in meta.replicas if r.segment_id == segment_id]
            self._objects.drop_replicas(meta, lost)
            if not meta.replicas:
                self._objects.erase(object_id)

    # ------------------------------------------------------------------------------------------
    # Write path

    def put_start(
        self, client_id: str, tenant: str, key: str, size: int, config: ReplicateConfig
    ) -> PutStartResult:
        """Reserve replicas for a new object; see :meth:`batch_put_start`."""
        group_ids = config.group_ids
        if group_ids is not None and len(group_ids) != 1:
            return PutStartResult(ErrorCode.INVALID_PARAMS)
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
        NO_AVAILABLE_HANDLE when no segment can hold it; INVALID_PARAMS for a bad key or size.
        A malformed request (length mismatch, bad config, too many keys) fails every key with
        INVALID_PARAMS.

        Complexity: O(keys × placement).
        """
        invalid = [PutStartResult(ErrorCode.INVALID_PARAMS)] * len(keys)
        tenant_or_none = self._resolve_tenant(tenant)
        if (
            tenant_or_none is None
            or len(keys) != len(sizes)
            or not self._batch_size_ok(keys)
            or (config.group_ids is not None and len(config.group_ids) != len(keys))
        ):
            return invalid
        pending_pin = self._resolve_soft_pin(config)
        if pending_pin is None or not 1 <= config.replica_num <= MAX_REPLICA_NUM:
            return invalid
        with self._lock:
            now = self._clock()
            return [
                self._put_start_locked(
                    client_id, tenant_or_none, key, size, config, i, pending_pin, now
                )
                for i, (key, size) in enumerate(zip(keys, sizes, strict=True))
            ]

    def _put_start_locked(
        self,
        client_id: str,
        tenant: str,
        key: str,
        size: int,
        config: ReplicateConfig,
        index: int,
        pending_pin: PendingSoftPin,
        now: float,
    ) -> PutStartResult:
        if not _key_ok(key) or not 0 < size <= MAX_VALUE_BYTES:
            return PutStartResult(ErrorCode.INVALID_PARAMS)
        existing = self._objects.get((tenant, key))
        if existing is not None:
            started_recently = (
                existing.put_start_time + self.config.put_start_discard_timeout_sec >= now
            )
            if existing.is_readable() or started_recently:
                return PutStartResult(ErrorCode.OBJECT_ALREADY_EXISTS)
            self._preempt_locked(existing)
        allocations = self._segments.allocate(self._placement_request(size, config))
        if not allocations:
            return PutStartResult(ErrorCode.NO_AVAILABLE_HANDLE)
        replicas = [
            Replica(
                next(self._replica_ids), a.segment.info.id, a.offset, size, ReplicaStatus.PROCESSING
            )
            for a in allocations
        ]
        meta = ObjectMetadata(
            tenant=tenant,
            key=key,
            size=size,
            client_id=client_id,
            put_start_time=now,
            replicas=replicas,
            data_type=int(config.data_type),
            hard_pinned=config.with_hard_pin,
            pending_soft_pin=pending_pin,
            group_id=config.group_ids[index] if config.group_ids else "",
        )
        self._objects.insert(meta)
        return PutStartResult(ErrorCode.OK, tuple(self._describe(meta, r) for r in replicas))

    def _placement_request(self, size: int, config: ReplicateConfig) -> PlacementRequest:
        preferred = (
            (config.preferred_segment,)
            if config.preferred_segment
            else tuple(config.preferred_segments)
        )
        return PlacementRequest(
            size=size,
            replica_num=config.replica_num,
            preferred_names=preferred,
            writer_host_id=config.host_id,
            local_first=config.prefer_alloc_in_same_node,
        )

    def _preempt_locked(self, stale: ObjectMetadata) -> None:
        """Drop a stuck write; its buffers are freed only after the release timeout."""
        release_at = stale.put_start_time + self.config.put_start_release_timeout_sec
        for replica in stale.replicas:
            heapq.heappush(
                self._discarded, _DiscardedBuffer(release_at, replica.segment_id, replica.offset)
            )
        self._objects.erase(stale.object_id)

    def put_end(self, client_id: str, tenant: str, key: str) -> ErrorCode:
        """Make a written object visible; see :meth:`batch_put_end`."""
        return self.batch_put_end(client_id, tenant, [key])[0]

    def batch_put_end(self, client_id: str, tenant: str, keys: Sequence[str]) -> list[ErrorCode]:
        """Mark each key's in-flight replicas COMPLETE, atomically making the object readable.

        Per key: OK (also when every replica is already COMPLETE, so a retry is harmless);
        OBJECT_NOT_FOUND; ILLEGAL_CLIENT when another client started the write; INVALID_WRITE
        when nothing is in flight.
        """
        return self._per_key(
            tenant, keys, lambda t, k, now: self._put_end_locked(client_id, t, k, now)
        )

    def _put_end_locked(self, client_id: str, tenant: str, key: str, now: float) -> ErrorCode:
        meta = self._objects.get((tenant, key))
        if meta is None:
            return ErrorCode.OBJECT_NOT_FOUND
        if meta.client_id != client_id:
            return ErrorCode.ILLEGAL_CLIENT
        if not meta.is_writing():
            return ErrorCode.OK if meta.is_readable() else ErrorCode.INVALID_WRITE
        self._objects.mark_complete(meta)
        self._commit_soft_pin(meta, now)
        meta.grant_lease(now, 0.0)
        return ErrorCode.OK

    def put_revoke(self, client_id: str, tenant: str, key: str) -> ErrorCode:
        """Abandon a write; see :meth:`batch_put_revoke`."""
        return self.batch_put_revoke(client_id, tenant, [key])[0]

    def batch_put_revoke(self, client_id: str, tenant: str, keys: Sequence[str]) -> list[ErrorCode]:
        """Free each key's in-flight replicas; an object left with none disappears.

        Per key: OK; OBJECT_NOT_FOUND; ILLEGAL_CLIENT; INVALID_WRITE when nothing is in flight.
        """
        return self._per_key(
            tenant, keys, lambda t, k, now: self._put_revoke_locked(client_id, t, k, now)
        )

    def _put_revoke_locked(self, client_id: str, tenant: str, key: str, now: float) -> ErrorCode:
        meta = self._objects.get((tenant, key))
        if meta is None:
            return ErrorCode.OBJECT_NOT_FOUND
        if meta.client_id != client_id:
            return ErrorCode.ILLEGAL_CLIENT
        doomed = meta.processing_replicas()
        if not doomed:
            return ErrorCode.INVALID_WRITE
        self._release_replicas(meta, doomed, now)
        return ErrorCode.OK

    def _release_replicas(self, meta: ObjectMetadata, doomed: list[Replica], now: float) -> None:
        """Free ``doomed`` replicas; erase the object if nothing is left.

        Memory under a live read lease is quarantined until the lease ends instead of being
        freed: a reader may still be copying out of it, and its transfer is only trusted while
        the lease holds, so the bytes it sees are never overwritten by a new writer first.
        """
        for replica in doomed:
            if meta.has_live_lease(now):
                self._discard(replica, meta.lease_timeout)
            else:
                self._segments.free(replica.segment_id, replica.offset)
        self._objects.drop_replicas(meta, doomed)
        if not meta.replicas:
            self._objects.erase(meta.object_id)

    def _discard(self, replica: Replica, release_at: float) -> None:
        heapq.heappush(
            self._discarded, _DiscardedBuffer(release_at, replica.segment_id, replica.offset)
        )

    def _resolve_soft_pin(self, config: ReplicateConfig) -> PendingSoftPin | None:
        """The soft-pin request of a write, or None when it is invalid."""
        try:
            action = SoftPinAction(config.soft_pin_action)
        except ValueError:
            return None
        ttl = config.soft_pin_ttl_ms
        if action != SoftPinAction.ENABLE:
            return None if ttl is not None else PendingSoftPin(action, 0)
        ttl = self.config.default_kv_soft_pin_ttl if ttl is None else ttl
        if not 0 <= ttl <= self.config.max_kv_soft_pin_ttl:
            return None
        return PendingSoftPin(action, ttl)

    @staticmethod
    def _commit_soft_pin(meta: ObjectMetadata, now: float) -> None:
        pending = meta.pending_soft_pin
        meta.pending_soft_pin = None
        if pending is None or pending.action == SoftPinAction.PRESERVE:
            return
        if pending.action == SoftPinAction.ENABLE and pending.ttl_ms > 0:
            meta.soft_pin_deadline = now + pending.ttl_ms / 1000.0
        else:
            meta.soft_pin_deadline = 0.0

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
        if not _key_ok(key):
            return ReplicaListResult(ErrorCode.INVALID_PARAMS)
        meta = self._objects.get((tenant, key))
        if meta is None:
            return ReplicaListResult(ErrorCode.OBJECT_NOT_FOUND)
        readable = meta.complete_replicas()
        if not readable:
            return ReplicaListResult(ErrorCode.REPLICA_IS_NOT_READY)
        meta.grant_lease(now, self._lease_ttl_s)
        return ReplicaListResult(
            ErrorCode.OK,
            tuple(self._describe(meta, r) for r in readable),
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
        with self._lock:
            now = self._clock()
            for key in keys:
                if not _key_ok(key):
                    results.append(int(ErrorCode.INVALID_PARAMS))
                    continue
                meta = self._objects.get((resolved, key))
                if meta is None or not meta.is_readable():
                    results.append(0)
                else:
                    meta.grant_lease(now, self._lease_ttl_s)
                    results.append(1)
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
        self._release_replicas(meta, list(meta.replicas), now)
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
        everyone = self.config.enable_multi_tenants and tenant == ""
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
        freed = 0
        with self._lock:
            while self._discarded and self._discarded[0].release_at <= now:
                buffer = heapq.heappop(self._discarded)
                self._segments.free(buffer.segment_id, buffer.offset)
                freed += 1
            deadline = self.config.put_start_release_timeout_sec
            for object_id, started in self._objects.oldest_processing():
                if started + deadline > now:
                    break
                meta = self._objects.get(object_id)
                if meta is not None:
                    stale = meta.processing_replicas()
                    self._release_replicas(meta, stale, now)
                    freed += len(stale)
        return freed

    # ------------------------------------------------------------------------------------------
    # Introspection

    def stats(self) -> dict[str, int]:
        """Counts and bytes for metrics and tests."""
        with self._lock:
            return {
                "objects": len(self._objects),
                "segments": len(self._segments.all_segments()),
                "capacity_bytes": self._segments.capacity_bytes(),
                "allocated_bytes": self._segments.used_bytes(),
                "clients": len(self._clients),
                "active_clients": self._clients.active_count,
                "discarded_buffers": len(self._discarded),
            }

    def check(self) -> None:
        """Verify every invariant across the state modules. O(state).

        Raises:
            AssertionError: state is inconsistent.
        """
        with self._lock:
            self._objects.check()
            self._segments.check()
            live: dict[str, int] = {}
            for meta in self._objects:
                for replica in meta.replicas:
                    if self._segments.get(replica.segment_id) is None:
                        raise AssertionError(f"{meta.object_id!r} has a replica on a gone segment")
                    live[replica.segment_id] = live.get(replica.segment_id, 0) + 1
            discarded: dict[str, int] = {}
            for buffer in self._discarded:
                discarded[buffer.segment_id] = discarded.get(buffer.segment_id, 0) + 1
            for mounted in self._segments.all_segments():
                sid = mounted.info.id
                expected = live.get(sid, 0) + discarded.get(sid, 0)
                if mounted.allocator.allocation_count != expected:
                    raise AssertionError(f"segment {sid}: allocations leak or double-free")

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
                step(resolved, k, now) if _key_ok(k) else ErrorCode.INVALID_PARAMS for k in keys
            ]

    def _batch_size_ok(self, keys: Sequence[str]) -> bool:
        return len(keys) <= self.config.max_batch_keys

    def _resolve_tenant(self, tenant: str) -> str | None:
        """The effective tenant, or None when the id is invalid."""
        if not self.config.enable_multi_tenants:
            return DEFAULT_TENANT
        if not tenant:
            return DEFAULT_TENANT
        if tenant.startswith("_") or any(ord(c) < 32 or ord(c) == 127 for c in tenant):
            return None
        return tenant

    def _describe(self, meta: ObjectMetadata, replica: Replica) -> ReplicaDescriptor:
        segment = self._segments.get(replica.segment_id)
        info = segment.info if segment is not None else _GONE_SEGMENT
        return ReplicaDescriptor(
            id=replica.id,
            status=replica.status,
            segment_id=replica.segment_id,
            segment_name=info.name,
            offset=replica.offset,
            size=meta.size,
            te_endpoint=info.te_endpoint,
            host_id=info.host_id,
            shm_path=info.shm_path,
        )

    def segment_of(self, segment_id: str) -> MountedSegment | None:
        """The mounted segment with this id (for tests and introspection)."""
        with self._lock:
            return self._segments.get(segment_id)

    def object_of(self, tenant: str, key: str) -> ObjectMetadata | None:
        """The metadata of one object (for tests and introspection); do not mutate it."""
        with self._lock:
            return self._objects.get((self._resolve_tenant(tenant) or DEFAULT_TENANT, key))


_GONE_SEGMENT = SegmentInfo(id="", name="", base=1, size=1, te_endpoint="")


def _key_ok(key: str) -> bool:
    # A UTF-8 character takes at most 4 bytes, so short keys need no encoding to be checked.
    if len(key) <= MAX_KEY_BYTES // 4:
        return len(key) > 0
    return len(key.encode("utf-8", "surrogatepass")) <= MAX_KEY_BYTES
