"""The eviction order's blocks (:class:`LeaseOrderedLRU`): a seeded stress test against a
plain model (candidates sorted by their last access), with ``check()`` after every event, and
the bounds the blocks keep: stale entries are compacted away, emptied blocks go, small ones
merge, so the order's length stays within a small factor of the candidates'."""

from __future__ import annotations

import random
from collections.abc import Hashable

import pytest

from mooncake_py.master.state import lru as lru_module
from mooncake_py.master.state.lru import LeaseOrderedLRU, Verdict


def entries(lru: LeaseOrderedLRU) -> int:
    return sum(len(block) for block in lru._blocks)  # noqa: SLF001


class Model:
    """Candidates and their last access, the plain way."""

    def __init__(self) -> None:
        self.clock = 0
        self.access: dict[str, int] = {}

    def touch(self, key: str, create: bool) -> None:
        if create or key in self.access:
            self.clock += 1
            self.access[key] = self.clock

    def order(self) -> list[str]:
        return sorted(self.access, key=self.access.__getitem__)


@pytest.mark.parametrize("seed", range(6))
def test_the_order_follows_accesses_through_compactions_and_merges(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small blocks, so that a few thousand events cross every path (append to a new block,
    # compact, merge, drop an emptied block) many times.
    monkeypatch.setattr(lru_module, "BLOCK_ENTRIES", 16)
    monkeypatch.setattr(lru_module, "_COMPACT_FROM", 4)
    rng = random.Random(seed)
    lru, model = LeaseOrderedLRU(), Model()
    keys = [f"k{i}" for i in range(rng.choice((5, 40, 200)))]
    hot = keys[: max(1, len(keys) // 10)]
    for step in range(3000):
        roll = rng.random()
        key = rng.choice(hot if rng.random() < 0.6 else keys)
        if roll < 0.35:
            lru.on_created(key)
            model.touch(key, create=True)
        elif roll < 0.75:
            lru.on_touched(key)
            model.touch(key, create=False)
        else:
            lru.on_removed(key)
            model.access.pop(key, None)
        lru.check(set(model.access))
        assert [r.object_id for r in lru.records()] == model.order()
        assert len(lru) == len(model.access)
        # Stale entries never outnumber live ones by more than 3 to 1 per block, plus the
        # short blocks' few.
        assert entries(lru) <= 4 * len(lru) + 4 * len(lru._blocks) + 16  # noqa: SLF001
        if step % 50 == 0:
            order = model.order()
            after = -1
            if order and rng.random() < 0.5:
                after = lru._records(rng.choice(order)).lru_stamp  # noqa: SLF001
            skip = set(rng.sample(order, len(order) // 3))
            limit, want = rng.randint(0, 30), rng.randint(1, 30)
            seen: list[Hashable] = []

            def judge(
                object_id: Hashable, seen: list[Hashable] = seen, skip: set[str] = skip
            ) -> Verdict:
                seen.append(object_id)
                return Verdict.SKIP if object_id in skip else Verdict.EVICT

            selection = lru.select(judge, want, limit, after)
            stamps = {k: lru._records(k).lru_stamp for k in order}  # noqa: SLF001
            later = [k for k in order if stamps[k] > after]
            expected_seen: list[str] = []
            victims: list[str] = []
            for candidate in later:
                if len(expected_seen) >= limit or len(victims) >= want:
                    break
                expected_seen.append(candidate)
                if candidate not in skip:
                    victims.append(candidate)
            assert seen == expected_seen
            assert selection.victims == victims
            assert selection.examined == len(expected_seen)
            assert selection.exhausted == (len(expected_seen) == len(later))


def test_blocks_stay_bounded_under_a_hot_set() -> None:
    """A million accesses to a hundred keys among a hundred thousand leave the order about as
    long as the candidates: each access leaves a stale entry behind, which compaction and the
    dropping of emptied blocks take away."""
    lru = LeaseOrderedLRU()
    keys = [f"k{i}" for i in range(100_000)]
    for key in keys:
        lru.on_created(key)
    rng = random.Random(1)
    hot = rng.sample(keys, 100)
    for _ in range(10):
        for _ in range(10_000):
            lru.on_touched(rng.choice(hot))
    lru.check(set(keys))
    assert entries(lru) <= len(keys) + 2 * lru_module.BLOCK_ENTRIES
    assert len(lru._blocks) <= len(keys) // lru_module.BLOCK_ENTRIES + 3  # noqa: SLF001


def test_check_detects_a_wrong_live_count() -> None:
    lru = LeaseOrderedLRU()
    for key in "abc":
        lru.on_created(key)
    lru._live[0] += 1  # noqa: SLF001
    with pytest.raises(AssertionError, match="live"):
        lru.check({"a", "b", "c"})
