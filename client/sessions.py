"""KV session calls of ``MooncakeDistributedStore`` (names and keywords as upstream's session
branch). Unlike the data calls, failures raise :class:`MooncakeError` whose message names the
code (SESSION_NOT_FOUND, SESSION_LIMIT_EXCEEDED, INVALID_PARAMS, RPC_FAIL, ...).

Session state lives only in the master's memory: after a master restart, applications re-attach
their objects and re-pin their sessions.
"""

from __future__ import annotations

from collections.abc import Sequence

from mooncake_py.errors import ErrorCode, MooncakeError
from mooncake_py.types import KvSessionInfo, KvSessionPage, ReleaseResult

from .core import ClientCore


def _raise_unless_ok(code: int, session_id: str) -> int:
    if code != 0:
        raise MooncakeError(code, f"session {session_id!r}")
    return 0


class KvSessionMethods:
    """Mixed into the store; expects ``_core``."""

    _core: ClientCore | None

    def _session_core(self) -> ClientCore:
        core = self._core
        if core is None:
            raise MooncakeError(ErrorCode.INVALID_PARAMS, "the store is not set up")
        return core

    def attach_kv_session(self, session_id: str, keys: Sequence[str]) -> list[int]:
        """Add existing objects to a session (creating it, unpinned, if needed).

        Returns:
            Per key: 0, OBJECT_NOT_FOUND (-704) or SESSION_LIMIT_EXCEEDED (-1802; then nothing
            was added). Duplicate keys are harmless.

        Raises:
            MooncakeError: INVALID_PARAMS for a bad id or key or too many keys; RPC_FAIL.
        """
        core = self._session_core()
        codes = core.master.attach_kv_session(core.tenant, session_id, list(keys))
        if keys and all(c == ErrorCode.INVALID_PARAMS for c in codes):
            raise MooncakeError(ErrorCode.INVALID_PARAMS, f"attach to session {session_id!r}")
        return codes

    def pin_kv_session(self, session_id: str) -> int:
        """Protect the session's objects from ordinary eviction (no TTL); returns 0.

        Raises:
            MooncakeError: SESSION_NOT_FOUND, INVALID_PARAMS, RPC_FAIL.
        """
        core = self._session_core()
        code = core.master.set_kv_session_pin(core.tenant, session_id, True)
        return _raise_unless_ok(code, session_id)

    def unpin_kv_session(self, session_id: str) -> int:
        """Remove this session's protection (others' and TTL pins stay); returns 0.

        Raises:
            MooncakeError: SESSION_NOT_FOUND, INVALID_PARAMS, RPC_FAIL.
        """
        core = self._session_core()
        code = core.master.set_kv_session_pin(core.tenant, session_id, False)
        return _raise_unless_ok(code, session_id)

    def update_kv_session(self, session_id: str, keep_keys: Sequence[str]) -> int:
        """Keep only members in ``keep_keys`` (never adds, never deletes data); returns 0.

        Raises:
            MooncakeError: SESSION_LIMIT_EXCEEDED (keep set above the member limit),
                INVALID_PARAMS, RPC_FAIL.
        """
        core = self._session_core()
        code = core.master.update_kv_session(core.tenant, session_id, list(keep_keys))
        return _raise_unless_ok(code, session_id)

    def close_kv_session(self, session_id: str) -> int:
        """Drop all of the session's memberships and its pin; data stays cached. Idempotent.

        Raises:
            MooncakeError: INVALID_PARAMS, RPC_FAIL.
        """
        core = self._session_core()
        return _raise_unless_ok(core.master.close_kv_session(core.tenant, session_id), session_id)

    def get_kv_session(self, session_id: str) -> KvSessionInfo:
        """``KvSessionInfo(session_id, pinned, member_count)``.

        Raises:
            MooncakeError: SESSION_NOT_FOUND, INVALID_PARAMS, RPC_FAIL.
        """
        core = self._session_core()
        code, info = core.master.get_kv_session(core.tenant, session_id)
        _raise_unless_ok(code, session_id)
        assert info is not None
        return info

    def list_kv_session_keys(
        self, session_id: str, cursor: str = "", limit: int = 1024
    ) -> KvSessionPage:
        """One page of the session's keys after ``cursor`` (exclusive), in key order.

        Raises:
            MooncakeError: SESSION_NOT_FOUND, INVALID_PARAMS (bad id, limit outside
                [1, max batch]), RPC_FAIL.
        """
        core = self._session_core()
        if not isinstance(limit, int) or not 1 <= limit < 2**32:
            raise MooncakeError(ErrorCode.INVALID_PARAMS, f"limit must be positive: {limit!r}")
        code, page = core.master.list_kv_session_keys(core.tenant, session_id, cursor, limit)
        _raise_unless_ok(code, session_id)
        assert page is not None
        return page

    def list_kv_sessions(
        self,
        cursor: str = "",
        limit: int = 1024,
        pinned: bool | None = None,
        min_idle_ms: int = 0,
    ) -> tuple[list[KvSessionInfo], str]:
        """One page of this tenant's sessions (weakly consistent), and the next cursor.

        Args:
            cursor: "" for the first page, then the returned cursor.
            limit: sessions per page.
            pinned: only pinned (True) or unpinned (False) sessions; None for all.
            min_idle_ms: only sessions idle at least this long.

        Returns:
            (infos, next cursor); the cursor is "" when the listing is done.

        Raises:
            MooncakeError: INVALID_PARAMS, RPC_FAIL.
        """
        core = self._session_core()
        if not isinstance(limit, int) or not 1 <= limit < 2**32 or min_idle_ms < 0:
            raise MooncakeError(ErrorCode.INVALID_PARAMS, "bad limit or min_idle_ms")
        code, infos, next_cursor = core.master.list_kv_sessions(
            core.tenant, cursor, limit, pinned, min_idle_ms
        )
        _raise_unless_ok(code, "*")
        return infos, next_cursor

    def release_kv_session(self, session_id: str) -> ReleaseResult:
        """Close the session and remove its members that nothing else needs (not shared with
        another session, not hard pinned, not leased, not being written).

        Returns:
            What was released and kept; for an unknown session, nothing and a message.

        Raises:
            MooncakeError: INVALID_PARAMS, RPC_FAIL.
        """
        core = self._session_core()
        code, result = core.master.release_kv_session(core.tenant, session_id)
        _raise_unless_ok(code, session_id)
        return result

    def release_stale_kv_sessions(
        self, max_idle_ms: int, include_pinned: bool = False
    ) -> ReleaseResult:
        """Release every session idle for longer than ``max_idle_ms``; returns the totals."""
        core = self._session_core()
        if max_idle_ms < 0:
            raise MooncakeError(ErrorCode.INVALID_PARAMS, "max_idle_ms must not be negative")
        code, result = core.master.release_stale_kv_sessions(
            core.tenant, max_idle_ms, include_pinned
        )
        _raise_unless_ok(code, "*")
        return result

    def release_all_kv_sessions(self, confirm: bool = False) -> ReleaseResult:
        """Release every session of this tenant.

        Raises:
            MooncakeError: INVALID_PARAMS unless ``confirm`` is true; RPC_FAIL.
        """
        core = self._session_core()
        code, result = core.master.release_all_kv_sessions(core.tenant, confirm)
        _raise_unless_ok(code, "*")
        return result

    def release_kv_cache(self, keep_pinned: bool = True) -> ReleaseResult:
        """Remove every KV-cache object of this tenant (data type KVCACHE or UNKNOWN) while
        other data, e.g. WEIGHT, stays resident; pinned sessions' objects stay unless
        ``keep_pinned`` is false. Nothing restarts."""
        core = self._session_core()
        code, result = core.master.release_kv_cache(core.tenant, keep_pinned)
        _raise_unless_ok(code, "*")
        return result
