"""The KV session registry: bounded, many-to-many membership of objects in sessions.

A session is an application-chosen id scoped to a tenant. It holds keys of that tenant's
objects; an object may belong to many sessions. There is no create call: the first attach or
admitted tagged write creates a session, unpinned, and it disappears with its pin as soon as
its last member goes, by whatever path (remove, eviction, client death, failed write, update,
close). Nothing here is persisted.

Concurrency design. All master state, this registry included, is owned by the service facade
and mutated only under its one lock; the registry has no lock of its own. Each object keeps
direct references to its :class:`KvSession` records (``ObjectMetadata.sessions``), and each
record carries its ``pinned`` flag as a plain attribute. Pin and unpin set that attribute:
O(1) whatever the session's size. The eviction loop decides "effectively soft pinned" by
reading the flags through the examined object's own references (:func:`pinned_by_session`),
O(references on that object), without looking anything up in the registry's indexes. That is
safe because a record is only ever reached through a live object's references (removing the
last member drops the record from the registry, after which no object refers to it) and the
flag is a single attribute whose reads and writes are atomic; eviction slices and pin calls run
under the same service lock, so a slice sees a pin either before or after it, never half.

Complexity: attach O(keys · log members); pin/unpin/get O(1); member removal O(log members);
list O(page · log members); update O(members · log members) in pages.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from sortedcontainers import SortedSet

from mooncake_py.errors import ErrorCode
from mooncake_py.master.metadata import ObjectMetadata

MAX_SESSION_ID_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class SessionLimits:
    """Bounds of the registry (upstream's ``MC_KV_SESSION_*`` limits)."""

    max_sessions: int = 100_000
    max_members: int = 1_000_000
    max_per_object: int = 100_000
    max_batch: int = 4096


class KvSession:
    """One session: its members (keys, kept sorted for paging) and its pin flag."""

    __slots__ = ("tenant", "session_id", "pinned", "members")

    def __init__(self, tenant: str, session_id: str) -> None:
        self.tenant = tenant
        self.session_id = session_id
        self.pinned = False
        self.members: SortedSet = SortedSet()

    def __repr__(self) -> str:
        return f"KvSession({self.tenant!r}, {self.session_id!r}, members={len(self.members)})"


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """What ``get_kv_session`` reports."""

    session_id: str
    pinned: bool
    member_count: int


def pinned_by_session(meta: ObjectMetadata) -> bool:
    """True when any session holding ``meta`` is pinned. O(references), no registry access."""
    sessions = meta.sessions
    return sessions is not None and any(s.pinned for s in sessions)


def valid_session_id(session_id: object) -> bool:
    """Non-empty, at most 4096 UTF-8 bytes, no NUL."""
    if not isinstance(session_id, str) or not session_id or "\0" in session_id:
        return False
    if len(session_id) <= MAX_SESSION_ID_BYTES // 4:
        return True
    try:
        return len(session_id.encode("utf-8")) <= MAX_SESSION_ID_BYTES
    except UnicodeEncodeError:
        return False


class SessionRegistry:
    """All sessions of all tenants. Not thread-safe: see the module docstring."""

    def __init__(self, limits: SessionLimits) -> None:
        self.limits = limits
        self._sessions: dict[tuple[str, str], KvSession] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, tenant: str, session_id: str) -> KvSession | None:
        """The session, or None. O(1)."""
        return self._sessions.get((tenant, session_id))

    # -- admission -------------------------------------------------------------------------

    def check_admission(
        self, tenant: str, plan: Sequence[tuple[ObjectMetadata | None, str, list[str]]]
    ) -> ErrorCode:
        """Would adding these memberships stay within every limit?

        Args:
            plan: (existing object or None for one about to be created, key, session ids).

        Returns:
            OK, INVALID_PARAMS (a bad id) or SESSION_LIMIT_EXCEEDED. Changes nothing.
        """
        new_sessions: set[str] = set()
        added: dict[str, set[str]] = {}
        for meta, key, session_ids in plan:
            unique = set(session_ids)
            if not all(valid_session_id(s) for s in unique):
                return ErrorCode.INVALID_PARAMS
            current = meta.sessions if meta is not None and meta.sessions else ()
            already = {s.session_id for s in current}
            if len(already | unique) > self.limits.max_per_object:
                return ErrorCode.SESSION_LIMIT_EXCEEDED
            for session_id in unique - already:
                session = self._sessions.get((tenant, session_id))
                if session is None:
                    new_sessions.add(session_id)
                    size = 0
                else:
                    size = len(session.members)
                joining = added.setdefault(session_id, set())
                joining.add(key)
                if size + len(joining) > self.limits.max_members:
                    return ErrorCode.SESSION_LIMIT_EXCEEDED
        if len(self._sessions) + len(new_sessions) > self.limits.max_sessions:
            return ErrorCode.SESSION_LIMIT_EXCEEDED
        return ErrorCode.OK

    def add(self, meta: ObjectMetadata, session_ids: Iterable[str]) -> None:
        """Make ``meta`` a member of each session (creating sessions as needed).

        The caller checked :meth:`check_admission` first.
        """
        for session_id in session_ids:
            key = (meta.tenant, session_id)
            session = self._sessions.get(key)
            if session is None:
                session = self._sessions[key] = KvSession(meta.tenant, session_id)
            if meta.sessions is None:
                meta.sessions = set()
            if session not in meta.sessions:
                meta.sessions.add(session)
                session.members.add(meta.key)

    # -- removal ---------------------------------------------------------------------------

    def detach(self, meta: ObjectMetadata, session: KvSession) -> None:
        """Remove one membership; a session left empty disappears with its pin."""
        if meta.sessions is not None:
            meta.sessions.discard(session)
            if not meta.sessions:
                meta.sessions = None
        session.members.discard(meta.key)
        if not session.members:
            self._sessions.pop((session.tenant, session.session_id), None)

    def adopt(self, meta: ObjectMetadata | None, key: str, memberships: set[Any] | None) -> None:
        """Hand the memberships of a replaced object (same key) to ``meta``; with no successor
        (its write was refused) the memberships end, as for any removed object."""
        if not memberships:
            return
        if meta is not None:
            meta.sessions = (meta.sessions or set()) | memberships
            return
        for session in memberships:
            session.members.discard(key)
            if not session.members:
                self._sessions.pop((session.tenant, session.session_id), None)

    def on_object_removed(self, meta: ObjectMetadata) -> None:
        """Drop every membership of an object that is going away. O(references)."""
        for session in list(meta.sessions or ()):
            self.detach(meta, session)

    # -- queries ---------------------------------------------------------------------------

    def info(self, tenant: str, session_id: str) -> SessionInfo | None:
        """Pin flag and member count, or None when the session does not exist."""
        session = self._sessions.get((tenant, session_id))
        if session is None:
            return None
        return SessionInfo(session_id, session.pinned, len(session.members))

    def page(self, session: KvSession, cursor: str, limit: int) -> tuple[list[str], str]:
        """Members after ``cursor`` (exclusive) in key order, and the next cursor ("" = done)."""
        members = session.members
        walk = members.irange(minimum=cursor, inclusive=(False, True)) if cursor else iter(members)
        keys = list(itertools.islice(walk, limit))
        more = bool(keys) and session.members.bisect_right(keys[-1]) < len(session.members)
        return keys, keys[-1] if more else ""

    def check(self, objects: Iterable[ObjectMetadata]) -> None:
        """Verify both directions of membership and that no empty session survives.

        Raises:
            AssertionError: the indexes disagree.
        """
        seen: dict[tuple[str, str], set[str]] = {}
        for meta in objects:
            if meta.sessions is not None and not meta.sessions:
                raise AssertionError(f"{meta.object_id!r} keeps an empty session set")
            for ref in meta.sessions or ():
                scoped = (ref.tenant, ref.session_id)
                if ref.tenant != meta.tenant:
                    raise AssertionError(f"{meta.object_id!r} is in another tenant's session")
                if self._sessions.get(scoped) is not ref:
                    raise AssertionError(
                        f"{meta.object_id!r} refers to a dropped session {scoped!r}"
                    )
                seen.setdefault(scoped, set()).add(meta.key)
        for scoped, record in self._sessions.items():
            if not record.members:
                raise AssertionError(f"empty session {scoped!r} survives")
            if set(record.members) != seen.get(scoped, set()):
                raise AssertionError(f"session {scoped!r} members disagree with objects")
        if len(self._sessions) > self.limits.max_sessions:
            raise AssertionError("more sessions than the limit")
