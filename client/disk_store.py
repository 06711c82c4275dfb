"""The segment owner's disk tier: objects evicted from memory, one file each.

The master places each disk replica at a unique, never reused offset of a disk segment's
virtual address space (ranges never overlap), so an offset names a file: ``objects/<offset as
16 hex digits>`` in the store's tier directory (:mod:`mooncake_py.client.disk_tier_dir`), in
the format of :mod:`mooncake_py.client.disk_format` (a checksummed header naming offset, size,
tenant and key, then the payload with its xxh3_64).

Durability. A file is written whole under ``staging/``, synced, and only then renamed into
``objects/``; the directory is synced once per batch. So ``objects/`` holds complete files only,
and with ``fsync`` on an object :meth:`DiskStore.write_batch` reported written survives a crash
(of the process or, with ``fsync``, of the host). Whatever ``staging/`` holds at open is
deleted.

Integrity. No torn or corrupt byte is served: every read checks the header and the file's
length; whole-object reads check the payload's checksum, and so does the first read of an
object since the store opened, partial or not (it reads the whole payload once). A file failing
any check is quarantined (deleted, dropped from the index, logged, and reported by
:meth:`DiskStore.take_quarantined`) and answered with FILE_READ_FAIL. Only a payload damaged
after its first check can reach a partial read.

Thread-safety. Every method may be called from any thread. Reads and deletes run concurrently
with each other and with a write batch; write batches run one at a time (a second waits), and
:meth:`DiskStore.scan` and :meth:`DiskStore.delete_all` exclude everything else while they run.
A read that opened a file before a delete unlinked it still reads it correctly; one that comes
after answers FILE_NOT_FOUND.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sortedcontainers import SortedDict

from mooncake_py.errors import ErrorCode

from .disk_format import (
    MAX_OFFSET,
    encode_header,
    file_name,
    fsync_directory,
    payload_checksum,
)
from .disk_reads import (
    Corrupt,
    IndexedObject,
    directory_problems,
    inspect_file,
    read_part,
    read_whole,
)
from .disk_tier_dir import OBJECTS_DIR, STAGING_DIR, claim_tier_directory
from .disk_writes import byte_view, overlaps, remove_any, unlink_quietly, write_file

log = logging.getLogger(__name__)

PART_SUFFIX = ".part"

_OK = 0
_INVALID = int(ErrorCode.INVALID_PARAMS)
_NOT_FOUND = int(ErrorCode.FILE_NOT_FOUND)
_READ_FAIL = int(ErrorCode.FILE_READ_FAIL)
_WRITE_FAIL = int(ErrorCode.FILE_WRITE_FAIL)
_BAD_BUFFER = int(ErrorCode.FILE_INVALID_BUFFER)
_CLOSED = int(ErrorCode.FILE_INVALID_HANDLE)
_FULL = int(ErrorCode.UNABLE_OFFLOAD)


@dataclass(frozen=True, slots=True)
class DiskWrite:
    """One object to write: ``data`` (bytes, or a view of the owner's segment memory, which
    is written in place) at ``offset`` of the disk segment."""

    offset: int
    tenant: str
    key: str
    data: memoryview | bytes


@dataclass(frozen=True, slots=True)
class DiskEntry:
    """One object on disk: ``size`` payload bytes at ``offset``."""

    offset: int
    size: int
    tenant: str
    key: str


class _Staged(NamedTuple):
    position: int  # in the batch
    offset: int
    part: str
    entry: IndexedObject
    payload: memoryview


class DiskStore:
    """One disk tier directory of objects, indexed by offset.

    Args:
        root: the tier root; this store claims its own ``root/tier-<n>/`` (see
            :mod:`mooncake_py.client.disk_tier_dir`) and finds the objects already there.
        fsync: sync every file and the directory before a write is reported done (off: faster,
            but a host crash may lose or drop reported writes; a process crash loses nothing).
        capacity_bytes: when given, a write that would take :attr:`used_bytes` past it is
            refused (UNABLE_OFFLOAD).
        owner: who the files belong to (the client's tenant): only a directory of that owner,
            or one holding no object, is claimed (:mod:`~.disk_tier_dir`).

    Raises:
        OSError: the root or tier directory cannot be created, locked or read.
        ValueError: a negative ``capacity_bytes``.

    Thread-safety: every method, from any thread (see the module docstring for what runs
    concurrently with what).
    """

    def __init__(
        self,
        root: str,
        *,
        fsync: bool = True,
        capacity_bytes: int | None = None,
        owner: str | None = None,
    ) -> None:
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self._fsync = fsync
        self._capacity = capacity_bytes
        self._directory, self._lock_fd = claim_tier_directory(root, owner)
        self._objects = os.path.join(self._directory, OBJECTS_DIR)
        self._staging = os.path.join(self._directory, STAGING_DIR)
        # Guards the index, used bytes, the quarantine list and ``_closed``; held briefly.
        self._lock = threading.Lock()
        # One write batch at a time; scan and delete_all take it too, so no batch has files
        # half-way between staging/ and the index while they look at the directory.
        self._write_lock = threading.Lock()
        self._index = SortedDict()  # offset -> IndexedObject
        self._used = 0
        self._closed = False
        self._quarantined: list[DiskEntry] = []
        # Objects whose payload checksum this store has checked since it opened (by a whole
        # read, or a verifying scan): partial reads of them check only the header and length.
        # Not even objects this store wrote are trusted before that: the file may have been
        # damaged since.
        self._checked: set[int] = set()
        try:
            os.makedirs(self._objects, exist_ok=True)
            os.makedirs(self._staging, exist_ok=True)
            self.scan()
        except BaseException:
            self.close()
            raise

    # -- properties ------------------------------------------------------------------------

    @property
    def directory(self) -> str:
        """The tier directory this store holds."""
        return self._directory

    @property
    def used_bytes(self) -> int:
        """Payload bytes of the objects on disk (headers not counted, as the master counts)."""
        with self._lock:
            return self._used

    @property
    def file_count(self) -> int:
        """Objects on disk."""
        with self._lock:
            return len(self._index)

    @property
    def capacity_bytes(self) -> int | None:
        """The payload bytes this store accepts at most (None: no limit of its own)."""
        return self._capacity

    def entries(self) -> list[DiskEntry]:
        """Every object on disk, by offset. O(n)."""
        with self._lock:
            return [
                DiskEntry(offset, found.size, found.tenant, found.key)
                for offset, found in self._index.items()
            ]

    def take_quarantined(self) -> list[DiskEntry]:
        """The objects quarantined by reads since the last call (their disk replicas are gone
        and the master may be told so)."""
        with self._lock:
            taken, self._quarantined = self._quarantined, []
        return taken

    # -- writes ----------------------------------------------------------------------------

    def write_batch(self, items: Sequence[DiskWrite]) -> list[int]:
        """Write each item's file: staged, synced (with ``fsync``), renamed into ``objects/``;
        the directory is synced once for the batch.

        Returns:
            Per item, 0 or a negative code: INVALID_PARAMS (an offset already on disk or
            repeated in the batch, a range overlapping another object's or beyond the 64-bit
            space, a tenant or key the header cannot hold, data that is not contiguous or was
            released), UNABLE_OFFLOAD (``capacity_bytes`` would be exceeded), FILE_WRITE_FAIL
            (an I/O error: the item leaves no file behind), FILE_INVALID_HANDLE (store closed).
            An item reported 0 is on disk and readable; never raises for an item's I/O error.

        Complexity: O(total bytes) of I/O plus one fsync per file and one for the directory.
        """
        with self._write_lock:
            results, staged = self._validate(items)
            written: list[_Staged] = []
            for item in staged:
                code = self._stage(item)
                if code:
                    results[item.position] = code
                else:
                    written.append(item)
            renamed: list[_Staged] = []
            for item in written:
                try:
                    os.rename(item.part, self._path(item.offset))
                    renamed.append(item)
                except OSError as exc:
                    log.warning("disk tier: cannot commit %s: %s", item.part, exc)
                    unlink_quietly(item.part)
                    results[item.position] = _WRITE_FAIL
            if renamed and self._fsync:
                try:
                    fsync_directory(self._objects)
                except OSError as exc:  # not durable: undo rather than report success
                    log.warning("disk tier: cannot sync %s: %s", self._objects, exc)
                    for item in renamed:
                        unlink_quietly(self._path(item.offset))
                        results[item.position] = _WRITE_FAIL
                    renamed = []
            with self._lock:
                for item in renamed:
                    self._index[item.offset] = item.entry
                    self._used += item.entry.size
            return results

    def _validate(self, items: Sequence[DiskWrite]) -> tuple[list[int], list[_Staged]]:
        """Per item, a refusal code or a staging plan (under the write lock)."""
        results = [_OK] * len(items)
        staged: list[_Staged] = []
        batch = SortedDict()  # offset -> size, of the items accepted so far
        with self._lock:
            if self._closed:
                return [_CLOSED] * len(items), []
            room = None if self._capacity is None else self._capacity - self._used
            for position, item in enumerate(items):
                view = byte_view(item.data)
                try:
                    tenant, key = item.tenant.encode(), item.key.encode()
                except UnicodeEncodeError:  # lone surrogates: no UTF-8 for the header
                    view = None
                size = len(view) if view is not None else 0
                if (
                    view is None
                    or not 0 <= item.offset <= MAX_OFFSET - size
                    or overlaps(self._index, item.offset, size, lambda e: e.size)
                    or overlaps(batch, item.offset, size, lambda s: s)
                ):
                    results[position] = _INVALID
                    continue
                if room is not None and size > room:
                    results[position] = _FULL
                    continue
                try:
                    header_size = len(encode_header(item.offset, size, 0, tenant, key))
                except ValueError:
                    results[position] = _INVALID
                    continue
                if room is not None:
                    room -= size
                batch[item.offset] = size
                part = os.path.join(self._staging, file_name(item.offset) + PART_SUFFIX)
                entry = IndexedObject(size, header_size, item.tenant, item.key)
                staged.append(_Staged(position, item.offset, part, entry, view))
        return results, staged

    def _stage(self, item: _Staged) -> int:
        """Write one staged file whole (and sync it); 0 or FILE_WRITE_FAIL, leaving no file."""
        try:
            checksum = payload_checksum(item.payload)
        except ValueError as exc:  # the caller released the view: nothing to write
            log.warning("disk tier: object %#x not written: %s", item.offset, exc)
            return _WRITE_FAIL
        header = encode_header(
            item.offset,
            len(item.payload),
            checksum,
            item.entry.tenant.encode(),
            item.entry.key.encode(),
        )
        return _OK if write_file(item.part, header, item.payload, self._fsync) else _WRITE_FAIL

    # -- reads -----------------------------------------------------------------------------

    def read_into(
        self,
        offset: int,
        size: int,
        dest: memoryview,
        *,
        tenant: str | None = None,
        key: str | None = None,
    ) -> int:
        """Read the whole object at ``offset`` into ``dest[:size]``, checking the header and the
        payload's checksum.

        Returns:
            0, or a negative code (``dest``'s contents are then undefined): FILE_NOT_FOUND (no
            object starts at ``offset``, or it is not of ``size`` bytes or of the given
            ``tenant``/``key``), FILE_INVALID_BUFFER (``dest`` shorter than ``size`` or not
            contiguous), FILE_READ_FAIL (torn, corrupt or unreadable: a torn or corrupt file is
            quarantined), FILE_INVALID_HANDLE (store closed).

        Complexity: O(size): one read and one hash of the payload.
        """
        with self._lock:
            if self._closed:
                return _CLOSED
            found = self._index.get(offset)
        if (
            found is None
            or found.size != size
            or (tenant is not None and tenant != found.tenant)
            or (key is not None and key != found.key)
        ):
            return _NOT_FOUND
        view = byte_view(dest)
        if view is None or len(view) < size:
            return _BAD_BUFFER
        return self._read_whole(offset, found, view[:size])

    def _read_whole(self, offset: int, found: IndexedObject, dest: memoryview) -> int:
        """:func:`read_whole`, quarantining a corrupt file and remembering a checked one."""
        result = read_whole(self._path(offset), offset, found, dest)
        if isinstance(result, Corrupt):
            return self._quarantine(offset, result.reason)
        if result == _OK:
            with self._lock:
                if offset in self._index:
                    self._checked.add(offset)
        return result

    def read_range(self, offset: int, length: int) -> memoryview | int:
        """Bytes ``[offset, offset + length)`` of the disk segment, which must lie inside one
        object (the one starting at the greatest offset <= ``offset``). A read of a whole
        object checks its payload's checksum. A partial read checks the header and the file's
        length; the first read of an object whose payload this store has not checked since it
        opened reads and checks the whole payload once (later changes to a checked payload
        go unnoticed by partial reads; whole reads always check).

        Returns:
            The bytes (a fresh buffer), or a negative code: FILE_NOT_FOUND (no object holds
            ``offset``), INVALID_PARAMS (a negative argument, or a range running past the end
            of the object holding its start), FILE_READ_FAIL (torn, corrupt or unreadable: a
            torn or corrupt file is quarantined), FILE_INVALID_HANDLE (store closed).

        Complexity: O(log n) to find the object, then O(length) of I/O (O(size) for a whole
        object, or the first read of an unchecked one).
        """
        if offset < 0 or length < 0:
            return _INVALID
        with self._lock:
            if self._closed:
                return _CLOSED
            at = self._index.bisect_right(offset) - 1
            if at < 0:
                return _NOT_FOUND
            start, found = self._index.peekitem(at)
            checked = start in self._checked
        whole_read = offset == start and length == found.size
        if not whole_read:
            if offset >= start + found.size:
                return _NOT_FOUND
            if offset + length > start + found.size:
                return _INVALID
        if whole_read or not checked:
            whole = memoryview(bytearray(found.size))
            code = self._read_whole(start, found, whole)
            if code:
                return code
            return whole if whole_read else whole[offset - start : offset - start + length]
        part = read_part(self._path(start), start, found, offset - start, length)
        return self._quarantine(start, part.reason) if isinstance(part, Corrupt) else part

    def _quarantine(self, offset: int, reason: str) -> int:
        """Delete a torn or corrupt file (and its index entry); always FILE_READ_FAIL."""
        with self._lock:
            found = self._index.pop(offset, None)
            self._checked.discard(offset)
            if found is not None:
                self._used -= found.size
                self._quarantined.append(DiskEntry(offset, found.size, found.tenant, found.key))
                unlink_quietly(self._path(offset))
        log.error("disk tier: object %#x quarantined (%s)", offset, reason)
        return _READ_FAIL

    # -- index and maintenance -------------------------------------------------------------

    def scan(self, *, verify: bool = False) -> list[DiskEntry]:
        """Rebuild the index from the directory: delete everything in ``staging/`` and every
        entry of ``objects/`` that is not a complete, valid object file (a name that is no
        16-hex-digit offset, not a regular file, an invalid header, a length that does not
        match it; with ``verify``, a payload whose checksum does not match).

        Returns:
            The objects found, by offset.

        Raises:
            OSError: a directory cannot be listed.

        Complexity: O(files) small reads (O(bytes on disk) with ``verify``); excludes every
        other operation while it runs.
        """
        with self._write_lock, self._lock:
            if self._closed:
                return []
            with os.scandir(self._staging) as leftovers:
                for entry in leftovers:
                    remove_any(entry.path)
            index = SortedDict()
            with os.scandir(self._objects) as names:
                for entry in names:
                    found = inspect_file(entry.name, entry.path, verify)
                    if found is None:
                        log.warning("disk tier: removing invalid object file %s", entry.path)
                        remove_any(entry.path)
                    else:
                        index[found[0]] = found[1]
            self._index = index
            self._checked = set(index) if verify else set()
            self._used = sum(found.size for found in index.values())
            return [DiskEntry(o, f.size, f.tenant, f.key) for o, f in index.items()]

    def delete(self, offsets: Iterable[int]) -> int:
        """Delete the objects at ``offsets`` (offsets with no object are skipped, as is one
        whose write batch has not returned yet).

        Returns:
            The files removed.

        Complexity: one unlink per object; the store's lock is held per object, so reads
        interleave.
        """
        removed = 0
        for offset in offsets:
            with self._lock:
                if self._closed:
                    break
                found = self._index.pop(offset, None)
                if found is None:
                    continue
                self._checked.discard(offset)
                try:
                    os.unlink(self._path(offset))
                    removed += 1
                except FileNotFoundError:
                    pass
                except OSError as exc:  # still there and valid: keep it indexed
                    log.warning("disk tier: cannot delete object %#x: %s", offset, exc)
                    self._index[offset] = found
                    continue
                self._used -= found.size
        return removed

    def delete_all(self) -> int:
        """Delete every object file (indexed or not).

        Returns:
            The files removed.
        """
        removed = 0
        with self._write_lock, self._lock:
            if self._closed:
                return 0
            with os.scandir(self._objects) as names:
                for entry in names:
                    remove_any(entry.path)
                    removed += 1
            self._index = SortedDict()
            self._checked = set()
            self._used = 0
        return removed

    def check(self) -> None:
        """Check the store's invariants: the index names exactly the files of ``objects/``,
        each of the indexed length; ``staging/`` is empty; :attr:`used_bytes` is the sum of
        the indexed sizes. For tests and diagnostics; excludes every other operation.

        Raises:
            AssertionError: an invariant does not hold (the message says which).
        """
        with self._write_lock, self._lock:
            problems = directory_problems(self._objects, self._staging, self._index, self._used)
        if problems:
            raise AssertionError("; ".join(problems))

    def close(self) -> None:
        """Release the tier directory (its files stay, for the next store to find). Later
        calls answer FILE_INVALID_HANDLE (writes, reads) or do nothing. Idempotent."""
        with self._write_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)

    def __enter__(self) -> DiskStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _path(self, offset: int) -> str:
        return os.path.join(self._objects, file_name(offset))
