"""Eviction, pins, upsert and groups: the policy alone, then scenarios through the service.

Pure logic on a FakeClock, no sockets. :class:`LeaseOrderedLRU` is exercised directly (order,
touch, the soft-pin side queue, SKIP, budgets, declined and abandoned walks); the rest drives a
:class:`MasterService` (watermark maths, LRU by access, what protects an object, the fallback
pass for soft pins, synchronous eviction on full writes, groups, slices, upsert) and ends each
scenario with ``service.check()``.

The "defects" section holds regression tests for bugs found and fixed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import pytest

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.eviction import SLICE_BUDGET, EvictionPass, Evictor
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.state.lru import LeaseOrderedLRU, Verdict
from mooncake_py.types import (
    PutStartResult,
    ReplicaStatus,
    ReplicateConfig,
    SegmentInfo,
    SoftPinAction,
)

KIB = 1 << 10
MIB = 1 << 20
T0 = 1000.0  # FakeClock's initial reading
OK = ErrorCode.OK
NO_HANDLE = ErrorCode.NO_AVAILABLE_HANDLE
ENABLE = SoftPinAction.ENABLE


# --- helpers -----------------------------------------------------------------------------------


def rounded(size: int) -> int:
    return -(-size // 64) * 64


def make_service(**overrides: Any) -> tuple[MasterService, FakeClock]:
    clock = FakeClock(T0)
    service = MasterService(MasterConfig(**overrides), clock=clock, rng=random.Random(0))
    return service, clock


def mount(service: MasterService, seg_id: str, size: int, owner: str = "owner") -> None:
    info = SegmentInfo(
        id=seg_id, name=f"name-{seg_id}", base=0x1000, size=size, te_endpoint="127.0.0.1:1"
    )
    assert service.mount_segment(owner, info) == OK


def start(service: MasterService, key: str, size: int, client: str = "w", **cfg: Any) -> Any:
    result = service.put_start(client, "", key, size, ReplicateConfig(**cfg))
    assert result.code == OK, ErrorCode.name_of(result.code)
    return result


def put(service: MasterService, key: str, size: int, client: str = "w", **cfg: Any) -> Any:
    result = start(service, key, size, client, **cfg)
    assert service.put_end(client, "", key) == OK
    return result


def put_many(service: MasterService, keys: Iterable[str], size: int, **cfg: Any) -> None:
    for key in keys:
        put(service, key, size, **cfg)


def upsert(
    service: MasterService, key: str, size: int, client: str = "u", **cfg: Any
) -> PutStartResult:
    return service.upsert_start(client, "", key, size, ReplicateConfig(**cfg))


def read(service: MasterService, *keys: str) -> None:
    for key in keys:
        assert service.reads.get_replica_list("", key).code == OK, key


def present(service: MasterService, keys: Iterable[str]) -> list[str]:
    return [k for k in keys if service.object_of("", k) is not None]


def gone(service: MasterService, keys: Iterable[str]) -> list[str]:
    return [k for k in keys if service.object_of("", k) is None]


def stat(service: MasterService, name: str) -> int:
    return service.stats()[name]


def run_pass(service: MasterService, now: float) -> EvictionPass | None:
    """A background pass as the loop runs it: start, then slices until done."""
    work = service.start_eviction()
    slices = 0
    while work is not None and not service.continue_eviction(work, now):
        slices += 1
        assert slices < 10_000, "eviction pass never finishes"
    return work


def small_slices(monkeypatch: pytest.MonkeyPatch, budget: int) -> None:
    """Make every ``continue_eviction`` slice examine at most ``budget`` candidates."""
    original = Evictor.run_slice

    def run_slice(self: Evictor, work: EvictionPass, now: float, budget_: int = budget) -> Any:
        return original(self, work, now, budget_)

    monkeypatch.setattr(Evictor, "run_slice", run_slice)


# --- LeaseOrderedLRU alone ---------------------------------------------------------------------


def lru_of(*ids: str) -> LeaseOrderedLRU:
    lru = LeaseOrderedLRU()
    for object_id in ids:
        lru.on_created(object_id)
    return lru


def judge(
    verdicts: dict[str, Verdict] | None = None, seen: list[Hashable] | None = None
) -> Callable[[Hashable], Verdict]:
    """A verdict function: EVICT unless told otherwise; records what it examined."""

    def verdict(object_id: Hashable) -> Verdict:
        if seen is not None:
            seen.append(object_id)
        return (verdicts or {}).get(str(object_id), Verdict.EVICT)

    return verdict


def chosen(
    lru: LeaseOrderedLRU,
    verdicts: dict[str, Verdict] | None = None,
    include_pinned: bool = False,
) -> list[Hashable]:
    """Every victim one unbounded walk selects, oldest first."""
    selection = lru.select(judge(verdicts), 10_000, 10_000, include_pinned=include_pinned)
    assert selection.exhausted
    return selection.victims


def test_lru_selects_oldest_first_and_selecting_moves_nothing() -> None:
    lru = lru_of("a", "b", "c", "d")
    assert chosen(lru) == ["a", "b", "c", "d"]
    assert chosen(lru) == ["a", "b", "c", "d"]  # nothing was removed: nothing moved
    lru.on_removed("b")
    lru.on_removed("d")
    assert chosen(lru) == ["a", "c"]
    assert len(lru) == 2 and "a" in lru and "b" not in lru
    lru.check({"a", "c"})


def test_lru_touch_moves_to_the_back() -> None:
    lru = lru_of("a", "b", "c")
    lru.on_touched("a")
    assert chosen(lru) == ["b", "c", "a"]
    lru.on_touched("c")
    lru.on_created("b")  # a completed rewrite counts as an access too
    assert chosen(lru) == ["a", "c", "b"]
    lru.on_touched("x")  # not a candidate (e.g. hard pinned): stays out
    assert "x" not in lru
    lru.check({"a", "b", "c"})


def test_lru_pinned_is_selected_only_in_the_fallback_and_keeps_its_place() -> None:
    lru = lru_of("a", "b", "c", "d")
    pins = {"a": Verdict.PINNED, "c": Verdict.PINNED}
    assert chosen(lru, pins) == ["b", "d"]
    assert chosen(lru, pins, include_pinned=True) == ["a", "b", "c", "d"]
    # The moment the pin ends the object is ordinary again, in its LRU place.
    assert chosen(lru, {"c": Verdict.PINNED}) == ["a", "b", "d"]
    assert chosen(lru, {}) == ["a", "b", "c", "d"]
    lru.check({"a", "b", "c", "d"})


def test_lru_skip_keeps_its_place_before_newer_entries() -> None:
    lru = lru_of("a", "b", "c")
    assert chosen(lru, {"a": Verdict.SKIP, "b": Verdict.SKIP}) == ["c"]
    lru.on_created("d")
    assert chosen(lru) == ["a", "b", "c", "d"]  # skipped ones are still the oldest
    assert chosen(lru, {"a": Verdict.SKIP, "b": Verdict.PINNED}) == ["c", "d"]
    lru.check({"a", "b", "c", "d"})


def test_lru_limit_bounds_the_candidates_judged_and_the_cursor_resumes() -> None:
    lru = lru_of(*[f"k{i}" for i in range(10)])
    seen: list[Hashable] = []
    verdicts = {"k0": Verdict.SKIP, "k1": Verdict.PINNED}
    first = lru.select(judge(verdicts, seen), want=100, limit=4)
    assert seen == ["k0", "k1", "k2", "k3"]
    assert (first.victims, first.examined, first.exhausted) == (["k2", "k3"], 4, False)
    # Resuming after the cursor judges only what comes next: no candidate twice.
    seen.clear()
    second = lru.select(judge(verdicts, seen), want=100, limit=4, after=first.cursor)
    assert seen == ["k4", "k5", "k6", "k7"] and not second.exhausted
    lru.on_removed("k8")  # removals between steps are fine
    lru.on_created("new")  # and a newer candidate is met at the end
    seen.clear()
    third = lru.select(judge(verdicts, seen), want=100, limit=4, after=second.cursor)
    assert seen == ["k9", "new"]
    assert third.exhausted and third.examined == 2
    # ``want`` stops a walk as soon as enough victims are found.
    seen.clear()
    some = lru.select(judge(verdicts, seen), want=2, limit=100)
    assert some.victims == ["k2", "k3"] and not some.exhausted
    assert seen == ["k0", "k1", "k2", "k3"]
    # The fallback judges pinned candidates in place.
    assert lru.select(judge(verdicts), 2, 100, include_pinned=True).victims == ["k1", "k2"]
    empty = lru.select(judge(verdicts), want=5, limit=0)
    assert (empty.victims, empty.examined) == ([], 0)
    assert LeaseOrderedLRU().select(judge(), 1, 1).exhausted
    lru.check({*(f"k{i}" for i in range(10) if i != 8), "new"})


def test_lru_check_detects_drift() -> None:
    lru = lru_of("a", "b")
    lru.check({"a", "b"})
    with pytest.raises(AssertionError, match="missing 1"):
        lru.check({"a", "b", "c"})
    with pytest.raises(AssertionError, match="extra 1"):
        lru.check({"a"})
    lru.on_removed("a")
    lru.on_removed("a")  # idempotent
    lru.on_removed("zzz")
    lru.check({"b"})
    assert len(lru) == 1


# --- watermark maths ---------------------------------------------------------------------------


def test_no_pass_at_or_below_the_watermark_and_the_target_above_it() -> None:
    service, clock = make_service()  # watermark 0.90, eviction_ratio 0.05
    mount(service, "s", 100 * KIB)
    keys = [f"k{i:02d}" for i in range(91)]
    put_many(service, keys[:90], KIB)
    assert stat(service, "allocated_bytes") / stat(service, "capacity_bytes") == 0.9
    assert service.start_eviction() is None
    assert service.evict_once(clock()) is None
    assert stat(service, "eviction_passes") == 0

    put(service, keys[90], KIB)  # 0.91 used
    candidates = stat(service, "eviction_candidates")
    assert candidates == 91
    used = 0.91
    ratio = max(0.05, used - 0.9 + 0.05)
    target = math.ceil(candidates * ratio)
    assert target == 6
    work = service.evict_once(clock())
    assert work is not None and work.done and not work.fallback
    assert (work.target, work.lower_bound, work.evicted) == (target, 3, 6)
    assert gone(service, keys) == keys[:6]  # oldest write first
    assert stat(service, "evicted_objects") == 6
    assert stat(service, "evicted_bytes") == 6 * KIB
    assert stat(service, "eviction_passes") == 1
    assert service.evict_once(clock()) is None  # 0.85 used now
    service.check()


def test_far_over_the_watermark_evicts_more_and_hard_pins_are_not_candidates() -> None:
    service, clock = make_service()
    mount(service, "s", 100 * KIB)
    put_many(service, [f"h{i}" for i in range(20)], KIB, with_hard_pin=True)
    put_many(service, [f"k{i:02d}" for i in range(80)], KIB)
    assert stat(service, "eviction_candidates") == 80  # the hard pins do not count
    work = service.evict_once(clock())
    assert work is not None
    # used 1.0: ratio = max(0.05, 1.0 - 0.9 + 0.05) = 0.15 of 80 candidates
    assert work.target == math.ceil(80 * (1.0 - 0.9 + 0.05)) == 12
    assert work.lower_bound == math.ceil(80 * 0.1) == 8
    assert work.evicted == 12
    assert gone(service, [f"k{i:02d}" for i in range(80)]) == [f"k{i:02d}" for i in range(12)]
    assert present(service, [f"h{i}" for i in range(20)]) == [f"h{i}" for i in range(20)]
    service.check()


def test_upstream_example_pinned_objects_survive_and_the_rest_is_lru_by_write() -> None:
    """Upstream §4, release 0.3.13.post1: one 16 MiB segment, a 1 MiB put every 50 ms, the
    eviction loop every 10 ms; keys 0-1 soft pinned, key 2 hard pinned."""
    service, clock = make_service()
    mount(service, "s", 16 * MIB)
    passes: list[tuple[float, int, EvictionPass]] = []
    for i in range(40):
        config: dict[str, Any] = {}
        if i < 2:
            config = {"soft_pin_action": ENABLE}
        elif i == 2:
            config = {"with_hard_pin": True}
        put(service, str(i), MIB, **config)  # every put succeeds
        for _ in range(5):
            clock.advance(0.01)
            ratio = stat(service, "allocated_bytes") / stat(service, "capacity_bytes")
            base = stat(service, "eviction_candidates")
            work = service.evict_once(clock())
            if work is not None:
                passes.append((ratio, base, work))
    assert passes
    for ratio, base, work in passes:
        # The upstream log: memory_ratio=0.9375, eviction_base=14, evicted_count=2.
        assert (ratio, base) == (0.9375, 14)
        assert (work.target, work.evicted, work.fallback) == (2, 2, False)
    survivors = present(service, [str(i) for i in range(40)])
    assert survivors == ["0", "1", "2", *[str(i) for i in range(29, 40)]]
    assert stat(service, "sync_evictions") == 0
    assert stat(service, "alloc_failures") == 0
    assert stat(service, "evicted_soft_pinned") == 0
    service.check()


# --- what goes first, what never goes ----------------------------------------------------------


def test_lru_order_follows_reads_as_well_as_writes() -> None:
    service, clock = make_service(default_kv_lease_ttl=1000)
    mount(service, "s", 4 * KIB)
    put_many(service, "ABCD", KIB)
    read(service, "A")  # A is now the most recently used
    assert service.reads.exist_key("", "B") == 1  # so is B, after A
    clock.advance(2)  # leases over
    put(service, "E", KIB)  # full: evicts the least recently used
    assert gone(service, "ABCDE") == ["C"]
    put(service, "F", KIB)
    assert gone(service, "ABCDEF") == ["C", "D"]
    put(service, "G", KIB)
    assert gone(service, "ABCDEFG") == ["A", "C", "D"]
    put(service, "H", KIB)
    assert gone(service, "ABCDEFGH") == ["A", "B", "C", "D"]
    assert stat(service, "sync_evictions") == 4
    # A watermark pass follows the same order: the least recently used of E F G H is F once
    # E has been read.
    read(service, "E")
    clock.advance(2)
    work = service.evict_once(clock())
    assert work is not None and work.evicted == 1
    assert gone(service, "EFGH") == ["F"]
    service.check()


def test_hard_pin_is_never_evicted_even_when_memory_is_full() -> None:
    service, clock = make_service(allow_evict_soft_pinned_objects=True)
    mount(service, "s", 4 * KIB)
    put(service, "H1", KIB, with_hard_pin=True)
    put(service, "H2", KIB, with_hard_pin=True, soft_pin_action=ENABLE, soft_pin_ttl_ms=1000)
    put_many(service, ["a", "b"], KIB)
    for key in "cdefg":  # each write evicts the oldest unpinned object
        put(service, key, KIB)
    assert present(service, ["H1", "H2", "a", "b", "c", "d", "e", "f", "g"]) == [
        "H1",
        "H2",
        "f",
        "g",
    ]
    clock.advance(5)  # the soft pin on H2 is over; the hard pin is forever
    assert service.remove("", "f") == OK and service.remove("", "g") == OK
    put_many(service, ["x", "y"], KIB)
    read(service, "x", "y")  # the only evictable objects are leased
    assert service.put_start("w", "", "z", KIB, ReplicateConfig()).code == NO_HANDLE
    assert service.put_start("w", "", "z", 3 * KIB, ReplicateConfig()).code == NO_HANDLE
    assert present(service, ["H1", "H2", "x", "y"]) == ["H1", "H2", "x", "y"]
    assert stat(service, "alloc_failures") == 2
    # Only hard pins left: the store is full and yet there is nothing to pass over.
    assert service.remove("", "x", force=True) == OK
    assert service.remove("", "y", force=True) == OK
    assert stat(service, "retired_buffers") == 2  # the readers may still be copying
    clock.advance(20)
    service.sweep_expired_puts(clock())  # the reads were never ended: their TTL is over
    assert stat(service, "retired_buffers") == 0
    put_many(service, ["H3", "H4"], KIB, with_hard_pin=True)
    assert stat(service, "eviction_candidates") == 0
    assert service.evict_once(clock()) is None
    assert service.put_start("w", "", "z", KIB, ReplicateConfig()).code == NO_HANDLE
    assert present(service, ["H1", "H2", "H3", "H4"]) == ["H1", "H2", "H3", "H4"]
    # Hard pin blocks only eviction: remove still deletes.
    assert service.remove("", "H1") == OK
    service.check()


def test_live_lease_protects_until_it_ends() -> None:
    service, clock = make_service(default_kv_lease_ttl=1000)
    mount(service, "s", 4 * KIB)
    put_many(service, "ABCD", KIB)
    read(service, "A", "B")
    put(service, "E", KIB)  # A and B are older but leased
    assert gone(service, "ABCDE") == ["C"]
    clock.advance(0.5)
    read(service, "A", "B", "D", "E")  # everything leased
    assert service.evict_once(clock()) is not None  # 100% used: a pass runs ...
    assert gone(service, "ABDE") == []  # ... and finds nothing it may take
    assert service.put_start("w", "", "F", KIB, ReplicateConfig()).code == NO_HANDLE
    clock.advance(1)  # every lease over
    put(service, "F", KIB)
    assert gone(service, "ABDEF") == ["A"]
    service.check()


def test_objects_being_written_are_never_evicted() -> None:
    service, clock = make_service()
    mount(service, "s", 4 * KIB)
    put_many(service, "AB", KIB)
    start(service, "C", KIB)  # first write in flight: not a candidate at all
    assert stat(service, "eviction_candidates") == 2
    assert upsert(service, "A", KIB).code == OK  # rewrite in place in flight
    assert upsert(service, "B", 512).code == OK  # new-size rewrite in flight
    assert stat(service, "eviction_candidates") == 2  # still tracked, but protected
    assert service.put_start("w", "", "D", 2 * KIB, ReplicateConfig()).code == NO_HANDLE
    work = service.evict_once(clock())
    assert work is not None and work.evicted == 0
    assert present(service, "ABC") == ["A", "B", "C"]
    assert stat(service, "evicted_objects") == 0
    # Once written they are ordinary candidates, in the order their writes ended.
    assert service.put_end("w", "", "C") == OK
    assert service.put_end("u", "", "A") == OK
    put(service, "D", 2 * KIB)  # C, whose write ended first, is the first to go
    assert "C" not in present(service, "ABCD")
    assert "B" in present(service, "ABCD")  # still being written
    assert service.put_end("u", "", "B") == OK
    service.check()


# --- soft pins ---------------------------------------------------------------------------------


def test_soft_pinned_objects_go_only_in_the_fallback_pass() -> None:
    service, clock = make_service(default_kv_lease_ttl=1000)
    mount(service, "s", 10 * KIB)
    put_many(service, ["P1", "P2"], KIB, soft_pin_action=ENABLE, soft_pin_ttl_ms=600_000)
    ordinary = [f"U{i}" for i in range(8)]
    put_many(service, ordinary, KIB)
    work = service.evict_once(clock())  # 100% used: target 2, lower bound 1
    assert work is not None and (work.target, work.lower_bound) == (2, 1)
    assert work.evicted == 2 and not work.fallback
    assert gone(service, ["P1", "P2", *ordinary]) == ["U0", "U1"]
    put_many(service, ["U8", "U9"], KIB)
    read(service, *ordinary[2:], "U8", "U9")  # every ordinary candidate is leased
    work = service.evict_once(clock())
    assert work is not None and work.fallback
    assert work.evicted == work.lower_bound == 1
    assert gone(service, ["P1", "P2"]) == ["P1"]  # the oldest pinned one
    assert stat(service, "evicted_soft_pinned") == 1
    assert stat(service, "evicted_objects") == 3
    service.check()


def test_write_takes_soft_pinned_objects_only_after_every_ordinary_one() -> None:
    service, clock = make_service(default_kv_lease_ttl=1000)
    mount(service, "s", 4 * KIB)
    put_many(service, ["P1", "P2"], KIB, soft_pin_action=ENABLE)
    put_many(service, ["A", "B"], KIB)
    put(service, "C", 2 * KIB)  # A and B go, although the pinned ones are older
    assert gone(service, ["P1", "P2", "A", "B"]) == ["A", "B"]
    read(service, "C")
    put(service, "D", KIB)  # nothing ordinary left: the oldest soft pin goes
    assert gone(service, ["P1", "P2", "C"]) == ["P1"]
    assert stat(service, "evicted_soft_pinned") == 1
    service.check()


@pytest.mark.parametrize("how", ["pass", "write"])
def test_soft_pins_are_never_evicted_when_not_allowed(how: str) -> None:
    service, clock = make_service(default_kv_lease_ttl=1000, allow_evict_soft_pinned_objects=False)
    mount(service, "s", 4 * KIB)
    put_many(service, ["P1", "P2", "P3"], KIB, soft_pin_action=ENABLE)
    put(service, "A", KIB)
    read(service, "A")
    if how == "pass":
        work = service.evict_once(clock())
        assert work is not None and work.evicted == 0
    else:  # writes must then fail
        assert service.put_start("w", "", "B", KIB, ReplicateConfig()).code == NO_HANDLE
        assert stat(service, "alloc_failures") == 1
    assert present(service, ["P1", "P2", "P3", "A"]) == ["P1", "P2", "P3", "A"]
    assert stat(service, "evicted_objects") == 0
    service.check()


def test_soft_pin_ttl_expires_by_itself_and_the_object_is_then_ordinary() -> None:
    service, clock = make_service(
        default_kv_lease_ttl=60_000, allow_evict_soft_pinned_objects=False
    )
    mount(service, "s", 4 * KIB)
    put(service, "P", KIB, soft_pin_action=ENABLE, soft_pin_ttl_ms=5000)
    put_many(service, "ABC", KIB)
    read(service, "A", "B", "C")
    clock.advance(4.999)
    assert service.put_start("w", "", "D", KIB, ReplicateConfig()).code == NO_HANDLE
    work = service.evict_once(clock())
    assert work is not None and work.evicted == 0
    clock.advance(0.001)  # the deadline itself: no longer pinned (now >= deadline)
    work = service.evict_once(clock())
    assert work is not None and work.evicted == 1 and not work.fallback
    assert gone(service, "PABC") == ["P"]
    assert stat(service, "evicted_soft_pinned") == 0  # it was ordinary when it went
    service.check()


def test_reads_never_extend_a_soft_pin() -> None:
    service, clock = make_service(default_kv_lease_ttl=1000, allow_evict_soft_pinned_objects=False)
    mount(service, "s", 2 * KIB)
    put(service, "P", KIB, soft_pin_action=ENABLE, soft_pin_ttl_ms=5000)
    deadline = T0 + 5
    for _ in range(4):
        clock.advance(1)
        read(service, "P")
        assert service.reads.exist_key("", "P") == 1
        assert service.put_end("w", "", "P") == OK  # a repeated end changes nothing either
        meta = service.object_of("", "P")
        assert meta is not None and meta.soft_pin_deadline == deadline
    clock.advance(1.5)  # past both the deadline and the last lease
    put(service, "A", KIB)
    put(service, "B", KIB)  # full: P is the oldest ordinary object now
    assert gone(service, ["P", "A", "B"]) == ["P"]
    service.check()


# --- eviction on the write path ----------------------------------------------------------------


def test_full_store_write_evicts_the_oldest_unpinned_objects_and_succeeds() -> None:
    service, _ = make_service()
    mount(service, "s", 4 * KIB)
    put_many(service, "ABCD", KIB)
    put(service, "E", KIB)
    assert gone(service, "ABCDE") == ["A"]
    stats = service.stats()
    assert (stats["sync_evictions"], stats["evicted_objects"], stats["evicted_bytes"]) == (
        1,
        1,
        KIB,
    )
    assert stats["alloc_failures"] == 0 and stats["allocated_bytes"] == 4 * KIB
    put(service, "F", 2 * KIB)  # needs two neighbours to go
    assert gone(service, "BCDEF") == ["B", "C"]
    assert stat(service, "sync_evictions") == 3
    # A batch evicts as it goes; keys of the batch in flight are never taken.
    results = service.batch_put_start("w", "", ["G", "H"], [2 * KIB, 2 * KIB], ReplicateConfig())
    assert [r.code for r in results] == [OK, OK]
    assert gone(service, "DEF") == ["D", "E", "F"]
    assert service.batch_put_end("w", "", ["G", "H"]) == [OK, OK]
    service.check()


def test_write_that_nothing_can_make_room_for_fails_and_schedules_a_pass() -> None:
    service, clock = make_service(default_kv_lease_ttl=1000)
    mount(service, "s", 64 * KIB)
    put_many(service, "AB", 16 * KIB)
    read(service, "A", "B")  # 50% used, everything leased
    assert service.start_eviction() is None  # below the watermark
    assert service.put_start("w", "", "C", 48 * KIB, ReplicateConfig()).code == NO_HANDLE
    assert stat(service, "alloc_failures") == 1
    assert stat(service, "evicted_objects") == 0
    # The failure makes the next background pass run even below the watermark.
    work = service.start_eviction()
    assert work is not None
    assert work.target == math.ceil(2 * 0.05) == 1
    clock.advance(2)  # the leases end before the pass runs
    assert service.continue_eviction(work, clock())
    assert work.evicted == 1
    assert gone(service, "AB") == ["A"]
    assert service.start_eviction() is None  # one failure, one pass
    put(service, "C", 48 * KIB)  # room now
    service.check()


def test_value_larger_than_every_segment_fails_without_evicting_anything() -> None:
    service, clock = make_service()
    mount(service, "s1", 64 * KIB)
    mount(service, "s2", 32 * KIB)
    put_many(service, "ABCD", 16 * KIB)
    result = service.put_start("w", "", "big", 64 * KIB + 1, ReplicateConfig())
    assert result.code == NO_HANDLE
    result = service.upsert_start("w", "", "A", 64 * KIB + 1, ReplicateConfig())
    assert result.code == NO_HANDLE
    assert present(service, "ABCD") == list("ABCD")
    assert stat(service, "evicted_objects") == 0
    assert service.start_eviction() is None  # evicting could never help
    put(service, "fits", 64 * KIB)  # exactly a segment: evicts what it needs
    service.check()


# --- groups ------------------------------------------------------------------------------------


def test_a_lease_on_one_member_protects_the_whole_group() -> None:
    service, clock = make_service(default_kv_lease_ttl=1000)
    mount(service, "s", 4 * KIB)
    put(service, "x", KIB, group_ids=["g"])
    read(service, "x")  # leases x (y is not a member yet)
    put(service, "y", KIB, group_ids=["g"])
    assert not service.is_leased("", "y")  # y itself is not leased
    put_many(service, "zw", KIB)
    put(service, "v", KIB)  # y is older than z, but its group is leased
    assert gone(service, "xyzwv") == ["z"]
    work = service.evict_once(clock())  # 100% used; still nothing of the group
    assert work is not None
    assert present(service, "xy") == ["x", "y"]
    service.check()


def test_eviction_takes_every_member_of_a_group_at_once() -> None:
    service, clock = make_service()
    mount(service, "s", 10 * KIB)
    put_many(service, ["a1", "a2", "a3"], KIB, group_ids=["A"])
    put(service, "h", KIB, group_ids=["A"], with_hard_pin=True)  # stays: hard pinned
    put_many(service, [f"k{i}" for i in range(6)], KIB)
    work = service.evict_once(clock())  # target 2: the oldest candidate brings its group
    assert work is not None and work.target == 2
    assert work.evicted == 3
    assert gone(service, ["a1", "a2", "a3", "h", "k0"]) == ["a1", "a2", "a3"]
    assert stat(service, "evicted_objects") == 3
    # A write too: one candidate, the whole group.
    put_many(service, ["b1", "b2"], KIB, group_ids=["B"])
    put(service, "k6", KIB)
    put(service, "big", 2 * KIB)
    assert gone(service, ["k0", "k1", "k2"]) == ["k0", "k1"]
    put(service, "big2", 2 * KIB)
    assert gone(service, ["k2", "k3", "k4"]) == ["k2", "k3"]
    service.check()


def test_a_read_of_one_member_keeps_the_whole_group_from_eviction() -> None:
    service, clock = make_service(default_kv_lease_ttl=1000)
    mount(service, "s", 4 * KIB)
    put_many(service, ["a", "b", "c"], KIB, group_ids=["g"])
    put(service, "solo", KIB)
    clock.advance(1)
    listed = service.reads.get_replica_list("", "b", "r")
    # Only b's bytes are being copied: the other members may be removed or replaced...
    assert not service.is_leased("", "a") and not service.is_leased("", "solo")
    assert upsert(service, "c", KIB).code == OK
    assert service.put_end("u", "", "c") == OK
    # ...but eviction takes groups whole, and b is being read.
    put(service, "d", KIB)
    assert gone(service, ["a", "b", "c", "solo"]) == ["solo"]
    assert service.reads.end_reads("r", [listed.read_id]) == [OK]
    put(service, "e", KIB)
    assert gone(service, ["a", "b", "c"]) == ["a", "b", "c"]
    service.check()


# --- slices ------------------------------------------------------------------------------------


def build_mixed_store(seed: int) -> tuple[MasterService, FakeClock, list[str]]:
    """200 1 KiB objects filling a 200 KiB segment: some leased, some soft pinned, some in
    flight, some in groups."""
    rng = random.Random(seed)
    service, clock = make_service(default_kv_lease_ttl=1000)
    mount(service, "s", 200 * KIB)
    keys = [f"k{i:03d}" for i in range(200)]
    for key in keys:
        roll = rng.random()
        config: dict[str, Any] = {}
        if roll < 0.1:
            config = {"soft_pin_action": ENABLE}
        elif roll < 0.2:
            config = {"group_ids": [rng.choice(["g0", "g1", "g2"])]}
        put(service, key, KIB, **config)
    for key in rng.sample(keys, 40):
        read(service, key)
    for key in rng.sample(keys, 10):
        if service.object_of("", key) is not None:
            upsert(service, key, KIB)  # may be busy: fine either way
    return service, clock, keys


@pytest.mark.parametrize("budget", [1, 16, 64])
def test_small_slices_finish_the_same_pass(monkeypatch: pytest.MonkeyPatch, budget: int) -> None:
    whole, clock = build_mixed_store(7)[:2]
    reference = whole.evict_once(clock())
    assert reference is not None and reference.evicted >= reference.target
    small_slices(monkeypatch, budget)
    sliced, sliced_clock, keys = build_mixed_store(7)
    work = sliced.start_eviction()
    assert work is not None
    slices = 1
    while not sliced.continue_eviction(work, sliced_clock()):
        slices += 1
        assert slices < 10_000, "eviction pass never finishes"
    assert (work.target, work.lower_bound, work.evicted) == (
        reference.target,
        reference.lower_bound,
        reference.evicted,
    )
    assert present(sliced, keys) == present(whole, keys)
    assert slices >= reference.evicted // budget
    sliced.check()
    whole.check()


def test_slices_reach_the_fallback_pass_too(monkeypatch: pytest.MonkeyPatch) -> None:
    small_slices(monkeypatch, 4)
    service, clock = make_service(default_kv_lease_ttl=1000)
    mount(service, "s", 4 * KIB)
    put_many(service, ["p0", "p1"], KIB, soft_pin_action=ENABLE)
    put(service, "u", KIB)
    put(service, "h", KIB, with_hard_pin=True)
    read(service, "u")
    work = run_pass(service, clock())  # 3 candidates, none ordinary: target 1, lower bound 1
    assert work is not None and work.fallback and work.done
    assert (work.target, work.lower_bound, work.evicted) == (1, 1, 1)
    assert gone(service, ["p0", "p1", "u", "h"]) == ["p0"]
    assert stat(service, "evicted_soft_pinned") == 1
    service.check()


def test_one_candidate_per_slice_does_not_starve(monkeypatch: pytest.MonkeyPatch) -> None:
    small_slices(monkeypatch, 1)
    service, clock = make_service()
    mount(service, "s", 100 * KIB)
    keys = [f"k{i:03d}" for i in range(100)]
    put_many(service, keys, KIB)
    work = service.start_eviction()
    assert work is not None and work.target == 15
    slices = 0
    while True:
        slices += 1
        if service.continue_eviction(work, clock()):
            break
        # Other calls get in between slices: new writes and reads.
        put(service, f"new{slices}", 64)
        read(service, keys[-1])
    assert slices == 15
    assert work.evicted == 15
    assert gone(service, keys) == keys[:15]
    service.check()


def test_a_pass_is_not_starved_by_protected_objects_at_the_front() -> None:
    """Regression (77ce56c): SKIP candidates kept their place at the front and every slice
    re-judged the same SLICE_BUDGET of them, so the pass evicted nothing and never ended."""
    service, clock = make_service()
    mount(service, "s", MIB)
    keys = [f"k{i:04d}" for i in range(1000)]
    results = service.batch_put_start("w", "", keys, [KIB] * len(keys), ReplicateConfig())
    assert {r.code for r in results} == {OK}
    assert service.batch_put_end("w", "", keys) == [OK] * len(keys)
    # The oldest SLICE_BUDGET + 88 objects are being rewritten (upsert in flight).
    rewriting = keys[: SLICE_BUDGET + 88]
    results = service.batch_upsert_start(
        "u", "", rewriting, [KIB] * len(rewriting), ReplicateConfig()
    )
    assert {r.code for r in results} == {OK}
    work = service.start_eviction()  # 97.7% used
    assert work is not None and work.target == 127
    finished = False
    for _ in range(100):
        if service.continue_eviction(work, clock()):
            finished = True
            break
    service.check()
    assert work.evicted >= work.target, f"evicted {work.evicted} in 100 slices"
    assert finished


@pytest.mark.parametrize("allow", [True, False])
def test_a_pass_over_many_soft_pinned_objects_finishes(allow: bool) -> None:
    """Regression (77ce56c): with a budget's worth of soft-pinned candidates the ordinary
    stage never ended, so the pass neither reached the fallback nor finished."""
    service, clock = make_service(allow_evict_soft_pinned_objects=allow)
    mount(service, "s", MIB)
    keys = [f"k{i:04d}" for i in range(1000)]  # every candidate soft pinned (30 min)
    config = ReplicateConfig(soft_pin_action=ENABLE)
    assert {r.code for r in service.batch_put_start("w", "", keys, [KIB] * 1000, config)} == {OK}
    assert service.batch_put_end("w", "", keys) == [OK] * 1000
    work = service.start_eviction()  # 97.7% used
    assert work is not None and (work.target, work.lower_bound) == (127, 77)
    finished = False
    for _ in range(100):
        if service.continue_eviction(work, clock()):
            finished = True
            break
    service.check()
    assert finished, f"not finished after 100 slices: {work}"
    # The fallback takes the lower bound, oldest first; without it nothing may go.
    assert work.fallback
    assert work.evicted == (77 if allow else 0)


# --- upsert ------------------------------------------------------------------------------------


def test_upsert_of_an_absent_key_creates_it() -> None:
    service, _ = make_service()
    mount(service, "s", 64 * KIB)
    result = upsert(service, "k", 1000, soft_pin_action=ENABLE, soft_pin_ttl_ms=5000)
    assert result.code == OK and len(result.replicas) == 1
    assert result.replicas[0].status == ReplicaStatus.PROCESSING
    assert service.reads.get_replica_list("", "k").code == ErrorCode.REPLICA_IS_NOT_READY
    assert service.put_end("u", "", "k") == OK
    listed = service.reads.get_replica_list("", "k")
    assert listed.code == OK and listed.size == 1000
    meta = service.object_of("", "k")
    assert meta is not None and meta.soft_pin_deadline == T0 + 5
    assert stat(service, "allocated_bytes") == rounded(1000)
    service.check()


def test_upsert_of_the_same_size_rewrites_in_place() -> None:
    service, _ = make_service()
    mount(service, "s1", 64 * KIB)
    mount(service, "s2", 64 * KIB)
    original = put(service, "k", 1000, replica_num=2)
    put(service, "other", 1000)
    before = stat(service, "allocated_bytes")
    result = upsert(service, "k", 1000)
    assert result.code == OK
    assert result.replicas == original.replicas  # the same descriptors, PROCESSING again
    assert service.reads.get_replica_list("", "k").code == ErrorCode.REPLICA_IS_NOT_READY
    assert service.reads.exist_key("", "k") == 0
    assert service.remove("", "k", force=True) == ErrorCode.REPLICA_IS_NOT_READY
    assert stat(service, "allocated_bytes") == before
    assert service.put_end("w", "", "k") == ErrorCode.ILLEGAL_CLIENT  # the upserter owns it
    assert service.put_end("u", "", "k") == OK
    listed = service.reads.get_replica_list("", "k")
    assert listed.code == OK
    assert [(r.id, r.segment_id, r.offset) for r in listed.replicas] == [
        (r.id, r.segment_id, r.offset) for r in original.replicas
    ]
    assert all(r.status == ReplicaStatus.COMPLETE for r in listed.replicas)
    service.check()


@pytest.mark.parametrize("new_size", [4000, 100])
def test_upsert_of_a_new_size_gets_new_replicas_and_frees_the_old(new_size: int) -> None:
    service, _ = make_service()
    mount(service, "s", 64 * KIB)
    original = put(service, "k", 1000)
    result = upsert(service, "k", new_size)
    assert result.code == OK and len(result.replicas) == 1
    assert result.replicas[0].id != original.replicas[0].id
    assert result.replicas[0].size == new_size
    assert stat(service, "allocated_bytes") == rounded(new_size)  # the old bytes are free
    assert stat(service, "objects") == 1
    assert service.reads.get_replica_list("", "k").code == ErrorCode.REPLICA_IS_NOT_READY
    assert service.put_end("u", "", "k") == OK
    listed = service.reads.get_replica_list("", "k")
    assert listed.code == OK and listed.size == new_size
    assert listed.replicas[0].offset == result.replicas[0].offset
    service.check()


def test_upsert_to_a_new_size_in_a_full_store_evicts_others_not_itself() -> None:
    service, _ = make_service()
    mount(service, "s", 4 * KIB)
    put_many(service, "ABCD", KIB)
    result = upsert(service, "A", 2 * KIB)  # B and C make the room; A keeps its identity
    assert result.code == OK
    assert gone(service, "ABCD") == ["B", "C"]
    assert stat(service, "evicted_objects") == 2
    assert service.put_end("u", "", "A") == OK
    assert service.reads.get_replica_list("", "A").size == 2 * KIB
    service.check()


@pytest.mark.parametrize("new_size", [1000, 2000])
def test_upsert_under_a_reader_writes_new_replicas_and_keeps_the_old_bytes(new_size: int) -> None:
    service, clock = make_service(default_kv_lease_ttl=1000)
    mount(service, "s", 64 * KIB)
    original = put(service, "k", 1000)
    reading = service.reads.get_replica_list("", "k", "r")
    result = upsert(service, "k", new_size)
    assert result.code == OK
    old_offsets = {r.offset for r in original.replicas}
    assert not old_offsets & {r.offset for r in result.replicas}  # never over the reader
    assert stat(service, "retired_buffers") == 1
    assert service.reads.get_replica_list("", "k", "r2").code == ErrorCode.REPLICA_IS_NOT_READY
    assert service.put_end("u", "", "k", result.write_id) == OK
    listed = service.reads.get_replica_list("", "k", "r2")
    assert listed.size == new_size and listed.replicas[0].offset == result.replicas[0].offset
    assert service.reads.end_reads("r2", [listed.read_id]) == [OK]
    # The old bytes come back when their reader is done, not at the TTL.
    used = stat(service, "allocated_bytes")
    assert service.reads.end_reads("r", [reading.read_id]) == [OK]
    assert stat(service, "allocated_bytes") == used - rounded(1000)
    assert stat(service, "retired_buffers") == 0
    service.check()


def test_upsert_of_an_unread_same_size_object_rewrites_it_in_place() -> None:
    service, _ = make_service()
    mount(service, "s", 64 * KIB)
    original = put(service, "k", 1000)
    result = upsert(service, "k", 1000)
    assert result.code == OK and result.replicas[0].offset == original.replicas[0].offset
    assert service.put_end("u", "", "k", result.write_id) == OK
    service.check()


def test_upsert_preempts_an_unfinished_put_at_once() -> None:
    service, clock = make_service(
        put_start_discard_timeout_sec=30, put_start_release_timeout_sec=600
    )
    mount(service, "s", 64 * KIB)
    start(service, "k", 1000, client="slow")
    clock.advance(1)  # far younger than the discard timeout
    result = upsert(service, "k", 2000, client="fast")
    assert result.code == OK
    # The slow writer may still be copying: its buffer waits for it to stop.
    assert stat(service, "preempted_buffers") == 1
    assert stat(service, "allocated_bytes") == rounded(1000) + rounded(2000)
    assert service.put_end("slow", "", "k") == ErrorCode.ILLEGAL_CLIENT
    # An unfinished upsert loses the same way.
    result = upsert(service, "k", 2000, client="faster")
    assert result.code == OK
    assert stat(service, "preempted_buffers") == 2
    assert service.put_end("fast", "", "k") == ErrorCode.ILLEGAL_CLIENT
    assert service.put_end("faster", "", "k") == OK
    assert service.reads.get_replica_list("", "k").size == 2000
    assert service.sweep_expired_puts(clock() + 598) == 0
    assert service.sweep_expired_puts(clock() + 600) == 2
    assert stat(service, "allocated_bytes") == rounded(2000)
    service.check()


def test_upsert_cannot_change_the_group() -> None:
    service, _ = make_service()
    mount(service, "s", 64 * KIB)
    put(service, "a", 100, group_ids=["g"])
    put(service, "solo", 100)
    bad = ReplicateConfig(group_ids=["h"])
    assert service.upsert_start("u", "", "a", 100, bad).code == ErrorCode.INVALID_PARAMS
    leave = ReplicateConfig(group_ids=[""])
    assert service.upsert_start("u", "", "a", 100, leave).code == ErrorCode.INVALID_PARAMS
    join = ReplicateConfig(group_ids=["g"])
    assert service.upsert_start("u", "", "solo", 100, join).code == ErrorCode.INVALID_PARAMS
    assert stat(service, "preempted_buffers") == 0
    assert upsert(service, "a", 200).code == OK  # no group given: keeps its group
    assert service.put_end("u", "", "a") == OK
    assert service.upsert_start("u", "", "a", 100, join).code == OK  # the same group is fine
    assert service.put_end("u", "", "a") == OK
    assert service.upsert_start("u", "", "new", 100, join).code == OK  # absent: joins
    meta = service.object_of("", "a")
    assert meta is not None and meta.group_id == "g"
    meta = service.object_of("", "new")
    assert meta is not None and meta.group_id == "g"
    service.check()


@pytest.mark.parametrize("new_size", [1000, 3000])
def test_upsert_keeps_the_hard_pin_and_a_live_soft_pin(new_size: int) -> None:
    service, clock = make_service()
    mount(service, "s", 64 * KIB)
    put(service, "hard", 1000, with_hard_pin=True)
    put(service, "soft", 1000, soft_pin_action=ENABLE, soft_pin_ttl_ms=60_000)
    put(service, "plain", 1000)
    clock.advance(10)
    for key in ("hard", "soft"):
        assert upsert(service, key, new_size).code == OK  # PRESERVE, no hard pin asked
        assert service.put_end("u", "", key) == OK
    hard = service.object_of("", "hard")
    soft = service.object_of("", "soft")
    assert hard is not None and hard.hard_pinned
    assert soft is not None and soft.soft_pin_deadline == T0 + 60 and not soft.hard_pinned
    # A hard pin is ORed in, and takes the object out of eviction at once.
    candidates = stat(service, "eviction_candidates")
    assert upsert(service, "plain", new_size, with_hard_pin=True).code == OK
    assert stat(service, "eviction_candidates") == candidates - 1
    assert service.put_end("u", "", "plain") == OK
    plain = service.object_of("", "plain")
    assert plain is not None and plain.hard_pinned
    # An explicit action replaces the soft pin at the end of the write.
    assert (
        upsert(service, "soft", new_size, soft_pin_action=ENABLE, soft_pin_ttl_ms=5000).code == OK
    )
    soft = service.object_of("", "soft")
    assert soft is not None and soft.soft_pin_deadline == T0 + 60  # pending until the end
    assert service.put_end("u", "", "soft") == OK
    soft = service.object_of("", "soft")
    assert soft is not None and soft.soft_pin_deadline == T0 + 15
    assert upsert(service, "soft", new_size, soft_pin_action=SoftPinAction.DISABLE).code == OK
    assert service.put_end("u", "", "soft") == OK
    soft = service.object_of("", "soft")
    assert soft is not None and soft.soft_pin_deadline == 0.0
    service.check()


def test_upsert_preempting_a_stuck_write_keeps_its_pins() -> None:
    service, clock = make_service()
    mount(service, "s", 64 * KIB)
    put(service, "k", 1000, with_hard_pin=True, soft_pin_action=ENABLE, soft_pin_ttl_ms=60_000)
    assert upsert(service, "k", 1000, client="stuck").code == OK  # never ended
    clock.advance(1)
    assert upsert(service, "k", 2000, client="u").code == OK
    assert service.put_end("u", "", "k") == OK
    meta = service.object_of("", "k")
    assert meta is not None and meta.hard_pinned and meta.soft_pin_deadline == T0 + 60
    service.check()


@pytest.mark.parametrize("new_size", [1000, 3000])
def test_revoking_an_upsert_drops_the_object(new_size: int) -> None:
    service, _ = make_service()
    mount(service, "s", 64 * KIB)
    put(service, "k", 1000)
    assert upsert(service, "k", new_size).code == OK
    assert service.put_revoke("w", "", "k") == ErrorCode.ILLEGAL_CLIENT
    assert service.put_revoke("u", "", "k") == OK
    # The old bytes may already be overwritten: the object is gone, its memory free.
    assert service.reads.get_replica_list("", "k").code == ErrorCode.OBJECT_NOT_FOUND
    assert stat(service, "allocated_bytes") == 0
    assert stat(service, "eviction_candidates") == 0
    assert service.put_revoke("u", "", "k") == ErrorCode.OBJECT_NOT_FOUND
    service.check()


# --- defects: regressions ----------------------------------------------------------------------


def test_a_write_evicts_an_expired_soft_pin_in_lru_order() -> None:
    service, clock = make_service()
    mount(service, "s", 4 * KIB)
    put(service, "A", KIB, soft_pin_action=ENABLE, soft_pin_ttl_ms=5000)
    put_many(service, "BCD", KIB)
    put(service, "E", KIB)  # full: B goes (A is pinned)
    assert gone(service, "ABCDE") == ["B"]
    clock.advance(10)  # A's pin is over: A is the least recently used object
    put(service, "F", KIB)
    service.check()
    assert gone(service, "ACDEF") == ["A"]


def test_a_small_write_evicts_in_lru_order_after_a_big_one() -> None:
    service, _ = make_service()
    mount(service, "small", 4 * KIB)
    mount(service, "big", 8 * KIB)
    olds = [f"s{i}" for i in range(4)]
    bigs = [f"b{i}" for i in range(8)]
    for key in olds:
        put(service, key, KIB, preferred_segment="name-small")
    for key in bigs:
        put(service, key, KIB, preferred_segment="name-big")
    put(service, "Y", 6 * KIB)  # fits only the big segment: b0..b5 go, s0..s3 are passed over
    assert gone(service, olds + bigs) == bigs[:6]
    put(service, "Z", KIB)  # s0 is now the least recently used object, and Z fits there
    service.check()
    assert gone(service, olds + bigs) == ["s0", *bigs[:6]]


def test_a_rejected_upsert_changes_nothing() -> None:
    """Regression (77ce56c): upsert_start ORed with_hard_pin into the object (and took it out of
    the eviction policy) before allocating, so a rejected upsert left it hard pinned."""
    service, _ = make_service()
    mount(service, "s", 64 * KIB)
    put(service, "B", 16 * KIB)
    result = upsert(service, "B", 64 * KIB + 1, with_hard_pin=True)  # can never fit
    assert result.code == NO_HANDLE
    meta = service.object_of("", "B")
    assert meta is not None and not meta.hard_pinned
    assert stat(service, "eviction_candidates") == 1
    assert service.reads.get_replica_list("", "B").code == OK
    service.check()


def test_an_expired_soft_pin_is_evicted_in_lru_order() -> None:
    """Regression (77ce56c): a soft-pinned object went to a side queue and stayed there after
    its pin expired, so newer objects were evicted before it."""
    service, clock = make_service(eviction_high_watermark_ratio=0.5)
    mount(service, "s", 64 * KIB)
    put(service, "A", 10 * KIB, soft_pin_action=ENABLE, soft_pin_ttl_ms=5000)
    for key in "BCD":
        clock.advance(1)
        put(service, key, 10 * KIB)
    work = service.evict_once(clock())  # 62.5% used: one goes, and it is not A (pinned)
    assert work is not None and work.evicted == 1
    assert gone(service, "ABCD") == ["B"]
    clock.advance(10)  # A's pin is over: A is now the least recently used object
    put(service, "E", 10 * KIB)
    work = service.evict_once(clock())
    assert work is not None and work.evicted == 1
    service.check()
    assert gone(service, "ACDE") == ["A"]


def test_a_pass_with_a_zero_target_evicts_nothing() -> None:
    """Regression (77ce56c): run_slice evicted before comparing with the goal, so a pass with
    target 0 (eviction_ratio=0 after a failed write below the watermark) evicted one object."""
    service, clock = make_service(eviction_ratio=0.0, default_kv_lease_ttl=1000)
    mount(service, "s", 64 * KIB)
    put_many(service, "AB", 16 * KIB)
    read(service, "A", "B")
    assert service.put_start("w", "", "C", 48 * KIB, ReplicateConfig()).code == NO_HANDLE
    clock.advance(2)
    work = run_pass(service, clock())
    service.check()
    assert work is None or work.target == 0
    assert stat(service, "evicted_objects") == 0


def test_a_failing_write_does_not_flush_segments_that_could_never_hold_it() -> None:
    """Regression (77ce56c): a write evicted in LRU order wherever candidates lived, so one that
    still failed had thrown away every object of segments too small to ever hold it."""
    service, _ = make_service(default_kv_lease_ttl=1000)
    mount(service, "small", 64 * KIB)
    mount(service, "big", MIB)
    assert (
        service.put_start(
            "w", "", "L", 600 * KIB, ReplicateConfig(preferred_segment="name-big")
        ).code
        == OK
    )
    assert service.put_end("w", "", "L") == OK
    small = [f"s{i:02d}" for i in range(16)]
    for key in small:
        result = service.put_start(
            "w", "", key, 4 * KIB, ReplicateConfig(preferred_segment="name-small")
        )
        assert result.code == OK and result.replicas[0].segment_id == "small"
        assert service.put_end("w", "", key) == OK
    read(service, "L")
    assert service.put_start("w", "", "V", 500 * KIB, ReplicateConfig()).code == NO_HANDLE
    service.check()
    assert gone(service, small) == []


def test_a_write_evicts_no_more_than_it_needs() -> None:
    """Regression (77ce56c): the allocation was retried only once the evicted bytes added up
    to the value's size, ignoring the free space around them (32 evictions instead of 1)."""
    service, _ = make_service()
    mount(service, "s", 64 * KIB)
    keys = [f"k{i:02d}" for i in range(64)]
    put_many(service, keys, KIB)  # k00 at offset 0, k01 at 1 KiB, ...
    for key in keys[1:32]:
        assert service.remove("", key) == OK  # 31 KiB free right after k00
    result = put(service, "V", 32 * KIB)  # evicting k00, the oldest, makes room
    assert result.replicas[0].offset == 0
    service.check()
    assert gone(service, keys[32:]) == []
    assert stat(service, "evicted_objects") == 1
