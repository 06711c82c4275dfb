"""A :class:`~.log_store.LogStore` in a local directory: one master that restarts.

Layout under the directory:

- ``log/<first seq:020d>.log``: segment files of records, each record framed as
  ``u32 length | u32 crc32 | u64 seq | bytes``; an append writes its records with one
  ``write`` and one ``fsync`` (group commit), so either the whole frame is on disk or the
  tail is torn; a torn or corrupt tail (a crash mid-append) is cut off when the store opens.
  A new segment file starts after each snapshot.
- ``snapshots/<seq:020d>/<table>.parquet`` plus ``MANIFEST`` (JSON: tables and their
  sha256), written into a temporary directory, fsynced, then renamed into place: a snapshot
  is either complete or absent. ``snapshot_retention_count`` snapshots are kept; log files
  wholly covered by the oldest kept snapshot are deleted.

Thread-safety: one event loop; file I/O runs inline (appends are small; snapshots are written
by :func:`asyncio.to_thread`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import struct
import zlib
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from .log_store import MAX_RECORD_BYTES, LogStoreError, RecordsDropped

_FRAME = struct.Struct("<IIQ")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirectoryLogStore:
    """The records and snapshots of one master in ``root`` (created if missing).

    Args:
        root: the directory (``--snapshot_dir``).
        retention: snapshots kept (``--snapshot_retention_count``).
        fsync: fsync every append and snapshot (off only for throwaway stores).

    Raises:
        LogStoreError: the directory cannot be created or read.
    """

    def __init__(self, root: str | os.PathLike[str], retention: int = 2, fsync: bool = True):
        self._root = Path(root)
        self._logs = self._root / "log"
        self._snapshots = self._root / "snapshots"
        self._retention = max(1, retention)
        self._fsync = fsync
        try:
            self._logs.mkdir(parents=True, exist_ok=True)
            self._snapshots.mkdir(parents=True, exist_ok=True)
            for staging in self._snapshots.glob(".staging-*"):
                shutil.rmtree(staging, ignore_errors=True)  # a snapshot a crash interrupted
            self._last = self._open_tail()
        except OSError as exc:
            raise LogStoreError(f"cannot use {self._root}: {exc}") from exc
        self._fd: int | None = None
        # One operation at a time: appends and snapshots run in worker threads.
        self._busy = asyncio.Lock()
        # The records of the file read last, by its size: recovery reads a file in many
        # calls and parses it once.
        self._parsed: tuple[Path, int, list[tuple[int, bytes]]] | None = None
        # After a snapshot the next append starts a log file of its own.
        self._new_file = False

    # -- records ---------------------------------------------------------------------------

    def _log_files(self) -> list[tuple[int, Path]]:
        files = []
        for path in self._logs.glob("*.log"):
            try:
                files.append((int(path.stem), path))
            except ValueError:
                continue
        return sorted(files)

    def _scan(self, path: Path) -> tuple[list[tuple[int, bytes]], int]:
        """The intact records of one file and the byte length they span."""
        data = path.read_bytes()
        records: list[tuple[int, bytes]] = []
        position = 0
        while position + _FRAME.size <= len(data):
            length, crc, seq = _FRAME.unpack_from(data, position)
            end = position + _FRAME.size + length
            body = data[position + _FRAME.size : end]
            if end > len(data) or zlib.crc32(body) != crc:
                break
            records.append((seq, body))
            position = end
        return records, position

    def _open_tail(self) -> int:
        """The last intact seq; a torn tail of the newest file is cut off."""
        snapshots = self._snapshot_seqs()
        last = snapshots[-1] if snapshots else 0
        files = self._log_files()
        if files:
            records, intact = self._scan(files[-1][1])
            if intact != files[-1][1].stat().st_size:
                with open(files[-1][1], "r+b") as handle:
                    handle.truncate(intact)
            if records:
                last = max(last, records[-1][0])
            elif len(files) > 1:
                earlier, _ = self._scan(files[-2][1])
                if earlier:
                    last = max(last, earlier[-1][0])
        return last

    async def append(self, first_seq: int, records: Sequence[bytes]) -> None:
        """See :meth:`LogStore.append`; one write and one fsync for all ``records``."""
        if first_seq != self._last + 1:
            raise ValueError(f"append at {first_seq}, expected {self._last + 1}")
        frames = []
        for offset, body in enumerate(records):
            if len(body) > MAX_RECORD_BYTES:
                raise ValueError(f"record of {len(body)} bytes > {MAX_RECORD_BYTES}")
            frames.append(_FRAME.pack(len(body), zlib.crc32(body), first_seq + offset) + body)
        async with self._busy:
            # The write and its fsync run off the event loop: other calls go on meanwhile.
            await asyncio.to_thread(self._write_frames, first_seq, b"".join(frames))
        self._last = first_seq + len(records) - 1

    def _write_frames(self, first_seq: int, data: bytes) -> None:
        """Write and fsync ``data`` at the end of the current log file (unbuffered: nothing
        is left in a buffer to be written later); on failure cut the file back to where it
        was, so a retry appends after intact frames (a torn frame in the middle would hide
        every record after it)."""
        fd = self._writer(first_seq)
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self._fsync:
                os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):  # else the next open cuts the torn tail off
                os.ftruncate(fd, start)
            self._close_writer()
            raise LogStoreError(f"append failed: {exc}") from exc

    def _writer(self, first_seq: int) -> int:
        """The descriptor of the log file appends go to (opened on first use)."""
        if self._fd is None:
            files = self._log_files()
            fresh = self._new_file or not files
            path = self._logs / f"{first_seq:020d}.log" if fresh else files[-1][1]
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._new_file = False
            if fresh:
                _fsync_dir(self._logs)
        return self._fd

    def _close_writer(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):  # nothing is buffered: nothing can be lost
                os.close(fd)

    async def records_after(self, seq: int, limit: int = 1024) -> list[tuple[int, bytes]]:
        """See :meth:`LogStore.records_after`."""
        found: list[tuple[int, bytes]] = []
        files = self._log_files()
        for index, (_first, path) in enumerate(files):
            following = files[index + 1][0] if index + 1 < len(files) else None
            if following is not None and following <= seq + 1:
                continue
            for record_seq, body in self._records_of(path):
                if record_seq > seq:
                    found.append((record_seq, body))
                    if len(found) >= limit:
                        return found
        if found and found[0][0] != seq + 1:
            raise RecordsDropped(f"records after {seq} start at {found[0][0]}: load a snapshot")
        return found

    def _records_of(self, path: Path) -> list[tuple[int, bytes]]:
        size = path.stat().st_size
        if self._parsed is not None and self._parsed[0] == path and self._parsed[1] == size:
            return self._parsed[2]
        records, _ = self._scan(path)
        self._parsed = (path, size, records)
        return records

    def follow(self, seq: int) -> AsyncIterator[tuple[int, bytes]]:
        """Not offered: a directory has one writer and no standby."""
        raise NotImplementedError("a directory log has no followers")

    async def last_seq(self) -> int:
        """See :meth:`LogStore.last_seq`."""
        return self._last

    # -- snapshots -------------------------------------------------------------------------

    def _snapshot_seqs(self) -> list[int]:
        seqs = []
        for path in self._snapshots.iterdir():
            if path.name.isdigit() and (path / "MANIFEST").exists():
                seqs.append(int(path.name))
        return sorted(seqs)

    async def save_snapshot(self, seq: int, tables: Mapping[str, bytes]) -> None:
        """See :meth:`LogStore.save_snapshot`; a new log file starts after it."""
        async with self._busy:
            try:
                await asyncio.to_thread(self._write_snapshot, seq, dict(tables))
            except OSError as exc:
                raise LogStoreError(f"snapshot {seq} failed: {exc}") from exc
            self._close_writer()
            self._new_file = True
            self._prune()

    def _write_snapshot(self, seq: int, tables: dict[str, bytes]) -> None:
        final = self._snapshots / f"{seq:020d}"
        staging = self._snapshots / f".staging-{seq:020d}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        manifest: dict[str, object] = {"seq": seq, "tables": {}}
        for name, blob in tables.items():
            path = staging / f"{name}.parquet"
            with open(path, "wb") as handle:
                handle.write(blob)
                if self._fsync:
                    os.fsync(handle.fileno())
            manifest["tables"][name] = hashlib.sha256(blob).hexdigest()  # type: ignore[index]
        with open(staging / "MANIFEST", "w", encoding="utf-8") as handle:
            json.dump(manifest, handle)
            if self._fsync:
                handle.flush()
                os.fsync(handle.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.rename(staging, final)
        if self._fsync:
            _fsync_dir(self._snapshots)

    def _prune(self) -> None:
        seqs = self._snapshot_seqs()
        for old in seqs[: -self._retention]:
            shutil.rmtree(self._snapshots / f"{old:020d}", ignore_errors=True)
        kept = self._snapshot_seqs()
        if not kept:
            return
        oldest = kept[0]
        files = self._log_files()
        for index, (_, path) in enumerate(files):
            following = files[index + 1][0] if index + 1 < len(files) else None
            if following is not None and following <= oldest + 1:
                path.unlink(missing_ok=True)

    async def load_snapshot(self) -> tuple[int, dict[str, bytes]] | None:
        """See :meth:`LogStore.load_snapshot`: the newest snapshot whose tables match their
        manifest; a damaged one is skipped for the one before."""
        for seq in reversed(self._snapshot_seqs()):
            folder = self._snapshots / f"{seq:020d}"
            try:
                manifest = json.loads((folder / "MANIFEST").read_text(encoding="utf-8"))
                tables = {}
                for name, digest in manifest["tables"].items():
                    blob = (folder / f"{name}.parquet").read_bytes()
                    if hashlib.sha256(blob).hexdigest() != digest:
                        raise ValueError(f"{name} does not match its digest")
                    tables[name] = blob
            except (OSError, ValueError, KeyError):
                continue
            return seq, tables
        return None

    async def close(self) -> None:
        """See :meth:`LogStore.close`."""
        self._close_writer()
