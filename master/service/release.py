"""Release operations of the master: free the memory that sessions hold.

:class:`ReleaseService` is reached as ``MasterService.releases``; it depends only on the shared
:class:`~mooncake_py.master.service.context.ServiceContext`. ``release_kv_session`` closes a
session and removes the members that nothing else needs: not held by another session, not hard
pinned, not being written. It works in pages, taking the service lock per page, so releasing a
huge session never stalls other calls for long; freed bytes are the allocators' own count of
what came back. A member a reader is still copying from is removed too: its memory comes back
the moment that read ends (``pending_bytes``). ``release_kv_cache`` removes every KV-cache object of
a tenant (data type KVCACHE or UNKNOWN) while other data (weights, ...) stays resident.
"""

from __future__ import annotations

from mooncake_py.errors import ErrorCode
from mooncake_py.types import ObjectDataType, ReleaseResult

from ..state.objects import ObjectMetadata
from ..state.session_registry import KvSession, valid_session_id
from ..state.store import is_soft_pinned
from .context import ServiceContext

RELEASE_PAGE = 256
KV_CACHE_TYPES = (int(ObjectDataType.KVCACHE), int(ObjectDataType.UNKNOWN))


class ReleaseService:
    """The release calls.

    Args:
        context: the shared lock, state, clock and tenant rule.

    Thread-safety: every method takes the context's lock; releasing sessions takes it once per
    page of members (so a release is not one transaction), :meth:`release_kv_cache` once.
    """

    def __init__(self, context: ServiceContext) -> None:
        self._lock = context.lock
        self._state = context.state
        self._clock = context.clock
        self._resolve_tenant = context.tenants.resolve

    def release_kv_session(self, tenant: str, session_id: str) -> tuple[ErrorCode, ReleaseResult]:
        """Close a session and remove its members that no one else needs.

        Returns:
            (OK, what was released and kept); an unknown session is (OK, nothing released,
            with a message); (INVALID_PARAMS, empty) for a bad id.
        """
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not valid_session_id(session_id):
            return ErrorCode.INVALID_PARAMS, ReleaseResult()
        with self._lock:
            session = self._state.sessions.get(resolved, session_id)
        if session is None:
            return ErrorCode.OK, ReleaseResult(message=f"no session {session_id!r}")
        return ErrorCode.OK, self._release(session)

    def _release(self, session: KvSession) -> ReleaseResult:
        total = ReleaseResult(sessions=1)
        cursor = ""
        while True:
            with self._lock:
                if self._state.sessions.get(session.tenant, session.session_id) is not session:
                    return total  # emptied (or closed) meanwhile
                page, cursor = self._state.sessions.page(session, cursor, RELEASE_PAGE)
                total += self._release_page(session, page)
            if not cursor:
                break
        with self._lock:
            # Whatever stayed (shared, protected) leaves the session; the session ends.
            if self._state.sessions.get(session.tenant, session.session_id) is session:
                for key in list(session.members):
                    meta = self._state.objects.get((session.tenant, key))
                    if meta is not None:
                        self._state.sessions.detach(meta, session)
        return total

    def _release_page(self, session: KvSession, keys: list[str]) -> ReleaseResult:
        now = self._clock()
        counts = dict.fromkeys(("shared", "hard", "writing"), 0)
        doomed: list[ObjectMetadata] = []
        for key in keys:
            meta = self._state.objects.get((session.tenant, key))
            if meta is None:
                continue
            reason = _kept_because(meta)
            if reason is None:
                doomed.append(meta)
            else:
                counts[reason] += 1
        freed, pending = self._remove_all_of(doomed, now)
        return ReleaseResult(
            released_objects=len(doomed),
            freed_bytes=freed,
            pending_bytes=pending,
            kept_shared=counts["shared"],
            kept_hard_pinned=counts["hard"],
            kept_writing=counts["writing"],
        )

    def _remove_all_of(self, doomed: list[ObjectMetadata], now: float) -> tuple[int, int]:
        """Remove objects; returns the bytes the allocators got back now and the bytes that
        come back when the reads still copying from them end."""
        self._state.reads.expire_due(now)
        before = self._state.segments.used_bytes()
        pending = 0
        for meta in doomed:
            pending += self._state.release_replicas(meta, list(meta.replicas), now)
        freed = before - self._state.segments.used_bytes()
        self._state.counters.released_objects += len(doomed)
        self._state.counters.released_bytes += freed
        return freed, pending

    def release_stale_kv_sessions(
        self, tenant: str, max_idle_ms: int, include_pinned: bool = False
    ) -> tuple[ErrorCode, ReleaseResult]:
        """Release every session of the tenant idle for longer than ``max_idle_ms``.

        Pinned sessions are skipped unless ``include_pinned``. Returns the totals.
        """
        resolved = self._resolve_tenant(tenant)
        if resolved is None or max_idle_ms < 0:
            return ErrorCode.INVALID_PARAMS, ReleaseResult()
        with self._lock:
            now = self._clock()
            stale = [
                s
                for s in self._state.sessions.sessions_after(resolved, "")
                if (now - s.last_active_at) * 1000 > max_idle_ms
                and (include_pinned or not s.pinned)
            ]
        return ErrorCode.OK, self._release_many(stale)

    def release_all_kv_sessions(
        self, tenant: str, confirm: bool = False
    ) -> tuple[ErrorCode, ReleaseResult]:
        """Release every session of the tenant; refused (INVALID_PARAMS) without ``confirm``."""
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not confirm:
            return ErrorCode.INVALID_PARAMS, ReleaseResult(message="confirm=True is required")
        with self._lock:
            every = list(self._state.sessions.sessions_after(resolved, ""))
        return ErrorCode.OK, self._release_many(every)

    def _release_many(self, sessions: list[KvSession]) -> ReleaseResult:
        total = ReleaseResult()
        for session in sessions:
            total += self._release(session)
        return total

    def release_kv_cache(
        self, tenant: str, keep_pinned: bool = True
    ) -> tuple[ErrorCode, ReleaseResult]:
        """Remove every KV-cache object (data type KVCACHE or UNKNOWN) of the tenant.

        Objects of other types stay. Soft-pinned objects (pinned sessions, TTL pins) stay
        unless ``keep_pinned`` is false; hard-pinned ones and writes in flight always stay.
        Objects readers are still copying from are removed, their memory returned the moment
        those reads end (``pending_bytes``).
        """
        resolved = self._resolve_tenant(tenant)
        if resolved is None:
            return ErrorCode.INVALID_PARAMS, ReleaseResult()
        with self._lock:
            now = self._clock()
            candidates = [
                m
                for m in self._state.objects.items_of_tenant(resolved)
                if m.data_type in KV_CACHE_TYPES
            ]
            counts = dict.fromkeys(("hard", "writing", "pinned"), 0)
            doomed: list[ObjectMetadata] = []
            for meta in candidates:
                if meta.hard_pinned:
                    counts["hard"] += 1
                elif meta.is_writing():
                    counts["writing"] += 1
                elif keep_pinned and is_soft_pinned(meta, now):
                    counts["pinned"] += 1
                else:
                    doomed.append(meta)
            freed, pending = self._remove_all_of(doomed, now)
        return ErrorCode.OK, ReleaseResult(
            released_objects=len(doomed),
            freed_bytes=freed,
            pending_bytes=pending,
            kept_hard_pinned=counts["hard"],
            kept_writing=counts["writing"],
            kept_pinned=counts["pinned"],
        )


def _kept_because(meta: ObjectMetadata) -> str | None:
    """Why a released session's member must stay, or None when it can go."""
    if meta.sessions is not None and len(meta.sessions) > 1:
        return "shared"
    if meta.hard_pinned:
        return "hard"
    if meta.is_writing():
        return "writing"
    return None
