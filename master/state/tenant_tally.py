"""Per-tenant figures of the object table, kept exact on every change.

For each tenant with at least one object, :class:`TenantTallies` keeps its object count, the
bytes its objects hold (size x replicas, every replica on the object's metadata whatever its
state, as :func:`~.session_registry.weight` counts them) and, for each segment, the bytes and
replicas it holds there. The object table (:class:`~.objects.ObjectTable`) calls it from the
four mutations every replica change goes through (insert, erase, add and drop replicas), so
the figures are exact after every call, and the tenant views read them in O(1) instead of
walking objects under the service lock.

Bytes count from the moment replicas are placed (PutStart), not from commit: an object's
replicas are on its metadata from then on, and the figures follow the metadata. A replica
taken off an object (removed, evicted, moved, preempted, retired for a reader still copying)
stops counting at once, even while its memory waits to be freed.

Thread-safety: none; the master service serializes every call under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # objects.py imports this module
    from .objects import ObjectMetadata, Replica


class SegmentShare:
    """What one tenant holds on one segment: ``bytes`` and ``replicas``."""

    __slots__ = ("bytes", "replicas")

    def __init__(self) -> None:
        self.bytes = 0
        self.replicas = 0


class TenantTally:
    """One tenant's figures: ``objects``, ``bytes`` held (all replicas), and its
    :class:`SegmentShare` per segment id (only segments where it holds a replica)."""

    __slots__ = ("objects", "bytes", "segments")

    def __init__(self) -> None:
        self.objects = 0
        self.bytes = 0
        self.segments: dict[str, SegmentShare] = {}


class TenantTallies:
    """The :class:`TenantTally` of every tenant that has objects.

    Each ``on_*`` method is O(replicas changed); queries are O(1). A tenant's entry goes away
    with its last object, so the table holds no more entries than there are tenants with
    objects, and a tally holds no more shares than segments where the tenant has replicas.
    """

    def __init__(self) -> None:
        self._tenants: dict[str, TenantTally] = {}

    def __len__(self) -> int:
        return len(self._tenants)

    def get(self, tenant: str) -> TenantTally | None:
        """The tenant's tally, None when it has no object. O(1). The caller must not change
        it."""
        return self._tenants.get(tenant)

    def items(self) -> Iterator[tuple[str, TenantTally]]:
        """(tenant, tally) for every tenant with objects. O(1) to start; do not change the
        table while iterating."""
        return iter(self._tenants.items())

    def share_on(self, tenant: str, segment_id: str) -> tuple[int, int]:
        """``(bytes, replicas)`` of ``tenant``'s objects on ``segment_id``. O(1)."""
        tally = self._tenants.get(tenant)
        share = None if tally is None else tally.segments.get(segment_id)
        return (0, 0) if share is None else (share.bytes, share.replicas)

    # -- changes (called by the object table only) ------------------------------------------

    def on_inserted(self, meta: ObjectMetadata) -> None:
        """``meta`` joined the table with its replicas. O(replicas)."""
        tally = self._tenants.get(meta.tenant)
        if tally is None:
            tally = self._tenants[meta.tenant] = TenantTally()
        tally.objects += 1
        # The loop of on_replicas_added, inlined: this runs on every put start.
        segments = tally.segments
        for replica in meta.replicas:
            share = segments.get(replica.segment_id)
            if share is None:
                share = segments[replica.segment_id] = SegmentShare()
            share.bytes += replica.size
            share.replicas += 1
            tally.bytes += replica.size

    def on_inserted_run(self, tenant: str, segment_id: str, objects: int, size: int) -> None:
        """``objects`` new objects of ``tenant`` joined the table, each with one replica on
        ``segment_id``, ``size`` bytes in all (what :meth:`on_inserted` of each adds). O(1)."""
        tally = self._tenants.get(tenant)
        if tally is None:
            tally = self._tenants[tenant] = TenantTally()
        tally.objects += objects
        tally.bytes += size
        share = tally.segments.get(segment_id)
        if share is None:
            share = tally.segments[segment_id] = SegmentShare()
        share.bytes += size
        share.replicas += objects

    def on_erased_run(self, tenant: str, segment_id: str, objects: int, size: int) -> None:
        """``objects`` objects of ``tenant``, each with one replica on ``segment_id``, ``size``
        bytes in all, left the table with those replicas (what :meth:`on_replicas_dropped`
        and :meth:`on_erased` of each take away). O(1)."""
        tally = self._tenants[tenant]
        share = tally.segments[segment_id]
        share.bytes -= size
        share.replicas -= objects
        if not share.replicas:
            del tally.segments[segment_id]
        tally.bytes -= size
        tally.objects -= objects
        if not tally.objects:
            del self._tenants[tenant]

    def on_erased(self, meta: ObjectMetadata) -> None:
        """``meta`` left the table with the replicas it still had. O(replicas)."""
        tally = self._tenants[meta.tenant]
        tally.objects -= 1
        if meta.replicas:
            self.on_replicas_dropped(meta, meta.replicas)
        if not tally.objects:
            del self._tenants[meta.tenant]

    def on_replicas_added(self, meta: ObjectMetadata, added: Sequence[Replica]) -> None:
        """``added`` were appended to ``meta``'s replicas. O(len(added))."""
        tally = self._tenants[meta.tenant]
        segments = tally.segments
        for replica in added:
            share = segments.get(replica.segment_id)
            if share is None:
                share = segments[replica.segment_id] = SegmentShare()
            share.bytes += replica.size
            share.replicas += 1
            tally.bytes += replica.size

    def on_replicas_dropped(self, meta: ObjectMetadata, dropped: Sequence[Replica]) -> None:
        """``dropped`` (each one on ``meta`` until now) were taken off it. O(len(dropped))."""
        tally = self._tenants[meta.tenant]
        segments = tally.segments
        for replica in dropped:
            share = segments[replica.segment_id]
            share.bytes -= replica.size
            share.replicas -= 1
            tally.bytes -= replica.size
            if not share.replicas:
                del segments[replica.segment_id]

    # -- invariants ---------------------------------------------------------------------------

    def check(self, objects: Iterable[ObjectMetadata]) -> None:
        """Recount every figure from ``objects`` (the whole table) and compare.
        O(objects + replicas).

        Raises:
            AssertionError: a figure disagrees with the recount.
        """
        counts: dict[str, int] = {}
        held: dict[str, int] = {}
        shares: dict[str, dict[str, tuple[int, int]]] = {}
        for meta in objects:
            tenant = meta.tenant
            counts[tenant] = counts.get(tenant, 0) + 1
            held[tenant] = held.get(tenant, 0) + meta.size * len(meta.replicas)
            per_segment = shares.setdefault(tenant, {})
            for replica in meta.replicas:
                used, count = per_segment.get(replica.segment_id, (0, 0))
                per_segment[replica.segment_id] = (used + replica.size, count + 1)
        if set(self._tenants) != set(counts):
            raise AssertionError("tenant tallies disagree with the tenants that have objects")
        for tenant, tally in self._tenants.items():
            if tally.objects != counts[tenant]:
                raise AssertionError(f"tenant {tenant!r}: {tally.objects} objects counted")
            if tally.bytes != held[tenant]:
                raise AssertionError(f"tenant {tenant!r}: {tally.bytes} bytes != {held[tenant]}")
            kept = {s: (share.bytes, share.replicas) for s, share in tally.segments.items()}
            if kept != shares[tenant]:
                raise AssertionError(f"tenant {tenant!r}: per-segment bytes disagree")
