"""The replicated log's rows against the live state, seeded: after any mix of calls, the image
the records build equals a full capture of the leader, and a master restored from it holds
the same state (and passes ``check()``).

This is what makes "no acknowledged write lost" checkable: a mutation point that forgot to
mark its row in the journal shows up here as an image that differs from the leader's.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from mooncake_py._wire import ha_records
from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.ha import snapshot as snapshot_module
from mooncake_py.master.ha.journal import Journal
from mooncake_py.master.ha.restore import restore_into
from mooncake_py.master.ha.rows import RowCapture, RowImage, TimeBase
from mooncake_py.master.ha.snapshot import capture_sliced, decode_image, encode_image
from mooncake_py.master.service.facade import MasterService
from mooncake_py.types import DiskReplicaEntry, ReplicateConfig, SegmentInfo, SoftPinAction

T0 = 1000.0
WALL0 = 1_800_000_000_000
KIB = 1 << 10
TENANTS = ("", "t1")
CLIENTS = ("c1", "c2", "c3")


class Leader:
    """A service whose every change goes through the journal into records and an image."""

    def __init__(self, seed: int, **overrides: object) -> None:
        self.clock = FakeClock(T0)
        self.config = MasterConfig(enable_multi_tenants=True, **overrides)  # type: ignore[arg-type]
        self.service = MasterService(self.config, clock=self.clock, rng=random.Random(seed))
        self.state = self.service.context.state
        self.journal = Journal()
        self.state.attach_journal(self.journal)
        self.capture = RowCapture(self.state, self.times)
        self.image = RowImage()
        self.records = 0

    def times(self) -> TimeBase:
        return TimeBase(self.clock(), WALL0 + round((self.clock() - T0) * 1000))

    def flush(self) -> None:
        """One record of everything dirty, through its wire form, into the image."""
        with self.service.context.lock:
            record = self.capture.record(self.image.seq + 1, self.journal.take())
        self.image.apply(ha_records.decode_record(ha_records.encode_record(record)))
        self.records += 1


def full_image(service: MasterService, times: Callable[[], TimeBase]) -> RowImage:
    """A capture of everything ``service`` holds, driven to the end."""
    image = None
    for step in capture_sliced(service.context.state, service.context.lock, times, lambda: 0):
        image = step if step is not None else image
    assert image is not None
    return image


def assert_same(a: RowImage, b: RowImage) -> None:
    assert a.objects == b.objects
    assert a.memberships == b.memberships
    assert a.sessions == b.sessions
    assert a.segments == b.segments
    assert a.clients == b.clients
    assert a.ranges == b.ranges


def mount(service: MasterService, client: str, index: int, size: int = 64 * KIB) -> str:
    segment_id = f"seg-{client}-{index}"
    info = SegmentInfo(
        id=segment_id,
        name=f"host-{client}",
        base=0x10000,
        size=size,
        te_endpoint="127.0.0.1:1",
        capability_key=bytes(range(32)),
    )
    assert service.mount_segment(client, info) == ErrorCode.OK
    return segment_id


def mount_disk(service: MasterService, client: str, size: int = 20 * KIB) -> str:
    segment_id = f"disk-{client}"
    info = SegmentInfo(
        id=segment_id,
        name=f"host-{client}",
        base=0,
        size=size,
        te_endpoint="127.0.0.1:1",
        capability_key=bytes(range(32)),
        disk=True,
    )
    assert service.mount_segment(client, info) == ErrorCode.OK
    return segment_id


def run_disk_tasks(service: MasterService, rng: random.Random, fail: float = 0.0) -> None:
    """Every owner fetches its disk tasks and reports them done (or, with probability
    ``fail``, failed), as :class:`~mooncake_py.client.disk_tier_host.DiskTierHost` does."""
    for client in CLIENTS:
        batch = service.disk.fetch_disk_tasks(client, 64)
        ids = [t.task_id for t in batch.tasks]
        codes = [-1103 if rng.random() < fail else 0 for _ in ids]
        assert service.disk.finish_disk_tasks(client, ids, codes) == [0] * len(ids)


def random_calls(leader: Leader, rng: random.Random, steps: int, disk: bool = False) -> None:
    """A mixed workload over every path that changes replicated rows (with ``disk``, also
    the disk tiers': spills, promotions, re-registered files, disk evictions)."""
    service = leader.service
    segments = [mount(service, c, 0, size=32 * KIB) for c in CLIENTS]
    for client, segment_id in zip(CLIENTS, segments, strict=True):
        mounted = service.segment_of(segment_id)
        assert mounted is not None
        infos = [mounted.info]
        if disk:
            tier = service.segment_of(mount_disk(service, client))
            assert tier is not None
            infos.append(tier.info)
        # A remount puts the client in good standing (a row of its own).
        assert service.remount_segments(client, infos) == ErrorCode.OK
    sessions = [f"conv-{i}" for i in range(6)]
    writing: list[tuple[str, str, str, int]] = []
    for step in range(steps):
        tenant = rng.choice(TENANTS)
        client = rng.choice(CLIENTS)
        key = f"k{rng.randrange(40)}"
        roll = rng.random()
        if roll < 0.35:
            tags = [rng.sample(sessions, rng.randrange(0, 3))] if rng.random() < 0.5 else None
            pin = rng.random() < 0.2
            pinning = {"soft_pin_action": SoftPinAction.ENABLE, "soft_pin_ttl_ms": 5000}
            config = ReplicateConfig(
                kv_sessions=tags, with_hard_pin=rng.random() < 0.05, **(pinning if pin else {})
            )
            start = (service.upsert_start if rng.random() < 0.3 else service.put_start)(
                client,
                tenant,
                key,
                rng.choice((100, 4 * KIB, 9 * KIB)),
                config,
                rng.choice((0, rng.randrange(1, 1 << 62))),
            )
            if start.code == ErrorCode.OK:
                if rng.random() < 0.8:
                    service.put_end(client, tenant, key, start.write_id)
                else:
                    writing.append((client, tenant, key, start.write_id))
        elif roll < 0.45 and writing:
            client, tenant, key, write_id = writing.pop(rng.randrange(len(writing)))
            (service.put_end if rng.random() < 0.5 else service.put_revoke)(
                client, tenant, key, write_id
            )
        elif roll < 0.50:
            service.remove(tenant, key, force=rng.random() < 0.5)
        elif roll < 0.65:
            session_id = rng.choice(sessions)
            keys = [f"k{rng.randrange(40)}" for _ in range(3)]
            service.sessions.attach_kv_session(tenant, session_id, keys)
        elif roll < 0.72:
            service.sessions.set_kv_session_pin(tenant, rng.choice(sessions), rng.random() < 0.6)
        elif roll < 0.74:
            service.sessions.close_kv_session(tenant, rng.choice(sessions))
        elif roll < 0.76:
            service.releases.release_kv_session(tenant, rng.choice(sessions), rng.random() < 0.5)
        elif roll < 0.765:
            service.releases.release_kv_cache(tenant, keep_pinned=rng.random() < 0.5)
        elif roll < 0.82 and segments:
            victim = segments.pop(rng.randrange(len(segments)))
            owner = victim.split("-")[1]
            service.unmount_segment(owner, victim)
            segments.append(mount(service, owner, step + 1, size=32 * KIB))
        elif roll < 0.86:
            leader.clock.advance(rng.choice((0.5, 2.0, 7.0)))
            service.sweep_expired_puts(leader.clock())
        elif roll < 0.89:
            service.evict_once(leader.clock())
        elif roll < 0.91:
            service.bind_client(f"bound-{rng.randrange(3)}", tenant or "default")
        elif roll < 0.905:
            service.remove_all(tenant, force=True)
        if rng.random() < 0.12:
            # Plain batches: the flat start (placement in runs, all or none: the segments are
            # small), the batch end's run loop, batch lookups and existence checks.
            keys = [f"k{rng.randrange(40)}" for _ in range(rng.randint(1, 6))]
            sizes = [rng.choice((100, 4 * KIB, 9 * KIB)) for _ in keys]
            attempt = rng.choice((0, rng.randrange(1, 1 << 62)))
            starts = service.batch_put_start(
                client, tenant, keys, sizes, ReplicateConfig(), attempt
            )
            started = [
                (k, s.write_id) for k, s in zip(keys, starts, strict=True) if s.code == ErrorCode.OK
            ]
            ending = [item for item in started if rng.random() < 0.8]
            writing += [(client, tenant, k, w) for k, w in started if (k, w) not in ending]
            if ending:
                service.batch_put_end(
                    client, tenant, [k for k, _ in ending], [w for _, w in ending]
                )
            service.reads.batch_get_replica_list(tenant, keys, client)
            service.reads.batch_exist_key(tenant, keys, client)
        if disk and rng.random() < 0.25:
            run_disk_tasks(service, rng, fail=0.1)
        if disk and rng.random() < 0.1:
            service.reads.batch_get_replica_list(tenant, [f"k{rng.randrange(40)}"], client)
        if disk and rng.random() < 0.03:
            offset = rng.randrange(1 << 40)
            service.disk.register_disk_replicas(
                client,
                f"disk-{client}",
                [DiskReplicaEntry(tenant, f"k{rng.randrange(60)}", offset, 700)],
            )
        if rng.random() < 0.3:
            leader.flush()
    if disk:
        run_disk_tasks(service, rng)
        run_disk_tasks(service, rng)  # promotions the last spills' reads started
    leader.flush()


@pytest.mark.parametrize(
    ("seed", "disk"), [(s, False) for s in range(12)] + [(s, True) for s in range(8)]
)
def test_records_rebuild_the_leader_and_a_restore_serves_it(seed: int, disk: bool) -> None:
    leader = Leader(seed)
    random_calls(leader, random.Random(seed), 400, disk)
    leader.service.check()
    truth = full_image(leader.service, leader.times)
    assert_same(leader.image, truth)

    # A restore from the records holds the same state, and passes the invariant check.
    clock = FakeClock(leader.clock())
    restored = MasterService(leader.config, clock=clock, rng=random.Random(seed))
    with restored.context.lock:
        report = restore_into(restored.context.state, leader.image, leader.times(), 30.0)
    restored.check()
    assert report.objects == len(leader.image.objects)
    again = full_image(restored, leader.times)
    assert again.objects == truth.objects
    assert again.memberships == truth.memberships
    assert again.sessions == truth.sessions
    assert again.segments == truth.segments
    assert again.ranges == truth.ranges
    assert restored.stats() == {**restored.stats(), "objects": len(truth.objects)}
    before = leader.service.stats()
    after = restored.stats()
    for figure in ("objects", "allocated_bytes", "capacity_bytes", "kv_sessions"):
        if figure in before:
            assert after[figure] == before[figure], figure
    # Ids a client may hold are never handed out again.
    assert restored.context.state.peek_next_ids() >= leader.state.peek_next_ids()


@pytest.mark.parametrize("seed", range(4))
def test_a_snapshot_round_trips_through_parquet(seed: int) -> None:
    leader = Leader(seed)
    random_calls(leader, random.Random(seed), 300)
    truth = full_image(leader.service, leader.times)
    truth.seq = 17
    decoded = decode_image(encode_image(truth))
    assert decoded.seq == 17
    assert_same(decoded, truth)
    assert decoded.next_write_id == truth.next_write_id


def test_a_missed_mark_is_caught() -> None:
    """The comparison above can fail: a change made behind the journal's back shows."""
    leader = Leader(0)
    mount(leader.service, "c1", 0)
    result = leader.service.put_start("c1", "", "k", 100, ReplicateConfig())
    leader.service.put_end("c1", "", "k", result.write_id)
    leader.flush()
    meta = leader.service.object_of("", "k")
    assert meta is not None
    meta.hard_pinned = True  # no mutation point saw this
    leader.flush()
    with pytest.raises(AssertionError):
        assert_same(leader.image, full_image(leader.service, leader.times))


def test_orphan_ranges_are_held_then_freed() -> None:
    """A range the old leader held for no object (a reader's, a preempted writer's) is not
    reused at once by the restored master; it goes back after the quarantine."""
    leader = Leader(0)
    mount(leader.service, "c1", 0, size=16 * KIB)
    first = leader.service.put_start("c1", "", "k", 4 * KIB, ReplicateConfig())
    assert leader.service.put_end("c1", "", "k", first.write_id) == ErrorCode.OK
    # A reader is copying when the object is removed: its range stays held for the reader.
    assert leader.service.reads.get_replica_list("", "k", "c2").code == ErrorCode.OK
    assert leader.service.remove("", "k", force=True) == ErrorCode.OK
    assert leader.service.stats()["allocated_bytes"] > 0
    leader.flush()
    clock = FakeClock(leader.clock())
    restored = MasterService(leader.config, clock=clock, rng=random.Random(0))
    restored.context.state.wall_ms = lambda: WALL0 + round((clock() - T0) * 1000)
    with restored.context.lock:
        report = restore_into(restored.context.state, leader.image, leader.times(), 30.0)
    assert report.quarantined == 1
    held = restored.stats()["allocated_bytes"]
    assert held == leader.service.stats()["allocated_bytes"]
    # Within the quarantine, a range freed by the new master is held too.
    mount(restored, "c2", 1, size=16 * KIB)
    again = restored.put_start("c2", "", "k2", 4 * KIB, ReplicateConfig())
    assert restored.put_end("c2", "", "k2", again.write_id) == ErrorCode.OK
    assert restored.remove("", "k2", force=True) == ErrorCode.OK
    assert restored.stats()["allocated_bytes"] == held + 4 * KIB
    restored.check()
    clock.advance(31.0)
    restored.sweep_expired_puts(clock())
    assert restored.stats()["allocated_bytes"] == 0
    restored.check()
    # After it, frees are immediate again.
    again = restored.put_start("c2", "", "k3", 4 * KIB, ReplicateConfig())
    assert restored.put_end("c2", "", "k3", again.write_id) == ErrorCode.OK
    assert restored.remove("", "k3", force=True) == ErrorCode.OK
    assert restored.stats()["allocated_bytes"] == 0


def restored_from(leader: Leader) -> MasterService:
    clock = FakeClock(leader.clock())
    restored = MasterService(leader.config, clock=clock, rng=random.Random(0))
    with restored.context.lock:
        restore_into(restored.context.state, leader.image, leader.times(), 30.0)
    restored.check()
    return restored


def test_a_segment_withdrawn_and_mounted_again_in_one_flush_restores() -> None:
    """An owner that expired and remounted under the same id between two records: the old
    mount's ranges go with it (a restore used to find them overlapping the new mount's)."""
    leader = Leader(0)
    segment_id = mount(leader.service, "c1", 0, size=32 * KIB)
    for i in range(3):
        start = leader.service.put_start("c1", "", f"k{i}", 4 * KIB, ReplicateConfig())
        leader.service.put_end("c1", "", f"k{i}", start.write_id)
    leader.flush()
    old = leader.service.put_start("c1", "", "late", 8 * KIB, ReplicateConfig())
    assert old.code == ErrorCode.OK
    assert leader.service.unmount_segment("c1", segment_id) == ErrorCode.OK
    mount(leader.service, "c1", 0, size=16 * KIB)  # the same id, smaller
    fresh = leader.service.put_start("c1", "", "new", 4 * KIB, ReplicateConfig())
    leader.service.put_end("c1", "", "new", fresh.write_id)
    leader.flush()
    assert_same(leader.image, full_image(leader.service, leader.times))
    restored = restored_from(leader)
    assert restored.stats()["allocated_bytes"] == leader.service.stats()["allocated_bytes"]


def test_an_object_in_many_sessions_costs_small_records() -> None:
    """Memberships travel one by one: an object in 300 sessions with 4 KiB ids makes no
    record over the store's limit, and a change to one of them logs that one only."""
    from mooncake_py.master.ha.log_store import MAX_RECORD_BYTES

    leader = Leader(0, kv_session_max_per_object=1000)
    mount(leader.service, "c1", 0)
    start = leader.service.put_start("c1", "", "k", 100, ReplicateConfig())
    leader.service.put_end("c1", "", "k", start.write_id)
    ids = [f"{i:04d}" + "x" * 4092 for i in range(300)]
    for session_id in ids:
        assert leader.service.sessions.attach_kv_session("", session_id, ["k"]) == [0]
    with leader.service.context.lock:
        parts = list(leader.capture.records(leader.journal.take(), 2048))
    from mooncake_py.master.ha.replicator import _split

    pieces = [piece for part in parts for piece in _split(part)]
    assert max(piece.ByteSize() for piece in pieces) <= MAX_RECORD_BYTES
    for number, piece in enumerate(pieces, leader.image.seq + 1):
        piece.seq = number
        leader.image.apply(piece)
    assert_same(leader.image, full_image(leader.service, leader.times))
    leader.service.sessions.attach_kv_session("", "one-more", ["k"])
    with leader.service.context.lock:
        record = leader.capture.record(leader.image.seq + 1, leader.journal.take())
    assert record.ByteSize() < 4096
    restored_from(leader)


def test_a_record_never_names_a_replica_whose_range_it_lacks() -> None:
    """Rows captured in slices: an object re-put between two slices (its new range belongs
    to the next flush) is logged with its new range, so a restore from the first flush alone
    never hands that range out again."""
    leader = Leader(0)
    mount(leader.service, "c1", 0, size=1 << 20)
    for i in range(8):
        start = leader.service.put_start("c1", "", f"k{i}", 4 * KIB, ReplicateConfig())
        leader.service.put_end("c1", "", f"k{i}", start.write_id)
    leader.flush()
    for i in range(8):
        leader.service.remove("", f"k{i}", force=True)
        start = leader.service.put_start("c1", "", f"k{i}", 4 * KIB, ReplicateConfig())
        leader.service.put_end("c1", "", f"k{i}", start.write_id)
    with leader.service.context.lock:
        parts = leader.capture.records(leader.journal.take(), 2)
        first = [next(parts)]
    # Between two slices: every object is re-put into a range of the next flush.
    for i in range(8):
        leader.service.remove("", f"k{i}", force=True)
        start = leader.service.upsert_start("c1", "", f"k{i}", 8 * KIB, ReplicateConfig())
        leader.service.put_end("c1", "", f"k{i}", start.write_id)
    with leader.service.context.lock:
        first.extend(parts)
    for number, part in enumerate(first, leader.image.seq + 1):
        part.seq = number
        leader.image.apply(part)
    restored = restored_from(leader)  # the next flush is lost
    # Every restored replica's range is held: new writes get other ranges.
    taken = {
        (r.segment_id, r.offset) for row in leader.image.objects.values() for r in row.replicas
    }
    for i in range(8):
        start = restored.put_start("c1", "", f"new{i}", 4 * KIB, ReplicateConfig())
        assert start.code == ErrorCode.OK
        meta = restored.object_of("", f"new{i}")
        assert meta is not None
        assert not {(r.segment_id, r.offset) for r in meta.replicas} & taken


def test_a_split_keeps_every_field_of_a_record() -> None:
    """Every repeated field of a record survives a split (a field left out is lost rows)."""
    from mooncake_py._wire import ha_records
    from mooncake_py.master.ha.replicator import _SPLIT_FIELDS, _split

    repeated = {
        f.name
        for f in ha_records.LogRecord.DESCRIPTOR.fields
        if f.is_repeated and f.name != "kv_cache_released_tenants"
    }
    assert set(_SPLIT_FIELDS) == repeated
    record = ha_records.LogRecord(seq=5)
    big = "x" * 4000
    for i in range(600):
        record.memberships.add(tenant="t", key=f"k{i}", session_id=big, present=True)
        record.unmounted_segments.append(f"s{i}-{big}")
    parts = _split(record)
    assert len(parts) > 1
    merged = ha_records.LogRecord()
    for part in parts:
        merged.MergeFrom(part)
    assert list(merged.memberships) == list(record.memberships)
    assert list(merged.unmounted_segments) == list(record.unmounted_segments)


@pytest.mark.parametrize("seed", range(30))
def test_uncovered_ranges_are_exactly_what_no_claim_holds(seed: int) -> None:
    """The orphans a restore holds: disjoint from the kept claims and from each other, and
    together with them covering every byte the old leader held (within the segment)."""
    from mooncake_py.master.ha.restore import _uncovered, _without_overlaps

    rng = random.Random(seed)
    capacity = 64 * 64
    ranges = {64 * rng.randrange(64): 64 * rng.randrange(1, 8) for _ in range(rng.randrange(12))}
    claims = sorted((64 * rng.randrange(64), 64 * rng.randrange(1, 6), owner) for owner in range(8))
    kept = _without_overlaps(claims, capacity)
    taken = [(o, n) for o, n, _ in kept]
    pieces = _uncovered(ranges, taken, capacity)

    def cells(intervals: list[tuple[int, int]]) -> list[int]:
        return [c for o, n in intervals for c in range(o // 64, (o + n) // 64)]

    kept_cells, piece_cells = cells(taken), cells(pieces)
    assert len(set(kept_cells)) == len(kept_cells)  # claims kept do not overlap
    assert len(set(piece_cells)) == len(piece_cells)
    assert not set(kept_cells) & set(piece_cells)
    held = {c for c in cells(list(ranges.items())) if c < capacity // 64}
    assert held <= set(kept_cells) | set(piece_cells)
    assert all(o + n <= capacity for o, n in taken + pieces)


def test_frees_after_a_restore_are_held_only_for_the_read_horizon() -> None:
    """Ranges the old leader held for nobody wait out the whole quarantine, but a range the
    restored master frees waits only as long as an unknown reader may copy from it, then is
    reusable: memory under pressure comes back after a failover."""
    leader = Leader(0)
    mount(leader.service, "c1", 0, size=16 * KIB)
    first = leader.service.put_start("c1", "", "k", 4 * KIB, ReplicateConfig())
    assert leader.service.put_end("c1", "", "k", first.write_id) == ErrorCode.OK
    leader.flush()
    clock = FakeClock(leader.clock())
    restored = MasterService(leader.config, clock=clock, rng=random.Random(0))
    restored.context.state.wall_ms = lambda: WALL0 + round((clock() - T0) * 1000)
    with restored.context.lock:
        restore_into(restored.context.state, leader.image, leader.times(), 600.0, 10.0)
    assert restored.remove("", "k", force=True) == ErrorCode.OK
    assert restored.stats()["allocated_bytes"] == 4 * KIB  # held for readers of the old leader
    clock.advance(11.0)
    restored.sweep_expired_puts(clock())
    assert restored.stats()["allocated_bytes"] == 0
    again = restored.put_start("c1", "", "k2", 16 * KIB, ReplicateConfig())
    assert again.code == ErrorCode.OK  # the whole segment is reusable
    restored.check()


def test_a_restored_disk_tier_never_hands_an_offset_out_again() -> None:
    leader = Leader(3)
    service = leader.service
    mount(service, "c1", 0)
    mount_disk(service, "c1")
    disk = service.disk
    entries = [DiskReplicaEntry("", f"f{i}", i * 1000, 1000) for i in range(3)]
    assert disk.register_disk_replicas("c1", "disk-c1", entries) == [0, 0, 0]
    service.remove("", "f2", force=True)  # the highest range is freed before the record
    leader.flush()
    restored = restored_from(leader)
    tier = restored.segment_of("disk-c1")
    assert tier is not None
    assert tier.allocator.allocate(10) == 3000  # past every offset the old leader handed out


def test_a_file_to_delete_is_still_to_delete_after_a_restore() -> None:
    leader = Leader(5)
    service = leader.service
    mount(service, "c1", 0)
    mount_disk(service, "c1")
    entry = DiskReplicaEntry("", "gone", 0, 1000)
    assert service.disk.register_disk_replicas("c1", "disk-c1", [entry]) == [0]
    assert service.remove("", "gone", force=True) == ErrorCode.OK  # its owner not told yet
    leader.flush()
    restored = restored_from(leader)
    # The restored master neither lets the file be registered again nor forgets to delete it.
    assert restored.disk.register_disk_replicas("c1", "disk-c1", [entry]) != [0]
    assert restored.disk.fetch_disk_tasks("c1", 0).deletes == (("disk-c1", (0,)),)
    restored.check()
    assert restored.stats()["disk_used_bytes"] == 0


def test_a_recorded_range_larger_than_its_replica_restores_the_replica_indexed() -> None:
    """An image whose range for a replica is larger than the replica's rounded size (an odd
    or damaged image): the replica holds its rounded size and stays in its segment's index
    (so withdrawing the segment still finds it); the rest of the range is an orphan."""
    leader = Leader(0)
    segment = mount(leader.service, "c1", 0, size=64 * KIB)
    start = leader.service.put_start("c1", "", "k", 4 * KIB, ReplicateConfig())
    assert leader.service.put_end("c1", "", "k", start.write_id) == ErrorCode.OK
    leader.flush()
    ((_, row),) = leader.image.objects.items()
    (replica,) = row.replicas
    leader.image.ranges[replica.segment_id][replica.offset] = 8 * KIB
    restored = restored_from(leader)  # check() included
    on_segment = restored.context.state.objects.objects_on_segment(segment)
    assert [key for _, key in on_segment] == ["k"]
    assert restored.stats()["allocated_bytes"] == 8 * KIB  # the object's 4 KiB + the orphan
    assert restored.reads.get_replica_list("", "k", "c2").code == ErrorCode.OK


def test_snapshot_tables_carry_every_row_field() -> None:
    """Every scalar field of every replicated row is a column of its snapshot table: a field
    added to a row and not to the table would be lost by a restore from a snapshot (as the
    attempt id of a write in flight once was: a retried start after a restart then found
    its own write "already existing")."""
    for kind, columns in snapshot_module._SCALARS.items():  # noqa: SLF001
        fields = {f.name for f in kind.DESCRIPTOR.fields} - {"replicas"}
        assert fields == {name for name, _ in columns}, kind.__name__
