"""The KV session registry: bounded, many-to-many membership of objects in sessions.

A session is an application-chosen id scoped to a tenant. It holds keys of that tenant's
objects; an object may belong to many sessions. There is no create call: the first attach or
admitted tagged write creates a session, unpinned, and it disappears with its pin as soon as
its last member goes, by whatever path (remove, eviction, client death, failed write, update,
close). With replication on, every change is marked in the journal (:mod:`..ha.journal`):
sessions, their pins and memberships survive a failover.

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

Per-tenant counts. The registry keeps, for every tenant with sessions, how many it has and
how many of them are pinned (:meth:`SessionRegistry.tenant_counts`), and the store-wide pinned
count (:meth:`SessionRegistry.pinned_count`), exact on every change: a session is created and
dropped only here, and setting :attr:`KvSession.pinned` (whoever sets it) tells the registry
that made it. Reading those counts is O(1).

Complexity: attach O(keys · log members); pin/unpin/get O(1); member removal O(log members);
list O(page · log members); update O(members · log members) in pages.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedSet

from mooncake_py.errors import ErrorCode

from .objects import ObjectMetadata

if TYPE_CHECKING:
    from ..ha.journal import Journal

MAX_SESSION_ID_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class SessionLimits:
    """Bounds of the registry (upstream's ``MC_KV_SESSION_*`` limits)."""

    max_sessions: int = 100_000
    max_members: int = 1_000_000
    max_per_object: int = 100_000
    max_batch: int = 4096


class SessionCounts:
    """One tenant's ``sessions`` and ``pinned`` sessions, kept by :class:`SessionRegistry`."""

    __slots__ = ("sessions", "pinned")

    def __init__(self) -> None:
        self.sessions = 0
        self.pinned = 0


class KvSession:
    """One session: its members (keys, kept sorted for paging), its pin flag, and accounting.

    ``bytes`` is the sum of the members' sizes times their replicas; ``exclusive_bytes`` the
    part of it held by members that belong to no other session. Both are kept exact on every
    change (see :meth:`SessionRegistry.reweigh`), never recomputed on a read.
    """

    __slots__ = (
        "tenant",
        "session_id",
        "_pinned",
        "_registry",
        "members",
        "created_at",
        "last_active_at",
        "bytes",
        "exclusive_bytes",
        "admitting",
    )

    def __init__(self, tenant: str, session_id: str, now: float) -> None:
        self.tenant = tenant
        self.session_id = session_id
        self._pinned = False
        # The registry that counts this session's pin; None once dropped (or never added).
        self._registry: SessionRegistry | None = None
        self.members: SortedSet = SortedSet()
        self.created_at = now
        self.last_active_at = now
        self.bytes = 0
        self.exclusive_bytes = 0
        # Tagged writes admitted but not yet registered: while any is, the session outlives
        # losing its last member (the write's own eviction may take it) and keeps its pin.
        self.admitting = 0

    @property
    def pinned(self) -> bool:
        """Whether the session is pinned (its members are soft pinned). O(1)."""
        return self._pinned

    @pinned.setter
    def pinned(self, pinned: bool) -> None:
        """Pin or unpin; a session in a registry has its change counted there. O(1)."""
        pinned = bool(pinned)
        if pinned == self._pinned:
            return
        self._pinned = pinned
        if self._registry is not None:
            self._registry._count_pin(self, 1 if pinned else -1)

    def __repr__(self) -> str:
        return f"KvSession({self.tenant!r}, {self.session_id!r}, members={len(self.members)})"


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """What ``get_kv_session`` reports (times on the service clock)."""

    session_id: str
    pinned: bool
    member_count: int
    created_at: float
    last_active_at: float
    bytes: int
    exclusive_bytes: int


def weight(meta: ObjectMetadata) -> int:
    """Bytes an object holds: its size times its replicas."""
    return meta.size * len(meta.replicas)


def describe(session: KvSession) -> SessionInfo:
    """A session's reportable state."""
    return SessionInfo(
        session.session_id,
        session.pinned,
        len(session.members),
        session.created_at,
        session.last_active_at,
        session.bytes,
        session.exclusive_bytes,
    )


def pinned_by_session(meta: ObjectMetadata) -> bool:
    """True when any session holding ``meta`` is pinned. O(references), no registry access."""
    sessions = meta.sessions
    # The flag itself rather than the property: eviction asks this of every candidate.
    return sessions is not None and any(s._pinned for s in sessions)


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

    def __init__(
        self, limits: SessionLimits, on_unpinned: Callable[[], None] | None = None
    ) -> None:
        self.limits = limits
        self._on_unpinned = on_unpinned
        self._sessions: dict[tuple[str, str], KvSession] = {}
        # Session ids in order, for paged listings.
        self._order: SortedSet = SortedSet()
        self.memberships = 0
        # Per tenant with sessions; entries go with a tenant's last session.
        self._counts: dict[str, SessionCounts] = {}
        self._pinned_total = 0
        # Told of every session whose own fields change and every object whose memberships
        # change, when the metadata is replicated.
        self.journal: Journal | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    def session_keys(self) -> list[tuple[str, str]]:
        """(tenant, session id) of every session. O(sessions)."""
        return list(self._sessions)

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

    def add(self, meta: ObjectMetadata, session_ids: Iterable[str], now: float) -> None:
        """Make ``meta`` a member of each session (creating sessions as needed).

        The caller checked :meth:`check_admission` first. Marks each session active.
        """
        journal = self.journal
        for session_id in session_ids:
            session = self._sessions.get((meta.tenant, session_id))
            if session is None:
                session = self._create(meta.tenant, session_id, now)
            session.last_active_at = now
            if journal is not None:
                journal.session(meta.tenant, session_id)
            if meta.sessions is None:
                meta.sessions = set()
                meta.session_weight = weight(meta)
            if session in meta.sessions:
                continue
            held = meta.session_weight
            others = meta.sessions
            if not others:
                session.exclusive_bytes += held
            elif len(others) == 1:
                next(iter(others)).exclusive_bytes -= held
            others.add(session)
            session.members.add(meta.key)
            session.bytes += held
            self.memberships += 1
            if journal is not None:
                journal.membership(meta.tenant, meta.key, session_id, True)

    def touch(self, session: KvSession, now: float) -> None:
        """The session was named by a call: it is active now."""
        session.last_active_at = now
        if self.journal is not None:
            self.journal.session(session.tenant, session.session_id)

    def _create(self, tenant: str, session_id: str, now: float) -> KvSession:
        session = self._sessions[(tenant, session_id)] = KvSession(tenant, session_id, now)
        self._order.add((tenant, session_id))
        session._registry = self
        counts = self._counts.get(tenant)
        if counts is None:
            counts = self._counts[tenant] = SessionCounts()
        counts.sessions += 1
        if self.journal is not None:
            self.journal.session(tenant, session_id)
        return session

    def _drop(self, session: KvSession) -> None:
        scoped = (session.tenant, session.session_id)
        if self._sessions.get(scoped) is not session:
            return  # dropped already
        del self._sessions[scoped]
        self._order.discard(scoped)
        if session._pinned:
            self._count_pin(session, -1)
        # A reference kept past this point may still set the flag: it no longer counts here.
        session._registry = None
        if self.journal is not None:
            self.journal.session(*scoped)
        counts = self._counts[session.tenant]
        counts.sessions -= 1
        if not counts.sessions:
            del self._counts[session.tenant]

    def _count_pin(self, session: KvSession, delta: int) -> None:
        """``session`` (one of this registry's) was pinned (+1) or unpinned (-1); an unpin
        also tells ``on_unpinned`` (its members may have lost their pin). O(1)."""
        self._counts[session.tenant].pinned += delta
        self._pinned_total += delta
        if self.journal is not None:
            self.journal.session(session.tenant, session.session_id)
        if delta < 0 and self._on_unpinned is not None:
            self._on_unpinned()

    def hold(self, tenant: str, session_ids: Iterable[str]) -> list[KvSession]:
        """Keep the existing sessions among ``session_ids`` alive during an admitted write."""
        held = [s for s in map(lambda i: self._sessions.get((tenant, i)), session_ids) if s]
        for session in held:
            session.admitting += 1
        return held

    def release_hold(self, held: list[KvSession]) -> None:
        """End :meth:`hold`; a session left without members then ends as usual."""
        for session in held:
            session.admitting -= 1
            if not session.members and not session.admitting:
                self._drop(session)

    def reweigh(self, meta: ObjectMetadata) -> None:
        """``meta``'s size or replicas changed: move the difference into its sessions. O(refs)."""
        sessions = meta.sessions
        if not sessions:
            return
        delta = weight(meta) - meta.session_weight
        if not delta:
            return
        meta.session_weight += delta
        for session in sessions:
            session.bytes += delta
        if len(sessions) == 1:
            next(iter(sessions)).exclusive_bytes += delta

    # -- removal ---------------------------------------------------------------------------

    def detach(self, meta: ObjectMetadata, session: KvSession) -> None:
        """Remove one membership; a session left empty disappears with its pin."""
        sessions = meta.sessions
        if session.pinned and self._on_unpinned is not None:
            self._on_unpinned()
        if sessions is not None and session in sessions:
            held = meta.session_weight
            sessions.discard(session)
            session.bytes -= held
            self.memberships -= 1
            if not sessions:
                session.exclusive_bytes -= held
                # Both back to their defaults, so the record can drop its side record.
                meta.sessions = None
                meta.session_weight = 0
            elif len(sessions) == 1:
                next(iter(sessions)).exclusive_bytes += held
        session.members.discard(meta.key)
        if self.journal is not None:
            self.journal.membership(session.tenant, meta.key, session.session_id, False)
        if not session.members and not session.admitting:
            self._drop(session)

    def adopt(
        self,
        successor: ObjectMetadata | None,
        predecessor: ObjectMetadata,
        memberships: set[Any] | None,
    ) -> None:
        """Hand the memberships of a replaced object to its ``successor`` (same key); with no
        successor (its write was refused) they end, as for any removed object."""
        if not memberships:
            return
        holder = successor if successor is not None else predecessor
        holder.sessions = memberships
        if self.journal is not None:
            self.journal.object(holder.object_id)
        holder.session_weight = predecessor.session_weight
        if successor is not None:
            self.reweigh(successor)
        else:
            self.on_object_removed(predecessor)

    def on_object_removed(self, meta: ObjectMetadata) -> None:
        """Drop every membership of an object that is going away. O(references)."""
        for session in list(meta.sessions or ()):
            self.detach(meta, session)

    # -- queries ---------------------------------------------------------------------------

    def info(self, tenant: str, session_id: str) -> SessionInfo | None:
        """A session's state, or None when it does not exist. O(1)."""
        session = self._sessions.get((tenant, session_id))
        return None if session is None else describe(session)

    def pinned_count(self) -> int:
        """Sessions pinned now, in every tenant. O(1)."""
        return self._pinned_total

    def tenant_counts(self, tenant: str) -> tuple[int, int]:
        """``(sessions, pinned sessions)`` of ``tenant``. O(1)."""
        counts = self._counts.get(tenant)
        return (0, 0) if counts is None else (counts.sessions, counts.pinned)

    def tenants(self) -> list[tuple[str, int, int]]:
        """``(tenant, sessions, pinned sessions)`` of every tenant with sessions.
        O(tenants)."""
        return [(tenant, c.sessions, c.pinned) for tenant, c in self._counts.items()]

    def sessions_after(self, tenant: str, cursor: str) -> Iterable[KvSession]:
        """The tenant's sessions with ids after ``cursor`` (exclusive), in id order."""
        start = (tenant, cursor)
        for scoped in self._order.irange(minimum=start, inclusive=(False, True)):
            if scoped[0] != tenant:
                return
            yield self._sessions[scoped]

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
        objects_seen = [m for m in objects if m.sessions is not None]
        for meta in objects_seen:
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
        if self.memberships != sum(len(r.members) for r in self._sessions.values()):
            raise AssertionError("membership count disagrees with sessions")
        if set(self._order) != set(self._sessions):
            raise AssertionError("session order index disagrees with sessions")
        recount: dict[tuple[str, str], list[int]] = {}
        for meta in objects_seen:
            held = weight(meta)
            if meta.session_weight != held:
                raise AssertionError(
                    f"{meta.object_id!r} accounted {meta.session_weight} != {held}"
                )
            for ref in meta.sessions or ():
                totals = recount.setdefault((ref.tenant, ref.session_id), [0, 0])
                totals[0] += held
                totals[1] += held if len(meta.sessions or ()) == 1 else 0
        for scoped, record in self._sessions.items():
            if [record.bytes, record.exclusive_bytes] != recount.get(scoped, [0, 0]):
                raise AssertionError(f"session {scoped!r} bytes disagree with a recount")
            if not record.members and not record.admitting:
                raise AssertionError(f"empty session {scoped!r} survives")
            if set(record.members) != seen.get(scoped, set()):
                raise AssertionError(f"session {scoped!r} members disagree with objects")
        if len(self._sessions) > self.limits.max_sessions:
            raise AssertionError("more sessions than the limit")
        self._check_counts()

    def _check_counts(self) -> None:
        """Recount the per-tenant and store-wide session counts. O(sessions)."""
        recount: dict[str, list[int]] = {}
        for record in self._sessions.values():
            if record._registry is not self:
                raise AssertionError(f"session {record!r} is not counted by its registry")
            counts = recount.setdefault(record.tenant, [0, 0])
            counts[0] += 1
            counts[1] += record._pinned
        kept = {tenant: [c.sessions, c.pinned] for tenant, c in self._counts.items()}
        if kept != recount:
            raise AssertionError(f"per-tenant session counts {kept} != recount {recount}")
        if self._pinned_total != sum(pinned for _, pinned in recount.values()):
            raise AssertionError("pinned session count disagrees with the sessions")
