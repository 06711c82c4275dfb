"""Seeded randomized stress of the master service against a light shadow model.

Weighted random operations (puts with pins and groups, upserts, reads by several clients and
the ends of those reads, existence checks, removes, eviction passes, segment churn, client
expiry, put sweeps, time jumps) run on a :class:`MasterService` with a FakeClock. A shadow
model predicts every result code, which replicas (ids, segments, offsets) each object has, its
pins, group and leases, the allocated bytes, the eviction candidates and which clients expire;
``service.check()`` runs after every operation.

The model keeps its own read holds (one per reader, object and replica set, with a count of
the reads sharing it and a deadline), existence holds per (client, key), the replicas retired
while readers still copy from them, late-read records (a hold that expired before its reader
ended it, clobbered when its range may have been written since), and the buffers of preempted
writes. Holds expire lazily, exactly where the master expires them (at the start of writes,
ends, removes, eviction passes, sweeps and EndReads), so every count the service reports
(read holds, reads in flight, existence holds, retired buffers and bytes, late reads,
preempted buffers) and every EndReads answer is predicted exactly.

Eviction is the one thing the model does not predict exactly: which victims a pass or a full
write picks depends on the policy's access order. So after each operation the model reconciles:
every object the service dropped must have been evictable when the operation began (readable,
not being written, no reader on any replica anywhere in its group, not hard pinned; soft pinned
only when soft-pinned eviction is allowed, and soft pinned or found by an existence check only
once every ordinary candidate went), groups go whole, only operations that may evict do, a
write evicts only objects with a replica in a segment large enough for its value (and fails
only once every such candidate is gone), and the eviction counters move by exactly what
disappeared. Whether a pass runs, its target and lower bound, and when a write must fail, are
predicted.

Remounted segments normally get a fresh id (a new incarnation); one variant reuses the old id,
as a client remounting after expiry does, so buffers kept for readers or preempted writers must
die with the segment they belonged to.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random

import pytest

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.state.reads import LATE_READ_MEMORY_S
from mooncake_py.types import (
    ClientStatus,
    PutStartResult,
    ReplicaListResult,
    ReplicaStatus,
    ReplicateConfig,
    SegmentInfo,
    SoftPinAction,
)

OPS = 3000
KEYS = [f"key-{i}" for i in range(50)]
GROUPS = ["g0", "g1", "g2"]
CLIENTS = ["c0", "c1", "c2"]
WRITERS = ["w0", "w1", *CLIENTS]
# Readers: two that never heartbeat, and two clients that expire when they go silent (their
# reads and existence holds then end with them).
READERS = ["r0", "r1", "c1", "c2"]
ALIGN = 64
TTL_S = 12.0
LEASE_MS = 3000
LEASE_S = LEASE_MS / 1000
DISCARD_S = 5.0
RELEASE_S = 20.0
SOFT_PIN_DEFAULT_MS = 8000
SOFT_PIN_MAX_MS = 60_000
WATERMARK = 0.8
EVICTION_RATIO = 0.1
# Values; big ones keep memory full (2 MB fits no segment at all).
SIZES = [1, 63, 64, 65, 1000, 4096, 20_000, 100_000, 100_000, 300_000, 300_000, 2_000_000]
END_AT_ONCE = 0.3  # a read whose reader ends it right away
MAX_ISSUED = 300  # reads remembered for a later EndReads

# (owner, name, size): c0 contributes two segments under one name.
SLOTS = [
    ("c0", "n0", 4 * 1024),
    ("c0", "n0", 64 * 1024),
    ("c1", "n1", 256 * 1024),
    ("c2", "n2", 1024 * 1024),
]

WEIGHTS = {
    "put_start": 20,
    "put_end": 16,
    "put_revoke": 3,
    "upsert": 8,
    "get": 12,
    "end_read": 8,
    "exist": 6,
    "remove": 5,
    "evict": 4,
    "unmount": 2,
    "mount": 3,
    "remount": 2,
    "advance": 9,
    "reap": 3,
    "sweep": 3,
    "ping": 8,
}

# Operations that may evict: writes that need room, and watermark passes.
EVICTING_OPS = {"put_start", "upsert", "evict"}
# Operations whose call expires due read and existence holds before anything else.
EXPIRING_OPS = {
    "put_start",
    "put_end",
    "put_revoke",
    "upsert",
    "end_read",
    "remove",
    "evict",
    "sweep",
}

# Soft-pin requests (action, soft_pin_ttl_ms); the last two are invalid.
PIN_CHOICES = [
    (SoftPinAction.PRESERVE, None),
    (SoftPinAction.PRESERVE, None),
    (SoftPinAction.PRESERVE, None),
    (SoftPinAction.ENABLE, None),
    (SoftPinAction.ENABLE, 0),
    (SoftPinAction.ENABLE, 2000),
    (SoftPinAction.ENABLE, 20_000),
    (SoftPinAction.DISABLE, None),
    (SoftPinAction.PRESERVE, 1000),
    (SoftPinAction.ENABLE, SOFT_PIN_MAX_MS + 1),
]

EVICT, PINNED, SKIP = "evict", "pinned", "skip"
OK = ErrorCode.OK
LEASE_EXPIRED = ErrorCode.LEASE_EXPIRED
INVALID_WRITE = ErrorCode.INVALID_WRITE


def rounded(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


@dataclasses.dataclass(frozen=True)
class Rep:
    """One replica: ``size`` value bytes at ``offset`` in segment ``seg``."""

    id: int
    seg: str
    offset: int
    size: int


@dataclasses.dataclass
class Obj:
    size: int
    writer: str
    start: float
    reps: dict[str, Rep]  # segment id -> replica, in the master's replica order
    write_id: int = 0  # the write in flight, 0 when readable
    readable: bool = False  # every replica COMPLETE; otherwise every one is PROCESSING
    hard: bool = False
    soft_deadline: float = 0.0
    pending: tuple[SoftPinAction, int] | None = None
    group: str = ""
    in_policy: bool = False  # an eviction candidate (stays one while an upsert is in flight)

    @property
    def segments(self) -> set[str]:
        return set(self.reps)


@dataclasses.dataclass
class Hold:
    """Reads by one client of one object through one set of replicas."""

    id: int
    client: str
    key: str
    reps: tuple[Rep, ...]
    deadline: float
    count: int = 1

    @property
    def rids(self) -> tuple[int, ...]:
        return tuple(r.id for r in self.reps)


@dataclasses.dataclass
class Late:
    """A hold that expired before its reader ended it."""

    client: str
    reps: tuple[Rep, ...]
    expired_at: float
    clobbered: bool = False


@dataclasses.dataclass
class Watch:
    """A freed range late readers may still be copying from: the next allocation overlapping
    it clobbers their records."""

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


@dataclasses.dataclass
class Snapshot:
    """What the model knew when an operation began."""

    now: float
    verdicts: dict[str, str]  # candidate key -> EVICT / PINNED / SKIP
    checked: set[str]  # PINNED candidates whose group is only existence-held, not soft pinned
    members: dict[str, set[str]]  # key -> keys that go with it (its group, hard pins aside)
    own_pin: dict[str, bool]  # key -> its own soft pin is live
    bytes: dict[str, int]  # key -> bytes counted by eviction (size x replicas)
    segments: dict[str, frozenset[str]]  # key -> segments holding its replicas
    stats: dict[str, int]


@dataclasses.dataclass
class Slot:
    owner: str
    name: str
    size: int
    seg_id: str
    mounted: bool = False

    def info(self) -> SegmentInfo:
        return SegmentInfo(
            id=self.seg_id,
            name=self.name,
            base=0x1000,
            size=self.size,
            te_endpoint="127.0.0.1:1",
            host_id=f"host-{self.owner}",
        )


class Model:
    """The service under test plus the shadow of what it must answer."""

    def __init__(self, seed: int, reuse_ids: bool, allow_soft: bool = True) -> None:
        self.rng = random.Random(seed)
        self.reuse_ids = reuse_ids
        self.allow_soft = allow_soft
        self.clock = FakeClock()
        config = MasterConfig(
            client_ttl=TTL_S,
            default_kv_lease_ttl=LEASE_MS,
            put_start_discard_timeout_sec=DISCARD_S,
            put_start_release_timeout_sec=RELEASE_S,
            default_kv_soft_pin_ttl=SOFT_PIN_DEFAULT_MS,
            max_kv_soft_pin_ttl=SOFT_PIN_MAX_MS,
            eviction_high_watermark_ratio=WATERMARK,
            eviction_ratio=EVICTION_RATIO,
            allow_evict_soft_pinned_objects=allow_soft,
        )
        self.service = MasterService(config, clock=self.clock, rng=random.Random(seed))
        self.objects: dict[str, Obj] = {}
        self.slots = [Slot(o, n, s, f"seg{i}.0") for i, (o, n, s) in enumerate(SLOTS)]
        self.incarnations = [0] * len(SLOTS)
        self.deadlines: dict[str, float] = {}  # client -> expiry, in touch order
        self.ok_clients: set[str] = set()
        # Read holds by id, and the reads in flight through each replica (over every hold).
        self.holds: dict[int, Hold] = {}
        self.readers: dict[int, int] = {}
        self.last_read_id = 0
        self.expired_holds = 0
        # Every read answered OK, as (reader, read id), until the reader ends it.
        self.issued: list[tuple[str, int]] = []
        # Replicas no object owns any more, kept (allocated) until their last reader is done.
        self.retired: dict[int, Rep] = {}
        self.late: dict[int, Late] = {}
        self.watches: list[Watch] = []
        # Existence holds: (client, key) -> deadline.
        self.exists: dict[tuple[str, str], float] = {}
        # Preempted writes by write id; every write id the service handed out.
        self.preempted: dict[int, Preempted] = {}
        self.write_ids: list[int] = []
        # Replicas this operation's own expiry will free before it allocates.
        self.expiry_frees: list[Rep] = []
        self.counts: dict[str, int] = dict.fromkeys(WEIGHTS, 0)
        self.codes: dict[tuple[str, int], int] = {}
        self.events: dict[str, int] = dict.fromkeys(
            [
                "preempted",
                "preempt_stopped",
                "retired",
                "reaped",
                "swept_writes",
                "released_buffers",
                "sync_evicted",
                "sync_failed",
                "passes",
                "pass_evicted",
                "checked_evicted",
                "upsert_absent",
                "upsert_same_size",
                "upsert_new_size",
                "upsert_under_read",
                "upsert_group_change",
                "upsert_preempted",
                "group_evicted",
                "shared_reads",
                "exist_taken_over",
                "late_ok",
                "late_clobbered",
                "expired_holds",
            ],
            0,
        )
        # Retired replicas freed, by what ended their last read (a reaped reader is rare).
        self.retired_freed = dict.fromkeys(["end", "expiry", "reap"], 0)
        self.soft_pinned_evicted = 0
        # Totals the service's counters must show.
        self.totals = dict.fromkeys(
            ["evicted_objects", "evicted_soft_pinned", "evicted_bytes", "alloc_failures"], 0
        )
        self.totals["eviction_passes"] = 0
        self.alloc_flag = False  # a write failed for lack of room: the next pass runs anyway
        self.snap: Snapshot | None = None
        self.current_op = ""
        self.reconciled = False
        for slot in self.slots:
            self._mount(slot)

    # -- shadow helpers ----------------------------------------------------------------------

    def now(self) -> float:
        return self.clock()

    def touch(self, client: str) -> None:
        self.deadlines.pop(client, None)
        self.deadlines[client] = self.now() + TTL_S

    def mounted_ids(self) -> set[str]:
        return {s.seg_id for s in self.slots if s.mounted}

    def drop_segment(self, seg_id: str) -> None:
        """A segment went away: what lived in it vanishes (no memory comes back anywhere), and
        a late reader of a replica that was still in it (an object's, one retired for other
        readers, or a freed range it watched) can no longer trust what it copied."""
        here = {r.id for o in self.objects.values() for r in o.reps.values() if r.seg == seg_id}
        here |= {i for i, r in self.retired.items() if r.seg == seg_id}
        for late in self.late.values():
            if any(r.id in here for r in late.reps):
                late.clobbered = True
        for watch in self.watches:
            if watch.seg == seg_id:
                for late_id in watch.late_ids:
                    if late_id in self.late:
                        self.late[late_id].clobbered = True
        self.watches = [w for w in self.watches if w.seg != seg_id]
        for rid in [i for i, r in self.retired.items() if r.seg == seg_id]:
            del self.retired[rid]
        for write_id, pre in list(self.preempted.items()):
            pre.reps = [r for r in pre.reps if r.seg != seg_id]
            if not pre.reps:
                del self.preempted[write_id]
        for key in list(self.objects):
            obj = self.objects[key]
            obj.reps.pop(seg_id, None)
            if not obj.reps:
                self.erase(key)

    def expected_allocated(self) -> int:
        live = sum(rounded(o.size) * len(o.reps) for o in self.objects.values())
        kept = sum(rounded(r.size) for r in self.retired.values())
        held = sum(rounded(r.size) for p in self.preempted.values() for r in p.reps)
        return live + kept + held

    def capacity(self) -> int:
        return sum(s.size for s in self.slots if s.mounted)

    def largest_segment(self) -> int:
        return max((s.size for s in self.slots if s.mounted), default=0)

    def names_that_fit(self, size: int) -> set[str]:
        """Segment names with room for ``size`` once this operation's own expiry has freed
        the retired replicas whose last hold runs out now."""
        names = set()
        for slot in self.slots:
            mounted = self.service.segment_of(slot.seg_id) if slot.mounted else None
            if mounted is None:
                continue
            allocator = mounted.allocator
            freed = [r for r in self.expiry_frees if r.seg == slot.seg_id]
            if freed:
                allocator = copy.deepcopy(allocator)
                for rep in freed:
                    allocator.free(rep.offset)
            if allocator.largest_free_block >= rounded(size):
                names.add(slot.name)
        return names

    def record(self, op: str, code: int) -> None:
        self.codes[(op, int(code))] = self.codes.get((op, int(code)), 0) + 1

    def _mount(self, slot: Slot) -> None:
        assert self.service.mount_segment(slot.owner, slot.info()) == OK
        slot.mounted = True
        self.touch(slot.owner)

    def _fresh_id(self, index: int) -> None:
        if not self.reuse_ids:
            self.incarnations[index] += 1
            self.slots[index].seg_id = f"seg{index}.{self.incarnations[index]}"

    def resolve_pin(
        self, action: SoftPinAction, ttl: int | None
    ) -> tuple[SoftPinAction, int] | None:
        """The pending soft pin of a write, or None when the request is invalid (as upstream)."""
        if action != SoftPinAction.ENABLE:
            return None if ttl is not None else (action, 0)
        ttl = SOFT_PIN_DEFAULT_MS if ttl is None else ttl
        return (action, ttl) if 0 <= ttl <= SOFT_PIN_MAX_MS else None

    def group_of(self, group: str) -> list[str]:
        return [k for k, o in self.objects.items() if group and o.group == group]

    # -- reads, holds and the memory they keep -----------------------------------------------

    def is_read(self, obj: Obj) -> bool:
        """A hold (expired lazily, as the master does) covers one of its replicas."""
        return any(r.id in self.readers for r in obj.reps.values())

    def is_checked(self, key: str) -> bool:
        return any(k == key for _, k in self.exists)

    def free(self, rep: Rep) -> None:
        """``rep``'s memory goes back; late readers of it now watch the range for reuse."""
        late_ids = {i for i, late in self.late.items() if rep in late.reps}
        if late_ids:
            self.watches.append(Watch(rep.seg, rep.offset, rep.offset + rep.size, late_ids))

    def retire_or_free(self, rep: Rep) -> None:
        """``rep`` leaves its object: kept for its readers, or freed at once."""
        if self.readers.get(rep.id, 0):
            self.retired[rep.id] = rep
            self.events["retired"] += 1
        else:
            self.free(rep)

    def allocated(self, reps: list[Rep]) -> None:
        """New replicas were handed out: late reads of any overlapping freed range are
        clobbered."""
        for rep in reps:
            end = rep.offset + rep.size
            kept = []
            for watch in self.watches:
                if watch.seg == rep.seg and watch.start < end and rep.offset < watch.end:
                    for late_id in watch.late_ids:
                        if late_id in self.late:
                            self.late[late_id].clobbered = True
                else:
                    kept.append(watch)
            self.watches = kept

    def release_reads(self, hold: Hold, times: int, why: str) -> list[Rep]:
        """``times`` reads through ``hold``'s replicas ended; returns the retired replicas
        that went back to their allocators."""
        freed = []
        for rid in hold.rids:
            left = self.readers[rid] - times
            if left:
                self.readers[rid] = left
                continue
            del self.readers[rid]
            rep = self.retired.pop(rid, None)
            if rep is not None:
                self.free(rep)
                freed.append(rep)
                self.retired_freed[why] += 1
        return freed

    def erase(self, key: str) -> Obj:
        """The object at ``key`` is gone (any path): the existence holds on it end."""
        for held in [h for h in self.exists if h[1] == key]:
            del self.exists[held]
        return self.objects.pop(key)

    def drop_hold(self, hold: Hold) -> None:
        del self.holds[hold.id]

    def expire(self) -> list[Rep]:
        """What the master's expiry does at ``now``: end every hold whose deadline passed
        (leaving a late-read record), drop lapsed existence holds and old late records.
        Returns the retired replicas freed."""
        now = self.now()
        freed: list[Rep] = []
        for hold in [h for h in self.holds.values() if h.deadline <= now]:
            self.late[hold.id] = Late(hold.client, hold.reps, now)
            self.drop_hold(hold)
            freed += self.release_reads(hold, hold.count, "expiry")
            self.expired_holds += 1
            self.events["expired_holds"] += 1
        for held, deadline in list(self.exists.items()):
            if deadline <= now:
                del self.exists[held]
        for late_id in [
            i for i, late in self.late.items() if late.expired_at + LATE_READ_MEMORY_S <= now
        ]:
            del self.late[late_id]
        return freed

    def expiring(self) -> None:
        """The coming call expires due holds before anything else (an admitted call of
        EXPIRING_OPS): the model does it first, so its verdicts and room estimates see what
        the call will see."""
        assert self.current_op in EXPIRING_OPS
        self.expiry_frees = self.expire()
        assert self.snap is not None
        self.snap = self.snapshot()

    def grant(self, client: str, key: str, obj: Obj, result: ReplicaListResult) -> None:
        """A read of ``key`` by ``client`` answered OK: check its hold and account for it."""
        reps = tuple(obj.reps.values())
        assert tuple(r.id for r in result.replicas) == tuple(r.id for r in reps)
        deadline = self.now() + LEASE_S
        shared = [
            h for h in self.holds.values() if h.client == client and h.key == key and h.reps == reps
        ]
        if shared:
            hold = shared[0]
            assert result.read_id == hold.id, "reads of one object by one client share a hold"
            hold.count += 1
            hold.deadline = max(hold.deadline, deadline)
            self.events["shared_reads"] += 1
        else:
            assert result.read_id > self.last_read_id, "a new hold has a fresh id"
            self.last_read_id = result.read_id
            hold = Hold(result.read_id, client, key, reps, deadline)
            self.holds[hold.id] = hold
        for rep in reps:
            self.readers[rep.id] = self.readers.get(rep.id, 0) + 1
        # This read takes the client's existence hold on the key over.
        if self.exists.pop((client, key), None) is not None:
            self.events["exist_taken_over"] += 1
        self.issued.append((client, hold.id))
        if len(self.issued) > MAX_ISSUED:
            del self.issued[0]

    def end_one(self, client: str, read_id: int) -> ErrorCode:
        hold = self.holds.get(read_id)
        if hold is not None and hold.client == client:
            hold.count -= 1
            self.release_reads(hold, 1, "end")
            if hold.count == 0:
                self.drop_hold(hold)
            return OK
        late = self.late.get(read_id)
        if late is not None and late.client == client:
            del self.late[read_id]
            self.events["late_clobbered" if late.clobbered else "late_ok"] += 1
            return LEASE_EXPIRED if late.clobbered else OK
        return LEASE_EXPIRED

    def end_reads(self, client: str, read_ids: list[int]) -> None:
        codes = self.service.reads.end_reads(client, read_ids)
        self.expire()
        expected = [self.end_one(client, i) for i in read_ids]
        for code in codes:
            self.record("end_read", code)
        assert codes == expected, (client, read_ids, codes, expected)

    def drop_client(self, client: str) -> None:
        """``client`` expired: its reads and existence holds end (no late records), and its
        preempted writes can no longer be copying."""
        for hold in [h for h in self.holds.values() if h.client == client]:
            self.drop_hold(hold)
            self.release_reads(hold, hold.count, "reap")
        for held in [h for h in self.exists if h[0] == client]:
            del self.exists[held]
        for write_id in [w for w, p in self.preempted.items() if p.writer == client]:
            del self.preempted[write_id]

    def preempt(self, key: str, obj: Obj) -> None:
        """``obj``'s write in flight is replaced: its buffers wait for its writer to stop."""
        assert obj.write_id and not obj.readable
        self.preempted[obj.write_id] = Preempted(
            obj.writer, key, list(obj.reps.values()), obj.start + RELEASE_S
        )
        self.erase(key)

    # -- eviction reconciliation -------------------------------------------------------------

    def snapshot(self, stats: dict[str, int] | None = None) -> Snapshot:
        """Eviction verdicts as the service would give them now (holds already expired, as
        every operation that may evict does first); ``stats`` taken now unless given (a write
        that preempted a stuck one re-judges after dropping it, since that can free its
        group)."""
        now = self.now()
        verdicts: dict[str, str] = {}
        checked: set[str] = set()
        members: dict[str, set[str]] = {}
        for key, obj in self.objects.items():
            group = self.group_of(obj.group) if obj.group else [key]
            members[key] = {k for k in group if not self.objects[k].hard}
            if not obj.in_policy:
                continue
            assert not obj.hard
            mates = [self.objects[k] for k in members[key]]
            if any(not m.readable or self.is_read(m) for m in mates):
                verdicts[key] = SKIP
            elif any(m.soft_deadline > now for m in mates):
                verdicts[key] = PINNED if self.allow_soft else SKIP
            elif any(self.is_checked(k) for k in members[key]):
                verdicts[key] = PINNED  # found by an existence check: after everything else
                checked.add(key)
            else:
                verdicts[key] = EVICT
        return Snapshot(
            now=now,
            verdicts=verdicts,
            checked=checked,
            members=members,
            own_pin={k: o.soft_deadline > now for k, o in self.objects.items()},
            bytes={k: o.size * len(o.reps) for k, o in self.objects.items()},
            segments={k: frozenset(o.reps) for k, o in self.objects.items()},
            stats=self.service.stats() if stats is None else stats,
        )

    def rejudge(self) -> None:
        """Re-take the verdicts after the model dropped a preempted write."""
        assert self.snap is not None
        self.snap = self.snapshot(self.snap.stats)

    def reconcile(
        self,
        alloc: str = "none",
        size: int = 0,
        protected: frozenset[str] = frozenset(),
    ) -> set[str]:
        """Account for objects the service evicted during this operation; returns them.

        ``alloc`` says what the operation's allocation did: ``none`` (no allocation, or it
        succeeded without evicting), ``evict_ok`` (it found no room and made some by
        evicting), ``evict_fail`` (it found no room and could not make enough), ``pass`` (a
        watermark pass). ``size`` is the value a write needed room for: a write evicts only
        objects (with their groups) that have a replica in a segment large enough for it.
        ``protected`` names an object the operation itself keeps out of eviction's reach (an
        upsert's own object while it allocates the new value).
        """
        snap = self.snap
        assert snap is not None
        self.reconciled = True
        present = {k for k in KEYS if self.service.object_of("", k) is not None}
        assert present <= set(self.objects), f"unknown objects {present - set(self.objects)}"
        evicted = set(self.objects) - present
        verdicts = snap.verdicts
        if evicted and self.current_op not in EVICTING_OPS:
            raise AssertionError(f"{self.current_op} dropped {sorted(evicted)}")
        for key in evicted:
            verdict = verdicts.get(key)
            assert verdict in (EVICT, PINNED), f"{key} evicted with verdict {verdict}"
            # Groups go whole (hard-pinned members stay).
            assert snap.members[key] <= evicted, f"group of {key} partly evicted"
        assert not (evicted & protected), f"protected {sorted(evicted & protected)} evicted"
        # A candidate whose group holds a protected object stays with it.
        spared = {k for k in verdicts if snap.members[k] & protected}
        ordinary = {k for k, v in verdicts.items() if v == EVICT} - protected - spared
        pinned = {k for k, v in verdicts.items() if v == PINNED} - protected - spared
        if alloc in ("evict_ok", "evict_fail"):
            useful = {s.seg_id for s in self.slots if s.mounted and s.size >= size}

            def helps(key: str) -> bool:
                return any(snap.segments[m] & useful for m in snap.members[key])

            for key in evicted:
                assert helps(key), f"{key} evicted, but no member could make room"
            ordinary = {k for k in ordinary if helps(k)}
            pinned = {k for k in pinned if helps(k)}
        if evicted & pinned:
            # Soft-pinned or existence-held objects go only after every ordinary candidate
            # (that could help).
            assert ordinary <= evicted, f"pinned evicted before {sorted(ordinary - evicted)}"
        took_pinned = evicted & {k for k, v in verdicts.items() if v == PINNED}
        self.soft_pinned_evicted += len(took_pinned - snap.checked)
        self.events["checked_evicted"] += len(took_pinned & snap.checked)
        if alloc == "evict_fail":
            assert ordinary <= evicted, f"write failed while {sorted(ordinary - evicted)} remain"
            assert pinned <= evicted, "write failed while pinned candidates could have gone"
        elif alloc == "evict_ok":
            assert evicted, "a write that found no room succeeded without evicting"
        else:
            assert alloc in ("none", "pass")
        stats = self.service.stats()

        def delta(name: str) -> int:
            return stats[name] - snap.stats[name]

        assert delta("evicted_objects") == len(evicted)
        soft = sum(snap.own_pin[k] for k in evicted)
        assert delta("evicted_soft_pinned") == soft
        assert delta("evicted_bytes") == sum(snap.bytes[k] for k in evicted)
        assert delta("alloc_failures") == int(alloc == "evict_fail")
        if alloc == "pass" or not evicted:
            assert delta("sync_evictions") == 0
        else:
            assert 1 <= delta("sync_evictions") <= len(evicted)
        if alloc == "evict_fail":
            self.alloc_flag = True
            self.events["sync_failed"] += 1
        elif alloc == "evict_ok":
            self.events["sync_evicted"] += 1
        self.totals["evicted_objects"] += len(evicted)
        self.totals["evicted_soft_pinned"] += soft
        self.totals["evicted_bytes"] += delta("evicted_bytes")
        self.totals["alloc_failures"] += int(alloc == "evict_fail")
        if any(self.objects[k].group for k in evicted):
            self.events["group_evicted"] += 1
        for key in evicted:
            # Nobody reads it (checked above), so its memory is free at once.
            for rep in self.erase(key).reps.values():
                assert rep.id not in self.readers
                self.free(rep)
        return evicted

    # -- operations --------------------------------------------------------------------------

    def _random_config(
        self, replica_num: int, preferred: str, hard: bool, group: str | None
    ) -> tuple[ReplicateConfig, tuple[SoftPinAction, int] | None]:
        action, ttl = self.rng.choice(PIN_CHOICES)
        config = ReplicateConfig(
            replica_num=replica_num,
            preferred_segment=preferred,
            with_hard_pin=hard,
            soft_pin_action=action,
            soft_pin_ttl_ms=ttl,
            group_ids=None if group is None else [group],
        )
        return config, self.resolve_pin(action, ttl)

    def _random_size(self) -> int:
        size = self.rng.choice(SIZES)
        return max(1, size + self.rng.randint(-16, 16))

    def _random_group(self) -> str | None:
        return self.rng.choice([None, None, None, None, None, *GROUPS])

    def _check_replicas(
        self, result: PutStartResult, size: int, replica_num: int, fits: set[str], preferred: str
    ) -> list[Rep]:
        segs = [r.segment_id for r in result.replicas]
        assert len({r.segment_name for r in result.replicas}) == len(segs)
        assert set(segs) <= self.mounted_ids()
        if fits:
            # Placement walks every name, so the count is exactly what fits (best effort).
            assert len(segs) == min(replica_num, len(fits))
            if preferred in fits:
                assert preferred in {r.segment_name for r in result.replicas}
        else:
            assert 1 <= len(segs) <= replica_num
        for replica in result.replicas:
            assert replica.status == ReplicaStatus.PROCESSING
            assert replica.size == size
        return [Rep(r.id, r.segment_id, r.offset, r.size) for r in result.replicas]

    def _new_write(self, result: PutStartResult) -> int:
        """Every start that answers OK names a write of its own."""
        assert result.code == OK
        assert not self.write_ids or result.write_id > self.write_ids[-1], "stale write id"
        self.write_ids.append(result.write_id)
        return result.write_id

    def _allocation(self, result: PutStartResult, size: int, fits: set[str]) -> tuple[str, bool]:
        """(reconcile mode, succeeded) for a write that needed ``size`` bytes."""
        if fits:
            assert result.code == OK
            return "none", True
        if size > self.largest_segment():  # could never fit: fails without evicting
            assert result.code == ErrorCode.NO_AVAILABLE_HANDLE
            return "none", False
        assert result.code in (OK, ErrorCode.NO_AVAILABLE_HANDLE)
        ok = result.code == OK
        return ("evict_ok" if ok else "evict_fail"), ok

    def _create(
        self,
        key: str,
        writer: str,
        size: int,
        config: ReplicateConfig,
        pin: tuple[SoftPinAction, int],
        group: str,
        fits: set[str],
        result: PutStartResult,
        predecessor: Obj | None,
    ) -> None:
        """A new object at ``key`` (the key is absent from the model by now)."""
        mode, ok = self._allocation(result, size, fits)
        reps: list[Rep] = []
        if ok:
            reps = self._check_replicas(
                result, size, config.replica_num, fits, config.preferred_segment
            )
            obj = Obj(size, writer, self.now(), {r.seg: r for r in reps}, pending=pin, group=group)
            obj.write_id = self._new_write(result)
            obj.hard = config.with_hard_pin or bool(predecessor and predecessor.hard)
            if predecessor is not None and predecessor.soft_deadline > self.now():
                obj.soft_deadline = predecessor.soft_deadline
            self.objects[key] = obj
        self.reconcile(mode, size=size)
        self.allocated(reps)  # after what eviction freed to make room for it

    def op_put_start(self) -> None:
        key = self.rng.choice(KEYS)
        writer = self.rng.choice(WRITERS)
        size = self._random_size()
        replica_num = self.rng.choice([1, 1, 1, 2, 3])
        preferred = self.rng.choice(["", "", "", "n0", "n1", "n2", "absent"])
        group = self._random_group()
        config, pin = self._random_config(replica_num, preferred, self.rng.random() < 0.06, group)
        if pin is not None:  # (an invalid start is refused before anything else)
            self.expiring()
        now = self.now()
        existing = self.objects.get(key)
        fits = self.names_that_fit(size)
        result = self.service.put_start(writer, "", key, size, config)
        self.record("put_start", result.code)
        if pin is None:
            assert result.code == ErrorCode.INVALID_PARAMS
            return
        if existing is not None and (existing.readable or existing.start + DISCARD_S > now):
            assert result.code == ErrorCode.OBJECT_ALREADY_EXISTS
            return
        if existing is not None:  # preempted: its buffers wait for its writer to stop
            self.events["preempted"] += 1
            self.preempt(key, existing)
            self.rejudge()
        self._create(key, writer, size, config, pin, group or "", fits, result, None)

    def op_upsert(self) -> None:
        key = self._pick_key()
        writer = self.rng.choice(WRITERS)
        existing = self.objects.get(key)
        size = self._random_size()
        if existing is not None and self.rng.random() < 0.5:
            size = existing.size
        replica_num = self.rng.choice([1, 1, 2])
        roll = self.rng.random()
        group = None if roll < 0.7 or existing is None else existing.group
        if roll > 0.9:
            group = self.rng.choice(["", *GROUPS])
        hard = self.rng.random() < 0.08
        config, pin = self._random_config(replica_num, "", hard, group)
        if pin is not None:  # (an invalid start is refused before anything else)
            self.expiring()
        fits = self.names_that_fit(size)
        now = self.now()
        before = self.service.object_of("", key)
        result = self.service.upsert_start(writer, "", key, size, config)
        self.record("upsert", result.code)
        if pin is None:
            assert result.code == ErrorCode.INVALID_PARAMS
            return
        if existing is None:
            self.events["upsert_absent"] += 1
            self._create(key, writer, size, config, pin, group or "", fits, result, None)
            return
        if group is not None and group != existing.group:
            self.events["upsert_group_change"] += 1
            assert result.code == ErrorCode.INVALID_PARAMS
            return
        if not existing.readable:
            # An unfinished put or upsert loses at once; its writer may still be copying.
            self.events["upsert_preempted"] += 1
            self.preempt(key, existing)
            self.rejudge()
            self._create(key, writer, size, config, pin, existing.group, fits, result, existing)
            return
        # An admitted upsert ORs in the hard pin; a rejected one changes nothing.
        hard = existing.hard or hard
        read = self.is_read(existing)
        if size == existing.size and not read:
            # Rewritten in place: the same replicas, unreadable until the write ends.
            self.events["upsert_same_size"] += 1
            assert result.code == OK
            old = list(existing.reps.values())
            assert [(r.id, r.segment_id, r.offset) for r in result.replicas] == [
                (r.id, r.seg, r.offset) for r in old
            ]
            assert all(r.status == ReplicaStatus.PROCESSING for r in result.replicas)
            # Late readers of these bytes can no longer trust what they copied.
            for late in self.late.values():
                if set(late.reps) & set(old):
                    late.clobbered = True
            existing.readable, existing.writer, existing.start = False, writer, now
            existing.write_id = self._new_write(result)
            existing.pending = pin
            existing.hard, existing.in_policy = hard, existing.in_policy and not hard
            self.reconcile()
            return
        mode, ok = self._allocation(result, size, fits)
        itself = frozenset([key])
        if not ok:
            self.reconcile(mode, size=size, protected=itself)
            return
        # Reallocated (a new size, or readers still copy the old bytes): the old replicas
        # are retired while read, freed at once otherwise.
        self.events["upsert_under_read" if read else "upsert_new_size"] += 1
        reps = self._check_replicas(result, size, replica_num, fits, "")
        after = self.service.object_of("", key)
        # Never evicted to make room for its own new value.
        assert after is before, "the upsert lost its own object (evicted with its group?)"
        self.reconcile(mode, size=size, protected=itself)
        self.allocated(reps)  # before the old bytes are let go
        for rep in existing.reps.values():
            self.retire_or_free(rep)
        existing.size, existing.reps = size, {r.seg: r for r in reps}
        existing.readable, existing.writer, existing.start = False, writer, now
        existing.write_id = self._new_write(result)
        existing.pending = pin
        existing.hard, existing.in_policy = hard, existing.in_policy and not hard

    def _finish(self, writer: str, key: str, write_id: int, revoke: bool) -> ErrorCode:
        """The answer to PutEnd / PutRevoke, applied to the model."""
        preempted = self.preempted.get(write_id) if write_id else None
        if preempted is not None and preempted.writer == writer:
            # The preempted writer stopped: its buffers come back at once.
            del self.preempted[write_id]
            self.events["preempt_stopped"] += 1
            return INVALID_WRITE
        obj = self.objects.get(key)
        if obj is None:
            return ErrorCode.OBJECT_NOT_FOUND
        if obj.writer != writer:
            return ErrorCode.ILLEGAL_CLIENT
        if write_id and obj.write_id != write_id:
            # Another write of this writer: a retry of an ended one, or one since replaced.
            return OK if obj.readable and not revoke else INVALID_WRITE
        if revoke:
            if obj.readable:
                return INVALID_WRITE
            for rep in obj.reps.values():
                self.retire_or_free(rep)  # nobody reads a write in flight: freed at once
            assert not self.retired.keys() & {r.id for r in obj.reps.values()}
            self.erase(key)
            return OK
        if obj.readable:  # a retry: nothing changes
            return OK
        now = self.now()
        obj.readable, obj.write_id = True, 0
        obj.in_policy = not obj.hard
        if obj.pending is not None:
            action, ttl = obj.pending
            if action == SoftPinAction.ENABLE and ttl > 0:
                obj.soft_deadline = now + ttl / 1000.0
            elif action != SoftPinAction.PRESERVE:
                obj.soft_deadline = 0.0
        obj.pending = None
        return OK

    def _pick_finish(self) -> tuple[str, str, int]:
        """(key, writer, write id) for an end or revoke: mostly an in-flight write, by write
        id or by 0; sometimes a preempted write, an old write id or a wrong client."""
        if self.preempted and self.rng.random() < 0.12:
            write_id, preempted = self.rng.choice(sorted(self.preempted.items()))
            writer = preempted.writer if self.rng.random() < 0.85 else self.rng.choice(WRITERS)
            key = preempted.key if self.rng.random() < 0.8 else self.rng.choice(KEYS)
            return key, writer, write_id
        key, writer = self._pick_write()
        obj = self.objects.get(key)
        roll = self.rng.random()
        if roll < 0.45 or not self.write_ids:
            write_id = 0
        elif roll < 0.85 and obj is not None:
            write_id = obj.write_id
        else:
            write_id = self.rng.choice(self.write_ids)
        return key, writer, write_id

    def op_put_end(self) -> None:
        key, writer, write_id = self._pick_finish()
        self.expiring()
        code = self.service.put_end(writer, "", key, write_id)
        self.record("put_end", code)
        expected = self._finish(writer, key, write_id, revoke=False)
        assert code == expected, (key, writer, write_id, code, expected)

    def op_put_revoke(self) -> None:
        key, writer, write_id = self._pick_finish()
        self.expiring()
        code = self.service.put_revoke(writer, "", key, write_id)
        self.record("put_revoke", code)
        expected = self._finish(writer, key, write_id, revoke=True)
        assert code == expected, (key, writer, write_id, code, expected)

    def _pick_key(self) -> str:
        """Mostly a key that exists, so that reads and removes often succeed."""
        if self.objects and self.rng.random() < 0.6:
            return self.rng.choice(sorted(self.objects))
        return self.rng.choice(KEYS)

    def _pick_write(self) -> tuple[str, str]:
        """Mostly an in-flight key and its writer; sometimes any key or a wrong client."""
        inflight = sorted(k for k, o in self.objects.items() if not o.readable)
        key = self.rng.choice(inflight if inflight and self.rng.random() < 0.7 else KEYS)
        obj = self.objects.get(key)
        if obj is not None and self.rng.random() < 0.85:
            return key, obj.writer
        return key, self.rng.choice(WRITERS)

    def op_get(self) -> None:
        reader = self.rng.choice(READERS)
        if self.rng.random() < 0.5:
            keys = [self._pick_key()]
            results = [self.service.reads.get_replica_list("", keys[0], reader)]
        else:
            keys = [self._pick_key() for _ in range(self.rng.choice([2, 3, 4]))]
            results = self.service.reads.batch_get_replica_list("", keys, reader)
        for key, result in zip(keys, results, strict=True):
            self.record("get", result.code)
            obj = self.objects.get(key)
            if obj is None:
                assert result.code == ErrorCode.OBJECT_NOT_FOUND
            elif not obj.readable:
                assert result.code == ErrorCode.REPLICA_IS_NOT_READY
            else:
                assert result.code == OK
                assert result.size == obj.size
                assert result.lease_ttl_ms == LEASE_MS
                assert {r.segment_id for r in result.replicas} == obj.segments
                assert len(result.replicas) == len(obj.reps)
                assert all(r.status == ReplicaStatus.COMPLETE for r in result.replicas)
                self.grant(reader, key, obj, result)
        for result in results:
            if result.code == OK and self.rng.random() < END_AT_ONCE:
                self.issued.remove((reader, result.read_id))
                self.end_reads(reader, [result.read_id])

    def op_end_read(self) -> None:
        roll = self.rng.random()
        if not self.issued or roll < 0.05:
            # An id this master never handed out.
            self.end_reads(self.rng.choice(READERS), [self.last_read_id + 1000])
            return
        reader, read_id = self.rng.choice(self.issued)
        if roll < 0.15:
            # Another client cannot end this one's reads.
            self.end_reads(self.rng.choice([r for r in READERS if r != reader]), [read_id])
            return
        mine = [e for e in self.issued if e[0] == reader and e != (reader, read_id)]
        batch = [(reader, read_id)]
        batch += self.rng.sample(mine, min(len(mine), self.rng.choice([0, 0, 0, 1, 2])))
        for entry in batch:
            self.issued.remove(entry)
        self.end_reads(reader, [i for _, i in batch])

    def op_exist(self) -> None:
        keys = list(dict.fromkeys(self._pick_key() for _ in range(self.rng.choice([1, 1, 5]))))
        client = self.rng.choice(READERS)
        answers = self.service.reads.batch_exist_key("", keys, client)
        deadline = self.now() + LEASE_S
        for key, answer in zip(keys, answers, strict=True):
            obj = self.objects.get(key)
            readable = obj is not None and obj.readable
            assert answer == int(readable)
            if readable:
                previous = self.exists.get((client, key), 0.0)
                self.exists[(client, key)] = max(previous, deadline)

    def op_remove(self) -> None:
        key = self._pick_key()
        force = self.rng.random() < 0.3
        self.expiring()
        code = self.service.remove("", key, force=force)
        self.record("remove", code)
        obj = self.objects.get(key)
        if obj is None:
            assert code == ErrorCode.OBJECT_NOT_FOUND
        elif not obj.readable:
            assert code == ErrorCode.REPLICA_IS_NOT_READY
        elif not force and (self.is_read(obj) or self.is_checked(key)):
            assert code == ErrorCode.OBJECT_HAS_LEASE
        else:
            assert code == OK
            for rep in obj.reps.values():
                self.retire_or_free(rep)  # forced: bytes readers copy wait for them
            self.erase(key)
            assert self.service.reads.exist_key("", key) == 0

    def op_evict(self) -> None:
        self.expiring()
        now = self.now()
        capacity = self.capacity()
        used = self.expected_allocated() / capacity if capacity else 0.0
        over = used - WATERMARK
        base = sum(o.in_policy for o in self.objects.values())
        expect_pass = (over > 0 or self.alloc_flag) and base > 0
        self.alloc_flag = False
        work = self.service.evict_once(now)
        evicted = self.reconcile("pass")
        if not expect_pass:
            assert work is None
            assert not evicted
            return
        assert work is not None and work.done
        self.events["passes"] += 1
        self.events["pass_evicted"] += len(evicted)
        self.totals["eviction_passes"] += 1
        ratio = max(EVICTION_RATIO, over + EVICTION_RATIO)
        target = math.ceil(base * ratio)
        lower = min(math.ceil(base * max(ratio * 0.5, over)), target)
        assert (work.target, work.lower_bound) == (target, lower)
        assert work.evicted == len(evicted)
        verdicts = self.snap.verdicts if self.snap else {}
        ordinary = {k for k, v in verdicts.items() if v == EVICT}
        pinned = {k for k, v in verdicts.items() if v == PINNED}
        if len(ordinary) >= target:
            assert evicted <= ordinary and len(evicted) >= target
            assert not work.fallback
        else:
            assert ordinary <= evicted
            # The fallback stage (soft pins when allowed, existence holds always) runs when
            # the ordinary candidates could not reach the lower bound.
            assert work.fallback == (len(ordinary) < lower)
            if work.fallback:
                assert len(evicted) >= min(lower, len(ordinary) + len(pinned))
            else:
                assert evicted == ordinary

    def op_unmount(self) -> None:
        slot = self.rng.choice(self.slots)
        if self.rng.random() < 0.2:  # a non-owner is refused
            intruder = self.rng.choice([c for c in CLIENTS if c != slot.owner])
            code = self.service.unmount_segment(intruder, slot.seg_id)
            assert code == (ErrorCode.INVALID_PARAMS if slot.mounted else OK)
            return
        assert self.service.unmount_segment(slot.owner, slot.seg_id) == OK
        if slot.mounted:
            slot.mounted = False
            self.drop_segment(slot.seg_id)
            self._fresh_id(self.slots.index(slot))

    def op_mount(self) -> None:
        index = self.rng.randrange(len(self.slots))
        slot = self.slots[index]
        if slot.mounted and self.rng.random() < 0.3:
            intruder = self.rng.choice([c for c in CLIENTS if c != slot.owner])
            code = self.service.mount_segment(intruder, slot.info())
            assert code == ErrorCode.INVALID_PARAMS
            return
        self._mount(slot)  # idempotent when already mounted

    def op_remount(self) -> None:
        client = self.rng.choice(CLIENTS)
        owned = [s for s in self.slots if s.owner == client]
        assert self.service.remount_segments(client, [s.info() for s in owned]) == OK
        for slot in owned:
            slot.mounted = True
        self.touch(client)
        self.ok_clients.add(client)
        assert self.service.ping(client).client_status == ClientStatus.OK
        self.touch(client)

    def op_ping(self) -> None:
        client = self.rng.choice(CLIENTS)
        answer = self.service.ping(client)
        assert answer.code == OK
        expected = ClientStatus.OK if client in self.ok_clients else ClientStatus.NEED_REMOUNT
        assert answer.client_status == expected
        self.touch(client)

    def op_advance(self) -> None:
        roll = self.rng.random()
        if roll < 0.8:
            step = self.rng.uniform(0.01, 1.0)
        elif roll < 0.97:
            step = self.rng.uniform(1.0, 6.0)
        else:
            step = self.rng.uniform(15.0, 30.0)
        self.clock.advance(step)

    def op_reap(self) -> None:
        now = self.now()
        expired = [c for c, deadline in self.deadlines.items() if deadline <= now]
        assert self.service.reap_expired_clients(now) == expired
        self.events["reaped"] += len(expired)
        for client in expired:
            del self.deadlines[client]
            self.ok_clients.discard(client)
            for index, slot in enumerate(self.slots):
                if slot.owner == client and slot.mounted:
                    slot.mounted = False
                    self.drop_segment(slot.seg_id)
                    self._fresh_id(index)
            self.drop_client(client)

    def op_sweep(self) -> None:
        self.expiring()
        now = self.now()
        expected = 0
        for write_id, preempted in list(self.preempted.items()):
            if preempted.release_at <= now:
                expected += len(preempted.reps)
                del self.preempted[write_id]
                self.events["released_buffers"] += 1
        for key in list(self.objects):
            obj = self.objects[key]
            if not obj.readable and obj.start + RELEASE_S <= now:
                expected += len(obj.reps)
                for rep in obj.reps.values():
                    self.retire_or_free(rep)  # nobody reads a write in flight
                self.erase(key)
                self.events["swept_writes"] += 1
        assert self.service.sweep_expired_puts(now) == expected

    # -- driver ------------------------------------------------------------------------------

    def verify(self) -> None:
        self.service.check()
        stats = self.service.stats()
        assert stats["objects"] == len(self.objects)
        assert stats["segments"] == sum(s.mounted for s in self.slots)
        assert stats["allocated_bytes"] == self.expected_allocated()
        assert stats["preempted_buffers"] == sum(len(p.reps) for p in self.preempted.values())
        assert stats["retired_buffers"] == len(self.retired)
        assert stats["retired_bytes"] == sum(r.size for r in self.retired.values())
        assert stats["read_holds"] == len(self.holds)
        assert stats["reads_in_flight"] == sum(h.count for h in self.holds.values())
        assert stats["existence_holds"] == len(self.exists)
        assert stats["late_reads"] == len(self.late)
        assert stats["expired_read_holds"] == self.expired_holds
        assert stats["clients"] == len(self.deadlines)
        assert stats["active_clients"] == len(self.ok_clients)
        assert stats["eviction_candidates"] == sum(o.in_policy for o in self.objects.values())
        for name, total in self.totals.items():
            assert stats[name] == total, name
        for key, obj in self.objects.items():
            meta = self.service.object_of("", key)
            assert meta is not None, key
            assert [(r.id, r.segment_id, r.offset, r.size) for r in meta.replicas] == [
                (r.id, r.seg, r.offset, r.size) for r in obj.reps.values()
            ], key
            assert meta.size == obj.size and meta.client_id == obj.writer, key
            assert meta.is_readable() == obj.readable, key
            assert meta.is_writing() != obj.readable, key
            assert meta.write_id == obj.write_id, key
            assert meta.hard_pinned == obj.hard, key
            assert meta.soft_pin_deadline == obj.soft_deadline, key
            assert meta.group_id == obj.group, key
            leased = self.is_read(obj) or self.is_checked(key)
            assert self.service.is_leased("", key) == leased, key

    def run(self, ops: int) -> None:
        names = list(WEIGHTS)
        weights = [WEIGHTS[n] for n in names]
        for step in range(ops):
            op = self.rng.choices(names, weights)[0]
            self.counts[op] += 1
            self.current_op = op
            try:
                self.expiry_frees = []
                self.snap = self.snapshot()
                self.reconciled = False
                getattr(self, f"op_{op}")()
                if not self.reconciled:
                    self.reconcile()
                self.verify()
            except AssertionError as exc:
                raise AssertionError(f"step {step} ({op}) at t={self.now():.3f}: {exc}") from exc


def _run(seed: int, reuse_ids: bool, allow_soft: bool = True) -> Model:
    model = Model(seed, reuse_ids, allow_soft)
    model.run(OPS)
    return model


@pytest.mark.parametrize(("seed", "allow_soft"), [(1, True), (2, True), (3, False)])
def test_random_ops_match_shadow(seed: int, allow_soft: bool) -> None:
    model = _run(seed, reuse_ids=False, allow_soft=allow_soft)
    # The run must have exercised the interesting paths, not just errors.
    codes = model.codes
    assert codes.get(("put_start", OK), 0) > 100
    assert codes.get(("put_start", ErrorCode.OBJECT_ALREADY_EXISTS), 0) > 10
    assert codes.get(("put_start", ErrorCode.NO_AVAILABLE_HANDLE), 0) > 0
    assert codes.get(("put_start", ErrorCode.INVALID_PARAMS), 0) > 0
    assert codes.get(("put_end", OK), 0) > 50
    assert codes.get(("put_end", INVALID_WRITE), 0) > 0
    assert codes.get(("get", OK), 0) > 50
    assert codes.get(("end_read", OK), 0) > 50
    assert codes.get(("end_read", LEASE_EXPIRED), 0) > 10
    assert codes.get(("remove", OK), 0) > 10
    assert codes.get(("remove", ErrorCode.OBJECT_HAS_LEASE), 0) > 0
    assert all(model.counts[op] > 0 for op in WEIGHTS)
    assert all(count > 0 for count in model.events.values()), model.events
    assert model.retired_freed["end"] > 0 and model.retired_freed["expiry"] > 0
    stats = model.service.stats()
    assert stats["evicted_objects"] > 30
    if allow_soft:
        assert model.soft_pinned_evicted > 0 and stats["evicted_soft_pinned"] > 0
    else:
        assert model.soft_pinned_evicted == 0 and stats["evicted_soft_pinned"] == 0


def test_random_ops_with_segment_ids_reused_on_remount() -> None:
    _run(1, reuse_ids=True)
