"""Rows: the master's state as the replicated log and the snapshots carry it.

Three conversions live here, and only here:

- **capture** (:class:`RowCapture`): the current image of one live object, session, segment,
  client or allocator range, as a ``mooncake_py._wire.ha_records`` row; and a whole record from
  the journal's dirty sets (:meth:`RowCapture.record`);
- **image** (:class:`RowImage`): rows by key, as a standby or a recovering master holds them
  while it reads records (:meth:`RowImage.apply`: last image wins, a removal deletes);
- **restore** (:func:`~.restore.restore_into`, in :mod:`.restore`): a row image becomes a
  live :class:`StoreState`.

Times on the service clock (monotonic, different on every master) travel as wall-clock
milliseconds: ``wall = wall_now + (t - clock_now)``, and back. Only what a new leader needs to
serve the same objects with the same guarantees travels: not the eviction order, read leases,
ping deadlines or replica tasks. A read lease is covered otherwise: every allocator range no
restored object holds is freed only after the longest time a reader or a writer may still
touch it (see :func:`~.restore.restore_into`).

Thread-safety: capture and restore run under the service lock; an image belongs to one task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import TypeVar

from mooncake_py._wire import ha_records

from ..state.disk_space import DiskSpace
from ..state.objects import ObjectMetadata
from ..state.store import StoreState
from .journal import DirtyRows

T = TypeVar("T")

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
        """The image of one object (its session memberships travel apart). O(replicas)."""
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
            attempt_id=self._state.objects.attempt_of(meta.object_id),
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
            disk=info.disk,
            next_offset=mounted.allocator.next_offset
            if isinstance(mounted.allocator, DiskSpace)
            else 0,
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
        record = LogRecord()
        for part in self.records(dirty, len(dirty) + 1):
            record.MergeFrom(part)
        record.seq = seq
        return record

    def records(self, dirty: DirtyRows, rows_per_record: int) -> Iterator[LogRecord]:
        """The records carrying every row in ``dirty``, ``rows_per_record`` rows at a time
        (unnumbered: ``seq`` 0). A generator: the caller holds the service lock around each
        ``next()`` and may let other calls run in between (a row changed meanwhile is marked
        dirty again, so a later record carries its newer image).

        The first record carries the withdrawals, segments, sessions and clients, then the
        memberships and the ranges as they were marked; each later one carries objects, each
        with the *current* range of every replica it names, read in the same hold of the lock:
        a record never names a replica whose range it does not hold, even when the range was
        allocated after the journal was taken (that allocation's own mark is in the next
        flush, which may never be stored).

        Complexity: O(rows_per_record) per step.
        """
        times = self._times()
        record = LogRecord(wall_ms=times.wall_ms)
        self._other_rows(record, dirty, times)
        self._stamp(record)
        yield record
        for members in _chunks(list(dirty.memberships.items()), rows_per_record):
            record = LogRecord(wall_ms=times.wall_ms)
            for (tenant, key, session_id), present in members:
                record.memberships.add(
                    tenant=tenant, key=key, session_id=session_id, present=present
                )
            self._stamp(record)
            yield record
        marked = [(s, o, n) for s, held in dirty.ranges.items() for o, n in held.items()]
        for held_ranges in _chunks(marked, rows_per_record):
            record = LogRecord(wall_ms=times.wall_ms)
            for segment_id, offset, size in held_ranges:
                record.ranges.add(segment_id=segment_id, offset=offset, size=size)
            self._stamp(record)
            yield record
        table = self._state.objects
        segments = self._state.segments
        for object_ids in _chunks(list(dirty.objects), rows_per_record):
            times = self._times()
            record = LogRecord(wall_ms=times.wall_ms)
            for object_id in object_ids:
                meta = table.get(object_id)
                if meta is None:
                    record.removed_objects.add(tenant=object_id[0], key=object_id[1])
                    continue
                record.objects.append(self.object_row(meta, times))
                for replica in meta.replicas:
                    mounted = segments.get(replica.segment_id)
                    if mounted is not None:
                        size = mounted.allocator.size_of(replica.offset)
                        record.ranges.add(
                            segment_id=replica.segment_id, offset=replica.offset, size=size
                        )
            self._stamp(record)
            yield record

    def _other_rows(self, record: LogRecord, dirty: DirtyRows, times: TimeBase) -> None:
        """Withdrawals, sessions, segments and clients of ``dirty`` into ``record``."""
        record.unmounted_segments.extend(sorted(dirty.unmounted))
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
        memberships: per object (tenant, key), the ids of the sessions holding it.
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
        self.memberships: dict[tuple[str, str], set[str]] = {}
        self.ranges: dict[str, dict[int, int]] = {}
        self.next_write_id = 1
        self.next_replica_id = 1
        self.kv_cache_released_tenants: set[str] = set()

    def replace_with(self, other: RowImage) -> None:
        """Become ``other`` (a newer image loaded from a snapshot), in place. O(1)."""
        self.__dict__.update(other.__dict__)

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
        for segment_id in record.unmounted_segments:
            # Withdrawn (maybe mounted again since): the old mount's ranges are gone.
            self.segments.pop(segment_id, None)
            self.ranges.pop(segment_id, None)
        for segment in record.segments:
            self.segments[segment.id] = segment
            self.ranges.setdefault(segment.id, {})
        for segment_id in record.removed_segments:
            self.segments.pop(segment_id, None)
            self.ranges.pop(segment_id, None)
        objects = self.objects
        memberships = self.memberships
        for row in record.objects:
            objects[(row.tenant, row.key)] = row
        for gone in record.removed_objects:
            objects.pop((gone.tenant, gone.key), None)
        for member in record.memberships:
            object_key = (member.tenant, member.key)
            held = memberships.get(object_key)
            if member.present:
                if held is None:
                    held = memberships[object_key] = set()
                held.add(member.session_id)
            elif held is not None:
                held.discard(member.session_id)
                if not held:
                    del memberships[object_key]
        for session in record.sessions:
            self.sessions[(session.tenant, session.session_id)] = session
        for gone in record.removed_sessions:
            self.sessions.pop((gone.tenant, gone.key), None)
        for client in record.clients:
            self.clients[client.client_id] = client
        for client_id in record.removed_clients:
            self.clients.pop(client_id, None)
        for held_range in record.ranges:
            ranges = self.ranges.get(held_range.segment_id)
            if ranges is None:
                continue  # a range of a segment withdrawn since
            if held_range.size:
                ranges[held_range.offset] = held_range.size
            else:
                ranges.pop(held_range.offset, None)
        self.next_write_id = max(self.next_write_id, record.next_write_id)
        self.next_replica_id = max(self.next_replica_id, record.next_replica_id)
        self.kv_cache_released_tenants = set(record.kv_cache_released_tenants)
        self.seq = record.seq

    def __len__(self) -> int:
        return len(self.objects)


def _chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
