"""Randomized allocate/free stress test of the offset allocator against a shadow model."""

from __future__ import annotations

import random

import pytest

from mooncake_py.master.state.allocator import OffsetAllocator

OPS = 5000
CHECK_EVERY = 1


def _assert_disjoint(shadow: dict[int, int], usable: int) -> None:
    end = 0
    for off in sorted(shadow):
        if off < end:
            raise AssertionError(f"allocation at {off} overlaps one ending at {end}")
        end = off + shadow[off]
    if end > usable:
        raise AssertionError(f"allocation ends at {end}, past usable capacity {usable}")


@pytest.mark.parametrize(
    ("seed", "capacity", "alignment"),
    [(1, 1 << 20, 64), (7, (1 << 20) + 100, 256), (42, 3 * (1 << 18) - 1, 1)],
)
def test_random_allocate_free_matches_shadow(seed: int, capacity: int, alignment: int) -> None:
    rng = random.Random(seed)
    alloc = OffsetAllocator(capacity, alignment=alignment)
    usable = alloc.usable_capacity
    assert usable == capacity - capacity % alignment
    shadow: dict[int, int] = {}
    live: list[int] = []
    failures = 0

    for step in range(OPS):
        # Bias toward allocation until the segment fills up, so both full and
        # fragmented states are exercised.
        if live and (rng.random() < 0.45 or alloc.free_bytes < usable // 8):
            off = live.pop(rng.randrange(len(live)))
            assert alloc.free(off) == shadow.pop(off)
        else:
            # Mostly small requests with an occasional large one.
            hi = usable // 4 if rng.random() < 0.05 else 8 * 1024
            size = rng.randint(1, hi)
            rounded = -(-size // alignment) * alignment
            largest = alloc.largest_free_block
            off = alloc.allocate(size)
            if off is None:
                failures += 1
                assert largest < rounded
            else:
                assert largest >= rounded
                assert off % alignment == 0
                assert off not in shadow
                assert alloc.size_of(off) == rounded
                shadow[off] = rounded
                live.append(off)

        assert alloc.allocation_count == len(shadow)
        assert alloc.used_bytes == sum(shadow.values())
        assert alloc.free_bytes == usable - alloc.used_bytes
        if step % CHECK_EVERY == 0:
            alloc.check()
            _assert_disjoint(shadow, usable)

    alloc.check()
    _assert_disjoint(shadow, usable)
    assert failures > 0, "the workload never filled the segment"

    for off in live:
        assert alloc.free(off) == shadow.pop(off)
    alloc.check()
    assert alloc.allocation_count == 0
    assert alloc.used_bytes == 0
    assert alloc.free_bytes == usable
    assert alloc.largest_free_block == usable
