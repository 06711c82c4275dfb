"""The one-master log store: records survive reopening, a torn tail is cut off, a damaged
snapshot is skipped, and snapshots bound the log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mooncake_py.master.ha.directory_log import DirectoryLogStore
from mooncake_py.master.ha.log_store import MAX_RECORD_BYTES, LogStoreError


def run(coroutine):  # type: ignore[no-untyped-def]
    return asyncio.run(coroutine)


def test_records_survive_reopening_in_order(tmp_path: Path) -> None:
    store = DirectoryLogStore(tmp_path)
    run(store.append(1, [b"one", b"two"]))
    run(store.append(3, [b"three"]))
    run(store.close())
    reopened = DirectoryLogStore(tmp_path)
    assert run(reopened.last_seq()) == 3
    assert run(reopened.records_after(0)) == [(1, b"one"), (2, b"two"), (3, b"three")]
    assert run(reopened.records_after(2)) == [(3, b"three")]
    assert run(reopened.records_after(1, limit=1)) == [(2, b"two")]


def test_appends_must_follow_and_fit(tmp_path: Path) -> None:
    store = DirectoryLogStore(tmp_path)
    run(store.append(1, [b"a"]))
    with pytest.raises(ValueError):
        run(store.append(3, [b"gap"]))
    with pytest.raises(ValueError):
        run(store.append(2, [b"x" * (MAX_RECORD_BYTES + 1)]))
    run(store.append(2, [b"b"]))
    assert [seq for seq, _ in run(store.records_after(0))] == [1, 2]


def test_a_torn_or_corrupt_tail_is_cut_off(tmp_path: Path) -> None:
    store = DirectoryLogStore(tmp_path)
    run(store.append(1, [b"kept"]))
    run(store.append(2, [b"torn record"]))
    run(store.close())
    (log_file,) = (tmp_path / "log").glob("*.log")
    data = log_file.read_bytes()
    log_file.write_bytes(data[:-3])  # a crash in the middle of the last write
    reopened = DirectoryLogStore(tmp_path)
    assert run(reopened.records_after(0)) == [(1, b"kept")]
    run(reopened.append(2, [b"rewritten"]))
    assert run(reopened.records_after(0)) == [(1, b"kept"), (2, b"rewritten")]
    run(reopened.close())
    # A flipped byte inside the last record is caught by its checksum the same way.
    data = bytearray(log_file.read_bytes())
    data[-2] ^= 0xFF
    log_file.write_bytes(bytes(data))
    assert run(DirectoryLogStore(tmp_path).records_after(0)) == [(1, b"kept")]


def test_snapshots_bound_the_log_and_a_damaged_one_is_skipped(tmp_path: Path) -> None:
    store = DirectoryLogStore(tmp_path, retention=2)
    seq = 0
    for snapshot in range(3):
        for _ in range(5):
            seq += 1
            run(store.append(seq, [f"r{seq}".encode()]))
        run(store.save_snapshot(seq, {"objects": f"snap{snapshot}".encode(), "meta": b"m"}))
    run(store.append(seq + 1, [b"tail"]))
    assert run(store.load_snapshot()) == (15, {"objects": b"snap2", "meta": b"m"})
    # Two snapshots kept; the log files wholly older than the oldest one are gone.
    assert sorted(p.name for p in (tmp_path / "snapshots").iterdir()) == [
        f"{10:020d}",
        f"{15:020d}",
    ]
    assert run(store.records_after(15)) == [(16, b"tail")]
    with pytest.raises(LogStoreError):
        run(store.records_after(3))  # covered by a dropped file: the caller must load a snapshot
    # A table that does not match its manifest: the previous snapshot counts.
    (tmp_path / "snapshots" / f"{15:020d}" / "objects.parquet").write_bytes(b"garbage")
    assert run(DirectoryLogStore(tmp_path).load_snapshot()) == (
        10,
        {"objects": b"snap1", "meta": b"m"},
    )
    # A snapshot missing its manifest (a crash before the rename) does not exist.
    (tmp_path / "snapshots" / f"{10:020d}" / "MANIFEST").unlink()
    assert run(DirectoryLogStore(tmp_path).load_snapshot()) is None


def test_an_unusable_directory_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(LogStoreError):
        DirectoryLogStore(blocker / "sub")


def test_a_failed_append_leaves_no_torn_frame_before_its_retry(tmp_path: Path) -> None:
    """A write that fails part-way (the disk fills up) is cut back, so the retried records
    and every later one survive reopening (a torn frame in the middle would hide them)."""
    import resource
    import signal

    store = DirectoryLogStore(tmp_path)
    run(store.append(1, [b"a" * 1000]))
    (log_file,) = (tmp_path / "log").glob("*.log")
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (log_file.stat().st_size + 500, hard))
    try:
        with pytest.raises(LogStoreError):
            run(store.append(2, [b"b" * 1000]))  # half a frame fits
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    run(store.append(2, [b"b" * 1000]))  # the retry, same number and bytes
    run(store.append(3, [b"c"]))
    run(store.close())
    assert [s for s, _ in run(DirectoryLogStore(tmp_path).records_after(0))] == [1, 2, 3]
