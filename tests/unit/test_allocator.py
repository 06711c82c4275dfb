"""Unit tests for the best-fit offset allocator."""

from __future__ import annotations

import pytest

from mooncake_py.master.state.allocator import OffsetAllocator

KIB = 1024


def test_initial_state() -> None:
    alloc = OffsetAllocator(64 * KIB)
    assert alloc.capacity == 64 * KIB
    assert alloc.usable_capacity == 64 * KIB
    assert alloc.alignment == 64
    assert alloc.used_bytes == 0
    assert alloc.free_bytes == 64 * KIB
    assert alloc.largest_free_block == 64 * KIB
    assert alloc.allocation_count == 0
    alloc.check()


def test_allocation_that_fits_exactly() -> None:
    alloc = OffsetAllocator(4 * KIB)
    assert alloc.allocate(4 * KIB) == 0
    assert alloc.free_bytes == 0
    assert alloc.largest_free_block == 0
    assert alloc.allocate(1) is None
    alloc.check()
    assert alloc.free(0) == 4 * KIB
    assert alloc.allocate(4 * KIB) == 0


@pytest.mark.parametrize(
    ("size", "alignment", "rounded"),
    [(1, 64, 64), (64, 64, 64), (65, 64, 128), (100, 1, 100), (4097, 4096, 8192)],
)
def test_sizes_round_up_to_alignment(size: int, alignment: int, rounded: int) -> None:
    alloc = OffsetAllocator(1 << 20, alignment=alignment)
    off = alloc.allocate(size)
    assert off is not None
    assert alloc.size_of(off) == rounded
    assert alloc.used_bytes == rounded
    second = alloc.allocate(size)
    assert second == off + rounded
    assert second % alignment == 0
    alloc.check()


def test_unaligned_capacity_tail_is_not_allocatable() -> None:
    alloc = OffsetAllocator(1000, alignment=256)
    assert alloc.capacity == 1000
    assert alloc.usable_capacity == 768
    assert alloc.free_bytes == 768
    assert alloc.largest_free_block == 768
    alloc.check()
    assert alloc.allocate(769) is None
    assert alloc.allocate(768) == 0
    assert alloc.allocate(1) is None
    alloc.check()


def test_capacity_below_alignment_has_nothing_allocatable() -> None:
    alloc = OffsetAllocator(10, alignment=64)
    assert alloc.usable_capacity == 0
    assert alloc.free_bytes == 0
    assert alloc.largest_free_block == 0
    assert alloc.allocate(1) is None
    alloc.check()


def test_best_fit_picks_smallest_sufficient_hole() -> None:
    alloc = OffsetAllocator(64 * KIB, alignment=64)
    # Holes of 4 KiB at 0, 1 KiB at 5 KiB and 2 KiB at 7 KiB, separated by live blocks.
    offs = [alloc.allocate(n * KIB) for n in (4, 1, 1, 1, 2, 1)]
    assert offs == [0, 4 * KIB, 5 * KIB, 6 * KIB, 7 * KIB, 9 * KIB]
    for off in (0, 5 * KIB, 7 * KIB):
        alloc.free(off)
    alloc.check()
    assert alloc.allocate(2 * KIB) == 7 * KIB
    assert alloc.allocate(KIB) == 5 * KIB
    assert alloc.allocate(3 * KIB) == 0
    alloc.check()


def test_best_fit_ties_prefer_lowest_offset() -> None:
    alloc = OffsetAllocator(16 * KIB, alignment=64)
    offs = [alloc.allocate(KIB) for _ in range(6)]
    assert None not in offs
    alloc.free(4 * KIB)
    alloc.free(2 * KIB)
    alloc.free(0)
    assert alloc.allocate(KIB) == 0
    assert alloc.allocate(KIB) == 2 * KIB
    assert alloc.allocate(KIB) == 4 * KIB


def test_allocations_never_overlap() -> None:
    alloc = OffsetAllocator(32 * KIB, alignment=64)
    ranges = []
    for size in (100, 64, 1, 1000, 4096, 63, 65, 2000):
        off = alloc.allocate(size)
        assert off is not None
        ranges.append((off, off + alloc.size_of(off)))
    ranges.sort()
    for (_, end), (start, _) in zip(ranges, ranges[1:], strict=False):
        assert end <= start
    alloc.check()


def test_free_coalesces_with_both_neighbours() -> None:
    alloc = OffsetAllocator(4 * KIB, alignment=64)
    a, b, c, d = (alloc.allocate(KIB) for _ in range(4))
    assert (a, b, c, d) == (0, KIB, 2 * KIB, 3 * KIB)
    alloc.free(a)
    alloc.free(c)
    assert alloc.largest_free_block == KIB
    alloc.check()
    # Freeing the middle block joins the free ranges on both sides.
    alloc.free(b)
    assert alloc.largest_free_block == 3 * KIB
    alloc.check()
    alloc.free(d)
    assert alloc.largest_free_block == 4 * KIB
    assert alloc.allocate(4 * KIB) == 0


def test_free_coalesces_with_left_neighbour_only() -> None:
    alloc = OffsetAllocator(3 * KIB, alignment=64)
    a, b, c = (alloc.allocate(KIB) for _ in range(3))
    assert c is not None
    alloc.free(a)
    alloc.free(b)
    assert alloc.largest_free_block == 2 * KIB
    alloc.check()
    assert alloc.allocate(2 * KIB) == 0


def test_free_coalesces_with_right_neighbour_only() -> None:
    alloc = OffsetAllocator(3 * KIB, alignment=64)
    a, b, c = (alloc.allocate(KIB) for _ in range(3))
    assert a is not None
    alloc.free(c)
    alloc.free(b)
    assert alloc.largest_free_block == 2 * KIB
    alloc.check()
    assert alloc.allocate(2 * KIB) == KIB


def test_free_coalesces_with_trailing_remainder() -> None:
    alloc = OffsetAllocator(8 * KIB, alignment=64)
    a = alloc.allocate(KIB)
    b = alloc.allocate(KIB)
    assert (a, b) == (0, KIB)
    alloc.free(b)
    assert alloc.largest_free_block == 7 * KIB
    alloc.free(a)
    assert alloc.largest_free_block == 8 * KIB
    alloc.check()


def test_exhaustion_returns_none_and_recovers() -> None:
    alloc = OffsetAllocator(4 * KIB, alignment=64)
    offs = [alloc.allocate(KIB) for _ in range(4)]
    assert None not in offs
    assert alloc.allocate(1) is None
    assert alloc.allocate(KIB) is None
    alloc.free(2 * KIB)
    assert alloc.allocate(KIB + 1) is None
    assert alloc.allocate(KIB) == 2 * KIB


def test_fragmented_space_cannot_satisfy_large_request() -> None:
    alloc = OffsetAllocator(4 * KIB, alignment=64)
    offs = [alloc.allocate(KIB) for _ in range(4)]
    alloc.free(0)
    alloc.free(2 * KIB)
    assert offs[0] == 0
    assert alloc.free_bytes == 2 * KIB
    assert alloc.largest_free_block == KIB
    assert alloc.allocate(2 * KIB) is None


def test_double_free_raises_key_error() -> None:
    alloc = OffsetAllocator(4 * KIB)
    off = alloc.allocate(100)
    assert off is not None
    alloc.free(off)
    with pytest.raises(KeyError):
        alloc.free(off)
    alloc.check()


@pytest.mark.parametrize("offset", [64, 1, -64, 1 << 40])
def test_free_or_size_of_unknown_offset_raises_key_error(offset: int) -> None:
    alloc = OffsetAllocator(4 * KIB)
    assert alloc.allocate(128) == 0
    with pytest.raises(KeyError):
        alloc.free(offset)
    with pytest.raises(KeyError):
        alloc.size_of(offset)
    alloc.check()


@pytest.mark.parametrize("capacity", [0, -1])
def test_non_positive_capacity_raises(capacity: int) -> None:
    with pytest.raises(ValueError):
        OffsetAllocator(capacity)


@pytest.mark.parametrize("alignment", [0, -64, 3, 48, 100])
def test_non_power_of_two_alignment_raises(alignment: int) -> None:
    with pytest.raises(ValueError):
        OffsetAllocator(4 * KIB, alignment=alignment)


@pytest.mark.parametrize("size", [0, -1])
def test_non_positive_size_raises(size: int) -> None:
    alloc = OffsetAllocator(4 * KIB)
    with pytest.raises(ValueError):
        alloc.allocate(size)
    alloc.check()


def test_counters_track_allocations() -> None:
    alloc = OffsetAllocator(64 * KIB, alignment=64)
    a = alloc.allocate(100)
    b = alloc.allocate(1000)
    assert a is not None and b is not None
    assert alloc.allocation_count == 2
    assert alloc.used_bytes == 128 + 1024
    assert alloc.free_bytes == 64 * KIB - 128 - 1024
    assert alloc.free(a) == 128
    assert alloc.allocation_count == 1
    assert alloc.used_bytes == 1024
    assert alloc.free(b) == 1024
    assert alloc.allocation_count == 0
    assert alloc.used_bytes == 0
    assert alloc.free_bytes == 64 * KIB
    assert alloc.largest_free_block == 64 * KIB


def _two_blocks() -> OffsetAllocator:
    alloc = OffsetAllocator(4 * KIB, alignment=64)
    assert alloc.allocate(KIB) == 0
    assert alloc.allocate(KIB) == KIB
    alloc.check()
    return alloc


def test_check_detects_stale_used_counter() -> None:
    alloc = _two_blocks()
    alloc._used += 64
    with pytest.raises(AssertionError, match="used_bytes"):
        alloc.check()


def test_check_detects_index_disagreement() -> None:
    alloc = _two_blocks()
    alloc._free_by_size.add((64, 3 * KIB))
    with pytest.raises(AssertionError):
        alloc.check()


def test_check_detects_overlapping_allocation() -> None:
    alloc = _two_blocks()
    alloc._allocations[512] = 1024
    alloc._used += 1024
    with pytest.raises(AssertionError):
        alloc.check()


def test_check_detects_allocation_inside_free_range() -> None:
    alloc = _two_blocks()
    alloc._allocations[3 * KIB] = 64
    alloc._used += 64
    with pytest.raises(AssertionError):
        alloc.check()


def test_check_detects_uncoalesced_free_ranges() -> None:
    alloc = _two_blocks()
    alloc._remove_free(2 * KIB, 2 * KIB)
    alloc._insert_free(2 * KIB, KIB)
    alloc._insert_free(3 * KIB, KIB)
    with pytest.raises(AssertionError, match="coalesced"):
        alloc.check()


def test_check_detects_unaccounted_gap() -> None:
    alloc = _two_blocks()
    del alloc._allocations[KIB]
    alloc._used -= KIB
    with pytest.raises(AssertionError, match="neither free nor allocated"):
        alloc.check()


def test_check_detects_range_past_usable_end() -> None:
    alloc = _two_blocks()
    alloc._remove_free(2 * KIB, 2 * KIB)
    alloc._insert_free(2 * KIB, 3 * KIB)
    with pytest.raises(AssertionError):
        alloc.check()
