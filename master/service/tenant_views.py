"""Tenant-scoped views of the store: what one tenant may see of segments and figures.

A tenant sees the segments it may use (:meth:`~mooncake_py.master.state.segments.
MountedSegment.usable_by`): its own, with their owning client ids, usage and allocations;
shared and unowned ones without other tenants' client ids, and with only its own objects'
bytes counted in them. Its figures count its own objects, clients and sessions. The global
views (an admin token, or a master without tokens) are the facade's ``stats`` and
``segment_usage`` with ``all_tenants``.

Thread-safety: none; callers hold the service lock.
"""

from __future__ import annotations

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
)
"""The figures a tenant-scoped GetStats answers (the global one answers many more)."""


def tenant_bytes_on(state: StoreState, mounted: MountedSegment, tenant: str) -> tuple[int, int]:
    """``(bytes, replicas)`` of ``tenant``'s objects on ``mounted``. O(objects on it)."""
    used = count = 0
    segment_id = mounted.info.id
    for object_id in state.objects.objects_on_segment(segment_id):
        meta = state.objects.get(object_id)
        if meta is None or meta.tenant != tenant:
            continue
        for replica in meta.replicas:
            if replica.segment_id == segment_id:
                used += replica.size
                count += 1
    return used, count


def segment_usage_of(state: StoreState, tenant: str) -> list[SegmentUsage]:
    """``(segment, owning client or "", used bytes, allocations)`` of every segment ``tenant``
    may use; shared and unowned segments count only ``tenant``'s objects and name their
    client only when it is ``tenant``'s own.

    Complexity: O(segments + objects on the shared and unowned ones).
    """
    usage: list[SegmentUsage] = []
    for mounted in state.segments.usable_by(tenant):
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
    and its sessions.

    Complexity: O(objects + segments + sessions).
    """
    usage = segment_usage_of(state, tenant)
    return {
        "objects": len(state.objects.items_of_tenant(tenant)),
        "segments": len(usage),
        "capacity_bytes": sum(info.size for info, _, _, _ in usage),
        "allocated_bytes": sum(used for _, _, used, _ in usage),
        "clients": state.clients.bound_count(tenant),
        "sessions": sum(1 for _ in state.sessions.sessions_after(tenant, "")),
        TENANT_VIEW_KEY: 1,
    }
