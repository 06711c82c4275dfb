"""Reading and checking disk-tier object files (:mod:`mooncake_py.client.disk_format`) for
:class:`~mooncake_py.client.disk_store.DiskStore`.

These functions only read. A file that fails a check (torn, corrupt, or no longer the object
the index recorded) is reported as :class:`Corrupt`, and the store quarantines it; an I/O error
is a plain FILE_READ_FAIL (the file may be fine: it is not deleted for that).

Thread-safety: no shared state; a file unlinked after it was opened still reads through its
descriptor, one unlinked before answers FILE_NOT_FOUND.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from typing import NamedTuple

from mooncake_py.errors import ErrorCode

from .disk_format import (
    Header,
    decode_header,
    file_name,
    offset_of_name,
    payload_checksum,
    payload_matches,
    read_exactly,
    read_header,
)

log = logging.getLogger(__name__)

_NOT_FOUND = int(ErrorCode.FILE_NOT_FOUND)
_READ_FAIL = int(ErrorCode.FILE_READ_FAIL)


class IndexedObject(NamedTuple):
    """What the store's index keeps of one object file."""

    size: int
    header_size: int
    tenant: str
    key: str


class Corrupt(NamedTuple):
    """A file that must not be served: why."""

    reason: str


def indexed_from(header: Header) -> IndexedObject:
    """The index entry of a file with ``header``."""
    return IndexedObject(header.payload_size, header.header_size, header.tenant, header.key)


def _matches(header: Header, offset: int, found: IndexedObject) -> bool:
    """Whether a file's header is still the one the index recorded for it."""
    return header.offset == offset and indexed_from(header) == found


def _open(path: str, offset: int) -> int:
    """A read descriptor of ``path``, or a negative code (logged unless merely missing)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:  # deleted since the index was consulted
        return _NOT_FOUND
    except OSError as exc:
        log.warning("disk tier: cannot open object %#x: %s", offset, exc)
        return _READ_FAIL


def read_whole(path: str, offset: int, found: IndexedObject, dest: memoryview) -> int | Corrupt:
    """Read the object file at ``path`` (offset ``offset``, indexed as ``found``) into
    ``dest`` (exactly ``found.size`` bytes), checking its length, header and payload checksum.

    Returns:
        0; FILE_NOT_FOUND (the file is gone); FILE_READ_FAIL (an I/O error); or
        :class:`Corrupt`. ``dest`` is undefined unless 0.

    Complexity: one ``preadv`` of the file and one hash of the payload.
    """
    fd = _open(path, offset)
    if fd < 0:
        return fd
    header_bytes = bytearray(found.header_size)
    expected = found.header_size + found.size
    try:
        file_length = os.fstat(fd).st_size
        got = read_exactly(fd, [memoryview(header_bytes), dest], 0)
    except OSError as exc:
        log.warning("disk tier: cannot read object %#x: %s", offset, exc)
        return _READ_FAIL
    finally:
        os.close(fd)
    if got != expected or file_length != expected:
        return Corrupt(f"{file_length} bytes long, {expected} expected")
    header = decode_header(header_bytes)
    if header is None or not _matches(header, offset, found):
        return Corrupt("invalid header")
    if payload_checksum(dest) != header.payload_checksum:
        return Corrupt("payload checksum mismatch")
    return 0


def read_part(
    path: str, offset: int, found: IndexedObject, skip: int, length: int
) -> memoryview | int | Corrupt:
    """``length`` payload bytes from ``skip`` into the object file at ``path``, after checking
    its header and length (not the payload's checksum: that needs the whole payload).

    Returns:
        The bytes (a fresh buffer); FILE_NOT_FOUND; FILE_READ_FAIL (an I/O error); or
        :class:`Corrupt`.

    Complexity: two small reads for the header, one of ``length`` bytes.
    """
    fd = _open(path, offset)
    if fd < 0:
        return fd
    out = memoryview(bytearray(length))
    try:
        header = read_header(fd, offset, os.fstat(fd).st_size)
        if header is None or not _matches(header, offset, found):
            return Corrupt("invalid header or length")
        got = read_exactly(fd, [out], header.header_size + skip)
    except OSError as exc:
        log.warning("disk tier: cannot read object %#x: %s", offset, exc)
        return _READ_FAIL
    finally:
        os.close(fd)
    if got != length:  # the file shrank under the read
        return Corrupt("short read")
    return out


def inspect_file(name: str, path: str, verify: bool) -> tuple[int, IndexedObject] | None:
    """The offset and index entry of the directory entry ``name`` of ``objects/``, or None
    when it is not a complete, valid object file: a name that is no offset, not a regular
    file, an invalid header, a length that does not match it, or (``verify``) a payload whose
    checksum does not match. Unreadable files count as invalid.

    Complexity: two small reads (plus the whole payload with ``verify``).
    """
    offset = offset_of_name(name)
    if offset is None:
        return None
    try:
        # O_NOFOLLOW: a symlink is no object; O_NONBLOCK: a FIFO must not block the scan.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            return None
        header = read_header(fd, offset, status.st_size)
        if header is None or (verify and not payload_matches(fd, header)):
            return None
    except OSError:
        return None
    finally:
        os.close(fd)
    return offset, indexed_from(header)


def directory_problems(
    objects: str, staging: str, index: Mapping[int, IndexedObject], used_bytes: int
) -> list[str]:
    """What breaks a store's invariants (empty when they hold): ``index`` must name exactly
    the files of ``objects``, each of its indexed length; ``staging`` must be empty;
    ``used_bytes`` must be the sum of the indexed sizes. The caller keeps the store still.

    Complexity: one listing and one stat per file.
    """
    problems: list[str] = []
    with os.scandir(objects) as listing:
        on_disk = {entry.name: entry.stat(follow_symlinks=False).st_size for entry in listing}
    indexed = {file_name(offset): found for offset, found in index.items()}
    if set(on_disk) != set(indexed):
        problems.append(f"index != objects/: {sorted(set(on_disk) ^ set(indexed))}")
    for name in set(on_disk) & set(indexed):
        found = indexed[name]
        if on_disk[name] != found.header_size + found.size:
            problems.append(f"{name}: {on_disk[name]} bytes on disk")
    leftovers = os.listdir(staging)
    if leftovers:
        problems.append(f"staging/ not empty: {leftovers}")
    if used_bytes != sum(found.size for found in index.values()):
        problems.append(f"used_bytes {used_bytes} != sum of sizes")
    return problems
