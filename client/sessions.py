"""KV session calls of ``MooncakeDistributedStore`` (names and keywords as upstream's session
branch). Unlike the data calls, failures raise :class:`MooncakeError` whose message names the
code (SESSION_NOT_FOUND, SESSION_LIMIT_EXCEEDED, INVALID_PARAMS, RPC_FAIL, ...).

Session state lives only in the master's memory: after a master restart, applications re-attach
their objects and re-pin their sessions.
"""

from __future__ import annotations

from collections.abc import Sequence

from mooncake_py.client.core import ClientCore
from mooncake_py.errors import ErrorCode, MooncakeError
from mooncake_py.types import KvSessionInfo, KvSessionPage


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
