"""The answers of ``GET /v1/memory/segments`` and ``GET /v1/memory/stats``: bytes per tier.

A store with disk tiers (segments mounted with ``disk=True``: each client's SSD offload
directory) holds bytes in two tiers, and every answer keeps them apart:

- each listed segment carries ``tier`` (``"memory"`` or ``"disk"``); the listing's
  ``total_*`` figures sum every segment listed (as before tiers existed), and ``tiers`` gives
  the same figures per tier (both tiers always present, zero when none is mounted);
- the stats keep their top-level ``allocated_bytes`` / ``capacity_bytes`` / ``segments``
  (memory only, as ``MasterService.stats``), and add ``memory`` and ``disk`` objects. The
  global view's ``disk`` also has the disk tier's store-wide activity (spills, promotions,
  disk evictions and hits, tasks in flight); a tenant's view has only the bytes of the disk
  tiers that tenant may use, since the store-wide counters describe other tenants too.

Thread-safety: pure functions of their arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .service.admin_queries import DISK_TIER, MEMORY_TIER, TIERS, SegmentDetail

DISK_ACTIVITY = {
    "spilled_objects": "spilled_objects",
    "spilled_bytes": "spilled_bytes",
    "spill_failures": "spill_failures",
    "spills_started": "spills_started",
    "spills_in_flight": "spills_in_flight",
    "demoted_objects": "demoted_objects",
    "promotions_started": "promotions_started",
    "promoted_objects": "promoted_objects",
    "promotion_failures": "promotion_failures",
    "evicted_objects": "disk_evicted_objects",
    "evicted_bytes": "disk_evicted_bytes",
    "hits": "disk_hits",
    "tasks": "disk_tasks",
    "deletes_pending": "disk_deletes_pending",
}
"""Field of the global view's ``disk`` object -> the ``MasterService.stats`` key it reads."""


def percent(used: int, capacity: int) -> float:
    """``used`` as a percentage of ``capacity`` to three decimals (0 for no capacity)."""
    return round(used / capacity * 100.0, 3) if capacity else 0.0


def occupancy(segments: int, used: int, capacity: int) -> dict[str, Any]:
    """One tier's figures: segments, used, capacity and free bytes, and the percentage used."""
    return {
        "segments": segments,
        "used_bytes": used,
        "capacity_bytes": capacity,
        "free_bytes": max(0, capacity - used),
        "usage_percent": percent(used, capacity),
    }


def tier_occupancy(details: Iterable[SegmentDetail]) -> dict[str, dict[str, Any]]:
    """:func:`occupancy` of each tier (both always present) over ``details``. O(segments)."""
    sums = {tier: [0, 0, 0] for tier in TIERS}
    for detail in details:
        figures = sums[detail.tier]
        figures[0] += 1
        figures[1] += detail.used_bytes
        figures[2] += detail.capacity_bytes
    return {tier: occupancy(*figures) for tier, figures in sums.items()}


def segment_json(detail: SegmentDetail) -> dict[str, Any]:
    """One segment as ``GET /v1/memory/segments`` lists it."""
    return {
        "name": detail.name,
        "segment_id": detail.segment_id,
        "client_id": detail.client_id,
        "te_endpoint": detail.te_endpoint,
        "status": detail.status.name,
        "tier": detail.tier,
        "used_bytes": detail.used_bytes,
        "capacity_bytes": detail.capacity_bytes,
        "free_bytes": max(0, detail.capacity_bytes - detail.used_bytes),
        "usage_percent": percent(detail.used_bytes, detail.capacity_bytes),
    }


def segments_json(details: Sequence[SegmentDetail]) -> dict[str, Any]:
    """The ``GET /v1/memory/segments`` answer for ``details`` (the caller's view)."""
    segments = [segment_json(d) for d in details]
    return {
        "segments": segments,
        "total_segments": len(segments),
        "total_used_bytes": sum(s["used_bytes"] for s in segments),
        "total_capacity_bytes": sum(s["capacity_bytes"] for s in segments),
        "total_free_bytes": sum(s["free_bytes"] for s in segments),
        "tiers": tier_occupancy(details),
    }


def tier_stats(
    figures: Mapping[str, int], visible: Sequence[SegmentDetail], global_view: bool
) -> dict[str, dict[str, Any]]:
    """The ``memory`` and ``disk`` objects of a ``GET /v1/memory/stats`` answer.

    Args:
        figures: ``MasterService.stats`` of the caller's view.
        visible: the segments of the caller's view (read for a tenant's disk bytes, which
            the tenant's figures do not carry).
        global_view: the store-wide view: the disk bytes and activity come from ``figures``.

    Returns:
        ``{"memory": occupancy, "disk": occupancy (+ activity in the global view)}``.
    """
    memory = occupancy(
        int(figures.get("segments", 0)),
        int(figures.get("allocated_bytes", 0)),
        int(figures.get("capacity_bytes", 0)),
    )
    if not global_view:
        return {MEMORY_TIER: memory, DISK_TIER: tier_occupancy(visible)[DISK_TIER]}
    disk = occupancy(
        int(figures.get("disk_segments", 0)),
        int(figures.get("disk_used_bytes", 0)),
        int(figures.get("disk_capacity_bytes", 0)),
    )
    disk.update({field: int(figures.get(key, 0)) for field, key in DISK_ACTIVITY.items()})
    return {MEMORY_TIER: memory, DISK_TIER: disk}
