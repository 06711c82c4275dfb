"""Seeded randomized stress of the master service against a light shadow model.

Weighted random operations (puts with pins and groups, upserts, reads, removes, eviction
passes, segment churn, client expiry, put sweeps, time jumps) run on a :class:`MasterService`
with a FakeClock. A shadow model predicts every result code, which segments hold each object,
each object's pins, group and lease, the allocated bytes, the eviction candidates and which
clients expire; ``service.check()`` runs after every operation.

Eviction is the one thing the model does not predict exactly: which victims a pass or a full
write picks depends on the policy's access order. So after each operation the model reconciles:
every object the service dropped must have been evictable when the operation began (readable,
not being written, no live lease anywhere in its group, not hard pinned; soft pinned only when
soft-pinned eviction is allowed and every ordinary candidate went first), groups go whole, only
operations that may evict do, a write evicts only objects with a replica in a segment large
enough for its value (and fails only once every such candidate is gone), and the eviction
counters move by exactly what disappeared. Whether a pass runs, its target and lower bound,
and when a write must fail, are predicted.

Remounted segments normally get a fresh id (a new incarnation); one variant reuses the old id,
as a client remounting after expiry does, so buffers queued for release must die with the
segment they belonged to.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.types import (
    ClientStatus,
    PutStartResult,
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
ALIGN = 64
TTL_S = 12.0
LEASE_MS = 3000
DISCARD_S = 5.0
RELEASE_S = 20.0
SOFT_PIN_DEFAULT_MS = 8000
SOFT_PIN_MAX_MS = 60_000
WATERMARK = 0.8
EVICTION_RATIO = 0.1
# Values; big ones keep memory full (2 MB fits no segment at all).
SIZES = [1, 63, 64, 65, 1000, 4096, 20_000, 100_000, 100_000, 300_000, 300_000, 2_000_000]

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


def rounded(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


@dataclasses.dataclass
class Obj:
    size: int
    writer: str
    start: float
    segments: set[str]
    readable: bool = False  # every replica COMPLETE; otherwise every one is PROCESSING
    lease_until: float = 0.0
    hard: bool = False
    soft_deadline: float = 0.0
    pending: tuple[SoftPinAction, int] | None = None
    group: str = ""
    in_policy: bool = False  # an eviction candidate (stays one while an upsert is in flight)


@dataclasses.dataclass
class Snapshot:
    """What the model knew when an operation began."""

    now: float
    verdicts: dict[str, str]  # candidate key -> EVICT / PINNED / SKIP
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
            shm_path="",
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
        # Buffers freed late (preempted writes, force-removed leased objects) as
        # (release_at, segment id, bytes): ``discarded`` on mounted segments, ``orphaned`` on
        # segments unmounted since. Whether the service still tracks orphaned entries is its
        # own business, so they only loosen the bounds on counts and never hold memory.
        self.discarded: list[tuple[float, str, int]] = []
        self.orphaned: list[tuple[float, str, int]] = []
        self.counts: dict[str, int] = dict.fromkeys(WEIGHTS, 0)
        self.codes: dict[tuple[str, int], int] = {}
        self.events: dict[str, int] = dict.fromkeys(
            [
                "preempted",
                "quarantined",
                "reaped",
                "swept_writes",
                "released_buffers",
                "sync_evicted",
                "sync_failed",
                "passes",
                "pass_evicted",
                "upsert_absent",
                "upsert_same_size",
                "upsert_new_size",
                "upsert_busy",
                "upsert_group_change",
                "upsert_preempted",
                "group_evicted",
            ],
            0,
        )
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
        self.orphaned += [d for d in self.discarded if d[1] == seg_id]
        self.discarded = [d for d in self.discarded if d[1] != seg_id]
        for key in list(self.objects):
            obj = self.objects[key]
            obj.segments.discard(seg_id)
            if not obj.segments:
                del self.objects[key]

    def expected_allocated(self) -> int:
        live = sum(rounded(o.size) * len(o.segments) for o in self.objects.values())
        return live + sum(b for _, _, b in self.discarded)

    def capacity(self) -> int:
        return sum(s.size for s in self.slots if s.mounted)

    def largest_segment(self) -> int:
        return max((s.size for s in self.slots if s.mounted), default=0)

    def names_that_fit(self, size: int) -> set[str]:
        names = set()
        for slot in self.slots:
            mounted = self.service.segment_of(slot.seg_id) if slot.mounted else None
            if mounted is not None and mounted.allocator.largest_free_block >= rounded(size):
                names.add(slot.name)
        return names

    def record(self, op: str, code: int) -> None:
        self.codes[(op, int(code))] = self.codes.get((op, int(code)), 0) + 1

    def _mount(self, slot: Slot) -> None:
        assert self.service.mount_segment(slot.owner, slot.info()) == ErrorCode.OK
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

    def lease(self, key: str) -> None:
        """A read of ``key``: it and every member of its group get a read lease."""
        obj = self.objects[key]
        until = self.now() + LEASE_MS / 1000
        for member in self.group_of(obj.group) if obj.group else [key]:
            other = self.objects[member]
            other.lease_until = max(other.lease_until, until)

    def release(self, obj: Obj) -> None:
        """The object's memory is given back: at once, or when a live read lease ends."""
        if self.now() < obj.lease_until:
            self.events["quarantined"] += 1
            for seg_id in obj.segments:
                self.discarded.append((obj.lease_until, seg_id, rounded(obj.size)))

    # -- eviction reconciliation -------------------------------------------------------------

    def snapshot(self, stats: dict[str, int] | None = None) -> Snapshot:
        """Eviction verdicts as the service would give them now; ``stats`` taken now unless
        given (a write that preempted a stuck one re-judges after dropping it, since that can
        free its group)."""
        now = self.now()
        verdicts: dict[str, str] = {}
        members: dict[str, set[str]] = {}
        for key, obj in self.objects.items():
            group = self.group_of(obj.group) if obj.group else [key]
            members[key] = {k for k in group if not self.objects[k].hard}
            if not obj.in_policy:
                continue
            assert not obj.hard
            mates = [self.objects[k] for k in members[key]]
            if any(not m.readable or now < m.lease_until for m in mates):
                verdicts[key] = SKIP
            elif any(m.soft_deadline > now for m in mates):
                verdicts[key] = PINNED
            else:
                verdicts[key] = EVICT
        return Snapshot(
            now=now,
            verdicts=verdicts,
            members=members,
            own_pin={k: o.soft_deadline > now for k, o in self.objects.items()},
            bytes={k: o.size * len(o.segments) for k, o in self.objects.items()},
            segments={k: frozenset(o.segments) for k, o in self.objects.items()},
            stats=self.service.stats() if stats is None else stats,
        )

    def rejudge(self) -> None:
        """Re-take the verdicts after the model dropped a preempted write."""
        assert self.snap is not None
        self.snap = self.snapshot(self.snap.stats)

    def reconcile(
        self,
        alloc: str = "none",
        self_evicted: frozenset[str] = frozenset(),
        size: int = 0,
        protected: frozenset[str] = frozenset(),
    ) -> set[str]:
        """Account for objects the service evicted during this operation; returns them.

        ``alloc`` says what the operation's allocation did: ``none`` (no allocation, or it
        succeeded without evicting), ``evict_ok`` (it found no room and made some by
        evicting), ``evict_fail`` (it found no room and could not make enough), ``pass`` (a
        watermark pass). ``self_evicted`` names an upserted key that eviction took and the
        upsert re-created. ``size`` is the value a write needed room for: a write evicts only
        objects (with their groups) that have a replica in a segment large enough for it.
        ``protected`` names an object the operation itself keeps out of eviction's reach (an
        upsert's own object while it allocates the new value).
        """
        snap = self.snap
        assert snap is not None
        self.reconciled = True
        present = {k for k in KEYS if self.service.object_of("", k) is not None}
        assert present <= set(self.objects), f"unknown objects {present - set(self.objects)}"
        evicted = (set(self.objects) - present) | set(self_evicted)
        verdicts = snap.verdicts
        if evicted and self.current_op not in EVICTING_OPS:
            raise AssertionError(f"{self.current_op} dropped {sorted(evicted)}")
        for key in evicted:
            verdict = verdicts.get(key)
            assert verdict in (EVICT, PINNED), f"{key} evicted with verdict {verdict}"
            assert verdict == EVICT or self.allow_soft, f"soft-pinned {key} evicted"
            # Groups go whole (hard-pinned members stay).
            assert snap.members[key] <= evicted, f"group of {key} partly evicted"
        assert not (evicted & protected), f"protected {sorted(evicted & protected)} evicted"
        ordinary = {k for k, v in verdicts.items() if v == EVICT} - protected
        pinned = {k for k, v in verdicts.items() if v == PINNED} - protected
        if alloc in ("evict_ok", "evict_fail"):
            useful = {s.seg_id for s in self.slots if s.mounted and s.size >= size}

            def helps(key: str) -> bool:
                return any(snap.segments[m] & useful for m in snap.members[key])

            for key in evicted:
                assert helps(key), f"{key} evicted, but no member could make room"
            ordinary = {k for k in ordinary if helps(k)}
            pinned = {k for k in pinned if helps(k)}
        if evicted & pinned:
            # Soft-pinned objects go only after every ordinary candidate (that could help).
            assert ordinary <= evicted, f"soft pins evicted before {sorted(ordinary - evicted)}"
        self.soft_pinned_evicted += len(evicted & {k for k, v in verdicts.items() if v == PINNED})
        if alloc == "evict_fail":
            assert ordinary <= evicted, f"write failed while {sorted(ordinary - evicted)} remain"
            if self.allow_soft:
                assert pinned <= evicted, "write failed while soft pins could have gone"
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
        if any(self.objects[k].group for k in evicted if k in self.objects):
            self.events["group_evicted"] += 1
        for key in evicted - set(self_evicted):
            # No live lease (checked above), so the memory is free at once.
            del self.objects[key]
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
    ) -> list[str]:
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
        return segs

    def _allocation(self, result: PutStartResult, size: int, fits: set[str]) -> tuple[str, bool]:
        """(reconcile mode, succeeded) for a write that needed ``size`` bytes."""
        if fits:
            assert result.code == ErrorCode.OK
            return "none", True
        if size > self.largest_segment():  # could never fit: fails without evicting
            assert result.code == ErrorCode.NO_AVAILABLE_HANDLE
            return "none", False
        assert result.code in (ErrorCode.OK, ErrorCode.NO_AVAILABLE_HANDLE)
        ok = result.code == ErrorCode.OK
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
        if ok:
            segs = self._check_replicas(
                result, size, config.replica_num, fits, config.preferred_segment
            )
            obj = Obj(size, writer, self.now(), set(segs), pending=pin, group=group)
            obj.hard = config.with_hard_pin or bool(predecessor and predecessor.hard)
            if predecessor is not None and predecessor.soft_deadline > self.now():
                obj.soft_deadline = predecessor.soft_deadline
            self.objects[key] = obj
        self.reconcile(mode, size=size)

    def op_put_start(self) -> None:
        key = self.rng.choice(KEYS)
        writer = self.rng.choice(WRITERS)
        size = self._random_size()
        replica_num = self.rng.choice([1, 1, 1, 2, 3])
        preferred = self.rng.choice(["", "", "", "n0", "n1", "n2", "absent"])
        group = self._random_group()
        config, pin = self._random_config(replica_num, preferred, self.rng.random() < 0.06, group)
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
        if existing is not None:  # preempted: its buffers wait for their release time
            self.events["preempted"] += 1
            for seg_id in existing.segments:
                self.discarded.append((existing.start + RELEASE_S, seg_id, rounded(existing.size)))
            del self.objects[key]
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
        fits = self.names_that_fit(size)
        hard = self.rng.random() < 0.08
        config, pin = self._random_config(replica_num, "", hard, group)
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
        if existing.readable and now < existing.lease_until:
            self.events["upsert_busy"] += 1
            assert result.code == ErrorCode.OBJECT_REPLICA_BUSY
            return
        if not existing.readable:
            # An unfinished put or upsert loses at once; its writer may still be copying.
            self.events["upsert_preempted"] += 1
            for seg_id in existing.segments:
                self.discarded.append((now + RELEASE_S, seg_id, rounded(existing.size)))
            del self.objects[key]
            self.rejudge()
            self._create(key, writer, size, config, pin, existing.group, fits, result, existing)
            return
        # An admitted upsert ORs in the hard pin; a rejected one changes nothing.
        hard = existing.hard or hard
        if size == existing.size:
            # Rewritten in place: the same replicas, unreadable until the write ends.
            self.events["upsert_same_size"] += 1
            assert result.code == ErrorCode.OK
            assert {r.segment_id for r in result.replicas} == existing.segments
            assert len(result.replicas) == len(existing.segments)
            assert all(r.status == ReplicaStatus.PROCESSING for r in result.replicas)
            existing.readable, existing.writer, existing.start = False, writer, now
            existing.pending = pin
            existing.hard, existing.in_policy = hard, existing.in_policy and not hard
            self.reconcile()
            return
        mode, ok = self._allocation(result, size, fits)
        itself = frozenset([key])
        if not ok:
            self.reconcile(mode, size=size, protected=itself)
            return
        self.events["upsert_new_size"] += 1
        segs = self._check_replicas(result, size, replica_num, fits, "")
        after = self.service.object_of("", key)
        # Never evicted to make room for its own new value; the old bytes are freed at once
        # (nobody holds a lease).
        assert after is before
        existing.size, existing.segments = size, set(segs)
        existing.readable, existing.writer, existing.start = False, writer, now
        existing.pending = pin
        existing.hard, existing.in_policy = hard, existing.in_policy and not hard
        self.reconcile(mode, size=size, protected=itself)

    def op_put_end(self) -> None:
        key, writer = self._pick_write()
        code = self.service.put_end(writer, "", key)
        self.record("put_end", code)
        obj = self.objects.get(key)
        if obj is None:
            assert code == ErrorCode.OBJECT_NOT_FOUND
        elif obj.writer != writer:
            assert code == ErrorCode.ILLEGAL_CLIENT
        else:
            assert code == ErrorCode.OK
            if obj.readable:  # a retry: nothing changes
                return
            now = self.now()
            obj.readable = True
            obj.lease_until = max(obj.lease_until, now)
            obj.in_policy = not obj.hard
            if obj.pending is not None:
                action, ttl = obj.pending
                if action == SoftPinAction.ENABLE and ttl > 0:
                    obj.soft_deadline = now + ttl / 1000.0
                elif action != SoftPinAction.PRESERVE:
                    obj.soft_deadline = 0.0
            obj.pending = None

    def op_put_revoke(self) -> None:
        key, writer = self._pick_write()
        code = self.service.put_revoke(writer, "", key)
        self.record("put_revoke", code)
        obj = self.objects.get(key)
        if obj is None:
            assert code == ErrorCode.OBJECT_NOT_FOUND
        elif obj.writer != writer:
            assert code == ErrorCode.ILLEGAL_CLIENT
        elif obj.readable:
            assert code == ErrorCode.INVALID_WRITE
        else:
            assert code == ErrorCode.OK
            self.release(obj)  # a group read may have leased it while in flight
            del self.objects[key]

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
        key = self._pick_key()
        result = self.service.get_replica_list("", key)
        self.record("get", result.code)
        obj = self.objects.get(key)
        if obj is None:
            assert result.code == ErrorCode.OBJECT_NOT_FOUND
        elif not obj.readable:
            assert result.code == ErrorCode.REPLICA_IS_NOT_READY
        else:
            assert result.code == ErrorCode.OK
            assert result.size == obj.size
            assert result.lease_ttl_ms == LEASE_MS
            assert {r.segment_id for r in result.replicas} == obj.segments
            assert len(result.replicas) == len(obj.segments)
            assert all(r.status == ReplicaStatus.COMPLETE for r in result.replicas)
            self.lease(key)

    def op_exist(self) -> None:
        keys = list(dict.fromkeys(self._pick_key() for _ in range(self.rng.choice([1, 1, 5]))))
        answers = self.service.batch_exist_key("", keys)
        for key, answer in zip(keys, answers, strict=True):
            obj = self.objects.get(key)
            readable = obj is not None and obj.readable
            assert answer == int(readable)
            if readable:
                self.lease(key)

    def op_remove(self) -> None:
        key = self._pick_key()
        force = self.rng.random() < 0.3
        code = self.service.remove("", key, force=force)
        self.record("remove", code)
        obj = self.objects.get(key)
        if obj is None:
            assert code == ErrorCode.OBJECT_NOT_FOUND
        elif not obj.readable:
            assert code == ErrorCode.REPLICA_IS_NOT_READY
        elif not force and self.now() < obj.lease_until:
            assert code == ErrorCode.OBJECT_HAS_LEASE
        else:
            assert code == ErrorCode.OK
            self.release(obj)  # forced: leased bytes wait for the lease to end
            del self.objects[key]
            assert self.service.exist_key("", key) == 0

    def op_evict(self) -> None:
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
            assert work.fallback == (self.allow_soft and len(ordinary) < lower)
            if work.fallback:
                assert len(evicted) >= min(lower, len(ordinary) + len(pinned))
            else:
                assert evicted == ordinary

    def op_unmount(self) -> None:
        slot = self.rng.choice(self.slots)
        if self.rng.random() < 0.2:  # a non-owner is refused
            intruder = self.rng.choice([c for c in CLIENTS if c != slot.owner])
            code = self.service.unmount_segment(intruder, slot.seg_id)
            assert code == (ErrorCode.INVALID_PARAMS if slot.mounted else ErrorCode.OK)
            return
        assert self.service.unmount_segment(slot.owner, slot.seg_id) == ErrorCode.OK
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
        assert self.service.remount_segments(client, [s.info() for s in owned]) == ErrorCode.OK
        for slot in owned:
            slot.mounted = True
        self.touch(client)
        self.ok_clients.add(client)
        assert self.service.ping(client).client_status == ClientStatus.OK
        self.touch(client)

    def op_ping(self) -> None:
        client = self.rng.choice(CLIENTS)
        answer = self.service.ping(client)
        assert answer.code == ErrorCode.OK
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

    def op_sweep(self) -> None:
        now = self.now()
        due = [d for d in self.discarded if d[0] <= now]
        self.discarded = [d for d in self.discarded if d[0] > now]
        due_orphans = [d for d in self.orphaned if d[0] <= now]
        self.orphaned = [d for d in self.orphaned if d[0] > now]
        expected = len(due)
        self.events["released_buffers"] += len(due)
        for key in list(self.objects):
            obj = self.objects[key]
            if not obj.readable and obj.start + RELEASE_S <= now:
                expected += len(obj.segments)
                self.release(obj)  # a group read may have leased it while in flight
                del self.objects[key]
                self.events["swept_writes"] += 1
        freed = self.service.sweep_expired_puts(now)
        assert expected <= freed <= expected + len(due_orphans)

    # -- driver ------------------------------------------------------------------------------

    def verify(self) -> None:
        self.service.check()
        stats = self.service.stats()
        assert stats["objects"] == len(self.objects)
        assert stats["segments"] == sum(s.mounted for s in self.slots)
        assert stats["allocated_bytes"] == self.expected_allocated()
        discarded = len(self.discarded)
        assert discarded <= stats["discarded_buffers"] <= discarded + len(self.orphaned)
        assert stats["clients"] == len(self.deadlines)
        assert stats["active_clients"] == len(self.ok_clients)
        assert stats["eviction_candidates"] == sum(o.in_policy for o in self.objects.values())
        for name, total in self.totals.items():
            assert stats[name] == total, name
        for key, obj in self.objects.items():
            meta = self.service.object_of("", key)
            assert meta is not None, key
            assert {r.segment_id for r in meta.replicas} == obj.segments, key
            assert meta.size == obj.size and meta.client_id == obj.writer, key
            assert meta.is_readable() == obj.readable, key
            assert meta.is_writing() != obj.readable, key
            assert meta.hard_pinned == obj.hard, key
            assert meta.soft_pin_deadline == obj.soft_deadline, key
            assert meta.lease_timeout == obj.lease_until, key
            assert meta.group_id == obj.group, key

    def run(self, ops: int) -> None:
        names = list(WEIGHTS)
        weights = [WEIGHTS[n] for n in names]
        for step in range(ops):
            op = self.rng.choices(names, weights)[0]
            self.counts[op] += 1
            self.current_op = op
            try:
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
    assert codes.get(("put_start", ErrorCode.OK), 0) > 100
    assert codes.get(("put_start", ErrorCode.OBJECT_ALREADY_EXISTS), 0) > 10
    assert codes.get(("put_start", ErrorCode.NO_AVAILABLE_HANDLE), 0) > 0
    assert codes.get(("put_start", ErrorCode.INVALID_PARAMS), 0) > 0
    assert codes.get(("put_end", ErrorCode.OK), 0) > 50
    assert codes.get(("get", ErrorCode.OK), 0) > 50
    assert codes.get(("remove", ErrorCode.OK), 0) > 10
    assert codes.get(("remove", ErrorCode.OBJECT_HAS_LEASE), 0) > 0
    assert codes.get(("upsert", ErrorCode.OBJECT_REPLICA_BUSY), 0) > 0
    assert all(model.counts[op] > 0 for op in WEIGHTS)
    assert all(count > 0 for count in model.events.values()), model.events
    stats = model.service.stats()
    assert stats["evicted_objects"] > 30
    if allow_soft:
        assert model.soft_pinned_evicted > 0 and stats["evicted_soft_pinned"] > 0
    else:
        assert model.soft_pinned_evicted == 0 and stats["evicted_soft_pinned"] == 0


def test_random_ops_with_segment_ids_reused_on_remount() -> None:
    _run(1, reuse_ids=True)
