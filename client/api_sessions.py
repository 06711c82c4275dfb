"""The KV-session calls of the typed :class:`~mooncake_py.Client`.

KV sessions are runtime state of the master: after a master restart, re-attach and re-pin
them. Errors are the typed exceptions of :mod:`mooncake_py.errors`; the calls are
thread-safe, as every :class:`~mooncake_py.Client` call.
"""

from __future__ import annotations

from collections.abc import Sequence

from mooncake_py.errors import ErrorCode, raise_for
from mooncake_py.types import KvSessionInfo, KvSessionPage, ReleaseResult

from .api_queries import ClientPart, invalid_params
from .results import BatchResult, KvSessionListing

INVALID = int(ErrorCode.INVALID_PARAMS)


def _check_session_id(session_id: str) -> None:
    if not isinstance(session_id, str) or not session_id:
        raise invalid_params("the session id must be a non-empty string", session_id)


def _check_limit(limit: int) -> None:
    if not isinstance(limit, int) or not 1 <= limit < 2**32:
        raise invalid_params(f"limit must be positive: {limit!r}")


class KvSessionCalls(ClientPart):
    """The KV-session half of :class:`~mooncake_py.Client` (a base class of it)."""

    def attach_kv_session(self, session_id: str, keys: Sequence[str]) -> BatchResult[None]:
        """Add existing objects to a session (creating it, unpinned, if needed).

        Returns:
            Per key: ok, OBJECT_NOT_FOUND, or SESSION_LIMIT_EXCEEDED (then nothing was added).
            Duplicate keys are harmless.

        Raises:
            InvalidParamsError: a bad id or key, or more keys than the master's batch limit.
        """
        core = self._joined()
        _check_session_id(session_id)
        codes = core.master.attach_kv_session(core.tenant, session_id, list(keys))
        if keys and all(c == INVALID for c in codes):
            raise invalid_params("attach refused", session_id)
        return BatchResult.of_codes(keys, codes)

    def pin_kv_session(self, session_id: str) -> None:
        """Protect the session's objects from ordinary eviction (no TTL).

        Raises:
            NotFoundError: SESSION_NOT_FOUND. InvalidParamsError: a bad id.
        """
        core = self._joined()
        _check_session_id(session_id)
        raise_for(core.master.set_kv_session_pin(core.tenant, session_id, True), key=session_id)

    def unpin_kv_session(self, session_id: str) -> None:
        """Remove this session's protection (other sessions' and TTL pins stay).

        Raises:
            NotFoundError: SESSION_NOT_FOUND. InvalidParamsError: a bad id.
        """
        core = self._joined()
        _check_session_id(session_id)
        raise_for(core.master.set_kv_session_pin(core.tenant, session_id, False), key=session_id)

    def update_kv_session(self, session_id: str, keep_keys: Sequence[str]) -> None:
        """Keep only the members in ``keep_keys`` (never adds, never deletes data); an
        unknown session is fine.

        Raises:
            LimitExceededError: the keep set is above the member limit. InvalidParamsError.
        """
        core = self._joined()
        _check_session_id(session_id)
        code = core.master.update_kv_session(core.tenant, session_id, list(keep_keys))
        raise_for(code, key=session_id)

    def close_kv_session(self, session_id: str) -> None:
        """Drop every membership and the pin; data stays cached. Idempotent."""
        core = self._joined()
        _check_session_id(session_id)
        raise_for(core.master.close_kv_session(core.tenant, session_id), key=session_id)

    def get_kv_session(self, session_id: str) -> KvSessionInfo:
        """What a session holds.

        Raises:
            NotFoundError: SESSION_NOT_FOUND. InvalidParamsError: a bad id.
        """
        core = self._joined()
        _check_session_id(session_id)
        code, info = core.master.get_kv_session(core.tenant, session_id)
        raise_for(code, key=session_id)
        assert info is not None
        return info

    def list_kv_session_keys(
        self, session_id: str, cursor: str = "", limit: int = 1024
    ) -> KvSessionPage:
        """One page of the session's keys after ``cursor`` (exclusive), in key order.

        Raises:
            NotFoundError: SESSION_NOT_FOUND. InvalidParamsError: a bad id or a limit outside
                [1, the master's batch limit].
        """
        core = self._joined()
        _check_session_id(session_id)
        _check_limit(limit)
        code, page = core.master.list_kv_session_keys(core.tenant, session_id, cursor, limit)
        raise_for(code, key=session_id)
        assert page is not None
        return page

    def list_kv_sessions(
        self,
        cursor: str = "",
        limit: int = 1024,
        pinned: bool | None = None,
        min_idle_ms: int = 0,
    ) -> KvSessionListing:
        """One page of this tenant's sessions (weakly consistent).

        Args:
            cursor: "" for the first page, then the returned ``next_cursor``.
            limit: sessions per page.
            pinned: only pinned (True) or unpinned (False) sessions; None for all.
            min_idle_ms: only sessions idle at least this long.

        Raises:
            InvalidParamsError: a bad limit or a negative idle bound.
        """
        core = self._joined()
        _check_limit(limit)
        if min_idle_ms < 0:
            raise invalid_params("min_idle_ms must not be negative")
        code, infos, next_cursor = core.master.list_kv_sessions(
            core.tenant, cursor, limit, pinned, min_idle_ms
        )
        raise_for(code)
        return KvSessionListing(infos, next_cursor)

    def release_kv_session(self, session_id: str, all_pages: bool = False) -> ReleaseResult:
        """Close the session and remove its members that nothing else needs (not shared with
        another session, not hard pinned, not being written). An unknown session releases
        nothing and says so in ``message``.

        Args:
            session_id: the session.
            all_pages: also remove the members other sessions share (they leave those
                sessions too); hard-pinned members and writes in flight still stay.
        """
        core = self._joined()
        _check_session_id(session_id)
        code, result = core.master.release_kv_session(core.tenant, session_id, all_pages)
        raise_for(code, key=session_id)
        return result

    def release_stale_kv_sessions(
        self, max_idle_ms: int, include_pinned: bool = False
    ) -> ReleaseResult:
        """Release every session idle for longer than ``max_idle_ms``; returns the totals."""
        core = self._joined()
        if max_idle_ms < 0:
            raise invalid_params("max_idle_ms must not be negative")
        code, result = core.master.release_stale_kv_sessions(
            core.tenant, max_idle_ms, include_pinned
        )
        raise_for(code)
        return result

    def release_all_kv_sessions(self, confirm: bool = False) -> ReleaseResult:
        """Release every session of this tenant.

        Raises:
            InvalidParamsError: unless ``confirm`` is true.
        """
        core = self._joined()
        code, result = core.master.release_all_kv_sessions(core.tenant, confirm)
        raise_for(code, result.message)
        return result

    def release_kv_cache(self, keep_pinned: bool = True) -> ReleaseResult:
        """Remove every KV-cache object of this tenant (data type KVCACHE or UNKNOWN) while
        other data, e.g. WEIGHT, stays; pinned sessions' objects stay unless ``keep_pinned``
        is false."""
        core = self._joined()
        code, result = core.master.release_kv_cache(core.tenant, keep_pinned)
        raise_for(code)
        return result
