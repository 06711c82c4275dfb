"""Removal in bulk of the objects nothing holds.

Most removals (``batch_remove``, ``remove_all``, removal by pattern) meet plain objects: one
replica, written, in no group, session or pin, that no reader, late reader or existence check
holds, on a segment whose freed ranges are reused at once (not shared, no grant floor), with
no disk tier mounted. Removing one the general way
(:meth:`~..state.store.StoreState.release_replicas` then ``erase``) walks a dozen layers and
gives its memory back with one allocator update of its own. :func:`remove_plain` removes a
batch of them together: the same state in the end (the object table and its figures, the
eviction order, the allocators, the journal), with the memory of objects side by side (as a
batch put places them) given back as one range.

Thread-safety: called under the service lock.
"""

from __future__ import annotations

from collections.abc import Sequence

from mooncake_py.types import ReplicaStatus

from ..state.objects import ObjectMetadata, Replica
from ..state.store import StoreState

_COMPLETE = ReplicaStatus.COMPLETE


def plain_replica(state: StoreState, meta: ObjectMetadata) -> Replica | None:
    """``meta``'s one replica when removing ``meta`` is plain (see the module), else None
    (remove it the general way). O(1)."""
    replica = meta.sole_replica
    if (
        replica is None
        or replica.status is not _COMPLETE
        or meta.rare_fields is not None
        or state.segments.has_disks
        or len(state.disk)
        or not state.reads.untouched(meta, replica)
    ):
        return None
    segments = state.segments
    mounted = segments.get(replica.segment_id)
    if mounted is None or mounted.info.shared or segments.grant_holds.floor_ms:
        return None  # its range may be held back, tagged: the general way untags it first
    return replica


def remove_plain(
    state: StoreState, metas: Sequence[ObjectMetadata], replicas: Sequence[Replica]
) -> None:
    """Remove each of ``metas``, whose one replica (``plain_replica``) is at the same
    position in ``replicas``, as removing each the general way would, and give its memory
    back at once. Each object must be in the table, once in ``metas``, and still plain.

    Complexity: O(k log k) for k objects, one allocator update per run of adjacent ranges.
    """
    if not metas:
        return
    on_removed = state.policy.on_record_removed
    for meta in metas:
        on_removed(meta)
    by_segment: dict[str, list[int]] = {}
    for replica in replicas:
        offsets = by_segment.get(replica.segment_id)
        if offsets is None:
            by_segment[replica.segment_id] = [replica.offset]
        else:
            offsets.append(replica.offset)
    # The allocations are tagged with the records: free them while the records still have
    # their sizes (erase_run leaves them), after the table has let go of the objects.
    state.objects.erase_run(metas)
    free_many = state.segments.free_many
    for segment_id, offsets in by_segment.items():
        free_many(segment_id, offsets)
