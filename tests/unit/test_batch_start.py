"""The flat batch put start: runs of allocations, batch placement, and the service's fast path.

Bottom up: :meth:`OffsetAllocator.allocate_run` (best fit for a whole run, side by side, each
piece an allocation of its own), :meth:`SegmentManager.place_batch` (one contiguous part per
segment name, halved when it does not fit, single misfits left out), then a real
:class:`MasterService` on a FakeClock: a differential test against the general per-key path,
proof that the flat path is taken, slicing, and the records and capabilities it makes.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections import Counter
from collections.abc import Sequence
from itertools import accumulate
from typing import Any, NamedTuple

import pytest

from mooncake_py import capability
from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.batch_start import flat_start_applies
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.service.slices import SliceTimer, Steps, map_runs_in_slices
from mooncake_py.master.service.write_calls import MAX_VALUE_BYTES
from mooncake_py.master.state.allocator import OffsetAllocator
from mooncake_py.master.state.segments import PlacedRun, SegmentManager
from mooncake_py.types import ObjectDataType, PutStartResult, ReplicateConfig, SegmentInfo

KIB = 1 << 10
SLOT = 1024  # every valid size of the service tests rounds to it (alignment 64)
T0 = 1000.0
WALL = 1_700_000_000_000
KEY = bytes(range(capability.KEY_BYTES))
OK = ErrorCode.OK
FLAT = ReplicateConfig()
GENERAL = ReplicateConfig(prefer_alloc_in_same_node=True)  # no host id: placed as random


def run_steps(steps: Steps[Any], between: Any = None) -> tuple[Any, int]:
    """Drive a sliced operation by hand; ``between()`` runs at each yield. (result, yields)."""
    yields = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, yields
        yields += 1
        if between is not None:
            between()


# --- OffsetAllocator.allocate_run ------------------------------------------------------------


def free_ranges(alloc: OffsetAllocator) -> list[tuple[int, int]]:
    """(offset, length) of every free range, from the allocations alone."""
    ranges, cursor = [], 0
    for offset, size in sorted(alloc.allocations()):
        if offset > cursor:
            ranges.append((cursor, offset - cursor))
        cursor = offset + size
    if cursor < alloc.usable_capacity:
        ranges.append((cursor, alloc.usable_capacity - cursor))
    return ranges


def best_fit(alloc: OffsetAllocator, length: int) -> int | None:
    """Where a best-fit allocation of ``length`` bytes must start (lowest among equals)."""
    fits = [(size, offset) for offset, size in free_ranges(alloc) if size >= length]
    return min(fits)[1] if fits else None


def snapshot(alloc: OffsetAllocator) -> tuple[Any, ...]:
    allocations = sorted(alloc.allocations())
    return alloc.used_bytes, alloc.largest_free_block, allocations, free_ranges(alloc)


def holed(holes: Sequence[tuple[int, int]], capacity: int = 16 * KIB) -> OffsetAllocator:
    """An allocator full but for ``holes`` (offset, length), in KiB blocks."""
    alloc = OffsetAllocator(capacity)
    for block in range(capacity // KIB):
        assert alloc.allocate(KIB) == block * KIB
    for offset, length in holes:
        for block in range(offset, offset + length, KIB):
            alloc.free(block)
    alloc.check()
    return alloc


def test_allocate_run_carves_side_by_side_from_the_best_fit_range() -> None:
    """The run's total picks the smallest range that holds it (the lowest of two equal ones),
    each piece is rounded to the alignment and starts where the previous one ends, and every
    piece is an allocation of its own: freed alone, the ranges coalesce back."""
    alloc = holed([(1 * KIB, 4 * KIB), (7 * KIB, 2 * KIB), (11 * KIB, 2 * KIB)])
    before = snapshot(alloc)
    offsets = alloc.allocate_run([100, 64, 1000, 1])  # rounded 128 + 64 + 1024 + 64
    assert offsets == [7 * KIB, 7 * KIB + 128, 7 * KIB + 192, 7 * KIB + 1216]
    assert [alloc.size_of(o) for o in offsets] == [128, 64, 1024, 64]
    assert alloc.used_bytes == before[0] + 1280
    alloc.check()
    for offset in (offsets[1], offsets[3], offsets[0], offsets[2]):
        alloc.free(offset)
        alloc.check()
    assert snapshot(alloc) == before
    assert alloc.allocate_run([KIB, KIB]) == [7 * KIB, 8 * KIB]  # a range filled exactly
    alloc.check()  # (no empty range left behind)


def test_allocate_run_that_cannot_be_made_changes_nothing() -> None:
    """Enough free bytes in all but no single range for the whole run, an empty run: None;
    a size of 0 or below: ValueError. Used bytes, allocations and free ranges stay as they
    were (a later run that fits still works)."""
    alloc = holed([(0, 2 * KIB), (4 * KIB, 2 * KIB), (10 * KIB, 3 * KIB)])
    before = snapshot(alloc)
    assert alloc.allocate_run([KIB, KIB, KIB, 1]) is None
    assert alloc.allocate_run([]) is None
    for sizes in ([64, 0], [-1], [128, 64, -64]):
        with pytest.raises(ValueError):
            alloc.allocate_run(sizes)
    assert snapshot(alloc) == before
    alloc.check()
    assert alloc.allocate_run([KIB, KIB, KIB]) == [10 * KIB, 11 * KIB, 12 * KIB]
    alloc.check()


@pytest.mark.parametrize("seed", range(6))
def test_allocator_stress_mixing_runs_singles_and_frees(seed: int) -> None:
    """Random allocate, allocate_run and free against a model of the live allocations: each
    answer is the best-fit one, a failed run changes nothing, and ``check()`` holds after
    every step."""
    rng = random.Random(seed)
    alloc = OffsetAllocator(128 * KIB + 17, alignment=rng.choice([64, 256, 1024]))
    live: dict[int, int] = {}
    for _ in range(500):
        roll = rng.random()
        if roll < 0.35 and live:
            freed = rng.choice(list(live))
            assert alloc.free(freed) == live.pop(freed)
        elif roll < 0.6:
            size = rng.randint(1, 6 * KIB)
            expected = best_fit(alloc, alloc.rounded(size))
            offset = alloc.allocate(size)
            assert offset == expected
            if offset is not None:
                live[offset] = alloc.rounded(size)
        else:
            sizes = [rng.randint(1, 3 * KIB) for _ in range(rng.randint(1, 12))]
            rounded = [alloc.rounded(s) for s in sizes]
            expected = best_fit(alloc, sum(rounded))
            before = snapshot(alloc)
            offsets = alloc.allocate_run(sizes)
            if expected is None:
                assert offsets is None and snapshot(alloc) == before
            else:
                assert offsets == list(accumulate(rounded[:-1], initial=expected))
                live.update(zip(offsets, rounded, strict=True))
        alloc.check()
        assert sorted(alloc.allocations()) == sorted(live.items())
        assert alloc.used_bytes == sum(live.values())


# --- SegmentManager.place_batch -------------------------------------------------------------


def info(seg_id: str, name: str, size: int, shared: bool = False) -> SegmentInfo:
    return SegmentInfo(seg_id, name, 0x1000, size, "127.0.0.1:1", shared=shared)


def manager(sizes_by_name: dict[str, int], seed: int = 0) -> SegmentManager:
    segments = SegmentManager(rng=random.Random(seed))
    for i, (name, size) in enumerate(sizes_by_name.items()):
        segments.mount("owner", info(f"s{i}", name, size))
    return segments


def recorder(segments: SegmentManager) -> list[tuple[str, int, int]]:
    told: list[tuple[str, int, int]] = []
    segments.on_allocated = lambda seg, offset, size: told.append((seg, offset, size))
    return told


def covered(runs: Sequence[PlacedRun]) -> list[int]:
    return [run.first + j for run in runs for j in range(len(run.offsets))]


def assert_side_by_side(run: PlacedRun, sizes: Sequence[int]) -> None:
    rounded = [-(-s // 64) * 64 for s in sizes[run.first : run.first + len(run.offsets)]]
    assert run.offsets == list(accumulate(rounded[:-1], initial=run.offsets[0]))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("total", "lengths"), [(64, [16] * 4), (10, [2, 3, 2, 3]), (3, [1] * 3)])
def test_place_batch_cuts_one_contiguous_part_per_name(
    seed: int, total: int, lengths: list[int]
) -> None:
    """N names: the batch is cut into min(N, values) contiguous parts as even as its length
    allows, part r going to the r-th name from a random start (each name once), each part
    side by side in one segment; the listener hears of each run's whole range, in order."""
    names = [f"n{i}" for i in range(4)]
    segments = manager(dict.fromkeys(names, 64 * KIB), seed)
    told = recorder(segments)
    sizes = [random.Random(seed).randint(900, 1100) for _ in range(total)]
    runs = segments.place_batch(sizes)
    assert [len(run.offsets) for run in runs] == lengths
    assert [run.first for run in runs] == list(accumulate(lengths[:-1], initial=0))
    order = [names.index(run.segment.info.name) for run in runs]
    assert order == [(order[0] + r) % 4 for r in range(len(runs))]
    for run in runs:
        assert_side_by_side(run, sizes)
    ends = [run.offsets[-1] + run.segment.allocator.size_of(run.offsets[-1]) for run in runs]
    expected = [
        (r.segment.info.id, r.offsets[0], e - r.offsets[0]) for r, e in zip(runs, ends, strict=True)
    ]
    assert told == expected


def test_place_batch_halves_a_part_no_segment_holds_whole() -> None:
    """A part too long for any free range of its name is halved until the pieces fit, each
    piece a run of its own, in batch order (best fit: the lower of two equal holes first)."""
    segments = manager({"n0": 16 * KIB})
    alloc = segments.get("s0").allocator  # type: ignore[union-attr]
    for _ in range(16):
        alloc.allocate(KIB)
    for block in (1, 2, 5, 6, 9):
        alloc.free(block * KIB)
    runs = segments.place_batch([KIB] * 5)
    assert [(run.first, run.offsets) for run in runs] == [
        (0, [1 * KIB, 2 * KIB]),
        (2, [9 * KIB]),
        (3, [5 * KIB, 6 * KIB]),
    ]
    segments.check()


def test_place_batch_places_nothing_when_a_value_fits_nowhere_in_its_name() -> None:
    """A single value no segment of its name can hold, even when another name has room,
    makes the whole batch unplaced: every range reserved for it is given back, told to
    nobody (the caller then starts the values one by one, in order)."""
    segments = manager({"n0": 4 * KIB})
    told = recorder(segments)
    sizes = [KIB, KIB, 10 * KIB, KIB, 3 * KIB]
    assert segments.place_batch(sizes) == []
    assert told == []  # nothing was handed out
    only = segments.get("s0")
    assert only is not None and only.allocator.used_bytes == 0
    segments.check()
    for seed in range(4):
        segments = manager({"tiny": KIB // 2, "roomy": 64 * KIB}, seed)
        assert segments.place_batch([KIB] * 4) == []
        assert all(m.allocator.used_bytes == 0 for m in segments.all_segments())
        segments.check()


def test_a_batch_given_back_is_not_held_after_a_restore() -> None:
    """After a restore every freed range waits for the grants the old leader may have minted
    (the grant floor). The ranges a batch that did not fit took meanwhile had none: they go
    straight back, so the values placed one by one next find all the room there was."""
    segments = manager({"n0": 4 * KIB})
    segments.grant_holds.floor_ms = segments.wall_ms() + 3_600_000  # a restore moments ago
    for _ in range(3):
        assert segments.place_batch([KIB, KIB, 10 * KIB]) == []
        only = segments.get("s0")
        assert only is not None and only.allocator.used_bytes == 0
        assert segments.grant_holds.held_count() == 0
    segments.check()


def test_spreads_batches_only_for_random_placement_over_everyone_s_segments() -> None:
    """The flat placement applies to the random strategy while every segment is everyone's:
    not for another strategy, nor once a tenant's own (unshared) segment is mounted."""
    assert manager({"n0": KIB}).spreads_batches
    assert not SegmentManager("free_ratio_first").spreads_batches
    assert not SegmentManager("local_first").spreads_batches
    segments = manager({"n0": KIB})
    segments.mount("a", info("shared", "n1", KIB, shared=True), tenant="tenant-a")
    assert segments.spreads_batches
    segments.mount("a", info("own", "n2", KIB), tenant="tenant-a")
    assert not segments.spreads_batches
    segments.unmount("own")
    assert segments.spreads_batches


# --- the service: the flat path against the general one -----------------------------------


def service_with(
    names: Sequence[str],
    segment_bytes: int,
    seed: int = 0,
    clock: FakeClock | None = None,
    key: bytes = KEY,
    **overrides: Any,
) -> MasterService:
    service = MasterService(
        MasterConfig(**overrides), clock=clock or FakeClock(T0), rng=random.Random(seed)
    )
    for i, name in enumerate(names):
        segment = SegmentInfo(f"seg-{i}", name, 1, segment_bytes, "h:1", capability_key=key)
        assert service.mount_segment("owner", segment) == OK
    return service


def shape(result: PutStartResult) -> tuple[Any, ...]:
    """What must not depend on the path: the code, replica sizes, the capabilities' modes."""
    grants = [capability.grant_of(r.capability) for r in result.replicas]
    modes = tuple(capability.GRANT.unpack(g)[2] for g in grants if g)
    return ErrorCode.name_of(result.code), tuple(r.size for r in result.replicas), modes


def where(result: PutStartResult) -> tuple[Any, ...]:
    return result.code, result.write_id, tuple((r.segment_id, r.offset) for r in result.replicas)


NAMES = ("n0", "n1", "n2", "n3", "n3")  # five segments, two of them under one name
SEGMENT_SLOTS = 48
TENANTS = ("", "ta", "tb")
CLIENTS = ("c0", "c1")
BAD_KEYS = ("", "x" * 4097, "é" * 2049)  # 2049 characters are 4098 UTF-8 bytes
BAD_SIZES = (0, -SLOT, MAX_VALUE_BYTES + 1)
TOO_BIG = (SEGMENT_SLOTS * SLOT + 1, MAX_VALUE_BYTES)
STATS = ("objects", "allocated_bytes", "preempted_buffers", "evicted_objects")


class Twins:
    """Two services with the same segments and clock: batches on the first take the flat
    path, on the second the general one. Every call is made on both and compared."""

    def __init__(self, seed: int) -> None:
        self.clock = FakeClock(T0)
        self.services = [
            service_with(NAMES, SEGMENT_SLOTS * SLOT, seed, self.clock, enable_multi_tenants=True)
            for _ in range(2)
        ]
        self.codes: Counter[str] = Counter()

    def start(
        self, client: str, tenant: str, keys: list[str], sizes: list[int], attempt: int
    ) -> list[list[PutStartResult]]:
        answers = [
            service.batch_put_start(client, tenant, keys, sizes, config, attempt)
            for service, config in zip(self.services, (FLAT, GENERAL), strict=True)
        ]
        assert [shape(r) for r in answers[0]] == [shape(r) for r in answers[1]], keys
        self.codes.update(ErrorCode.name_of(r.code) for r in answers[0])
        self.compare()
        return answers

    def end(
        self, client: str, tenant: str, keys: list[str], ids: list[list[int]]
    ) -> list[ErrorCode]:
        codes = [
            service.batch_put_end(client, tenant, keys, side_ids)
            for service, side_ids in zip(self.services, ids, strict=True)
        ]
        assert codes[0] == codes[1], keys
        self.codes.update(f"end {ErrorCode.name_of(c)}" for c in codes[0])
        self.compare()
        return codes[0]

    def end_flight(self, flight: Flight) -> list[ErrorCode]:
        return self.end(flight.client, flight.tenant, [flight.key], [[i] for i in flight.ids])

    def compare(self) -> None:
        flat, general = self.services
        flat.check()
        general.check()
        assert flat.tenant_figures() == general.tenant_figures()
        flat_stats, general_stats = flat.stats(), general.stats()
        assert [flat_stats[s] for s in STATS] == [general_stats[s] for s in STATS]


class Flight(NamedTuple):
    """A write left in flight: who started it and its write id on each service."""

    tenant: str
    client: str
    key: str
    ids: list[int]


@pytest.mark.parametrize("seed", range(5))
def test_flat_start_answers_what_the_general_path_answers(seed: int) -> None:
    """Random batches mixing new keys, repeats inside a batch, written keys, writes in flight
    (fresh: OBJECT_ALREADY_EXISTS; stale: preempted, their end INVALID_WRITE), other tenants'
    keys, bad keys and sizes, values too big for any segment, and memory full of written
    objects (eviction makes room), with repeated attempts. Per key both services answer the
    same codes, replica sizes and capability modes, a repeated attempt the same writes as the
    first time, ends the same codes; check() passes and the figures agree after every call.

    Keys already written are picked among the newest objects, which eviction (oldest first)
    does not reach within a batch: this test's model of a repeated attempt assumes a key the
    first call found stays found (the tight-memory test below covers eviction in a batch)."""
    rng = random.Random(seed)
    twins = Twins(seed)
    serial = itertools.count()
    recent: list[tuple[str, str]] = []  # (tenant, key) of the newest written objects
    flights: list[Flight] = []
    advances = 0
    for round_ in range(40):
        tenant, client = rng.choice(TENANTS), rng.choice(CLIENTS)
        keys: list[str] = []
        sizes: list[int] = []
        for _ in range(rng.randint(1, 40)):
            roll, size = rng.random(), rng.randint(SLOT - 63, SLOT)
            own_flights = [f.key for f in flights if f.tenant == tenant]
            key = f"key-{next(serial)}"
            if roll < 0.08 and keys:
                key = rng.choice(keys)
            elif roll < 0.18 and own_flights:
                key = rng.choice(own_flights)
            elif roll < 0.34 and recent:
                key = rng.choice(recent[-40:])[1]  # this tenant's or another's
            elif roll < 0.38:
                key = rng.choice(BAD_KEYS)
            elif roll < 0.42:
                size = rng.choice(BAD_SIZES)
            elif roll < 0.45:
                size = rng.choice(TOO_BIG)
            elif roll < 0.5:
                key = "é" * 2045 + f"{next(serial):06d}"  # 4096 UTF-8 bytes: valid
            keys.append(key)
            sizes.append(size)
        attempt = rng.choice((0, 0, round_ + 1))
        answers = twins.start(client, tenant, keys, sizes, attempt)
        if attempt and rng.random() < 0.5:
            again = twins.start(client, tenant, keys, sizes, attempt)
            for first, second in zip(answers, again, strict=True):
                # Every valid mention of a key the first call started answers that write.
                wrote = {k: where(r) for k, r in zip(keys, first, strict=True) if r.code == OK}
                expected = [
                    where(r) if r.code == ErrorCode.INVALID_PARAMS else wrote.get(k, where(r))
                    for k, r in zip(keys, first, strict=True)
                ]
                assert [where(r) for r in second] == expected
        started: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            if answers[0][i].code == OK and key not in started:
                started[key] = [answers[0][i].write_id, answers[1][i].write_id]
        ending = []
        for key, ids in started.items():
            if len(flights) < 10 and rng.random() < 0.15:
                flights.append(Flight(tenant, client, key, ids))
            else:
                ending.append(key)
        ends = twins.end(client, tenant, ending, [[started[k][s] for k in ending] for s in (0, 1)])
        assert set(ends) <= {OK}
        recent += [(tenant, key) for key in ending]
        if flights and rng.random() < 0.3:
            for flight in rng.sample(flights, min(3, len(flights))):
                flights.remove(flight)
                if twins.end_flight(flight) == [OK]:
                    recent.append((flight.tenant, flight.key))
        if advances < 10 and rng.random() < 0.2:
            advances += 1
            twins.clock.advance(twins.services[0].config.put_start_discard_timeout_sec + 1)
    for flight in flights:
        twins.end_flight(flight)
    for name in ("OK", "OBJECT_ALREADY_EXISTS", "INVALID_PARAMS", "NO_AVAILABLE_HANDLE"):
        assert twins.codes[name], (name, twins.codes)
    assert twins.codes["end INVALID_WRITE"], "no stale write was preempted"
    assert twins.services[0].stats()["evicted_objects"], "memory never filled up"


def no_room(config: ReplicateConfig, seed: int) -> tuple[list[str], int]:
    """Room for 4 of 6 values, none evictable: in order, the first 4 keys get it; the flat
    path gives it to whichever parts fit their name."""
    service = service_with(("n0", "n1"), 4 * KIB, seed)
    service.put_start("w", "", "fill", 4 * KIB, ReplicateConfig(preferred_segment="n0"))
    answers = service.batch_put_start("w", "", [f"k{i}" for i in range(6)], [SLOT] * 6, config)
    service.check()
    return [ErrorCode.name_of(r.code) for r in answers], service.stats()["evicted_objects"]


def evicting(config: ReplicateConfig, seed: int) -> tuple[list[str], int]:
    """One free slot, "old" the oldest written object: in order, "a" takes the slot, "old"
    exists and "b" evicts it (one eviction). When the flat path gives the slot to "b", "a"
    evicts "old" first, which is then started anew (OK) and evicts "x" too."""
    service = service_with(("n0", "n1"), 2 * KIB, seed)
    for key, name in (("old", "n0"), ("x", "n0"), ("y", "n1")):
        service.put_start("w", "", key, SLOT, ReplicateConfig(preferred_segment=name))
        assert service.put_end("w", "", key) == OK
    answers = service.batch_put_start("w", "", ["a", "old", "b"], [SLOT] * 3, config)
    service.check()
    return [ErrorCode.name_of(r.code) for r in answers], service.stats()["evicted_objects"]


@pytest.mark.parametrize("scenario", [no_room, evicting])
def test_tight_memory_answers_as_the_general_path(scenario: Any) -> None:
    """Where memory is short, which keys get room, and what eviction takes before a later
    key is met, are decided in key order on the flat path as on the general one (see each
    scenario): the same codes and the same number of evictions."""
    for seed in range(12):
        assert scenario(FLAT, seed) == scenario(GENERAL, seed), seed


def test_flat_start_applies_only_to_plain_puts() -> None:
    """One replica, no placement preference, group or KV-session tag, not an upsert; pins
    and data types do not matter."""
    assert flat_start_applies(FLAT, False)
    assert flat_start_applies(
        ReplicateConfig(with_hard_pin=True, data_type=ObjectDataType.TENSOR), False
    )
    assert not flat_start_applies(FLAT, True)
    for bad in (
        {"replica_num": 2},
        {"group_ids": ["g"]},
        {"kv_sessions": [["s"]]},
        {"preferred_segment": "n0"},
        {"preferred_segments": ["n0"]},
        {"prefer_alloc_in_same_node": True},
    ):
        assert not flat_start_applies(ReplicateConfig(**bad), False), bad


def test_plain_batch_lands_as_one_run_per_segment() -> None:
    """64 new keys on 4 segments: 4 runs of 16 consecutive keys at adjacent offsets, one per
    segment (the flat path was taken); the general path places key by key instead."""
    names = ("n0", "n1", "n2", "n3")
    keys = [f"k{i}" for i in range(64)]
    runs: list[list[str]] = []
    for config in (FLAT, GENERAL):
        service = service_with(names, 64 * SLOT, seed=3)
        results = service.batch_put_start("w", "", keys, [SLOT] * 64, config)
        assert all(r.code == OK for r in results)
        service.check()
        runs.append([r.replicas[0].segment_id for r in results])
        if config is FLAT:
            for block in range(4):
                part = results[16 * block : 16 * block + 16]
                assert len({r.replicas[0].segment_id for r in part}) == 1
                first = part[0].replicas[0].offset
                assert [r.replicas[0].offset for r in part] == [first + j * SLOT for j in range(16)]
    flat_runs, general_runs = (len([k for k, _ in itertools.groupby(r)]) for r in runs)
    assert flat_runs == 4 and len(set(runs[0])) == 4
    assert general_runs > 4


def test_owned_segments_keep_batches_on_the_general_path() -> None:
    """With a tenant's own segment mounted, a plain batch of another tenant never lands in
    it (the flat placement does not filter by owner, so it must not be used)."""
    service = MasterService(
        MasterConfig(auth_tokens_file="tokens.yaml"), clock=FakeClock(T0), rng=random.Random(1)
    )
    for seg_id, tenant in (("mine", "tenant-a"), ("theirs", "tenant-b"), ("anyone", "")):
        segment = SegmentInfo(seg_id, f"name-{seg_id}", 0x1000, 64 * SLOT, "127.0.0.1:1")
        assert service.mount_segment(f"owner-{seg_id}", segment, tenant) == OK
    keys = [f"k{i}" for i in range(60)]
    results = service.batch_put_start("w", "tenant-b", keys, [SLOT] * 60, FLAT)
    assert all(r.code == OK for r in results)
    assert {r.replicas[0].segment_id for r in results} <= {"theirs", "anyone"}
    service.check()


# --- slices -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("seconds", "yields"), [(0.0, 3), (3600.0, 0)])
def test_map_runs_in_slices_yields_between_slices_without_the_lock(
    seconds: float, yields: int
) -> None:
    """Runs of at most ``run_length``, each under the lock with its slice's time; a spent
    slice ends after its run and yields with the lock let go; the results come back
    concatenated in order. A batch that fits in one slice never yields."""
    lock, clock = threading.Lock(), itertools.count(1)
    calls: list[tuple[int, int, float, bool]] = []
    slices: list[bool] = []  # each start of a slice: whether the lock is held

    def start_slice() -> float:
        slices.append(lock.locked())
        return float(next(clock))

    def run_step(first: int, stop: int, now: float) -> list[int]:
        calls.append((first, stop, now, lock.locked()))
        return list(range(first, stop))

    def between() -> None:
        assert not lock.locked()

    result, seen = run_steps(
        map_runs_in_slices(lock, 10, start_slice, run_step, 3, seconds), between
    )
    assert result == list(range(10))
    assert seen == yields and slices == [True] * (yields + 1)
    nows = [1.0, 2.0, 3.0, 4.0] if yields else [1.0] * 4
    assert calls == [
        (a, b, now, True)
        for (a, b), now in zip(((0, 3), (3, 6), (6, 9), (9, 10)), nows, strict=True)
    ]


def test_large_batch_through_the_sliced_call_driven_by_hand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every slice spent after one run: 300 keys come back one result per key after 4
    yields, each with the service lock free (another writer gets in between)."""
    monkeypatch.setattr(SliceTimer, "spent", lambda self: True)
    service = service_with(("n0", "n1", "n2"), 128 * SLOT)
    keys = [f"big-{i}" for i in range(300)]
    others: list[PutStartResult] = []

    def between() -> None:
        assert not service.context.lock.locked()
        others.append(service.put_start("x", "", f"between-{len(others)}", SLOT, FLAT))

    steps = service.batch_put_start_sliced("w", "", keys, [SLOT] * 300, FLAT)
    results, yields = run_steps(steps, between)
    assert yields == 4 and [r.code for r in others] == [OK] * 4
    assert len(results) == 300 and all(r.code == OK for r in results)
    metas = [service.object_of("", k) for k in keys]
    assert [m.write_id if m else 0 for m in metas] == [r.write_id for r in results]
    service.check()


# --- records and capabilities -----------------------------------------------------------------


def test_flat_records_intern_writer_and_tenant_and_carry_write_capabilities() -> None:
    """Two calls with equal but distinct client and tenant strings: every record holds the
    same two string objects; check() passes; each answer's capability verifies with the
    segment's key for exactly its range with WRITE (and MAP: an unowned, unshared segment)."""
    service = service_with(("n0", "n1"), 64 * SLOT, enable_multi_tenants=True)
    keys = [f"k{i}" for i in range(24)]
    answers: list[PutStartResult] = []
    for call in range(2):
        client, tenant = "".join(["wri", "ter"]), "".join(["ten", "ant"])
        part = keys[call * 12 : call * 12 + 12]
        answers += service.batch_put_start(client, tenant, part, [SLOT - call] * 12, FLAT)
    metas = [service.object_of("tenant", k) for k in keys]
    assert all(m is not None for m in metas)
    assert len({id(m.client_id) for m in metas}) == 1  # type: ignore[union-attr]
    assert len({id(m.tenant) for m in metas}) == 1  # type: ignore[union-attr]
    service.check()
    for answer, meta in zip(answers, metas, strict=True):
        assert answer.code == OK and meta is not None and answer.write_id == meta.write_id
        ((descriptor,), (replica,)) = answer.replicas, meta.replicas
        offset, size = descriptor.offset, descriptor.size
        assert (descriptor.segment_id, offset, size) == (
            replica.segment_id,
            replica.offset,
            meta.size,
        )
        signer = capability.SegmentSigner(KEY, descriptor.segment_id.encode())
        grant = capability.grant_of(descriptor.capability)
        assert signer.verify(grant, offset, size, capability.WRITE)
        assert not signer.verify(grant, offset, size + 1, capability.WRITE)
        assert not signer.verify(grant, offset + 1, size, capability.WRITE)
        assert capability.GRANT.unpack(grant)[2] == capability.WRITE | capability.MAP
        proof = capability.proof_key(KEY, descriptor.segment_id.encode())
        assert capability.proof_key_of(descriptor.capability) == proof


RECORD_FIELDS: tuple[str, ...] = ("size", "client_id", "put_start_time", "write_id")
RECORD_FIELDS += ("hard_pinned", "data_type", "pending_soft_pin", "replicas", "readable")
RECORD_FIELDS += ("soft_pin_deadline", "group_id")


@pytest.mark.parametrize("key", [KEY, b""])
def test_one_segment_batch_answers_exactly_as_the_general_path(key: bytes) -> None:
    """On one segment both paths place the same offsets: the answers (descriptors,
    capabilities, write ids) and records are then equal field for field, with a segment key
    and without one (no capability); a repeated attempt answers the same again."""
    rng = random.Random(5)
    keys = [f"k{i}" for i in range(20)]
    sizes = [rng.randint(1, 3 * KIB) for _ in keys]
    kv = ObjectDataType.KVCACHE
    answers: list[list[PutStartResult]] = []
    records: list[list[tuple[Any, ...]]] = []
    for config in (
        ReplicateConfig(with_hard_pin=True, data_type=kv),
        ReplicateConfig(with_hard_pin=True, data_type=kv, prefer_alloc_in_same_node=True),
    ):
        service = service_with(("solo",), 128 * KIB, key=key)
        service.context.state.wall_ms = lambda: WALL
        answers.append(service.batch_put_start("w", "", keys, sizes, config, attempt_id=7))
        assert service.batch_put_start("w", "", keys, sizes, config, attempt_id=7) == answers[-1]
        service.check()
        metas = [service.object_of("", k) for k in keys]
        records.append([tuple(getattr(m, f) for f in RECORD_FIELDS) for m in metas])
    assert answers[0] == answers[1] and records[0] == records[1]
    assert all(r.code == OK for r in answers[0])
    assert all(bool(r.replicas[0].capability) == bool(key) for r in answers[0])
