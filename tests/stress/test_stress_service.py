"""Seeded randomized stress of the master service against a light shadow model.

Weighted random operations (writes, reads, removes, segment churn, client expiry, put sweeps,
time jumps) run on a :class:`MasterService` with a FakeClock. A shadow model predicts every
result code, which segments hold each object, the allocated bytes and which clients expire;
``service.check()`` runs after every operation.

Remounted segments normally get a fresh id (a new incarnation); one variant reuses the old id,
as a client remounting after expiry does, so buffers queued for release must die with the
segment they belonged to.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service import MasterService
from mooncake_py.types import ClientStatus, ReplicaStatus, ReplicateConfig, SegmentInfo

OPS = 3000
KEYS = [f"key-{i}" for i in range(50)]
CLIENTS = ["c0", "c1", "c2"]
WRITERS = ["w0", "w1", *CLIENTS]
ALIGN = 64
TTL_S = 12.0
LEASE_MS = 3000
DISCARD_S = 5.0
RELEASE_S = 20.0

# (owner, name, size): c0 contributes two segments under one name.
SLOTS = [
    ("c0", "n0", 4 * 1024),
    ("c0", "n0", 64 * 1024),
    ("c1", "n1", 256 * 1024),
    ("c2", "n2", 1024 * 1024),
]

WEIGHTS = {
    "put_start": 20,
    "put_end": 14,
    "put_revoke": 3,
    "get": 12,
    "exist": 6,
    "remove": 7,
    "unmount": 2,
    "mount": 3,
    "remount": 2,
    "advance": 9,
    "reap": 3,
    "sweep": 3,
    "ping": 8,
}


def rounded(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


@dataclasses.dataclass
class Obj:
    size: int
    writer: str
    start: float
    segments: set[str]
    readable: bool = False
    lease_until: float = 0.0


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

    def __init__(self, seed: int, reuse_ids: bool) -> None:
        self.rng = random.Random(seed)
        self.reuse_ids = reuse_ids
        self.clock = FakeClock()
        config = MasterConfig(
            client_ttl=TTL_S,
            default_kv_lease_ttl=LEASE_MS,
            put_start_discard_timeout_sec=DISCARD_S,
            put_start_release_timeout_sec=RELEASE_S,
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
            ["preempted", "quarantined", "reaped", "swept_writes", "released_buffers"], 0
        )
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

    # -- operations --------------------------------------------------------------------------

    def op_put_start(self) -> None:
        key = self.rng.choice(KEYS)
        writer = self.rng.choice(WRITERS)
        size = self.rng.choice([1, 63, 64, 65, 1000, 4096, 20_000, 100_000, 300_000, 2_000_000])
        size = max(1, size + self.rng.randint(-16, 16))
        replica_num = self.rng.choice([1, 1, 1, 2, 3])
        preferred = self.rng.choice(["", "", "", "n0", "n1", "n2", "absent"])
        config = ReplicateConfig(replica_num=replica_num, preferred_segment=preferred)
        now = self.now()
        existing = self.objects.get(key)
        fits = self.names_that_fit(size)
        result = self.service.put_start(writer, "", key, size, config)
        self.record("put_start", result.code)
        if existing is not None and (existing.readable or existing.start + DISCARD_S > now):
            assert result.code == ErrorCode.OBJECT_ALREADY_EXISTS
            return
        if existing is not None:  # preempted: its buffers wait for their release time
            self.events["preempted"] += 1
            for seg_id in existing.segments:
                self.discarded.append((existing.start + RELEASE_S, seg_id, rounded(existing.size)))
            del self.objects[key]
        if not fits:
            assert result.code == ErrorCode.NO_AVAILABLE_HANDLE
            return
        assert result.code == ErrorCode.OK
        # Placement walks every name, so the count is exactly what fits (best effort).
        assert len(result.replicas) == min(replica_num, len(fits))
        segs = [r.segment_id for r in result.replicas]
        assert len({r.segment_name for r in result.replicas}) == len(segs)
        assert set(segs) <= self.mounted_ids()
        if preferred in fits:
            assert preferred in {r.segment_name for r in result.replicas}
        for replica in result.replicas:
            assert replica.status == ReplicaStatus.PROCESSING
            assert replica.size == size
        self.objects[key] = Obj(size, writer, now, set(segs))

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
            obj.readable = True
            obj.lease_until = max(obj.lease_until, self.now())

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
            obj.lease_until = max(obj.lease_until, self.now() + LEASE_MS / 1000)

    def op_exist(self) -> None:
        keys = list(dict.fromkeys(self._pick_key() for _ in range(self.rng.choice([1, 1, 5]))))
        answers = self.service.batch_exist_key("", keys)
        for key, answer in zip(keys, answers, strict=True):
            obj = self.objects.get(key)
            readable = obj is not None and obj.readable
            assert answer == int(readable)
            if obj is not None and readable:
                obj.lease_until = max(obj.lease_until, self.now() + LEASE_MS / 1000)

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
            if self.now() < obj.lease_until:  # forced: leased bytes wait for the lease to end
                self.events["quarantined"] += 1
                for seg_id in obj.segments:
                    self.discarded.append((obj.lease_until, seg_id, rounded(obj.size)))
            del self.objects[key]
            assert self.service.exist_key("", key) == 0

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

    def run(self, ops: int) -> None:
        names = list(WEIGHTS)
        weights = [WEIGHTS[n] for n in names]
        for step in range(ops):
            op = self.rng.choices(names, weights)[0]
            self.counts[op] += 1
            try:
                getattr(self, f"op_{op}")()
                self.verify()
            except AssertionError as exc:
                raise AssertionError(f"step {step} ({op}) at t={self.now():.3f}: {exc}") from exc


def _run(seed: int, reuse_ids: bool) -> Model:
    model = Model(seed, reuse_ids)
    model.run(OPS)
    return model


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_ops_match_shadow(seed: int) -> None:
    model = _run(seed, reuse_ids=False)
    # The run must have exercised the interesting paths, not just errors.
    codes = model.codes
    assert codes.get(("put_start", ErrorCode.OK), 0) > 100
    assert codes.get(("put_start", ErrorCode.OBJECT_ALREADY_EXISTS), 0) > 10
    assert codes.get(("put_start", ErrorCode.NO_AVAILABLE_HANDLE), 0) > 0
    assert codes.get(("put_end", ErrorCode.OK), 0) > 50
    assert codes.get(("get", ErrorCode.OK), 0) > 50
    assert codes.get(("remove", ErrorCode.OK), 0) > 10
    assert codes.get(("remove", ErrorCode.OBJECT_HAS_LEASE), 0) > 0
    assert all(model.counts[op] > 0 for op in WEIGHTS)
    assert all(count > 0 for count in model.events.values()), model.events


def test_random_ops_with_segment_ids_reused_on_remount() -> None:
    _run(1, reuse_ids=True)
