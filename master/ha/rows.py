"""Rows: the master's state as the replicated log and the snapshots carry it.

Three conversions live here, and only here:

- **capture** (:class:`RowCapture`): the current image of one live object, session, segment,
  client or allocator range, as a ``mooncake_py._wire.ha_records`` row; and a whole record from
  the journal's dirty sets (:meth:`RowCapture.record`);
- **image** (:class:`RowImage`): rows by key, as a standby or a recovering master holds them
  while it reads records (:meth:`RowImage.apply`: last image wins, a removal deletes);
- **restore** (:func:`restore_into`): a row image becomes a live :class:`StoreState`.

Times on the service clock (monotonic, different on every master) travel as wall-clock
milliseconds: ``wall = wall_now + (t - clock_now)``, and back. Only what a new leader needs to
serve the same objects with the same guarantees travels: not the eviction order, read leases,
ping deadlines or replica tasks. A read lease is covered otherwise: every allocator range no
restored object holds is freed only after the longest time a reader or a writer may still
touch it (see :func:`restore_into`).

Thread-safety: capture and restore run under the service lock; an image belongs to one task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator

from mooncake_py._wire import ha_records
from mooncake_py.types import ReplicaStatus, SegmentInfo, SoftPinAction

from ..state.objects import ObjectMetadata, PendingSoftPin, Replica
from ..state.store import StoreState
from .journal import DirtyRows

ObjectRow = ha_records.ObjectRow
SessionRow = ha_records.SessionRow
SegmentRow = ha_records.SegmentRow
ClientRow = ha_records.ClientRow
LogRecord = ha_records.LogRecord


@dataclasses.dataclass(frozen=True, slots=True)
class TimeBase:
    """One instant on both clocks: ``clock_now`` on the service clock (s), ``wall_ms``."""

    clock_now: float
    wall_ms: int

    def to_wall(self, t: float) -> int:
        """Service-clock seconds -> wall ms (0 stays 0: "none")."""
        return 0 if t == 0 else self.wall_ms + round((t - self.clock_now) * 1000)

    def to_clock(self, wall_ms: int) -> float:
        """Wall ms -> service-clock seconds (0 stays 0)."""
        return 0.0 if wall_ms == 0 else self.clock_now + (wall_ms - self.wall_ms) / 1000.0


class RowCapture:
    """Reads rows out of a live state.

    Args:
        state: the state (read under the service lock).
        times: returns the current :class:`TimeBase`.
    """

    def __init__(self, state: StoreState, times: Callable[[], TimeBase]) -> None:
        self._state = state
        self._times = times

    def object_row(self, meta: ObjectMetadata, times: TimeBase) -> ha_records.ObjectRow:
        """The image of one object. O(replicas + sessions)."""
        row = ObjectRow(
            tenant=meta.object_id[0],
            key=meta.object_id[1],
            size=meta.size,
            client_id=meta.client_id,
            put_start_ms=times.to_wall(meta.put_start_time),
            data_type=meta.data_type,
            write_id=meta.write_id,
            hard_pinned=meta.hard_pinned,
            soft_pin_deadline_ms=times.to_wall(meta.soft_pin_deadline),
            group_id=meta.group_id,
        )
        for replica in meta.replicas:
            row.replicas.add(
                id=replica.id,
                segment_id=replica.segment_id,
                offset=replica.offset,
                size=replica.size,
                status=int(replica.status),
            )
        pending = meta.pending_soft_pin
        if pending is not None:
            row.has_pending_pin = True
            row.pending_pin_action = int(pending.action)
            row.pending_pin_ttl_ms = pending.ttl_ms
        if meta.sessions:
            row.sessions.extend(sorted(s.session_id for s in meta.sessions))
        return row

    def session_row(self, tenant: str, session_id: str, times: TimeBase) -> SessionRow | None:
        """The image of one session, or None when it is gone. O(1)."""
        session = self._state.sessions.get(tenant, session_id)
        if session is None:
            return None
        return SessionRow(
            tenant=tenant,
            session_id=session_id,
            pinned=session.pinned,
            created_ms=times.to_wall(session.created_at),
            last_active_ms=times.to_wall(session.last_active_at),
        )

    def segment_row(self, segment_id: str) -> SegmentRow | None:
        """The image of one mounted segment, or None when it is not mounted. O(1)."""
        mounted = self._state.segments.get(segment_id)
        if mounted is None:
            return None
        info = mounted.info
        return SegmentRow(
            id=info.id,
            name=info.name,
            base=info.base,
            size=info.size,
            te_endpoint=info.te_endpoint,
            protocol=info.protocol,
            host_id=info.host_id,
            shared=info.shared,
            capability_key=info.capability_key,
            client_id=mounted.client_id,
            tenant=mounted.tenant,
        )

    def client_row(self, client_id: str) -> ClientRow | None:
        """The image of one client's binding and standing, or None when it is unknown."""
        clients = self._state.clients
        tenant = clients.tenant_of(client_id)
        ok = clients.is_ok(client_id)
        if tenant is None and not ok:
            return None  # a segment's owner needs no row: restore registers it anyway
        return ClientRow(client_id=client_id, bound=tenant is not None, tenant=tenant or "", ok=ok)

    def record(self, seq: int, dirty: DirtyRows) -> LogRecord:
        """The record carrying every row in ``dirty``: current images, or removals.

        Complexity: O(dirty rows × their size).
        """
        parts = list(self.records(dirty, len(dirty) + 1))
        assert len(parts) == 1
        parts[0].seq = seq
        return parts[0]

    def records(self, dirty: DirtyRows, rows_per_record: int) -> Iterator[LogRecord]:
        """The records carrying every row in ``dirty``, ``rows_per_record`` object and range
        rows at a time (unnumbered: ``seq`` 0). A generator: the caller holds the service lock
        around each ``next()`` and may let other calls run in between (a row changed meanwhile
        is marked dirty again, so a later record carries its newer image). The first record
        carries the segments, sessions and clients, so every range follows its segment.

        Complexity: O(rows_per_record) per step.
        """
        objects = list(dirty.objects)
        ranges = list(dirty.ranges.items())
        first = True
        position = 0
        while first or position < len(objects) or ranges:
            times = self._times()
            record = LogRecord(wall_ms=times.wall_ms)
            if first:
                self._other_rows(record, dirty, times)
                first = False
            chunk = objects[position : position + rows_per_record]
            position += len(chunk)
            table = self._state.objects
            for object_id in chunk:
                meta = table.get(object_id)
                if meta is None:
                    record.removed_objects.add(tenant=object_id[0], key=object_id[1])
                else:
                    record.objects.append(self.object_row(meta, times))
            if position >= len(objects):
                taken, ranges = ranges[:rows_per_record], ranges[rows_per_record:]
                for (segment_id, offset), size in taken:
                    record.ranges.add(segment_id=segment_id, offset=offset, size=size)
            self._stamp(record)
            yield record

    def _other_rows(self, record: LogRecord, dirty: DirtyRows, times: TimeBase) -> None:
        """Sessions, segments and clients of ``dirty`` into ``record``."""
        for tenant, session_id in dirty.sessions:
            session_row = self.session_row(tenant, session_id, times)
            if session_row is None:
                record.removed_sessions.add(tenant=tenant, key=session_id)
            else:
                record.sessions.append(session_row)
        for segment_id in dirty.segments:
            segment_row = self.segment_row(segment_id)
            if segment_row is None:
                record.removed_segments.append(segment_id)
            else:
                record.segments.append(segment_row)
        for client_id in dirty.clients:
            client_row = self.client_row(client_id)
            if client_row is None:
                record.removed_clients.append(client_id)
            else:
                record.clients.append(client_row)

    def _stamp(self, record: LogRecord) -> None:
        state = self._state
        record.next_write_id, record.next_replica_id = state.peek_next_ids()
        record.kv_cache_released_tenants.extend(sorted(state.kv_cache_released_tenants))


class RowImage:
    """Rows by key: the state a sequence of records (after a snapshot) describes.

    Attributes:
        seq: the last record applied (or the snapshot's).
        objects, sessions, segments, clients: rows by key.
        ranges: per segment, offset -> rounded size held.
        next_write_id, next_replica_id: the leader's id counters at ``seq``.
        kv_cache_released_tenants: as of ``seq``.
    """

    def __init__(self) -> None:
        self.seq = 0
        self.objects: dict[tuple[str, str], ObjectRow] = {}
        self.sessions: dict[tuple[str, str], SessionRow] = {}
        self.segments: dict[str, SegmentRow] = {}
        self.clients: dict[str, ClientRow] = {}
        self.ranges: dict[str, dict[int, int]] = {}
        self.next_write_id = 1
        self.next_replica_id = 1
        self.kv_cache_released_tenants: set[str] = set()

    def apply(self, record: LogRecord) -> None:
        """Apply one record (the one after :attr:`seq`; an older one is ignored).

        Raises:
            ValueError: a record was skipped (``record.seq > seq + 1``).

        Complexity: O(rows in the record).
        """
        if record.seq <= self.seq:
            return
        if record.seq != self.seq + 1:
            raise ValueError(f"record {record.seq} does not follow {self.seq}")
        objects = self.objects
        for row in record.objects:
            objects[(row.tenant, row.key)] = row
        for gone in record.removed_objects:
            objects.pop((gone.tenant, gone.key), None)
        for session in record.sessions:
            self.sessions[(session.tenant, session.session_id)] = session
        for gone in record.removed_sessions:
            self.sessions.pop((gone.tenant, gone.key), None)
        for segment in record.segments:
            self.segments[segment.id] = segment
            self.ranges.setdefault(segment.id, {})
        for segment_id in record.removed_segments:
            self.segments.pop(segment_id, None)
            self.ranges.pop(segment_id, None)
        for client in record.clients:
            self.clients[client.client_id] = client
        for client_id in record.removed_clients:
            self.clients.pop(client_id, None)
        for held in record.ranges:
            ranges = self.ranges.get(held.segment_id)
            if ranges is None:
                continue  # a range of a segment withdrawn since
            if held.size:
                ranges[held.offset] = held.size
            else:
                ranges.pop(held.offset, None)
        self.next_write_id = max(self.next_write_id, record.next_write_id)
        self.next_replica_id = max(self.next_replica_id, record.next_replica_id)
        self.kv_cache_released_tenants = set(record.kv_cache_released_tenants)
        self.seq = record.seq

    def __len__(self) -> int:
        return len(self.objects)


@dataclasses.dataclass(frozen=True, slots=True)
class RestoreReport:
    """What :func:`restore_into` did.

    Attributes:
        objects: objects restored.
        dropped_objects: object rows dropped (no replica on a restored segment, or a range
            that does not fit the segment).
        sessions: sessions restored.
        segments: segments restored.
        quarantined: allocator ranges held by no restored object, freed after the quarantine.
    """

    objects: int
    dropped_objects: int
    sessions: int
    segments: int
    quarantined: int


def restore_into(
    state: StoreState, image: RowImage, times: TimeBase, quarantine_s: float
) -> RestoreReport:
    """Rebuild a fresh ``state`` (nothing mounted, no object) from ``image``.

    Segments are mounted for their owners, who get a fresh ping deadline (``client_ttl``
    from now: a segment whose owner never speaks to this master again goes with the owner,
    its objects with it). Every allocator range the leader held is held again; the ranges
    no restored object owns (reads, preempted writes, replica tasks, capability holds in
    flight on the old leader) are freed ``quarantine_s`` from now, the longest any of those
    may still touch them, and so is every range freed before then (a reader of the old
    leader may still be copying an object removed right after the restore). Objects keep
    their replicas, write ids, pins and sessions; a replica on a segment that did not
    survive is dropped, an object left without replicas too. The id counters continue after
    the leader's.

    Returns:
        What was restored and dropped.

    Raises:
        ValueError: ``state`` is not fresh.

    Complexity: O(rows × log ranges per segment).
    """
    if len(state.objects) or state.segments.all_segments():
        raise ValueError("restore needs a fresh state")
    now = times.clock_now
    for segment in image.segments.values():
        info = SegmentInfo(
            id=segment.id,
            name=segment.name,
            base=segment.base,
            size=segment.size,
            te_endpoint=segment.te_endpoint,
            protocol=segment.protocol or "tcp",
            host_id=segment.host_id,
            shared=segment.shared,
            capability_key=segment.capability_key,
        )
        mounted = state.segments.mount(segment.client_id, info, segment.tenant)
        mounted.allocator.restore_allocations(image.ranges.get(segment.id, {}).items())
    for client in _clients_to_restore(image):
        if client.bound:
            state.clients.bind(client.client_id, client.tenant, now)
        state.clients.touch(client.client_id, now)
        if client.ok:
            state.clients.mark_ok(client.client_id)
    owned: dict[str, set[int]] = {segment_id: set() for segment_id in image.segments}
    restored = dropped = 0
    for row in image.objects.values():
        meta = _object_of(row, times, image, owned)
        if meta is None:
            dropped += 1
            continue
        state.objects.insert(meta)
        if meta.is_readable() and not meta.hard_pinned:
            state.policy.on_created(meta.object_id)
        if meta.soft_pin_deadline > now:
            state.note_soft_pin(meta.soft_pin_deadline)
        restored += 1
    sessions = _restore_sessions(state, image, times)
    until_ms = times.wall_ms + round(quarantine_s * 1000)
    quarantined = _quarantine_orphans(state, image, owned, until_ms)
    state.restore_next_ids(image.next_write_id, image.next_replica_id)
    state.kv_cache_released_tenants = set(image.kv_cache_released_tenants)
    return RestoreReport(restored, dropped, sessions, len(image.segments), quarantined)


def _clients_to_restore(image: RowImage) -> Iterable[ClientRow]:
    seen = set(image.clients)
    yield from image.clients.values()
    for row in image.segments.values():
        if row.client_id not in seen:
            seen.add(row.client_id)
            yield ClientRow(client_id=row.client_id)


def _object_of(
    row: ObjectRow, times: TimeBase, image: RowImage, owned: dict[str, set[int]]
) -> ObjectMetadata | None:
    replicas = []
    for r in row.replicas:
        held = image.ranges.get(r.segment_id)
        if held is None or held.get(r.offset, 0) < r.size or r.offset in owned[r.segment_id]:
            continue  # its segment is gone, or the range is not (or no longer only) its own
        owned[r.segment_id].add(r.offset)
        replicas.append(Replica(r.id, r.segment_id, r.offset, r.size, ReplicaStatus(r.status)))
    if not replicas:
        return None
    meta = ObjectMetadata(
        row.tenant,
        row.key,
        row.size,
        row.client_id,
        times.to_clock(row.put_start_ms),
        tuple(replicas),
        data_type=row.data_type,
        write_id=row.write_id,
        hard_pinned=row.hard_pinned,
        soft_pin_deadline=times.to_clock(row.soft_pin_deadline_ms),
        pending_soft_pin=(
            PendingSoftPin(SoftPinAction(row.pending_pin_action), row.pending_pin_ttl_ms)
            if row.has_pending_pin
            else None
        ),
        group_id=row.group_id,
    )
    return meta


def _restore_sessions(state: StoreState, image: RowImage, times: TimeBase) -> int:
    """Attach every restored object to its sessions, then give each session its fields."""
    registry = state.sessions
    for row in image.objects.values():
        if not row.sessions:
            continue
        meta = state.objects.get((row.tenant, row.key))
        if meta is None:
            continue
        live = [s for s in row.sessions if (row.tenant, s) in image.sessions]
        if live:
            registry.add(meta, live, times.clock_now)
    count = 0
    for (tenant, session_id), srow in image.sessions.items():
        session = registry.get(tenant, session_id)
        if session is None:
            continue  # every member is gone
        session.created_at = times.to_clock(srow.created_ms)
        session.last_active_at = times.to_clock(srow.last_active_ms)
        session.pinned = srow.pinned
        count += 1
    return count


def _quarantine_orphans(
    state: StoreState, image: RowImage, owned: dict[str, set[int]], until_ms: int
) -> int:
    """Hold every range no restored object owns until ``until_ms`` (wall clock), and every
    range freed before then too (freed by the usual sweep of held ranges)."""
    holds = state.segments.grant_holds
    holds.floor_ms = max(holds.floor_ms, until_ms)
    count = 0
    for segment_id, ranges in image.ranges.items():
        if segment_id not in image.segments:
            continue
        mine = owned.get(segment_id, set())
        for offset in ranges:
            if offset not in mine:
                holds.hold(segment_id, offset, until_ms)
                count += 1
    return count
