"""The disk tier store on real files: round trips, refusals, directory claims, reopening, torn
and corrupt files (never served, gone after a scan), concurrency, and a seeded stress run
against a model with the store's own invariant check."""

from __future__ import annotations

import array
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mooncake_py.client.disk_format import FIXED, file_name
from mooncake_py.client.disk_store import DiskEntry, DiskStore, DiskWrite
from mooncake_py.errors import ErrorCode

INVALID = int(ErrorCode.INVALID_PARAMS)
NOT_FOUND = int(ErrorCode.FILE_NOT_FOUND)
READ_FAIL = int(ErrorCode.FILE_READ_FAIL)
WRITE_FAIL = int(ErrorCode.FILE_WRITE_FAIL)
CLOSED = int(ErrorCode.FILE_INVALID_HANDLE)
FULL = int(ErrorCode.UNABLE_OFFLOAD)
BAD_BUFFER = int(ErrorCode.FILE_INVALID_BUFFER)


def payload(offset: int, size: int) -> bytes:
    """Bytes derived from the offset, so every object's content differs."""
    rng = random.Random(offset)
    return rng.randbytes(size)


def item(offset: int, size: int, tenant: str = "t", key: str | None = None) -> DiskWrite:
    return DiskWrite(
        offset, tenant, key if key is not None else f"k{offset}", payload(offset, size)
    )


def read_all(store: DiskStore, offset: int, size: int) -> bytes | int:
    buffer = bytearray(size)
    code = store.read_into(offset, size, memoryview(buffer))
    return bytes(buffer) if code == 0 else code


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(tmp_path / "tier-root")


@pytest.fixture
def store(root: str) -> Iterator[DiskStore]:
    with DiskStore(root) as opened:
        yield opened


def objects_dir(store: DiskStore) -> Path:
    return Path(store.directory) / "objects"


def test_write_read_range_delete_round_trip(store: DiskStore) -> None:
    sizes = {0: 1000, 4096: 1, 10_000: 70_000, 1 << 40: 5}
    assert store.write_batch([item(o, n) for o, n in sizes.items()]) == [0] * 4
    assert store.file_count == 4
    assert store.used_bytes == sum(sizes.values())
    assert store.entries() == [DiskEntry(o, n, "t", f"k{o}") for o, n in sorted(sizes.items())]
    for offset, size in sizes.items():
        assert read_all(store, offset, size) == payload(offset, size)
        whole = store.read_range(offset, size)
        assert isinstance(whole, memoryview) and bytes(whole) == payload(offset, size)
    part = store.read_range(10_000 + 123, 4567)
    assert isinstance(part, memoryview)
    assert bytes(part) == payload(10_000, 70_000)[123 : 123 + 4567]
    tail = store.read_range(10_000 + 69_999, 1)
    assert isinstance(tail, memoryview) and bytes(tail) == payload(10_000, 70_000)[-1:]
    store.check()
    assert store.delete([4096, 10_000, 777]) == 2
    assert store.file_count == 2 and store.used_bytes == 1005
    assert read_all(store, 4096, 1) == NOT_FOUND
    assert store.read_range(10_000, 10) == NOT_FOUND
    assert store.delete([4096]) == 0
    store.check()
    assert store.delete_all() == 2
    assert store.file_count == 0 and store.used_bytes == 0
    assert list(objects_dir(store).iterdir()) == []
    store.check()


def test_read_into_checks_what_the_caller_expects(store: DiskStore) -> None:
    assert store.write_batch([item(100, 64, tenant="a", key="x")]) == [0]
    dest = memoryview(bytearray(128))
    assert store.read_into(100, 64, dest, tenant="a", key="x") == 0
    assert bytes(dest[:64]) == payload(100, 64)
    assert store.read_into(100, 64, dest, tenant="b") == NOT_FOUND
    assert store.read_into(100, 64, dest, key="y") == NOT_FOUND
    assert store.read_into(100, 63, dest) == NOT_FOUND
    assert store.read_into(101, 64, dest) == NOT_FOUND
    assert store.read_into(100, 64, memoryview(bytearray(63))) == BAD_BUFFER
    assert store.file_count == 1  # none of these harmed the file
    assert read_all(store, 100, 64) == payload(100, 64)


def test_ranges_must_lie_inside_one_object(store: DiskStore) -> None:
    assert store.write_batch([item(1000, 100), item(1100, 100), item(5000, 10)]) == [0, 0, 0]
    assert store.read_range(1050, 100) == INVALID  # spans two files
    assert store.read_range(1150, 51) == INVALID  # runs past the last byte
    assert store.read_range(1200, 10) == NOT_FOUND  # a gap
    assert store.read_range(999, 2) == NOT_FOUND  # before every object
    assert store.read_range(6000, 1) == NOT_FOUND  # after every object
    assert store.read_range(-1, 1) == INVALID
    assert store.read_range(1000, -1) == INVALID
    empty = store.read_range(1010, 0)
    assert isinstance(empty, memoryview) and len(empty) == 0


def test_typed_views_are_written_as_their_bytes_and_strided_ones_refused(
    store: DiskStore,
) -> None:
    words = array.array("I", range(1000))
    strided = memoryview(bytearray(100))[::2]
    results = store.write_batch(
        [DiskWrite(0, "t", "words", memoryview(words)), DiskWrite(8000, "t", "s", strided)]
    )
    assert results == [0, INVALID]
    assert read_all(store, 0, len(words) * words.itemsize) == words.tobytes()
    assert store.file_count == 1


def test_duplicate_and_overlapping_offsets_are_refused(store: DiskStore) -> None:
    assert store.write_batch([item(1000, 100)]) == [0]
    results = store.write_batch(
        [
            item(1000, 100),  # already on disk
            item(1050, 10),  # inside it
            item(950, 51),  # its end runs into it
            item(2000, 10),
            item(2000, 10),  # repeated in the batch
            item(2005, 10),  # overlaps an earlier item of the batch
            item(1100, 10),  # adjacent: fine
            item((1 << 64) - 4, 5),  # beyond the 64-bit address space
            DiskWrite(3000, "t", "\udcff", b"x"),  # no UTF-8 for a lone surrogate
        ]
    )
    assert results == [INVALID, INVALID, INVALID, 0, INVALID, INVALID, 0, INVALID, INVALID]
    assert read_all(store, 1000, 100) == payload(1000, 100)  # the first write untouched
    assert read_all(store, 2000, 10) == payload(2000, 10)
    store.check()


def test_capacity_refuses_writes_past_it(root: str) -> None:
    with DiskStore(root, capacity_bytes=100) as store:
        assert store.capacity_bytes == 100
        assert store.write_batch([item(0, 60), item(100, 50), item(200, 40)]) == [0, FULL, 0]
        assert store.used_bytes == 100
        assert store.write_batch([item(300, 1)]) == [FULL]
        assert store.delete([0]) == 1
        assert store.write_batch([item(300, 60)]) == [0]
        store.check()
    with pytest.raises(ValueError):
        DiskStore(root, capacity_bytes=-1)


def test_a_failed_item_leaves_nothing_and_the_rest_of_the_batch_lands(store: DiskStore) -> None:
    # A directory where the item's staging file must go makes its write fail (EISDIR).
    blocker = Path(store.directory) / "staging" / (file_name(500) + ".part")
    blocker.mkdir()
    assert store.write_batch([item(0, 10), item(500, 10), item(900, 10)]) == [0, WRITE_FAIL, 0]
    assert not (objects_dir(store) / file_name(500)).exists()
    assert [e.offset for e in store.entries()] == [0, 900]
    assert read_all(store, 500, 10) == NOT_FOUND
    blocker.rmdir()
    assert store.write_batch([item(500, 10)]) == [0]  # the failure reserved nothing
    store.check()


def test_stores_sharing_a_root_get_their_own_directories(root: str) -> None:
    first, second = DiskStore(root), DiskStore(root)
    try:
        assert first.directory != second.directory
        assert first.write_batch([item(0, 10)]) == [0]
        assert second.write_batch([item(0, 20)]) == [0]  # same offset, other disk segment
        assert read_all(first, 0, 10) == payload(0, 10)
        assert read_all(second, 0, 20) == payload(0, 20)
        second.close()
        # A store that opens now takes the free directory: the one second released.
        with DiskStore(root) as third:
            assert third.directory == second.directory
            assert third.entries() == [DiskEntry(0, 20, "t", "k0")]
    finally:
        first.close()
        second.close()


def test_reopening_finds_the_files_and_prefers_the_directory_holding_them(root: str) -> None:
    with DiskStore(root) as empty_holder, DiskStore(root) as writer:
        assert writer.write_batch([item(o, 100 + o) for o in (0, 1000, 5000)]) == [0, 0, 0]
        written_dir, empty_dir = writer.directory, empty_holder.directory
    # Both directories are free now; the one with files comes first.
    with DiskStore(root) as reopened:
        assert reopened.directory == written_dir != empty_dir
        assert [e.offset for e in reopened.entries()] == [0, 1000, 5000]
        assert reopened.used_bytes == 100 + 1100 + 5100
        for offset in (0, 1000, 5000):
            assert read_all(reopened, offset, 100 + offset) == payload(offset, 100 + offset)
        reopened.check()


def test_a_closed_store_refuses_everything(root: str) -> None:
    store = DiskStore(root)
    assert store.write_batch([item(0, 10)]) == [0]
    store.close()
    store.close()  # idempotent
    assert store.write_batch([item(100, 10)]) == [CLOSED]
    assert read_all(store, 0, 10) == CLOSED
    assert store.read_range(0, 10) == CLOSED
    assert store.delete([0]) == 0
    with DiskStore(root) as again:  # the lock was released, the file kept
        assert again.directory == store.directory
        assert read_all(again, 0, 10) == payload(0, 10)


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def _header_size(path: Path) -> int:
    return FIXED.unpack_from(path.read_bytes())[3]


def _damage(store: DiskStore, how: str) -> None:
    """Damage the object at offset 0 (1000 payload bytes) as ``how`` says."""
    path = objects_dir(store) / file_name(0)
    if how == "truncated":
        os.truncate(path, path.stat().st_size - 1)
    elif how == "extended":
        with path.open("ab") as handle:
            handle.write(b"\0")
    elif how == "payload byte":
        _flip(path, _header_size(path) + 500)
    elif how == "header byte":
        _flip(path, FIXED.size + 1)  # inside the tenant: only the header checksum notices
    elif how == "header only":
        os.truncate(path, _header_size(path) - 3)
    else:
        raise AssertionError(how)


DAMAGES = ["truncated", "extended", "payload byte", "header byte", "header only"]


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_file_is_never_served_while_open(store: DiskStore, how: str) -> None:
    assert store.write_batch([item(0, 1000), item(5000, 10)]) == [0, 0]
    _damage(store, how)
    assert store.read_range(0, 1000) == READ_FAIL
    assert not (objects_dir(store) / file_name(0)).exists()  # quarantined
    assert store.take_quarantined() == [DiskEntry(0, 1000, "t", "k0")]
    assert store.take_quarantined() == []
    assert store.read_range(0, 1000) == NOT_FOUND
    assert read_all(store, 5000, 10) == payload(5000, 10)  # the neighbour is fine
    store.check()


@pytest.mark.parametrize("how", DAMAGES)
def test_partial_and_typed_reads_of_a_damaged_file_fail_too(store: DiskStore, how: str) -> None:
    assert store.write_batch([item(0, 1000)]) == [0]
    _damage(store, how)
    assert store.read_range(10, 100) == READ_FAIL
    assert read_all(store, 0, 1000) == NOT_FOUND  # quarantined by the partial read
    store.check()


@pytest.mark.parametrize("how", DAMAGES)
def test_a_file_damaged_while_closed_is_never_served_after_reopening(root: str, how: str) -> None:
    with DiskStore(root) as store:
        assert store.write_batch([item(0, 1000), item(5000, 10)]) == [0, 0]
        _damage(store, how)
    with DiskStore(root) as reopened:
        # The scan at open removes what its header and length show; a flipped payload byte is
        # caught by the first read, whole or partial.
        assert reopened.read_range(100, 10) in (READ_FAIL, NOT_FOUND)
        assert reopened.read_range(0, 1000) == NOT_FOUND
        assert [e.offset for e in reopened.entries()] == [5000]
        assert read_all(reopened, 5000, 10) == payload(5000, 10)
        reopened.check()


def test_a_verifying_scan_removes_corrupt_payloads(store: DiskStore) -> None:
    assert store.write_batch([item(0, 1000), item(5000, 10)]) == [0, 0]
    _damage(store, "payload byte")
    assert [e.offset for e in store.scan()] == [0, 5000]  # header and length are fine
    assert [e.offset for e in store.scan(verify=True)] == [5000]
    assert not (objects_dir(store) / file_name(0)).exists()
    store.check()


def test_a_scan_removes_leftovers_and_strangers(root: str) -> None:
    with DiskStore(root) as store:
        assert store.write_batch([item(0, 10)]) == [0]
        staging = Path(store.directory) / "staging"
        objects = objects_dir(store)
        (staging / (file_name(64) + ".part")).write_bytes(b"half a file")
        (objects / "not-an-offset").write_bytes((objects / file_name(0)).read_bytes())
        (objects / file_name(0).upper().replace("0", "A", 1)).write_bytes(b"x")
        (objects / "00000000000000000").write_bytes(b"seventeen digits")
        (objects / file_name(128)).mkdir()
        (objects / file_name(256)).symlink_to(objects / file_name(0))
        # A valid file under the wrong name: its header names offset 0.
        (objects / file_name(512)).write_bytes((objects / file_name(0)).read_bytes())
    with DiskStore(root) as reopened:
        assert reopened.entries() == [DiskEntry(0, 10, "t", "k0")]
        assert sorted(p.name for p in objects.iterdir()) == [file_name(0)]
        assert list(staging.iterdir()) == []
        reopened.check()


def test_reads_racing_deletes_read_exactly_or_find_nothing(store: DiskStore) -> None:
    offsets = [i * 100_000 for i in range(200)]
    assert store.write_batch([item(o, 20_000 + o % 7) for o in offsets]) == [0] * 200
    failures: list[str] = []
    stop = threading.Event()

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            offset = rng.choice(offsets)
            size = 20_000 + offset % 7
            skip = rng.randrange(2) * rng.randrange(size)
            got = store.read_range(offset + skip, size - skip)
            if isinstance(got, memoryview):
                if bytes(got) != payload(offset, size)[skip:]:
                    failures.append(f"wrong bytes at {offset}+{skip}")
            elif got != NOT_FOUND:
                failures.append(f"code {got} at {offset}+{skip}")

    readers = [threading.Thread(target=reader, args=(seed,)) for seed in range(4)]
    for thread in readers:
        thread.start()
    shuffled = offsets[:]
    random.Random(7).shuffle(shuffled)
    removed = sum(store.delete([offset]) for offset in shuffled)
    stop.set()
    for thread in readers:
        thread.join()
    assert failures == []
    assert removed == 200 and store.file_count == 0
    assert store.take_quarantined() == []
    store.check()


def test_seeded_stress_matches_a_model(root: str) -> None:
    rng = random.Random(20261201)
    model: dict[int, int] = {}  # offset -> size
    next_offset = 0
    store = DiskStore(root, capacity_bytes=2_000_000)
    try:
        for step in range(300):
            action = rng.random()
            if action < 0.45:
                batch = []
                for _ in range(rng.randrange(1, 6)):
                    size = rng.choice([0, 1, 100, 4096, 50_000, 300_000])
                    batch.append(item(next_offset, size))
                    next_offset += size + rng.randrange(0, 3)
                if model and rng.random() < 0.3:  # a duplicate now and then
                    batch.append(item(rng.choice(list(model)), 1))
                results = store.write_batch(batch)
                room = 2_000_000 - sum(model.values())
                for write, code in zip(batch, results, strict=True):
                    size = len(write.data)
                    if write.offset in model:
                        assert code == INVALID
                    elif size > room:
                        assert code == FULL
                    else:
                        assert code == 0, (step, code)
                        model[write.offset] = size
                        room -= size
            elif action < 0.65 and model:
                doomed = rng.sample(list(model), min(len(model), rng.randrange(1, 4)))
                assert store.delete(doomed + [next_offset + 10]) == len(doomed)
                for offset in doomed:
                    del model[offset]
            elif action < 0.9 and model:
                offset = rng.choice(list(model))
                size = model[offset]
                skip = rng.randrange(size) if size else 0
                got = store.read_range(offset + skip, size - skip)
                assert isinstance(got, memoryview)
                assert bytes(got) == payload(offset, size)[skip:]
            else:
                store.close()
                store = DiskStore(root, capacity_bytes=2_000_000)
            store.check()
            assert {e.offset: e.size for e in store.entries()} == model
            assert store.used_bytes == sum(model.values())
    finally:
        store.close()


def test_check_notices_a_stray_file(store: DiskStore) -> None:
    assert store.write_batch([item(0, 10)]) == [0]
    store.check()
    (objects_dir(store) / file_name(64)).write_bytes(b"stray")
    with pytest.raises(AssertionError, match="index != objects"):
        store.check()


def test_unsynced_stores_work_the_same(root: str) -> None:
    with DiskStore(root, fsync=False) as store:
        assert store.write_batch([item(0, 10), item(10, 10)]) == [0, 0]
        assert read_all(store, 10, 10) == payload(10, 10)
    with DiskStore(root, fsync=False) as reopened:
        assert [e.offset for e in reopened.entries()] == [0, 10]


@pytest.mark.parametrize("how", ["truncated", "extended", "header byte", "header only"])
def test_partial_reads_of_a_checked_object_still_check_header_and_length(
    store: DiskStore, how: str
) -> None:
    assert store.write_batch([item(0, 1000)]) == [0]
    assert read_all(store, 0, 1000) == payload(0, 1000)  # checked: partial reads go cheap
    part = store.read_range(10, 100)
    assert isinstance(part, memoryview) and bytes(part) == payload(0, 1000)[10:110]
    _damage(store, how)
    assert store.read_range(10, 100) == READ_FAIL
    assert store.read_range(0, 1000) == NOT_FOUND
    store.check()


def test_a_view_released_before_the_write_fails_only_its_item(store: DiskStore) -> None:
    released = memoryview(bytearray(b"gone"))
    released.release()
    results = store.write_batch([item(0, 10), DiskWrite(100, "t", "r", released), item(200, 10)])
    assert results == [0, INVALID, 0]  # a released view is no contiguous buffer
    store.check()


def test_a_store_takes_only_its_owners_directories_or_empty_ones(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    a = DiskStore(root, fsync=False, owner="tenant:a")
    assert a.write_batch([item(0, 100)]) == [0]
    a_dir = a.directory
    a.close()
    b = DiskStore(root, fsync=False, owner="tenant:b")
    assert b.directory != a_dir and b.entries() == []  # A's files are not B's to take
    b_dir = b.directory
    b.close()
    again = DiskStore(root, fsync=False, owner="tenant:a")
    assert again.directory == a_dir and [e.offset for e in again.entries()] == [0]
    again.close()
    c = DiskStore(root, fsync=False, owner="tenant:c")
    assert c.directory == b_dir  # empty: nothing of B's is lost
    c.close()
