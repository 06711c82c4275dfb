"""One tenant's sessions at a glance: totals over all of them and the top sessions by a figure.

:func:`overview_sliced` walks every session of a tenant once, in slices
(:mod:`~mooncake_py.master.service.slices`), reading each session's kept figures (no per-session
object is built): it sums the totals and keeps the ``limit`` sessions that rank first by one
figure, in a heap. It is what the dashboard asks for on every refresh, so its cost is O(sessions
x log limit) with a few attribute reads per session, and the lock is never held for more than
one slice. Weakly consistent, as the listing: each session is judged as it was when the walk
reached it; one that ended before the walk finished is left out of the ranking.

Thread-safety: takes the context's lock once per slice.
"""

from __future__ import annotations

import dataclasses
import heapq
import time

from mooncake_py.errors import ErrorCode
from mooncake_py.types import KvSessionInfo

from ..state.session_registry import KvSession, describe
from .context import ServiceContext
from .kv_sessions import public_info
from .slices import SLICE_SECONDS, SliceTimer, Steps

RANKINGS = ("pages_bytes", "exclusive_bytes", "idle_ms", "pages_cached")
"""The figures sessions can be ranked by (the memory API's field names)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SessionTotals:
    """Totals over every session of a tenant.

    Attributes:
        sessions: sessions.
        pinned: pinned sessions.
        pages: memberships (a member of two sessions counts twice).
        bytes: the sessions' bytes summed.
        exclusive_bytes: the sessions' exclusive bytes summed.
    """

    sessions: int = 0
    pinned: int = 0
    pages: int = 0
    bytes: int = 0
    exclusive_bytes: int = 0


Overview = tuple[ErrorCode, SessionTotals, list[KvSessionInfo]]


def _rank(session: KvSession, ranking: str) -> float:
    """The figure ``ranking`` names, growing with the rank (idle grows as activity is older)."""
    if ranking == "pages_bytes":
        return session.bytes
    if ranking == "exclusive_bytes":
        return session.exclusive_bytes
    if ranking == "pages_cached":
        return len(session.members)
    return -session.last_active_at  # idle_ms


def overview_sliced(
    context: ServiceContext,
    tenant: str,
    ranking: str | None = None,
    descending: bool = True,
    limit: int = 0,
    pinned: bool | None = None,
    min_idle_ms: float = 0.0,
    slice_seconds: float = SLICE_SECONDS,
) -> Steps[Overview]:
    """Totals over all of ``tenant``'s sessions, and the first ``limit`` by ``ranking``.

    Args:
        context: the service's shared state.
        tenant: the tenant (resolved by the context's rule).
        ranking: one of :data:`RANKINGS`, or None for totals only.
        descending: largest first (ties by session id, ascending, either way).
        limit: sessions to keep in the ranking (0: none).
        pinned: rank only pinned (True) or unpinned (False) sessions; None: all.
        min_idle_ms: rank only sessions idle at least this long.
        slice_seconds: how long one slice may hold the lock.

    Returns:
        (OK, totals, the ranked sessions described as of the walk's end); (INVALID_PARAMS,
        empty, []) for a bad tenant, an unknown ranking or a negative limit.

    Complexity: O(sessions x log limit), in slices; O(limit log limit) to finish.
    """
    resolved = context.tenants.resolve(tenant)
    if resolved is None or limit < 0 or (ranking is not None and ranking not in RANKINGS):
        return ErrorCode.INVALID_PARAMS, SessionTotals(), []
    lock, registry, clock = context.lock, context.state.sessions, context.clock
    sign = 1 if descending else -1
    # A min-heap of the best ``limit`` so far: (signed figure, negated id order, counter, s).
    kept: list[tuple[float, _Reversed, int, KvSession]] = []
    totals = [0, 0, 0, 0, 0]
    timer = SliceTimer(slice_seconds)
    cursor = ""
    seen = 0
    while True:
        with lock:
            now = clock()
            done = True
            for session in registry.sessions_after(resolved, cursor):
                cursor = session.session_id
                totals[0] += 1
                totals[1] += session.pinned
                totals[2] += len(session.members)
                totals[3] += session.bytes
                totals[4] += session.exclusive_bytes
                if limit and _chosen(session, now, pinned, min_idle_ms):
                    seen += 1
                    entry = (sign * _rank(session, ranking or ""), _Reversed(cursor), seen, session)
                    if len(kept) < limit:
                        heapq.heappush(kept, entry)
                    elif entry[:2] > kept[0][:2]:
                        heapq.heapreplace(kept, entry)
                if timer.spent():
                    done = False
                    break
        if done:
            break
        yield
        timer.restart()
    ranked = sorted(kept, key=lambda e: e[:2], reverse=True)
    with lock:
        now = clock()
        offset = time.time() - now
        infos = [
            public_info(describe(session), now, offset)
            for _, _, _, session in ranked
            if registry.get(session.tenant, session.session_id) is session
        ]
    return ErrorCode.OK, SessionTotals(*totals), infos


def _chosen(session: KvSession, now: float, pinned: bool | None, min_idle_ms: float) -> bool:
    if pinned is not None and session.pinned != pinned:
        return False
    return (now - session.last_active_at) * 1000 >= min_idle_ms


@dataclasses.dataclass(frozen=True, slots=True)
class _Reversed:
    """A session id that orders backwards, so that among equal figures the heap keeps (and
    the ranking lists first) the smaller id."""

    session_id: str

    def __lt__(self, other: _Reversed) -> bool:
        return self.session_id > other.session_id

    def __gt__(self, other: _Reversed) -> bool:
        return self.session_id < other.session_id
