"""Replica management of the master: clearing a client's own replicas (BatchReplicaClear).

:class:`ReplicaService` is reached as ``MasterService.replicas``; it depends only on the shared
:class:`~mooncake_py.master.service.context.ServiceContext`.

``batch_replica_clear`` follows upstream's ``MasterService::BatchReplicaClear``: for each key
the caller names, the object is cleared only when the caller's client wrote it and nothing
holds it (no read in progress, no ``is_exist`` hold: upstream's "lease expired"). With no
segment name the whole object goes, provided every replica is COMPLETE (a write in flight
keeps it); with a segment name only the object's COMPLETE replicas on segments of that name go,
and the object goes too when none is left. Keys that do not qualify are skipped silently (the
answer lists only the keys cleared), as upstream. Memory comes back at once (no reader holds
what is cleared). The call is sliced (:mod:`.slices`).
"""

from __future__ import annotations

from collections.abc import Sequence

from mooncake_py.errors import ErrorCode

from ..state.objects import ReplicaStatus, valid_key
from .context import ServiceContext
from .slices import Steps, map_in_slices

Cleared = tuple[ErrorCode, list[str]]


class ReplicaService:
    """Replica management calls.

    Args:
        context: the shared lock, state, clock and tenant rule.
        max_batch_keys: the most keys one call may name.

    Thread-safety: takes the context's lock once per slice.
    """

    def __init__(self, context: ServiceContext, max_batch_keys: int) -> None:
        self._lock = context.lock
        self._state = context.state
        self._clock = context.clock
        self._resolve_tenant = context.tenants.resolve
        self._max_batch = max_batch_keys

    def batch_replica_clear_sliced(
        self, client_id: str, tenant: str, keys: Sequence[str], segment_name: str = ""
    ) -> Steps[Cleared]:
        """Clear the caller's unheld objects, or their replicas on one segment (see module).

        Returns:
            (OK, the keys cleared, in request order); (INVALID_PARAMS, []) for a bad tenant,
            no client id, or more than ``max_batch_keys`` keys.

        Complexity: O(keys × replicas), in slices.
        """
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not client_id or len(keys) > self._max_batch:
            return ErrorCode.INVALID_PARAMS, []
        scope: str = resolved  # narrowed for the closure
        state = self._state

        def begin() -> float:
            now = self._clock()
            state.reads.expire_due(now)
            return now

        def clear(_: int, key: str, now: float) -> bool:
            meta = state.objects.get((scope, key)) if valid_key(key) else None
            if meta is None or meta.client_id != client_id or state.is_leased(meta):
                return False
            if not segment_name:
                if any(r.status is not ReplicaStatus.COMPLETE for r in meta.replicas):
                    return False
                doomed = list(meta.replicas)
            else:
                doomed = [
                    r
                    for r in meta.replicas
                    if r.status is ReplicaStatus.COMPLETE
                    and self._segment_name(r.segment_id) == segment_name
                ]
                if not doomed:
                    return False
            state.release_replicas(meta, doomed, now)
            return True

        cleared = yield from map_in_slices(self._lock, keys, begin, clear)
        return ErrorCode.OK, [key for key, done in zip(keys, cleared, strict=True) if done]

    def _segment_name(self, segment_id: str) -> str | None:
        mounted = self._state.segments.get(segment_id)
        return None if mounted is None else mounted.info.name
