"""Seeded randomized stress of KV sessions against a shadow model of membership.

Weighted random operations run on a :class:`MasterService` with a FakeClock and small session
limits (so every limit is hit): tagged and untagged puts and upserts, put end and revoke,
attach, pin/unpin, update, close, get, list, remove, reads (leases), eviction passes, segment
churn, client expiry, put sweeps and clock jumps. ``service.check()`` runs after every operation.

The model keeps each session's members and pin flag. It predicts exactly every answer of attach,
pin/unpin, update, close, get and list, and the admission verdict of every tagged write
(INVALID_PARAMS / SESSION_LIMIT_EXCEEDED, which must change nothing). Write outcomes that depend
on the allocator (OK or NO_AVAILABLE_HANDLE) are read from the service and applied.

Objects can also vanish through eviction, which the model does not predict. After every
operation it reconciles: each object that disappeared without the operation explaining it must
have been evictable when the operation began (readable, no write in flight, no live lease), the
operation must be one that may evict, a soft-pinned object (TTL pin or any pinned session) may
go only if soft-pinned eviction is allowed and only after every ordinary evictable object went,
and the eviction counters move by exactly what disappeared. The vanished objects' memberships
are then dropped from the model, with every session they empty.

After every operation the model and the service must agree on the whole registry: the set of
sessions, each one's pin flag and member count, and each object's sessions.

An admitted tagged write holds the existing sessions it names until it has registered: when its
own eviction or preemption takes a held session's last member, the session survives with its pin.
An upsert never evicts its own object to make room for itself.
"""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.state.objects import ObjectMetadata
from mooncake_py.types import ReplicateConfig, SegmentInfo, SoftPinAction

OPS = 3000
KEYS = [f"k{i:02d}" for i in range(40)]
SESSIONS = [f"s{i:02d}" for i in range(10)]  # more than MAX_SESSIONS
BAD_IDS = ["", "bad\0id", "x" * 4097]
WRITERS = ["w0", "w1"]
OWNERS = ["c0", "c1", "c2"]
SEGMENT_BYTES = 24 * 1024
SIZES = [512, 1024, 2048, 4096, 8192]

MAX_SESSIONS = 6
MAX_MEMBERS = 8
MAX_PER_OBJECT = 3
MAX_BATCH = 8

TTL_S = 40.0
LEASE_MS = 2000
DISCARD_S = 4.0
RELEASE_S = 15.0
SOFT_PIN_DEFAULT_MS = 6000
SOFT_PIN_MAX_MS = 30_000

PIN_CHOICES = [
    (SoftPinAction.PRESERVE, None),
    (SoftPinAction.PRESERVE, None),
    (SoftPinAction.PRESERVE, None),
    (SoftPinAction.ENABLE, None),
    (SoftPinAction.ENABLE, 3000),
    (SoftPinAction.DISABLE, None),
]

WEIGHTS = {
    "put": 18,
    "upsert": 8,
    "put_end": 16,
    "revoke": 3,
    "attach": 10,
    "pin": 5,
    "unpin": 4,
    "update": 4,
    "close": 3,
    "get": 4,
    "list": 4,
    "remove": 5,
    "read": 6,
    "evict": 4,
    "advance": 8,
    "sweep": 3,
    "reap": 3,
    "ping": 6,
    "mount": 3,
    "unmount": 1,
}

# Operations that may evict: writes that need room, and watermark passes.
EVICTING_OPS = {"put", "upsert", "evict"}

OK = ErrorCode.OK
INVALID = ErrorCode.INVALID_PARAMS
LIMIT = ErrorCode.SESSION_LIMIT_EXCEEDED
SESSION_NOT_FOUND = ErrorCode.SESSION_NOT_FOUND
NOT_FOUND = ErrorCode.OBJECT_NOT_FOUND
EXISTS = ErrorCode.OBJECT_ALREADY_EXISTS
NO_HANDLE = ErrorCode.NO_AVAILABLE_HANDLE


def valid_id(session_id: str) -> bool:
    return bool(session_id) and "\0" not in session_id and len(session_id.encode("utf-8")) <= 4096


@dataclasses.dataclass
class Session:
    members: set[str]
    pinned: bool = False


@dataclasses.dataclass(frozen=True)
class Seen:
    """An object as it was when an operation began."""

    meta: ObjectMetadata  # identity (kept alive so ``is`` comparisons stay meaningful)
    readable: bool
    writing: bool
    lease_timeout: float
    soft_deadline: float
    client: str
    start: float
    size: int
    segments: frozenset[str]


class Model:
    """The service under test plus the shadow of its session registry."""

    def __init__(self, seed: int, allow_soft: bool) -> None:
        self.rng = random.Random(seed)
        self.allow_soft = allow_soft
        self.clock = FakeClock()
        config = MasterConfig(
            client_ttl=TTL_S,
            default_kv_lease_ttl=LEASE_MS,
            put_start_discard_timeout_sec=DISCARD_S,
            put_start_release_timeout_sec=RELEASE_S,
            default_kv_soft_pin_ttl=SOFT_PIN_DEFAULT_MS,
            max_kv_soft_pin_ttl=SOFT_PIN_MAX_MS,
            eviction_high_watermark_ratio=0.8,
            eviction_ratio=0.15,
            allow_evict_soft_pinned_objects=allow_soft,
            kv_session_max_sessions=MAX_SESSIONS,
            kv_session_max_members=MAX_MEMBERS,
            kv_session_max_per_object=MAX_PER_OBJECT,
            kv_session_max_batch=MAX_BATCH,
        )
        self.service = MasterService(config, clock=self.clock, rng=random.Random(seed))
        self.sessions: dict[str, Session] = {}
        self.segment_of: dict[str, str | None] = dict.fromkeys(OWNERS)
        self.incarnation = 0
        self.counts: dict[str, int] = dict.fromkeys(WEIGHTS, 0)
        self.codes: dict[tuple[str, int], int] = {}
        self.events: dict[str, int] = dict.fromkeys(
            [
                "evicted",
                "evicted_pinned",
                "fallback_checks",
                "preempted",
                "list_walks",
                "reaped_owners",
                "lost_to_segments",
                "swept",
                "held_sessions",
            ],
            0,
        )
        for owner in OWNERS:
            self.mount(owner)

    # -- model helpers ---------------------------------------------------------------------

    def of_key(self, key: str) -> set[str]:
        return {sid for sid, s in self.sessions.items() if key in s.members}

    def key_pinned(self, key: str) -> bool:
        return any(s.pinned for s in self.sessions.values() if key in s.members)

    def add(self, key: str, session_ids: list[str]) -> None:
        for sid in session_ids:
            self.sessions.setdefault(sid, Session(set())).members.add(key)

    def drop_key(self, key: str) -> None:
        for sid in list(self.sessions):
            members = self.sessions[sid].members
            members.discard(key)
            if not members:
                del self.sessions[sid]

    def admission(self, present: set[str], plan: list[tuple[str, list[str]]]) -> ErrorCode:
        """What the registry must answer for adding these (key, session ids) memberships."""
        new_sessions: set[str] = set()
        joining: dict[str, set[str]] = {}
        for key, session_ids in plan:
            unique = set(session_ids)
            if not all(valid_id(s) for s in unique):
                return INVALID
            already = self.of_key(key) if key in present else set()
            if len(already | unique) > MAX_PER_OBJECT:
                return LIMIT
            for sid in unique - already:
                session = self.sessions.get(sid)
                if session is None:
                    new_sessions.add(sid)
                size = 0 if session is None else len(session.members)
                joining.setdefault(sid, set()).add(key)
                if size + len(joining[sid]) > MAX_MEMBERS:
                    return LIMIT
        if len(self.sessions) + len(new_sessions) > MAX_SESSIONS:
            return LIMIT
        return OK

    def snapshot(self) -> dict[str, Seen]:
        seen: dict[str, Seen] = {}
        for key in KEYS:
            meta = self.service.object_of("", key)
            if meta is None:
                continue
            seen[key] = Seen(
                meta=meta,
                readable=meta.is_readable(),
                writing=meta.is_writing(),
                lease_timeout=meta.lease_timeout,
                soft_deadline=meta.soft_pin_deadline,
                client=meta.client_id,
                start=meta.put_start_time,
                size=meta.size,
                segments=frozenset(r.segment_id for r in meta.replicas),
            )
        return seen

    def mount(self, owner: str) -> None:
        self.incarnation += 1
        seg_id = f"seg-{owner}-{self.incarnation}"
        info = SegmentInfo(
            id=seg_id,
            name=f"name-{owner}",
            base=0x1000,
            size=SEGMENT_BYTES,
            te_endpoint="127.0.0.1:1",
        )
        assert self.service.mount_segment(owner, info) == OK
        self.segment_of[owner] = seg_id

    def record(self, op: str, code: int) -> None:
        self.codes[(op, int(code))] = self.codes.get((op, int(code)), 0) + 1

    # -- one operation ---------------------------------------------------------------------

    def step(self) -> None:
        names = list(WEIGHTS)
        op = self.rng.choices(names, weights=[WEIGHTS[n] for n in names])[0]
        self.counts[op] += 1
        now = self.clock()
        before = self.snapshot()
        pinned_before = {k: self.key_pinned(k) for k in before}
        stats_before = self.service.stats()
        self.explained: set[str] = set()  # keys whose disappearance the op itself explains
        self.must_go: set[str] = set()  # keys the op must have removed
        self.may_evict = op in EVICTING_OPS
        self.protected: set[str] = set()  # an upsert's own object, out of eviction's reach
        # An admitted tagged write registers its tags once its write has started (after any
        # eviction it caused): (key, session ids).
        self.pending: tuple[str, list[str]] | None = None
        self.pins_before = {sid: s.pinned for sid, s in self.sessions.items()}
        getattr(self, f"op_{op}")(now, before)
        self.reconcile(op, now, before, pinned_before, stats_before)
        self.compare()
        self.service.check()

    # -- writes ----------------------------------------------------------------------------

    def write_args(self) -> tuple[str, int, list[str] | None, ReplicateConfig]:
        key = self.rng.choice(KEYS)
        size = self.rng.choice(SIZES)
        roll = self.rng.random()
        tags: list[str] | None
        if roll < 0.35:
            tags = None
        elif roll < 0.9:
            tags = self.rng.sample(SESSIONS, self.rng.choice([1, 1, 1, 2, MAX_PER_OBJECT]))
        elif roll < 0.96:
            tags = self.rng.sample(SESSIONS, MAX_PER_OBJECT + 1)  # over the per-object limit
        else:
            tags = [self.rng.choice(SESSIONS), self.rng.choice(BAD_IDS)]
        if tags and self.rng.random() < 0.1:
            tags = tags + tags[:1]  # a duplicate in the list
        action, ttl = self.rng.choice(PIN_CHOICES)
        cfg = ReplicateConfig(
            soft_pin_action=action,
            soft_pin_ttl_ms=ttl,
            kv_sessions=None if tags is None else [list(tags)],
        )
        return key, size, tags, cfg

    def admitted(
        self, op: str, key: str, tags: list[str] | None, code: int, present: set[str]
    ) -> bool:
        """Check a tagged write's admission; True when it went on to the write itself."""
        if not tags:
            return True
        expected = self.admission(present, [(key, tags)])
        if expected != OK:
            assert code == expected, (op, key, tags, ErrorCode.name_of(code))
            self.may_evict = False  # refused before any allocation
            return False
        assert code not in (INVALID, LIMIT), (op, key, tags, ErrorCode.name_of(code))
        return True

    def op_put(self, now: float, before: dict[str, Seen]) -> None:
        key, size, tags, cfg = self.write_args()
        writer = self.rng.choice(WRITERS)
        code = self.service.put_start(writer, "", key, size, cfg).code
        self.record("put", code)
        old = before.get(key)
        stale = old is not None and not old.readable and old.start + DISCARD_S < now
        # A stale write this put preempts does not count: its memberships die with it.
        if not self.admitted("put", key, tags, code, set(before) - ({key} if stale else set())):
            return
        if old is not None and not stale:
            assert code == EXISTS, ErrorCode.name_of(code)
            self.may_evict = False
            self.pending = (key, tags or [])
            return
        if old is not None:
            # A stale write: preempted, and its memberships end with it.
            self.events["preempted"] += 1
            self.drop_key(key)
            self.explained.add(key)
        assert code in (OK, NO_HANDLE), ErrorCode.name_of(code)
        meta = self.service.object_of("", key)
        if code == OK:
            assert meta is not None and meta.is_writing() and meta.size == size
            self.pending = (key, tags or [])
        else:
            assert meta is None

    def op_upsert(self, now: float, before: dict[str, Seen]) -> None:
        key, size, tags, cfg = self.write_args()
        writer = self.rng.choice(WRITERS)
        code = self.service.upsert_start(writer, "", key, size, cfg).code
        self.record("upsert", code)
        if not self.admitted("upsert", key, tags, code, set(before)):
            return
        old = before.get(key)
        meta = self.service.object_of("", key)
        if old is None:
            assert code in (OK, NO_HANDLE), ErrorCode.name_of(code)
            assert (meta is not None) == (code == OK)
        elif old.readable and old.lease_timeout > now:
            assert code == ErrorCode.OBJECT_REPLICA_BUSY, ErrorCode.name_of(code)
            self.may_evict = False
            return
        elif old.writing:
            # Preempts the write in flight; the memberships carry over to the new write.
            assert code in (OK, NO_HANDLE), ErrorCode.name_of(code)
            if code != OK:
                assert meta is None
                self.drop_key(key)
                self.explained.add(key)
                return
        elif old.size == size:
            assert code == OK, ErrorCode.name_of(code)
            assert meta is old.meta  # rewritten in place
            self.may_evict = False
        else:
            # Reallocated: it may evict others, never itself; refused, it changes nothing.
            assert code in (OK, NO_HANDLE), ErrorCode.name_of(code)
            assert meta is old.meta
            self.protected.add(key)
        if code == OK:
            assert meta is not None and meta.is_writing() and meta.size == size
            self.pending = (key, tags or [])

    def pick_key(self, before: dict[str, Seen], writing: bool | None = None) -> str:
        """Mostly a present key (being written or not, if asked), sometimes any key."""
        fitting = [k for k, s in before.items() if writing is None or s.writing == writing]
        if fitting and self.rng.random() < 0.85:
            return self.rng.choice(fitting)
        return self.rng.choice(KEYS)

    def op_put_end(self, now: float, before: dict[str, Seen]) -> None:
        key = self.pick_key(before, writing=True)
        old = before.get(key)
        writer = old.client if old is not None and self.rng.random() < 0.9 else "w0"
        self.record("put_end", self.service.put_end(writer, "", key))

    def op_revoke(self, now: float, before: dict[str, Seen]) -> None:
        key = self.pick_key(before, writing=True)
        old = before.get(key)
        writer = old.client if old is not None else "w0"
        code = self.service.put_revoke(writer, "", key)
        self.record("revoke", code)
        if code == OK:
            assert old is not None and old.writing
            self.must_go.add(key)

    def op_remove(self, now: float, before: dict[str, Seen]) -> None:
        key = self.pick_key(before)
        force = self.rng.random() < 0.3
        code = self.service.remove("", key, force)
        self.record("remove", code)
        old = before.get(key)
        if old is None:
            expected = NOT_FOUND
        elif old.writing:
            expected = ErrorCode.REPLICA_IS_NOT_READY
        elif not force and old.lease_timeout > now:
            expected = ErrorCode.OBJECT_HAS_LEASE
        else:
            expected = OK
        assert code == expected, (ErrorCode.name_of(code), ErrorCode.name_of(expected))
        if code == OK:
            self.must_go.add(key)

    def op_read(self, now: float, before: dict[str, Seen]) -> None:
        key = self.pick_key(before, writing=False)
        code = self.service.get_replica_list("", key).code
        self.record("read", code)
        old = before.get(key)
        if old is None:
            assert code == NOT_FOUND
        elif not old.readable:
            assert code == ErrorCode.REPLICA_IS_NOT_READY
        else:
            assert code == OK

    # -- session calls ---------------------------------------------------------------------

    def pick_session(self) -> str:
        roll = self.rng.random()
        if roll < 0.04:
            return self.rng.choice(BAD_IDS)
        if roll < 0.7 and self.sessions:
            return self.rng.choice(sorted(self.sessions))
        return self.rng.choice(SESSIONS)

    def op_attach(self, now: float, before: dict[str, Seen]) -> None:
        sid = self.pick_session()
        n = self.rng.choice([1, 1, 2, 3, 4, 6, MAX_BATCH, MAX_BATCH + 1])
        keys = [self.pick_key(before) for _ in range(n)]
        if self.rng.random() < 0.5 and sid in self.sessions:
            keys += self.rng.sample(sorted(self.sessions[sid].members), 1)[: MAX_BATCH - n]
        codes = self.service.sessions.attach_kv_session("", sid, keys)
        for code in set(codes):
            self.record("attach", code)
        if not valid_id(sid) or len(keys) > MAX_BATCH:
            assert codes == [INVALID] * len(keys)
            return
        found = [k for k in dict.fromkeys(keys) if k in before]
        verdict = self.admission(set(before), [(k, [sid]) for k in found])
        assert verdict in (OK, LIMIT)
        if verdict == LIMIT:
            expected = [int(LIMIT) if k in before else int(NOT_FOUND) for k in keys]
        else:
            expected = [0 if k in before else int(NOT_FOUND) for k in keys]
            self.add_each(found, sid)
        assert codes == expected, (sid, keys, codes, expected)

    def add_each(self, keys: list[str], sid: str) -> None:
        for key in keys:
            self.add(key, [sid])

    def set_pin(self, flag: bool) -> None:
        sid = self.pick_session()
        code = self.service.sessions.set_kv_session_pin("", sid, flag)
        self.record("pin" if flag else "unpin", code)
        if not valid_id(sid):
            assert code == INVALID
        elif sid not in self.sessions:
            assert code == SESSION_NOT_FOUND
        else:
            assert code == OK
            self.sessions[sid].pinned = flag

    def op_pin(self, now: float, before: dict[str, Seen]) -> None:
        self.set_pin(True)

    def op_unpin(self, now: float, before: dict[str, Seen]) -> None:
        self.set_pin(False)

    def op_update(self, now: float, before: dict[str, Seen]) -> None:
        sid = self.pick_session()
        roll = self.rng.random()
        if roll < 0.1:
            keep = [f"x{i}" for i in range(MAX_MEMBERS + 1)]  # over the member limit
        elif roll < 0.2:
            keep = []
        else:
            keep = self.rng.sample(KEYS, self.rng.randint(1, MAX_MEMBERS))
        code = self.service.sessions.update_kv_session("", sid, keep)
        self.record("update", code)
        if not valid_id(sid):
            assert code == INVALID
        elif len(set(keep)) > MAX_MEMBERS:
            assert code == LIMIT
        else:
            assert code == OK
            session = self.sessions.get(sid)
            if session is not None:
                session.members &= set(keep)
                if not session.members:
                    del self.sessions[sid]

    def op_close(self, now: float, before: dict[str, Seen]) -> None:
        sid = self.pick_session()
        code = self.service.sessions.close_kv_session("", sid)
        self.record("close", code)
        if not valid_id(sid):
            assert code == INVALID
        else:
            assert code == OK
            self.sessions.pop(sid, None)

    def op_get(self, now: float, before: dict[str, Seen]) -> None:
        sid = self.pick_session()
        code, found = self.service.sessions.get_kv_session("", sid)
        self.record("get", code)
        if not valid_id(sid):
            assert (code, found) == (INVALID, None)
        elif sid not in self.sessions:
            assert (code, found) == (SESSION_NOT_FOUND, None)
        else:
            session = self.sessions[sid]
            assert code == OK and found is not None
            assert (found.session_id, found.pinned, found.member_count) == (
                sid,
                session.pinned,
                len(session.members),
            )

    def op_list(self, now: float, before: dict[str, Seen]) -> None:
        sid = self.pick_session()
        limit = self.rng.choice([0, 1, 1, 2, 3, 5, MAX_BATCH, MAX_BATCH + 1])
        cursor = self.rng.choice(["", "", self.rng.choice(KEYS), "k15x", "zz"])
        code, page = self.service.sessions.list_kv_session_keys("", sid, cursor, limit)
        self.record("list", code)
        if not valid_id(sid) or not 1 <= limit <= MAX_BATCH:
            assert (code, page) == (INVALID, None)
            return
        if sid not in self.sessions:
            assert (code, page) == (SESSION_NOT_FOUND, None)
            return
        ordered = sorted(self.sessions[sid].members)
        after = [k for k in ordered if k > cursor] if cursor else ordered
        assert code == OK and page is not None
        assert page.keys == after[:limit]
        assert page.next_cursor == (after[limit - 1] if len(after) > limit else "")
        # Walking the rest from there yields every member once, in order.
        walked, cursor = list(page.keys), page.next_cursor
        while cursor:
            code, page = self.service.sessions.list_kv_session_keys("", sid, cursor, limit)
            assert code == OK and page is not None and page.keys
            walked += page.keys
            cursor = page.next_cursor
        assert walked == after
        self.events["list_walks"] += 1

    # -- eviction, time, liveness ----------------------------------------------------------

    def op_evict(self, now: float, before: dict[str, Seen]) -> None:
        self.service.evict_once(now)

    def op_advance(self, now: float, before: dict[str, Seen]) -> None:
        self.clock.advance(self.rng.choice([0.5, 1.0, 2.0, 3.0, 5.0, 8.0]))

    def op_sweep(self, now: float, before: dict[str, Seen]) -> None:
        self.service.sweep_expired_puts(now)
        swept = {k for k, s in before.items() if s.writing and s.start + RELEASE_S <= now}
        self.events["swept"] += len(swept)
        self.must_go |= swept

    def op_reap(self, now: float, before: dict[str, Seen]) -> None:
        expired = self.service.reap_expired_clients(now)
        lost: set[str] = set()
        for owner in expired:
            seg_id = self.segment_of.get(owner)
            if seg_id is not None:
                lost.add(seg_id)
                self.segment_of[owner] = None
        self.events["reaped_owners"] += len(expired)
        doomed = {k for k, s in before.items() if s.segments <= lost}
        self.events["lost_to_segments"] += len(doomed)
        self.must_go |= doomed

    def op_ping(self, now: float, before: dict[str, Seen]) -> None:
        owner = self.rng.choice(OWNERS)
        if self.segment_of[owner] is not None:
            self.service.ping(owner)

    def op_mount(self, now: float, before: dict[str, Seen]) -> None:
        dead = [o for o in OWNERS if self.segment_of[o] is None]
        if dead:
            self.mount(self.rng.choice(dead))

    def op_unmount(self, now: float, before: dict[str, Seen]) -> None:
        live = [o for o in OWNERS if self.segment_of[o] is not None]
        if len(live) < 2 or self.rng.random() < 0.5:
            return
        owner = self.rng.choice(live)
        seg_id = self.segment_of[owner]
        assert seg_id is not None
        assert self.service.unmount_segment(owner, seg_id) == OK
        self.segment_of[owner] = None
        doomed = {k for k, s in before.items() if s.segments <= {seg_id}}
        self.events["lost_to_segments"] += len(doomed)
        self.must_go |= doomed

    # -- reconciliation --------------------------------------------------------------------

    def reconcile(
        self,
        op: str,
        now: float,
        before: dict[str, Seen],
        pinned_before: dict[str, bool],
        stats_before: dict[str, int],
    ) -> None:
        after = {k for k in KEYS if self.service.object_of("", k) is not None}
        gone = set(before) - after
        assert self.must_go <= gone, (op, sorted(self.must_go - gone))
        evicted = gone - self.explained - self.must_go
        if evicted:
            assert self.may_evict, (op, sorted(evicted))

        def evictable(key: str) -> bool:
            seen = before[key]
            return seen.readable and not seen.writing and seen.lease_timeout <= now

        def soft(key: str) -> bool:
            return pinned_before[key] or before[key].soft_deadline > now

        for key in evicted:
            assert evictable(key), (op, key, before[key])
        pinned_gone = {k for k in evicted if soft(k)}
        if pinned_gone:
            assert self.allow_soft, (op, sorted(pinned_gone))
            self.events["fallback_checks"] += 1
            # The fallback comes only after every ordinary evictable object went.
            for key, seen in before.items():
                if evictable(key) and not soft(key) and key not in self.protected:
                    assert self.service.object_of("", key) is not seen.meta, (op, key)
        stats = self.service.stats()
        assert stats["evicted_objects"] - stats_before["evicted_objects"] == len(evicted)
        assert stats["evicted_soft_pinned"] - stats_before["evicted_soft_pinned"] == len(
            pinned_gone
        )
        self.events["evicted"] += len(evicted)
        self.events["evicted_pinned"] += len(pinned_gone)
        for key in gone:
            self.drop_key(key)
        if self.pending is not None:
            key, tags = self.pending
            for sid in dict.fromkeys(tags):
                held = sid not in self.sessions and sid in self.pins_before
                self.add(key, [sid])
                if held:
                    # The write held it: it outlived losing its last member, pin and all.
                    self.sessions[sid].pinned = self.pins_before[sid]
                    self.events["held_sessions"] += 1

    def compare(self) -> None:
        """The service's registry equals the model's, session by session and key by key."""
        assert len(self.service._state.sessions) == len(self.sessions)  # noqa: SLF001
        for sid, session in self.sessions.items():
            code, found = self.service.sessions.get_kv_session("", sid)
            assert code == OK and found is not None, sid
            assert (found.pinned, found.member_count) == (session.pinned, len(session.members))
        for key in KEYS:
            meta = self.service.object_of("", key)
            if meta is not None:
                assert {s.session_id for s in meta.sessions or ()} == self.of_key(key), key
            else:
                assert not self.of_key(key), key


@pytest.mark.parametrize(
    ("seed", "allow_soft"), [(1, True), (2, True), (3, False)], ids=["s1", "s2", "s3-no-soft"]
)
def test_random_session_ops_match_the_model(seed: int, allow_soft: bool) -> None:
    model = Model(seed, allow_soft)
    began = time.perf_counter()
    for _ in range(OPS):
        model.step()
    elapsed = time.perf_counter() - began
    assert elapsed < 8.0, f"too slow: {elapsed:.1f}s"
    # The run must have exercised what it is meant to.
    codes = model.codes
    for op in ("attach", "put", "upsert"):
        assert codes.get((op, int(LIMIT)), 0) > 0, f"{op} never hit a session limit"
    assert codes.get(("attach", 0), 0) > 50
    assert codes.get(("attach", int(INVALID)), 0) > 0
    assert codes.get(("pin", int(SESSION_NOT_FOUND)), 0) > 0
    assert codes.get(("update", int(LIMIT)), 0) > 0
    assert codes.get(("list", 0), 0) > 20
    assert model.events["evicted"] > 20
    assert model.events["preempted"] > 0
    if allow_soft:
        assert model.events["evicted_pinned"] > 0
    assert model.events["list_walks"] > 20
