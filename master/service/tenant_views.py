"""Tenant-scoped views of the store: what one tenant may see of segments and figures.

A tenant sees the segments it may use (:meth:`~mooncake_py.master.state.segments.
MountedSegment.usable_by`): its own, with their owning client ids, usage and allocations;
shared and unowned ones without other tenants' client ids, and with only its own objects'
bytes counted in them. Its figures count its own objects, clients and sessions. The global
views (an admin token, or a master without tokens) are the facade's ``stats`` and
``segment_usage`` with ``all_tenants``.

Every figure is read from counters the state keeps exact on every change (the object table's
tenant tallies, :mod:`~mooncake_py.master.state.tenant_tally`, and the session registry's
per-tenant counts), so no view walks objects: a dashboard polling them cannot stall the master.

Thread-safety: none; callers hold the service lock.
"""

from __future__ import annotations

import dataclasses

from mooncake_py._wire.codec import SegmentUsage

from ..state.segments import MountedSegment
from ..state.store import StoreState

TENANT_VIEW_KEY = "tenant_view"
"""Set (to 1) in a tenant-scoped GetStats answer, absent from the global one: how a caller
tells which view its token got."""

TENANT_STAT_KEYS = (
    "objects",
    "segments",
    "capacity_bytes",
    "allocated_bytes",
    "clients",
    "sessions",
    "pinned_sessions",
    "disk_segments",
    "disk_capacity_bytes",
    "disk_used_bytes",
)
"""The figures a tenant-scoped GetStats answers (the global one answers many more); the
unprefixed segment figures are memory's, the ``disk_*`` ones the disk tiers'."""


def tenant_bytes_on(state: StoreState, mounted: MountedSegment, tenant: str) -> tuple[int, int]:
    """``(bytes, replicas)`` of ``tenant``'s objects on ``mounted``: every replica on their
    metadata, whatever its state (in flight or written). O(1)."""
    return state.objects.tallies.share_on(tenant, mounted.info.id)


def segment_usage_of(state: StoreState, tenant: str) -> list[SegmentUsage]:
    """``(segment, owning client or "", used bytes, allocations)`` of every segment ``tenant``
    may use (memory segments and disk tiers); shared and unowned segments count only
    ``tenant``'s objects and name their client only when it is ``tenant``'s own.

    Complexity: O(segments), O(1) per segment ``tenant`` may use.
    """
    usage: list[SegmentUsage] = []
    segments = state.segments
    usable = segments.usable_by(tenant)
    if segments.has_disks:
        usable += [d for d in segments.disk_segments() if d.usable_by(tenant)]
    for mounted in usable:
        if mounted.tenant == tenant and not mounted.info.shared:
            allocator = mounted.allocator
            usage.append(
                (mounted.info, mounted.client_id, allocator.used_bytes, allocator.allocation_count)
            )
            continue
        used, count = tenant_bytes_on(state, mounted, tenant)
        client_id = mounted.client_id if mounted.tenant == tenant else ""
        usage.append((mounted.info, client_id, used, count))
    return usage


def stats_of(state: StoreState, tenant: str) -> dict[str, int]:
    """:data:`TENANT_STAT_KEYS` (and :data:`TENANT_VIEW_KEY`) for ``tenant``: its objects,
    the segments it may use and their capacity, the bytes its objects hold, its bound clients
    and its sessions (all, and pinned).

    Complexity: O(segments) to find those ``tenant`` may use, O(1) for each of them and for
    the object and session figures; O(client bindings) for ``clients``.
    """
    usage = segment_usage_of(state, tenant)
    memory = [u for u in usage if not u[0].disk]
    disk = [u for u in usage if u[0].disk]
    tally = state.objects.tallies.get(tenant)
    sessions, pinned_sessions = state.sessions.tenant_counts(tenant)
    return {
        "objects": 0 if tally is None else tally.objects,
        "segments": len(memory),
        "capacity_bytes": sum(info.size for info, _, _, _ in memory),
        "allocated_bytes": sum(used for _, _, used, _ in memory),
        "clients": state.clients.bound_count(tenant),
        "sessions": sessions,
        "pinned_sessions": pinned_sessions,
        "disk_segments": len(disk),
        "disk_capacity_bytes": sum(info.size for info, _, _, _ in disk),
        "disk_used_bytes": sum(used for _, _, used, _ in disk),
        TENANT_VIEW_KEY: 1,
    }


FIGURE_KEYS = ("objects", "bytes", "sessions", "pinned_sessions")
"""The figures :func:`tenant_figures` gives each tenant."""


def tenant_figures(state: StoreState) -> dict[str, dict[str, int]]:
    """:data:`FIGURE_KEYS` of every tenant that has objects or sessions: its object count,
    the bytes its objects hold (size x replicas, in flight or written), its sessions and how
    many of them are pinned. A tenant with neither objects nor sessions is absent.

    Complexity: O(tenants with objects or sessions).
    """
    figures: dict[str, dict[str, int]] = {}
    for tenant, tally in state.objects.tallies.items():
        figures[tenant] = {
            "objects": tally.objects,
            "bytes": tally.bytes,
            "sessions": 0,
            "pinned_sessions": 0,
        }
    for tenant, sessions, pinned in state.sessions.tenants():
        entry = figures.setdefault(tenant, {"objects": 0, "bytes": 0})
        entry["sessions"] = sessions
        entry["pinned_sessions"] = pinned
    return figures


def store_stats(state: StoreState) -> dict[str, int]:
    """The store-wide counts and bytes of ``MasterService.stats`` (every figure a kept
    counter: O(segments)). The caller holds the service lock."""
    segments, clients = state.segments, state.clients
    return {
        "objects": len(state.objects),
        "segments": len(segments.memory_segments()),
        "capacity_bytes": segments.capacity_bytes(),
        "allocated_bytes": segments.used_bytes(),
        "disk_segments": len(segments.disk_segments()),
        "disk_capacity_bytes": segments.disk_capacity_bytes(),
        "disk_used_bytes": segments.disk_used_bytes(),
        "disk_tasks": len(state.disk),
        "spills_in_flight": state.disk.spilling_count,
        "disk_deletes_pending": state.disk.pending_deletes(),
        "clients": len(clients),
        "active_clients": clients.active_count,
        "preempted_buffers": state.preempted_count(),
        "retired_bytes": state.reads.retired_bytes(),
        **state.reads.counts(),
        "eviction_candidates": len(state.policy),
        "sessions": len(state.sessions),
        "pinned_sessions": state.sessions.pinned_count(),
        "memberships": state.sessions.memberships,
        **dataclasses.asdict(state.counters),
    }
