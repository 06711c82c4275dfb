"""Seeded randomized stress of KV sessions against a shadow model of membership.

Weighted random operations run on a :class:`MasterService` with a FakeClock and small session
limits (so every limit is hit): tagged and untagged puts and upserts, put end and revoke,
attach, pin/unpin, update, close, get, list, remove, reads and existence checks by several
clients and the ends of those reads, eviction passes, segment churn, client expiry, put sweeps
and clock jumps. ``service.check()`` runs after every operation.

The model keeps each session's members and pin flag. It predicts exactly every answer of attach,
pin/unpin, update, close, get and list, and the admission verdict of every tagged write
(INVALID_PARAMS / SESSION_LIMIT_EXCEEDED, which must change nothing). Write outcomes that depend
on the allocator (OK or NO_AVAILABLE_HANDLE) are read from the service and applied.

The model also keeps the reads: read holds (per reader, object and replica set, with a count
and a deadline, expired lazily exactly where the master expires them), existence holds per
(client, key), replicas retired while readers copy from them, late-read records and the
buffers of preempted writes. It predicts every read, existence, EndReads, remove, PutEnd,
PutRevoke and sweep answer, and the service's hold, retired, late and preempted counts and its
allocated bytes.

Objects can also vanish through eviction, which the model does not predict. After every
operation it reconciles: each object that disappeared without the operation explaining it must
have been evictable when the operation began (readable, no write in flight, no reader on any of
its replicas), the operation must be one that may evict, a soft-pinned object (TTL pin or any
pinned session) may go only if soft-pinned eviction is allowed, soft-pinned or existence-held
objects only after every ordinary evictable object went, and the eviction counters move by
exactly what disappeared. The vanished objects' memberships are then dropped from the model,
with every session they empty, and their replicas are freed (or retired for their readers).

After every operation the model and the service must agree on the whole registry: the set of
sessions, each one's pin flag and member count, and each object's sessions.

An admitted tagged write holds the existing sessions it names until it has registered: when its
own eviction or preemption takes a held session's last member, the session survives with its pin.
An upsert never evicts its own object to make room for itself; an upsert under readers
reallocates and retires the old replicas.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.state.objects import ObjectMetadata
from mooncake_py.master.state.reads import LATE_READ_MEMORY_S
from mooncake_py.types import PutStartResult, ReplicateConfig, SegmentInfo, SoftPinAction

OPS = 3000
KEYS = [f"k{i:02d}" for i in range(40)]
SESSIONS = [f"s{i:02d}" for i in range(10)]  # more than MAX_SESSIONS
BAD_IDS = ["", "bad\0id", "x" * 4097]
WRITERS = ["w0", "w1"]
OWNERS = ["c0", "c1", "c2"]
# Readers: two that never heartbeat, and a segment owner whose expiry ends its reads.
READERS = ["r0", "r1", "c1"]
SEGMENT_BYTES = 24 * 1024
SIZES = [512, 1024, 2048, 4096, 8192]

MAX_SESSIONS = 6
MAX_MEMBERS = 8
MAX_PER_OBJECT = 3
MAX_BATCH = 8

TTL_S = 40.0
LEASE_MS = 2000
LEASE_S = LEASE_MS / 1000
END_AT_ONCE = 0.3  # a read whose reader ends it right away
MAX_ISSUED = 200  # reads remembered for a later EndReads
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
    "end_read": 4,
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
# Operations whose call expires due read and existence holds before anything else.
EXPIRING_OPS = {"put", "upsert", "put_end", "revoke", "remove", "end_read", "evict", "sweep"}

OK = ErrorCode.OK
INVALID = ErrorCode.INVALID_PARAMS
LIMIT = ErrorCode.SESSION_LIMIT_EXCEEDED
SESSION_NOT_FOUND = ErrorCode.SESSION_NOT_FOUND
NOT_FOUND = ErrorCode.OBJECT_NOT_FOUND
EXISTS = ErrorCode.OBJECT_ALREADY_EXISTS
NO_HANDLE = ErrorCode.NO_AVAILABLE_HANDLE
LEASE_EXPIRED = ErrorCode.LEASE_EXPIRED
INVALID_WRITE = ErrorCode.INVALID_WRITE


def valid_id(session_id: str) -> bool:
    return bool(session_id) and "\0" not in session_id and len(session_id.encode("utf-8")) <= 4096


@dataclasses.dataclass
class Session:
    members: set[str]
    pinned: bool = False


@dataclasses.dataclass(frozen=True)
class Rep:
    """One replica: ``size`` bytes at ``offset`` in segment ``seg``."""

    id: int
    seg: str
    offset: int
    size: int


@dataclasses.dataclass(frozen=True)
class Seen:
    """An object as it was when an operation began."""

    meta: ObjectMetadata  # identity (kept alive so ``is`` comparisons stay meaningful)
    readable: bool
    writing: bool
    soft_deadline: float
    client: str
    start: float
    size: int
    segments: frozenset[str]
    reps: tuple[Rep, ...]
    write_id: int


@dataclasses.dataclass
class Hold:
    """Reads by one client of one object through one set of replicas."""

    client: str
    key: str
    reps: tuple[Rep, ...]
    deadline: float
    count: int = 1


@dataclasses.dataclass
class Late:
    """A hold that expired before its reader ended it."""

    client: str
    reps: tuple[Rep, ...]
    expired_at: float
    clobbered: bool = False


@dataclasses.dataclass
class Watch:
    """A freed range late readers may still copy from; the next allocation overlapping it
    clobbers their records."""

    seg: str
    start: int
    end: int
    late_ids: set[int]


@dataclasses.dataclass
class Preempted:
    """A preempted write's buffers, kept until its writer stops or its release time."""

    writer: str
    key: str
    reps: list[Rep]
    release_at: float


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
                "retired",
                "retired_freed",
                "preempt_stopped",
                "upsert_under_read",
                "expired_holds",
                "late_ok",
                "late_clobbered",
                "exist_checks",
            ],
            0,
        )
        # Read holds by id, the reads in flight through each replica, and every read answered
        # OK (reader, read id) until its reader ends it.
        self.holds: dict[int, Hold] = {}
        self.readers: dict[int, int] = {}
        self.last_read_id = 0
        self.expired_holds = 0
        self.issued: list[tuple[str, int]] = []
        # Replicas no object owns any more, kept until their last reader is done.
        self.retired: dict[int, Rep] = {}
        self.late: dict[int, Late] = {}
        self.watches: list[Watch] = []
        self.exists: dict[tuple[str, str], float] = {}  # (client, key) -> deadline
        self.preempted: dict[int, Preempted] = {}  # by write id
        self.last_write_id = 0
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
                soft_deadline=meta.soft_pin_deadline,
                client=meta.client_id,
                start=meta.put_start_time,
                size=meta.size,
                segments=frozenset(r.segment_id for r in meta.replicas),
                reps=tuple(Rep(r.id, r.segment_id, r.offset, r.size) for r in meta.replicas),
                write_id=meta.write_id,
            )
        return seen

    # -- reads, holds and the memory they keep ---------------------------------------------

    def is_read(self, seen: Seen) -> bool:
        """A hold (expired lazily, as the master does) covers one of its replicas."""
        return any(r.id in self.readers for r in seen.reps)

    def is_checked(self, key: str) -> bool:
        return any(k == key for _, k in self.exists)

    def free(self, rep: Rep) -> None:
        """``rep``'s memory goes back; its late readers now watch the range for reuse."""
        late_ids = {i for i, late in self.late.items() if rep in late.reps}
        if late_ids:
            self.watches.append(Watch(rep.seg, rep.offset, rep.offset + rep.size, late_ids))

    def retire_or_free(self, rep: Rep) -> None:
        """``rep`` left its object: kept for its readers, or freed at once."""
        if rep.id in self.readers:
            self.retired[rep.id] = rep
            self.events["retired"] += 1
        else:
            self.free(rep)

    def clobber(self, late_ids: set[int]) -> None:
        for late_id in late_ids:
            if late_id in self.late:
                self.late[late_id].clobbered = True

    def allocated(self, reps: list[Rep]) -> None:
        """New replicas were handed out: late reads of overlapping freed ranges are clobbered."""
        for rep in reps:
            hit = [
                w
                for w in self.watches
                if w.seg == rep.seg and w.start < rep.offset + rep.size and rep.offset < w.end
            ]
            for watch in hit:
                self.clobber(watch.late_ids)
            self.watches = [w for w in self.watches if w not in hit]

    def release_reads(self, hold: Hold, times: int) -> None:
        for rep in hold.reps:
            left = self.readers[rep.id] - times
            if left:
                self.readers[rep.id] = left
                continue
            del self.readers[rep.id]
            retired = self.retired.pop(rep.id, None)
            if retired is not None:
                self.free(retired)
                self.events["retired_freed"] += 1

    def expire(self, now: float) -> None:
        """The master's expiry at ``now``: holds past their deadline end (leaving late-read
        records), lapsed existence holds and old late records go."""
        for hold_id, hold in [(i, h) for i, h in self.holds.items() if h.deadline <= now]:
            self.late[hold_id] = Late(hold.client, hold.reps, now)
            del self.holds[hold_id]
            self.release_reads(hold, hold.count)
            self.expired_holds += 1
            self.events["expired_holds"] += 1
        for held in [h for h, deadline in self.exists.items() if deadline <= now]:
            del self.exists[held]
        for late_id in [
            i for i, x in self.late.items() if x.expired_at + LATE_READ_MEMORY_S <= now
        ]:
            del self.late[late_id]

    def end_reads(self, client: str, read_ids: list[int]) -> None:
        codes = self.service.reads.end_reads(client, read_ids)
        self.expire(self.clock())
        expected: list[ErrorCode] = []
        for read_id in read_ids:
            hold = self.holds.get(read_id)
            late = self.late.get(read_id)
            if hold is not None and hold.client == client:
                hold.count -= 1
                self.release_reads(hold, 1)
                if hold.count == 0:
                    del self.holds[read_id]
                expected.append(OK)
            elif late is not None and late.client == client:
                del self.late[read_id]
                self.events["late_clobbered" if late.clobbered else "late_ok"] += 1
                expected.append(LEASE_EXPIRED if late.clobbered else OK)
            else:
                expected.append(LEASE_EXPIRED)
        for code in codes:
            self.record("end_read", code)
        assert codes == expected, (client, read_ids, codes, expected)

    def drop_segment(self, seg_id: str, before: dict[str, Seen]) -> None:
        """A segment went away: what lived in it vanishes, and a late reader of a replica
        still in it (an object's, one retired for other readers, or a freed range it
        watched) can no longer trust what it copied."""
        here = {r.id for s in before.values() for r in s.reps if r.seg == seg_id}
        here |= {i for i, r in self.retired.items() if r.seg == seg_id}
        for late in self.late.values():
            if any(r.id in here for r in late.reps):
                late.clobbered = True
        for watch in self.watches:
            if watch.seg == seg_id:
                self.clobber(watch.late_ids)
        self.watches = [w for w in self.watches if w.seg != seg_id]
        for rid in [i for i, r in self.retired.items() if r.seg == seg_id]:
            del self.retired[rid]
        for write_id, preempted in list(self.preempted.items()):
            preempted.reps = [r for r in preempted.reps if r.seg != seg_id]
            if not preempted.reps:
                del self.preempted[write_id]
        self.dropped.add(seg_id)

    def preempt(self, key: str, old: Seen) -> None:
        """``old``'s write in flight is replaced: its buffers wait for its writer to stop."""
        assert old.writing and old.write_id
        self.preempted[old.write_id] = Preempted(
            old.client, key, list(old.reps), old.start + RELEASE_S
        )
        self.preempted_keys.add(key)

    def started(self, result: PutStartResult) -> None:
        """A start answered OK: a fresh write id, and new replicas to account for."""
        assert result.code == OK
        assert result.write_id > self.last_write_id, "stale write id"
        self.last_write_id = result.write_id
        self.allocations = [Rep(r.id, r.segment_id, r.offset, r.size) for r in result.replicas]

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
        if op in EXPIRING_OPS:
            # The call expires due holds before anything else: the model does it first, so
            # its verdicts see what the call will see.
            self.expire(now)
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
        # What the op did to replicas, for the memory accounting: segments it dropped, keys
        # whose write in flight it preempted, replicas it allocated, an upsert's old replicas
        # (let go after its allocation).
        self.dropped: set[str] = set()
        self.preempted_keys: set[str] = set()
        self.allocations: list[Rep] = []
        self.own_old: set[Rep] = set()
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
        result = self.service.put_start(writer, "", key, size, cfg)
        code = result.code
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
            self.preempt(key, old)
            self.drop_key(key)
            self.explained.add(key)
        assert code in (OK, NO_HANDLE), ErrorCode.name_of(code)
        meta = self.service.object_of("", key)
        if code == OK:
            assert meta is not None and meta.is_writing() and meta.size == size
            self.started(result)
            self.pending = (key, tags or [])
        else:
            assert meta is None

    def op_upsert(self, now: float, before: dict[str, Seen]) -> None:
        key, size, tags, cfg = self.write_args()
        writer = self.rng.choice(WRITERS)
        result = self.service.upsert_start(writer, "", key, size, cfg)
        code = result.code
        self.record("upsert", code)
        if not self.admitted("upsert", key, tags, code, set(before)):
            return
        old = before.get(key)
        meta = self.service.object_of("", key)
        if old is None:
            assert code in (OK, NO_HANDLE), ErrorCode.name_of(code)
            assert (meta is not None) == (code == OK)
        elif old.writing:
            # Preempts the write in flight; the memberships carry over to the new write.
            assert code in (OK, NO_HANDLE), ErrorCode.name_of(code)
            self.preempt(key, old)
            if code != OK:
                assert meta is None
                self.drop_key(key)
                self.explained.add(key)
                return
        elif old.size == size and not self.is_read(old):
            assert code == OK, ErrorCode.name_of(code)
            assert meta is old.meta  # rewritten in place
            assert [(r.id, r.offset) for r in meta.replicas] == [(r.id, r.offset) for r in old.reps]
            # Late readers of these bytes can no longer trust what they copied.
            for late in self.late.values():
                if set(late.reps) & set(old.reps):
                    late.clobbered = True
            self.may_evict = False
        else:
            # Reallocated (a new size, or readers copy the old bytes, which are then retired):
            # it may evict others, never itself; refused, it changes nothing.
            assert code in (OK, NO_HANDLE), ErrorCode.name_of(code)
            assert meta is old.meta, "the upsert lost its own object (evicted with its group?)"
            self.protected.add(key)
            if code == OK:
                self.own_old = set(old.reps)
                self.events["upsert_under_read"] += int(old.size == size)
        if code == OK:
            assert meta is not None and meta.is_writing() and meta.size == size
            self.started(result)
            self.pending = (key, tags or [])

    def pick_key(self, before: dict[str, Seen], writing: bool | None = None) -> str:
        """Mostly a present key (being written or not, if asked), sometimes any key."""
        fitting = [k for k, s in before.items() if writing is None or s.writing == writing]
        if fitting and self.rng.random() < 0.85:
            return self.rng.choice(fitting)
        return self.rng.choice(KEYS)

    def pick_write_id(self, old: Seen | None) -> tuple[int, str | None]:
        """(write id, its writer when it names a preempted write): mostly 0 (the client's
        write in flight), sometimes the write's own id or a preempted write's."""
        roll = self.rng.random()
        if roll < 0.15 and self.preempted:
            write_id, preempted = self.rng.choice(sorted(self.preempted.items()))
            return write_id, preempted.writer
        if roll < 0.4 and old is not None:
            return old.write_id, None
        return 0, None

    def finish(self, writer: str, key: str, write_id: int, old: Seen | None, revoke: bool) -> int:
        """What PutEnd / PutRevoke must answer."""
        preempted = self.preempted.get(write_id) if write_id else None
        if preempted is not None and preempted.writer == writer:
            del self.preempted[write_id]  # its writer stopped: the buffers come back now
            self.events["preempt_stopped"] += 1
            return INVALID_WRITE
        if old is None:
            return NOT_FOUND
        if old.client != writer:
            return ErrorCode.ILLEGAL_CLIENT
        if write_id and old.write_id != write_id:
            return OK if old.readable and not old.writing and not revoke else INVALID_WRITE
        if not old.writing:
            return OK if old.readable and not revoke else INVALID_WRITE
        if revoke:
            self.must_go.add(key)  # every replica of a write in flight goes
        return OK

    def op_put_end(self, now: float, before: dict[str, Seen]) -> None:
        key = self.pick_key(before, writing=True)
        old = before.get(key)
        writer = old.client if old is not None and self.rng.random() < 0.9 else "w0"
        write_id, owner = self.pick_write_id(old)
        writer = owner or writer
        code = self.service.put_end(writer, "", key, write_id)
        self.record("put_end", code)
        expected = self.finish(writer, key, write_id, old, revoke=False)
        assert code == expected, (key, writer, write_id, code, expected)

    def op_revoke(self, now: float, before: dict[str, Seen]) -> None:
        key = self.pick_key(before, writing=True)
        old = before.get(key)
        writer = old.client if old is not None else "w0"
        write_id, owner = self.pick_write_id(old)
        writer = owner or writer
        code = self.service.put_revoke(writer, "", key, write_id)
        self.record("revoke", code)
        expected = self.finish(writer, key, write_id, old, revoke=True)
        assert code == expected, (key, writer, write_id, code, expected)

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
        elif not force and (self.is_read(old) or self.is_checked(key)):
            expected = ErrorCode.OBJECT_HAS_LEASE
        else:
            expected = OK
        assert code == expected, (ErrorCode.name_of(code), ErrorCode.name_of(expected))
        if code == OK:
            self.must_go.add(key)

    def op_read(self, now: float, before: dict[str, Seen]) -> None:
        key = self.pick_key(before, writing=False)
        reader = self.rng.choice(READERS)
        old = before.get(key)
        if self.rng.random() < 0.25:
            # An existence check: a found key is held for this client until it reads it.
            found = self.service.reads.exist_key("", key, reader)
            assert found == int(old is not None and old.readable), (key, found)
            if found:
                previous = self.exists.get((reader, key), 0.0)
                self.exists[(reader, key)] = max(previous, now + LEASE_S)
                self.events["exist_checks"] += 1
            return
        result = self.service.reads.get_replica_list("", key, reader)
        code = result.code
        self.record("read", code)
        if old is None:
            assert code == NOT_FOUND
        elif not old.readable:
            assert code == ErrorCode.REPLICA_IS_NOT_READY
        else:
            assert code == OK
            assert [r.id for r in result.replicas] == [r.id for r in old.reps]
            shared = [
                i
                for i, h in self.holds.items()
                if h.client == reader and h.key == key and h.reps == old.reps
            ]
            if shared:
                # Reads of one object by one client through the same replicas share a hold.
                assert result.read_id == shared[0]
                hold = self.holds[result.read_id]
                hold.count += 1
                hold.deadline = max(hold.deadline, now + LEASE_S)
            else:
                assert result.read_id > self.last_read_id
                self.last_read_id = result.read_id
                self.holds[result.read_id] = Hold(reader, key, old.reps, now + LEASE_S)
            for rep in old.reps:
                self.readers[rep.id] = self.readers.get(rep.id, 0) + 1
            self.exists.pop((reader, key), None)  # the read takes the check's hold over
            if self.rng.random() < END_AT_ONCE:
                self.end_reads(reader, [result.read_id])
            else:
                self.issued = [*self.issued[-MAX_ISSUED:], (reader, result.read_id)]

    def op_end_read(self, now: float, before: dict[str, Seen]) -> None:
        if not self.issued or self.rng.random() < 0.05:
            self.end_reads(self.rng.choice(READERS), [self.last_read_id + 1000])  # unknown
            return
        reader, read_id = self.rng.choice(self.issued)
        if self.rng.random() < 0.1:
            # Another client cannot end this one's reads.
            self.end_reads(self.rng.choice([r for r in READERS if r != reader]), [read_id])
            return
        mine = [e for e in self.issued if e[0] == reader and e != (reader, read_id)]
        batch = [(reader, read_id), *self.rng.sample(mine, min(len(mine), self.rng.randint(0, 2)))]
        for entry in batch:
            self.issued.remove(entry)
        self.end_reads(reader, [i for _, i in batch])

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
        freed = self.service.sweep_expired_puts(now)
        swept = {k for k, s in before.items() if s.writing and s.start + RELEASE_S <= now}
        due = [w for w, p in self.preempted.items() if p.release_at <= now]
        expected = sum(len(before[k].reps) for k in swept)
        expected += sum(len(self.preempted.pop(w).reps) for w in due)
        assert freed == expected, (freed, expected)
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
                self.drop_segment(seg_id, before)
            # Its reads and existence holds end with it (no late records).
            for read_id, hold in list(self.holds.items()):
                if hold.client == owner:
                    del self.holds[read_id]
                    self.release_reads(hold, hold.count)
            for held in [h for h in self.exists if h[0] == owner]:
                del self.exists[held]
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
        self.drop_segment(seg_id, before)
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
            return seen.readable and not seen.writing and not self.is_read(seen)

        def soft(key: str) -> bool:
            return pinned_before[key] or before[key].soft_deadline > now

        def fallback(key: str) -> bool:
            # Soft pinned, or found by an existence check: only once the others are gone.
            return soft(key) or self.is_checked(key)

        for key in evicted:
            assert evictable(key), (op, key, before[key])
        pinned_gone = {k for k in evicted if soft(k)}
        assert self.allow_soft or not pinned_gone, (op, sorted(pinned_gone))
        if any(fallback(k) for k in evicted):
            self.events["fallback_checks"] += 1
            # The fallback comes only after every ordinary evictable object went.
            for key, seen in before.items():
                if evictable(key) and not fallback(key) and key not in self.protected:
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
        self.account_replicas(before)
        if self.pending is not None:
            key, tags = self.pending
            for sid in dict.fromkeys(tags):
                held = sid not in self.sessions and sid in self.pins_before
                self.add(key, [sid])
                if held:
                    # The write held it: it outlived losing its last member, pin and all.
                    self.sessions[sid].pinned = self.pins_before[sid]
                    self.events["held_sessions"] += 1

    def account_replicas(self, before: dict[str, Seen]) -> None:
        """Replicas that left their objects during the op: those of dropped segments
        vanished, a preempted write's wait for its writer, the rest are freed or retired for
        their readers. Frees by eviction come before the op's allocation, an upsert's old
        replicas after it."""
        for key, seen in before.items():
            meta = self.service.object_of("", key)
            if meta is not seen.meta:
                # Erased (a new object may have taken its key): its existence holds ended.
                for held in [h for h in self.exists if h[1] == key]:
                    del self.exists[held]
            kept = {r.id for r in meta.replicas} if meta is seen.meta else set()
            for rep in seen.reps:
                if rep.id in kept or rep.seg in self.dropped or rep in self.own_old:
                    continue
                if key in self.preempted_keys:
                    continue  # kept for the preempted writer (see preempt)
                self.retire_or_free(rep)
        self.allocated(self.allocations)
        for rep in self.own_old:
            self.retire_or_free(rep)

    def compare(self) -> None:
        """The service's registry equals the model's, session by session and key by key;
        its read, retired and preempted bookkeeping and its memory equal the model's."""
        stats = self.service.stats()
        assert stats["read_holds"] == len(self.holds)
        assert stats["reads_in_flight"] == sum(h.count for h in self.holds.values())
        assert stats["existence_holds"] == len(self.exists)
        assert stats["late_reads"] == len(self.late)
        assert stats["expired_read_holds"] == self.expired_holds
        assert stats["retired_buffers"] == len(self.retired)
        assert stats["preempted_buffers"] == sum(len(p.reps) for p in self.preempted.values())
        live = sum(m.size * len(m.replicas) for m in self.service._state.objects)  # noqa: SLF001
        kept = sum(r.size for r in self.retired.values())
        held = sum(r.size for p in self.preempted.values() for r in p.reps)
        assert stats["allocated_bytes"] == live + kept + held  # sizes are 64-byte aligned
        for key in KEYS:
            meta = self.service.object_of("", key)
            if meta is not None:
                read = any(r.id in self.readers for r in meta.replicas)
                assert self.service.is_leased("", key) == (read or self.is_checked(key)), key
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
    for _ in range(OPS):
        model.step()
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
    # And the reads: ended in time, ended late (intact or clobbered), never ended, retired
    # replicas, existence checks, preempted writers stopping.
    assert codes.get(("end_read", 0), 0) > 20
    assert codes.get(("end_read", int(LEASE_EXPIRED)), 0) > 0
    assert codes.get(("remove", int(ErrorCode.OBJECT_HAS_LEASE)), 0) > 0
    for event in ("expired_holds", "late_ok", "late_clobbered", "retired", "retired_freed"):
        assert model.events[event] > 0, event
    assert model.events["exist_checks"] > 0 and model.events["preempt_stopped"] > 0
