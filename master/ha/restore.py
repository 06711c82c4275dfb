"""Restore: a row image (:class:`~.rows.RowImage`) becomes a live state.

A standby that wins the election and a master restarting on its log both end here. The work
grows with the store, so it runs in slices (:func:`restore_sliced`): the caller holds the
service lock for each step and yields to its event loop in between, so the election's lease
keeps being renewed while a large state is rebuilt.

Thread-safety: each step runs under the service lock of a master that serves nothing yet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Iterator

from mooncake_py.types import ReplicaStatus, SegmentInfo, SoftPinAction

from ..state.disk_space import DiskSpace
from ..state.objects import ObjectMetadata, PendingSoftPin, Replica
from ..state.store import StoreState
from .rows import ObjectRow, RowImage, SegmentRow, TimeBase

DISK_EXTENT = 1 << 63
"""Where a disk tier's virtual offsets end, for the overlap and orphan walks."""
OBJECTS_PER_STEP = 4096
"""Objects restored per step of :func:`restore_sliced` (a few tens of milliseconds)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RestoreReport:
    """What a restore did.

    Attributes:
        objects: objects restored.
        dropped_objects: object rows dropped (no replica on a restored segment, or a range
            not held for it).
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
    state: StoreState,
    image: RowImage,
    times: TimeBase,
    quarantine_s: float,
    free_hold_s: float | None = None,
) -> RestoreReport:
    """:func:`restore_sliced` run to the end at once (tests, small states)."""
    steps = restore_sliced(state, image, times, quarantine_s, free_hold_s)
    while True:
        report = next(steps)
        if report is not None:
            return report


def restore_sliced(
    state: StoreState,
    image: RowImage,
    times: TimeBase,
    quarantine_s: float,
    free_hold_s: float | None = None,
) -> Iterator[RestoreReport | None]:
    """Rebuild a fresh ``state`` (nothing mounted, no object) from ``image``, in steps: each
    ``next()`` does a bounded part and yields None; the last yields the report.

    Segments are mounted for their owners; owners that were in good standing (or own a
    segment) get a fresh ping deadline (``client_ttl`` from now: a segment whose owner never
    speaks to this master again goes with the owner, its objects with it). Every allocator
    range the leader held is held again; the ranges no restored object owns (reads,
    preempted writes, replica tasks, capability holds in flight on the old leader) are freed
    ``quarantine_s`` from now, the longest any of those may still touch them; a range freed
    within ``free_hold_s`` (default ``quarantine_s``) is held until then too (a reader of the
    old leader, whose lease this master does not know, may still be copying an object
    removed right after the restore: the read lease or capability TTL is enough). Objects
    keep their replicas, write ids, pins, group and sessions; a replica on a segment that
    did not survive, or on a range not held for it, is dropped, an object left without
    replicas too. The id counters continue after the
    leader's. Ranges claimed twice or past a segment's end (a torn flush: some rows of a
    flush stored, the rest not) never stop a restore: the first claim in offset order keeps
    the range, and whatever the old leader held beyond the restored objects' ranges is held
    and quarantined.

    Raises:
        ValueError: ``state`` is not fresh (from the first step).

    Complexity: O(rows × log ranges per segment) in all, O(OBJECTS_PER_STEP) per step.
    """
    if len(state.objects) or state.segments.all_segments():
        raise ValueError("restore needs a fresh state")
    now = times.clock_now
    allocators = {}
    for segment in image.segments.values():
        mounted = state.segments.mount(segment.client_id, _info_of(segment), segment.tenant)
        allocators[segment.id] = mounted.allocator
    owners = {row.client_id for row in image.segments.values()}
    for client_id in owners | set(image.clients):
        client = image.clients.get(client_id)
        if client is not None and client.bound:
            state.clients.bind(client_id, client.tenant, now)
        if client_id in owners or (client is not None and client.ok):
            state.clients.touch(client_id, now)
        if client is not None and client.ok:
            state.clients.mark_ok(client_id)
    yield None
    # Which replica holds which range: a range claimed twice (a damaged or torn log) goes to
    # the first claim in offset order, and the later claimant loses that replica.
    claims: dict[str, list[tuple[int, int, tuple[int, int]]]] = {sid: [] for sid in allocators}
    rows = list(image.objects.values())
    for index, row in enumerate(rows):
        for position, r in enumerate(row.replicas):
            allocator = allocators.get(r.segment_id)
            if allocator is None:
                continue
            size = image.ranges.get(r.segment_id, {}).get(r.offset) or allocator.rounded(r.size)
            if r.size <= size:
                # The replica holds exactly its rounded size (the allocators index it by that);
                # the rest of a larger recorded range is left over, as an orphan.
                held = allocator.rounded(r.size)
                claims[r.segment_id].append((r.offset, held, (index, position)))
        if index % OBJECTS_PER_STEP == OBJECTS_PER_STEP - 1:
            yield None
    accepted: set[tuple[int, int]] = set()
    quarantined = 0
    until_ms = times.wall_ms + round(quarantine_s * 1000)
    holds = state.segments.grant_holds
    for segment_id, allocator in allocators.items():
        disk = isinstance(allocator, DiskSpace)
        # A disk tier's offsets are a virtual address space: no capacity bounds them.
        extent = DISK_EXTENT if disk else allocator.usable_capacity
        kept = _without_overlaps(sorted(claims[segment_id]), extent)
        accepted.update(owner for _, _, owner in kept)
        taken = [(offset, size) for offset, size, _ in kept]
        orphans = _uncovered(image.ranges.get(segment_id, {}), taken, extent)
        allocator.restore_allocations(sorted(taken + orphans))
        if isinstance(allocator, DiskSpace):
            allocator.advance_to(image.segments[segment_id].next_offset)
        if disk:
            # Disk offsets are never handed out again, so nothing needs holding: an orphan (a
            # spill the old leader had reserved for) is freed now and its file, if the owner
            # wrote one, deleted.
            for offset, _ in orphans:
                state.segments.free(segment_id, offset)
        else:
            for offset, _ in orphans:
                holds.hold(segment_id, offset, until_ms)
        quarantined += len(orphans)
        yield None
    # Every range freed soon after the restore is held too (a reader of the old leader may
    # still be copying an object removed right after it).
    hold_s = quarantine_s if free_hold_s is None else free_hold_s
    if rows or any(image.ranges.values()):
        # (An empty image had no reader to protect: a fresh start frees at once.)
        holds.floor_ms = max(holds.floor_ms, times.wall_ms + round(hold_s * 1000))
    restored = dropped = 0
    disks = state.segments.has_disks
    for index, row in enumerate(rows):
        meta = _object_of(row, times, index, accepted)
        if meta is None:
            dropped += 1
        else:
            state.objects.insert(meta)
            if row.attempt_id and meta.is_writing():
                state.objects.set_attempt(meta, row.attempt_id)  # a repeat finds its write
            on_disk = [r for r in meta.replicas if state.on_disk(r)] if disks else []
            for replica in on_disk:
                state.disk.on_disk(replica.segment_id, meta.object_id)
            in_memory = len(on_disk) < len(meta.replicas)
            if meta.is_readable() and not meta.hard_pinned and in_memory:
                state.policy.on_created(meta.object_id)
            if meta.soft_pin_deadline > now:
                state.note_soft_pin(meta.soft_pin_deadline)
            restored += 1
        if index % OBJECTS_PER_STEP == OBJECTS_PER_STEP - 1:
            yield None
    sessions = yield from _restore_sessions(state, image, times)
    state.restore_next_ids(image.next_write_id, image.next_replica_id)
    state.kv_cache_released_tenants = set(image.kv_cache_released_tenants)
    yield RestoreReport(restored, dropped, sessions, len(allocators), quarantined)


def _without_overlaps(
    claims: list[tuple[int, int, tuple[int, int]]], capacity: int
) -> list[tuple[int, int, tuple[int, int]]]:
    """``claims`` (offset, size, (object index, replica position)) sorted by offset, without
    those that overlap an earlier one or end past ``capacity``. O(claims)."""
    kept: list[tuple[int, int, tuple[int, int]]] = []
    end = 0
    for offset, size, owner in claims:
        if offset < end or offset + size > capacity:
            continue
        kept.append((offset, size, owner))
        end = offset + size
    return kept


def _uncovered(
    ranges: dict[int, int], taken: list[tuple[int, int]], capacity: int
) -> list[tuple[int, int]]:
    """The parts of the image's ``ranges`` that no taken range covers, as ranges of their
    own: what the old leader held for no restored object. O((ranges + taken) log)."""
    covered = sorted(taken)
    pieces: list[tuple[int, int]] = []
    index = 0
    for offset, size in sorted(ranges.items()):
        start, stop = offset, min(offset + size, capacity)
        while index < len(covered) and covered[index][0] + covered[index][1] <= start:
            index += 1
        probe = index
        while start < stop:
            if probe < len(covered) and covered[probe][0] < stop:
                c_start, c_stop = covered[probe][0], covered[probe][0] + covered[probe][1]
                if c_start > start:
                    pieces.append((start, c_start - start))
                start = max(start, c_stop)
                probe += 1
            else:
                pieces.append((start, stop - start))
                break
    merged: list[tuple[int, int]] = []
    for offset, size in pieces:  # an orphan overlapping an earlier orphan: one range
        if merged and offset < merged[-1][0] + merged[-1][1]:
            last_offset, last_size = merged[-1]
            merged[-1] = (last_offset, max(last_size, offset + size - last_offset))
        elif size > 0:
            merged.append((offset, size))
    return merged


def _info_of(row: SegmentRow) -> SegmentInfo:
    return SegmentInfo(
        id=row.id,
        name=row.name,
        base=row.base,
        size=row.size,
        te_endpoint=row.te_endpoint,
        protocol=row.protocol or "tcp",
        host_id=row.host_id,
        shared=row.shared,
        capability_key=row.capability_key,
        disk=row.disk,
    )


def _object_of(
    row: ObjectRow, times: TimeBase, index: int, accepted: set[tuple[int, int]]
) -> ObjectMetadata | None:
    replicas = [
        Replica(r.id, r.segment_id, r.offset, r.size, ReplicaStatus(r.status))
        for position, r in enumerate(row.replicas)
        if (index, position) in accepted
    ]
    if not replicas:
        return None
    return ObjectMetadata(
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


def _restore_sessions(
    state: StoreState, image: RowImage, times: TimeBase
) -> Generator[None, None, int]:
    """Attach every restored object to its sessions, then give each session its fields.
    A generator returning the sessions restored."""
    registry = state.sessions
    for count, ((tenant, key), session_ids) in enumerate(list(image.memberships.items()), 1):
        meta = state.objects.get((tenant, key))
        if meta is not None:
            live = sorted(s for s in session_ids if (tenant, s) in image.sessions)
            if live:
                registry.add(meta, live, times.clock_now)
        if count % OBJECTS_PER_STEP == 0:
            yield None
    restored = 0
    for (tenant, session_id), srow in image.sessions.items():
        session = registry.get(tenant, session_id)
        if session is None:
            continue  # every member is gone
        session.created_at = times.to_clock(srow.created_ms)
        session.last_active_at = times.to_clock(srow.last_active_ms)
        session.pinned = srow.pinned
        restored += 1
    return restored
