"""Release operations of the master: free the memory that sessions hold.

:class:`ReleaseService` is reached as ``MasterService.releases``; it depends only on the shared
:class:`~mooncake_py.master.service.context.ServiceContext`. ``release_kv_session`` closes a
session and removes the members that nothing else needs: not held by another session (unless
``all_pages``), not hard pinned, not being written. ``release_kv_cache`` removes every KV-cache
object of a tenant (data type KVCACHE or UNKNOWN) while other data (weights, ...) stays
resident. Freed bytes are the allocators' own count of what came back. A member a reader is
still copying from is removed too: its memory comes back the moment that read ends
(``pending_bytes``).

**Counts and sleep state.** Every call answered OK counts, by kind (:data:`RELEASE_KINDS`), in
the state's counters: calls, objects removed, bytes freed. A ``release_kv_cache`` that removes
at least one object puts its tenant in the ``kv_cache_released`` sleep state (as vLLM's
``engine_sleep_state``), which lasts until that tenant commits a KV-cache write (the write path
clears it); :meth:`ReleaseService.kv_cache_state` reads it.

**Slices.** Every release is a sliced operation (:mod:`~mooncake_py.master.service.slices`):
it works for at most one slice's time per hold of the service lock and lets other calls in
between, so releasing a huge session (or every session, or a whole tenant's KV cache) never
stalls other callers for long. A release is therefore not one transaction: each member (or
object, or session) is judged by its state when the walk reaches it. Members that join a
session after the walk passed their key are not removed, but they leave the session when it
ends; objects written after ``release_kv_cache`` took its snapshot are not seen; sessions
created after the stale/all walk passed their id are not released.
"""

from __future__ import annotations

from collections.abc import Callable

from mooncake_py.errors import ErrorCode
from mooncake_py.types import ObjectDataType, ReleaseResult

from ..state.objects import ObjectMetadata
from ..state.session_registry import KvSession, valid_session_id
from ..state.store import is_soft_pinned
from .context import ServiceContext
from .slices import SLICE_SECONDS, SliceTimer, Steps, drive

RELEASE_PAGE = 64
"""Members looked at between two checks of the slice's time."""

KV_CACHE_TYPES = (int(ObjectDataType.KVCACHE), int(ObjectDataType.UNKNOWN))

Released = tuple[ErrorCode, ReleaseResult]

RELEASE_KINDS = ("session", "stale", "all", "kv_cache")
"""The release kinds counted apart: release_kv_session, release_stale_kv_sessions,
release_all_kv_sessions, release_kv_cache. Kind ``k`` counts in the state's counters as
``k_releases``, ``k_released_objects`` and ``k_released_bytes``."""

AWAKE = "awake"
KV_CACHE_RELEASED = "kv_cache_released"
SLEEP_STATES = (AWAKE, KV_CACHE_RELEASED)
"""The values of a tenant's KV-cache sleep state (:meth:`ReleaseService.kv_cache_state`)."""


class ReleaseService:
    """The release calls.

    Args:
        context: the shared lock, state, clock and tenant rule.
        slice_seconds: how long one slice may hold the lock.

    Thread-safety: every method takes the context's lock once per slice; the ``*_sliced``
    generators yield between slices with the lock free, the plain methods run every slice
    back to back.
    """

    def __init__(self, context: ServiceContext, slice_seconds: float = SLICE_SECONDS) -> None:
        self._lock = context.lock
        self._state = context.state
        self._clock = context.clock
        self._resolve_tenant = context.tenants.resolve
        self.slice_seconds = slice_seconds

    # -- one session -----------------------------------------------------------------------

    def release_kv_session(self, tenant: str, session_id: str, all_pages: bool = False) -> Released:
        """:meth:`release_kv_session_sliced`, every slice back to back."""
        return drive(self.release_kv_session_sliced(tenant, session_id, all_pages=all_pages))

    def release_kv_session_sliced(
        self, tenant: str, session_id: str, all_pages: bool = False
    ) -> Steps[Released]:
        """Close a session and remove its members that no one else needs.

        Args:
            all_pages: remove the members other sessions share too (they leave those
                sessions); hard-pinned members and writes in flight still stay.

        Returns:
            (OK, what was released and kept); an unknown session is (OK, nothing released,
            with a message); (INVALID_PARAMS, empty) for a bad id. An OK answer counts as a
            ``session`` release.

        Complexity: O(members), in slices.
        """
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not valid_session_id(session_id):
            return ErrorCode.INVALID_PARAMS, ReleaseResult()
        with self._lock:
            session = self._state.sessions.get(resolved, session_id)
        if session is None:
            total = ReleaseResult(message=f"no session {session_id!r}")
        else:
            timer = SliceTimer(self.slice_seconds)
            total = yield from self._release(session, timer, all_pages)
        self._count("session", total)
        return ErrorCode.OK, total

    def _release(
        self, session: KvSession, timer: SliceTimer, all_pages: bool = False
    ) -> Steps[ReleaseResult]:
        """Remove what the session alone holds, then end it (see the module)."""
        total = ReleaseResult(sessions=1)
        registry = self._state.sessions
        # First walk: remove the members that can go. Second walk: whatever stayed (shared,
        # protected) leaves the session, which then ends.
        for removing in (True, False):
            cursor = ""
            while True:
                with self._lock:
                    while True:
                        if registry.get(session.tenant, session.session_id) is not session:
                            return total  # emptied (or closed) meanwhile
                        page, cursor = registry.page(session, cursor, RELEASE_PAGE)
                        if removing:
                            total += self._release_page(session, page, all_pages)
                        else:
                            self._detach_page(session, page)
                        if not cursor or timer.spent():
                            break
                if not cursor:
                    break
                yield
                timer.restart()
        return total

    def _release_page(self, session: KvSession, keys: list[str], all_pages: bool) -> ReleaseResult:
        now = self._clock()
        counts = dict.fromkeys(("shared", "hard", "writing"), 0)
        doomed: list[ObjectMetadata] = []
        for key in keys:
            meta = self._state.objects.get((session.tenant, key))
            if meta is None:
                continue
            reason = _kept_because(meta, all_pages)
            if reason is None:
                doomed.append(meta)
            else:
                counts[reason] += 1
        freed, pending, freed_disk = self._remove_all_of(doomed, now)
        return ReleaseResult(
            released_objects=len(doomed),
            freed_bytes=freed,
            freed_disk_bytes=freed_disk,
            pending_bytes=pending,
            kept_shared=counts["shared"],
            kept_hard_pinned=counts["hard"],
            kept_writing=counts["writing"],
        )

    def _detach_page(self, session: KvSession, keys: list[str]) -> None:
        for key in keys:
            meta = self._state.objects.get((session.tenant, key))
            if meta is not None:
                self._state.sessions.detach(meta, session)

    def _remove_all_of(self, doomed: list[ObjectMetadata], now: float) -> tuple[int, int, int]:
        """Remove objects; returns the memory bytes the allocators got back now, the bytes that
        come back when the reads still copying from them end, and the disk tier bytes freed
        (their files are deleted by their owners)."""
        self._state.reads.expire_due(now)
        segments = self._state.segments
        before = segments.used_bytes()
        disk_before = segments.disk_used_bytes() if segments.has_disks else 0
        pending = 0
        for meta in doomed:
            pending += self._state.release_replicas(meta, list(meta.replicas), now)
        freed = before - segments.used_bytes()
        freed_disk = disk_before - segments.disk_used_bytes() if segments.has_disks else 0
        self._state.counters.released_objects += len(doomed)
        self._state.counters.released_bytes += freed
        return freed, pending, freed_disk

    def _count(self, kind: str, total: ReleaseResult) -> None:
        """Count one release of ``kind`` (:data:`RELEASE_KINDS`) answered OK, with its totals."""
        amounts = (
            ("releases", 1),
            ("released_objects", total.released_objects),
            ("released_bytes", total.freed_bytes),
        )
        with self._lock:
            counters = self._state.counters
            for suffix, amount in amounts:
                name = f"{kind}_{suffix}"
                setattr(counters, name, getattr(counters, name) + amount)

    # -- many sessions ---------------------------------------------------------------------

    def release_stale_kv_sessions(
        self, tenant: str, max_idle_ms: int, include_pinned: bool = False
    ) -> Released:
        """:meth:`release_stale_kv_sessions_sliced`, every slice back to back."""
        return drive(self.release_stale_kv_sessions_sliced(tenant, max_idle_ms, include_pinned))

    def release_stale_kv_sessions_sliced(
        self, tenant: str, max_idle_ms: int, include_pinned: bool = False
    ) -> Steps[Released]:
        """Release every session of the tenant idle for longer than ``max_idle_ms``.

        Pinned sessions are skipped unless ``include_pinned``. A session is judged idle when
        the walk over the tenant's sessions (in id order) reaches it. Returns the totals
        (counted as a ``stale`` release); (INVALID_PARAMS, empty) for a bad tenant or a
        negative bound.

        Complexity: O(sessions + their members), in slices.
        """
        resolved = self._resolve_tenant(tenant)
        if resolved is None or max_idle_ms < 0:
            return ErrorCode.INVALID_PARAMS, ReleaseResult()

        def stale(session: KvSession, now: float) -> bool:
            idle = (now - session.last_active_at) * 1000 > max_idle_ms
            return idle and (include_pinned or not session.pinned)

        total = yield from self._release_each(resolved, stale)
        self._count("stale", total)
        return ErrorCode.OK, total

    def release_all_kv_sessions(self, tenant: str, confirm: bool = False) -> Released:
        """:meth:`release_all_kv_sessions_sliced`, every slice back to back."""
        return drive(self.release_all_kv_sessions_sliced(tenant, confirm))

    def release_all_kv_sessions_sliced(self, tenant: str, confirm: bool = False) -> Steps[Released]:
        """Release every session of the tenant (counted as an ``all`` release); refused
        (INVALID_PARAMS) without ``confirm``.

        Complexity: O(sessions + their members), in slices.
        """
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not confirm:
            return ErrorCode.INVALID_PARAMS, ReleaseResult(message="confirm=True is required")
        total = yield from self._release_each(resolved, lambda s, now: True)
        self._count("all", total)
        return ErrorCode.OK, total

    def _release_each(
        self, tenant: str, chosen: Callable[[KvSession, float], bool]
    ) -> Steps[ReleaseResult]:
        """Walk the tenant's sessions in id order and release each one ``chosen`` accepts
        when the walk reaches it."""
        total = ReleaseResult()
        timer = SliceTimer(self.slice_seconds)
        cursor = ""
        while True:
            picked: KvSession | None = None
            with self._lock:
                now = self._clock()
                walk = self._state.sessions.sessions_after(tenant, cursor)
                for session in walk:
                    cursor = session.session_id
                    if chosen(session, now):
                        picked = session
                        break
                    if timer.spent():
                        break
                else:
                    cursor = ""  # walked to the end
            if picked is not None:
                total += yield from self._release(picked, timer)
            if not cursor:
                return total
            if timer.spent():
                yield
                timer.restart()

    # -- the KV cache ----------------------------------------------------------------------

    def release_kv_cache(self, tenant: str, keep_pinned: bool = True) -> Released:
        """:meth:`release_kv_cache_sliced`, every slice back to back."""
        return drive(self.release_kv_cache_sliced(tenant, keep_pinned))

    def release_kv_cache_sliced(self, tenant: str, keep_pinned: bool = True) -> Steps[Released]:
        """Remove every KV-cache object (data type KVCACHE or UNKNOWN) of the tenant.

        Objects of other types stay. Soft-pinned objects (pinned sessions, TTL pins) stay
        unless ``keep_pinned`` is false; hard-pinned ones and writes in flight always stay.
        Objects readers are still copying from are removed, their memory returned the moment
        those reads end (``pending_bytes``). Each object is judged when the walk over a
        snapshot of the object table reaches it. Each slice that removes an object puts the
        tenant in the ``kv_cache_released`` sleep state (see the module).

        Returns:
            (OK, totals), counted as a ``kv_cache`` release; (INVALID_PARAMS, empty) for a
            bad tenant.

        Complexity: O(objects), in slices.
        """
        resolved = self._resolve_tenant(tenant)
        if resolved is None:
            return ErrorCode.INVALID_PARAMS, ReleaseResult()
        with self._lock:
            objects = self._state.objects.snapshot()
        total = ReleaseResult()
        timer = SliceTimer(self.slice_seconds)
        position = 0
        while position < len(objects):
            with self._lock:
                now = self._clock()
                counts = dict.fromkeys(("hard", "writing", "pinned"), 0)
                doomed: list[ObjectMetadata] = []
                while position < len(objects):
                    meta = objects[position]
                    position += 1
                    if (
                        meta.tenant == resolved
                        and meta.data_type in KV_CACHE_TYPES
                        and self._state.objects.get(meta.object_id) is meta
                    ):
                        if meta.hard_pinned:
                            counts["hard"] += 1
                        elif meta.is_writing():
                            counts["writing"] += 1
                        elif keep_pinned and is_soft_pinned(meta, now):
                            counts["pinned"] += 1
                        else:
                            doomed.append(meta)
                    if timer.spent():
                        break
                freed, pending, freed_disk = self._remove_all_of(doomed, now)
                if doomed:
                    # Under the lock, in order with the commits that clear it again.
                    self._state.kv_cache_released_tenants.add(resolved)
            total += ReleaseResult(
                released_objects=len(doomed),
                freed_bytes=freed,
                freed_disk_bytes=freed_disk,
                pending_bytes=pending,
                kept_hard_pinned=counts["hard"],
                kept_writing=counts["writing"],
                kept_pinned=counts["pinned"],
            )
            if position < len(objects):
                yield
                timer.restart()
        self._count("kv_cache", total)
        return ErrorCode.OK, total

    # -- sleep state -----------------------------------------------------------------------

    def kv_cache_state(self, tenant: str) -> str:
        """The tenant's KV-cache sleep state: ``kv_cache_released`` from a
        ``release_kv_cache`` that removed at least one of its objects until its next KV-cache
        write commits, else ``awake`` (also for an invalid tenant id). O(1)."""
        resolved = self._resolve_tenant(tenant)
        with self._lock:
            released = resolved in self._state.kv_cache_released_tenants
        return KV_CACHE_RELEASED if released else AWAKE

    def kv_cache_released_tenants(self) -> list[str]:
        """The (resolved) tenants in the ``kv_cache_released`` state, sorted.
        O(t log t) for t such tenants."""
        with self._lock:
            return sorted(self._state.kv_cache_released_tenants)


def _kept_because(meta: ObjectMetadata, all_pages: bool = False) -> str | None:
    """Why a released session's member must stay, or None when it can go (a member other
    sessions share goes too with ``all_pages``)."""
    if not all_pages and meta.sessions is not None and len(meta.sessions) > 1:
        return "shared"
    if meta.hard_pinned:
        return "hard"
    if meta.is_writing():
        return "writing"
    return None
