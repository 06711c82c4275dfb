"""KV session operations of the master (attach, pin, unpin, update, close, get, list).

:class:`SessionService` is reached as ``MasterService.sessions``; it depends only on the shared
:class:`~mooncake_py.master.service.context.ServiceContext`. Sessions a write joins are handled
by the write path (:mod:`mooncake_py.master.service.writes`); see
:mod:`mooncake_py.master.state.session_registry` for the registry and its concurrency design.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from mooncake_py.errors import ErrorCode
from mooncake_py.types import KvSessionInfo, KvSessionPage

from ..state.objects import ObjectMetadata, valid_key
from ..state.session_registry import SessionInfo, describe, valid_session_id
from .context import ServiceContext
from .slices import SLICE_SECONDS, SliceTimer, Steps, drive

UPDATE_PAGE = 64
"""Members examined between two checks of the slice's time while updating or closing."""

Listing = tuple[ErrorCode, list[KvSessionInfo], str]


class SessionService:
    """The KV session calls.

    Args:
        context: the shared lock, state, clock and tenant rule.
        slice_seconds: how long one slice of a sliced call may hold the lock.

    Thread-safety: every method takes the context's lock; updates, closes and listings are
    sliced operations (:mod:`~mooncake_py.master.service.slices`) that take it once per slice
    (their ``*_sliced`` generators yield between slices with the lock free), the others once.
    """

    def __init__(self, context: ServiceContext, slice_seconds: float = SLICE_SECONDS) -> None:
        self._lock = context.lock
        self._state = context.state
        self._clock = context.clock
        self._resolve_tenant = context.tenants.resolve
        self.slice_seconds = slice_seconds

    def attach_kv_session(self, tenant: str, session_id: str, keys: Sequence[str]) -> list[int]:
        """Add existing objects to a session, creating it (unpinned) if needed.

        Returns:
            Per key: 0, OBJECT_NOT_FOUND, or SESSION_LIMIT_EXCEEDED (then nothing at all was
            added); every key INVALID_PARAMS for a bad id, a bad key or more than
            ``max_batch`` keys. Duplicate keys are harmless.
        """
        resolved = self._resolve_tenant(tenant)
        registry = self._state.sessions
        if (
            resolved is None
            or not valid_session_id(session_id)
            or len(keys) > registry.limits.max_batch
            or not all(valid_key(k) for k in keys)
        ):
            return [int(ErrorCode.INVALID_PARAMS)] * len(keys)
        with self._lock:
            found: dict[str, ObjectMetadata] = {}
            for key in keys:
                meta = self._state.objects.get((resolved, key))
                if meta is not None:
                    found[key] = meta
            plan = [(meta, key, [session_id]) for key, meta in found.items()]
            code = registry.check_admission(resolved, plan)
            if code != ErrorCode.OK:
                return [int(code) if k in found else int(ErrorCode.OBJECT_NOT_FOUND) for k in keys]
            now = self._clock()
            for meta in found.values():
                registry.add(meta, [session_id], now)
            return [0 if k in found else int(ErrorCode.OBJECT_NOT_FOUND) for k in keys]

    def set_kv_session_pin(self, tenant: str, session_id: str, pinned: bool) -> ErrorCode:
        """Pin or unpin a session: one flag, O(1) whatever its size.

        Returns:
            OK, SESSION_NOT_FOUND, or INVALID_PARAMS for a bad id.
        """
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not valid_session_id(session_id):
            return ErrorCode.INVALID_PARAMS
        with self._lock:
            session = self._state.sessions.get(resolved, session_id)
            if session is None:
                return ErrorCode.SESSION_NOT_FOUND
            session.pinned = pinned  # an unpin bumps the pin epoch through the registry
            self._state.sessions.touch(session, self._clock())
            return ErrorCode.OK

    def update_kv_session(
        self, tenant: str, session_id: str, keep_keys: Sequence[str] | None
    ) -> ErrorCode:
        """:meth:`update_kv_session_sliced`, every slice back to back."""
        return drive(self.update_kv_session_sliced(tenant, session_id, keep_keys))

    def update_kv_session_sliced(
        self, tenant: str, session_id: str, keep_keys: Sequence[str] | None
    ) -> Steps[ErrorCode]:
        """Keep only the members in ``keep_keys`` (``None``: keep none, i.e. close).

        Never adds members, ignores unknown keys and never deletes data. Walks the members in
        key order, in slices, so it is not one transaction and may interleave with writes: a
        member that joins behind the walk stays. An empty result deletes the session with
        its pin.

        Returns:
            OK (also for an unknown session), SESSION_LIMIT_EXCEEDED for a keep set larger
            than the member limit (checked before any change), INVALID_PARAMS for a bad id.

        Complexity: O(members + len(keep_keys)), in slices.
        """
        resolved = self._resolve_tenant(tenant)
        registry = self._state.sessions
        if resolved is None or not valid_session_id(session_id):
            return ErrorCode.INVALID_PARAMS
        keep = frozenset(keep_keys or ())
        if len(keep) > registry.limits.max_members:
            return ErrorCode.SESSION_LIMIT_EXCEEDED
        timer = SliceTimer(self.slice_seconds)
        cursor = ""
        while True:
            with self._lock:
                session = registry.get(resolved, session_id)
                if session is None:
                    return ErrorCode.OK
                if not cursor and keep_keys is not None:
                    registry.touch(session, self._clock())
                while True:
                    page, cursor = registry.page(session, cursor, UPDATE_PAGE)
                    for key in page:
                        meta = self._state.objects.get((resolved, key))
                        if key not in keep and meta is not None:
                            registry.detach(meta, session)
                    if not cursor or timer.spent() or registry.get(resolved, session_id) is None:
                        break
            if not cursor:
                return ErrorCode.OK
            yield
            timer.restart()

    def close_kv_session(self, tenant: str, session_id: str) -> ErrorCode:
        """Drop every membership and the pin; shared data stays cached. Idempotent."""
        return self.update_kv_session(tenant, session_id, None)

    def close_kv_session_sliced(self, tenant: str, session_id: str) -> Steps[ErrorCode]:
        """:meth:`close_kv_session` as a sliced operation."""
        return (yield from self.update_kv_session_sliced(tenant, session_id, None))

    def get_kv_session(
        self, tenant: str, session_id: str
    ) -> tuple[ErrorCode, KvSessionInfo | None]:
        """(OK, info), (SESSION_NOT_FOUND, None) or (INVALID_PARAMS, None)."""
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not valid_session_id(session_id):
            return ErrorCode.INVALID_PARAMS, None
        with self._lock:
            info = self._state.sessions.info(resolved, session_id)
            now = self._clock()
        if info is None:
            return ErrorCode.SESSION_NOT_FOUND, None
        return ErrorCode.OK, public_info(info, now, time.time() - now)

    def list_kv_sessions(
        self,
        tenant: str,
        cursor: str = "",
        limit: int = 1024,
        pinned: bool | None = None,
        min_idle_ms: int = 0,
    ) -> Listing:
        """:meth:`list_kv_sessions_sliced`, every slice back to back."""
        return drive(self.list_kv_sessions_sliced(tenant, cursor, limit, pinned, min_idle_ms))

    def list_kv_sessions_sliced(
        self,
        tenant: str,
        cursor: str = "",
        limit: int = 1024,
        pinned: bool | None = None,
        min_idle_ms: int = 0,
    ) -> Steps[Listing]:
        """One page of the tenant's sessions after ``cursor`` (exclusive), in id order.

        Weakly consistent: sessions created or ended between pages (or between the slices
        of one page) may or may not appear; each is described as it was when the walk reached
        it. A page examines at most ``16 * limit`` sessions, so a selective filter may return
        a short (even empty) page with a cursor to continue from.

        Returns:
            (OK, infos, next cursor or "" when done), or INVALID_PARAMS for a limit outside
            [1, max_batch] or a negative idle bound.

        Complexity: O(16 * limit), in slices.
        """
        resolved = self._resolve_tenant(tenant)
        if resolved is None or not 1 <= limit <= self._state.sessions.limits.max_batch:
            return ErrorCode.INVALID_PARAMS, [], ""
        if min_idle_ms < 0:
            return ErrorCode.INVALID_PARAMS, [], ""
        infos: list[KvSessionInfo] = []
        timer = SliceTimer(self.slice_seconds)
        examined = 0
        last = cursor
        while True:
            with self._lock:
                now = self._clock()
                offset = time.time() - now
                for session in self._state.sessions.sessions_after(resolved, last):
                    if len(infos) >= limit or examined >= 16 * limit:
                        return ErrorCode.OK, infos, last
                    examined += 1
                    last = session.session_id
                    idle_ms = (now - session.last_active_at) * 1000
                    if (pinned is None or session.pinned == pinned) and idle_ms >= min_idle_ms:
                        infos.append(public_info(describe(session), now, offset))
                    if timer.spent():
                        break
                else:
                    return ErrorCode.OK, infos, ""
            yield
            timer.restart()

    def list_kv_session_keys(
        self, tenant: str, session_id: str, cursor: str = "", limit: int = 1024
    ) -> tuple[ErrorCode, KvSessionPage | None]:
        """One page of member keys after ``cursor`` (exclusive), in key order.

        Returns:
            (OK, page); (SESSION_NOT_FOUND, None); (INVALID_PARAMS, None) for a bad id or a
            limit outside [1, max_batch].
        """
        resolved = self._resolve_tenant(tenant)
        registry = self._state.sessions
        if resolved is None or not valid_session_id(session_id):
            return ErrorCode.INVALID_PARAMS, None
        if not 1 <= limit <= registry.limits.max_batch:
            return ErrorCode.INVALID_PARAMS, None
        with self._lock:
            session = registry.get(resolved, session_id)
            if session is None:
                return ErrorCode.SESSION_NOT_FOUND, None
            keys, next_cursor = registry.page(session, cursor, limit)
        return ErrorCode.OK, KvSessionPage(keys, next_cursor)


def public_info(info: SessionInfo, now: float, offset: float) -> KvSessionInfo:
    """A session as the listing and get_kv_session report it: service-clock times to Unix
    times (``offset`` = wall time - service time), plus idle."""
    return KvSessionInfo(
        session_id=info.session_id,
        pinned=info.pinned,
        member_count=info.member_count,
        created_at=info.created_at + offset,
        last_active_at=info.last_active_at + offset,
        bytes=info.bytes,
        exclusive_bytes=info.exclusive_bytes,
        idle_ms=max(0, int((now - info.last_active_at) * 1000)),
    )
