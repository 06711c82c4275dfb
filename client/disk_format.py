"""The on-disk format of one disk-tier object file, and the plain-file I/O the store uses.

A disk-tier file holds one object: a header, then the payload. Its name (in the tier's
``objects/`` directory) is the object's offset in the disk segment's virtual address space, as
16 lowercase hex digits (:func:`file_name`).

Header (little-endian)::

    magic "MCDK" | version u16 | flags u16 (0) | header_size u32 | payload_size u64
    | offset u64 | payload xxh3_64 u64 | tenant_len u16 | key_len u32        (42 bytes)
    | tenant (UTF-8) | key (UTF-8) | header xxh3_64 u64 (of every byte before it)

``header_size`` is the whole header (42 + tenant_len + key_len + 8): the payload starts there,
and a complete file is exactly ``header_size + payload_size`` bytes long. The header carries
the offset too, so a file renamed by hand (or a header belonging to another object) is caught.

Thread-safety: pure functions; the I/O helpers touch only the descriptors they are given.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

MAGIC = b"MCDK"
VERSION = 1
FIXED = struct.Struct("<4sHHIQQQHI")
"""magic, version, flags, header_size, payload_size, offset, payload checksum, tenant length,
key length."""
CHECKSUM = struct.Struct("<Q")
MAX_TENANT_BYTES = 0xFFFF
MAX_KEY_BYTES = 1 << 20
"""Longest key a header holds (far above any real key: a corrupt length must not make a scan
read megabytes of garbage)."""
MAX_HEADER_BYTES = FIXED.size + MAX_TENANT_BYTES + MAX_KEY_BYTES + CHECKSUM.size
MAX_OFFSET = (1 << 64) - 1

_NAME = re.compile(r"[0-9a-f]{16}")
# os.writev / os.preadv take at most this many buffers per call on Linux (IOV_MAX).
_IOV_MAX = 1024


@dataclass(frozen=True, slots=True)
class Header:
    """A decoded, verified header."""

    header_size: int
    payload_size: int
    offset: int
    payload_checksum: int
    tenant: str
    key: str


def file_name(offset: int) -> str:
    """The file name of the object at ``offset`` (16 lowercase hex digits)."""
    return f"{offset:016x}"


def offset_of_name(name: str) -> int | None:
    """The offset a file name stands for, or None when it is no :func:`file_name`."""
    return int(name, 16) if _NAME.fullmatch(name) else None


def payload_checksum(payload: memoryview | bytes) -> int:
    """xxh3_64 of ``payload``, read in place (no copy). O(len(payload))."""
    return xxhash.xxh3_64_intdigest(payload)


def encode_header(
    offset: int, size: int, checksum: int, tenant_bytes: bytes, key_bytes: bytes
) -> bytes:
    """The header of an object (see the module docstring).

    Raises:
        ValueError: a tenant or key longer than the format holds, or an offset or size out of
            the u64 range.
    """
    if len(tenant_bytes) > MAX_TENANT_BYTES or len(key_bytes) > MAX_KEY_BYTES:
        raise ValueError("tenant or key too long for a disk-tier header")
    if not (0 <= offset <= MAX_OFFSET and 0 <= size <= MAX_OFFSET):
        raise ValueError("offset or size out of range")
    header_size = FIXED.size + len(tenant_bytes) + len(key_bytes) + CHECKSUM.size
    body = (
        FIXED.pack(
            MAGIC,
            VERSION,
            0,
            header_size,
            size,
            offset,
            checksum,
            len(tenant_bytes),
            len(key_bytes),
        )
        + tenant_bytes
        + key_bytes
    )
    return body + CHECKSUM.pack(xxhash.xxh3_64_intdigest(body))


def header_size_of(fixed: bytes) -> int | None:
    """The full header size announced by a header's first :data:`FIXED` bytes, or None when
    they are no header of this format (magic, version, flags, lengths)."""
    if len(fixed) < FIXED.size:
        return None
    magic, version, flags, header_size, _, _, _, tenant_len, key_len = FIXED.unpack_from(fixed)
    if magic != MAGIC or version != VERSION or flags != 0:
        return None
    if key_len > MAX_KEY_BYTES:
        return None
    if header_size != FIXED.size + tenant_len + key_len + CHECKSUM.size:
        return None
    return int(header_size)


def decode_header(raw: bytes | bytearray) -> Header | None:
    """The header ``raw`` holds (exactly its bytes), or None when it is not a valid one: wrong
    magic or version, inconsistent lengths, a header checksum that does not match, or text
    that is not UTF-8. O(len(raw))."""
    header_size = header_size_of(bytes(raw[: FIXED.size]))
    if header_size is None or len(raw) != header_size:
        return None
    body_end = header_size - CHECKSUM.size
    (stored,) = CHECKSUM.unpack_from(raw, body_end)
    if xxhash.xxh3_64_intdigest(memoryview(raw)[:body_end]) != stored:
        return None
    _, _, _, _, size, offset, checksum, tenant_len, key_len = FIXED.unpack_from(raw)
    text_start = FIXED.size
    try:
        tenant = bytes(raw[text_start : text_start + tenant_len]).decode()
        key = bytes(raw[text_start + tenant_len : body_end]).decode()
    except UnicodeDecodeError:
        return None
    return Header(header_size, size, offset, checksum, tenant, key)


def write_all(fd: int, buffers: Sequence[memoryview | bytes]) -> None:
    """Write every buffer to ``fd`` in order, resuming after short writes (the kernel caps one
    ``writev`` near 2 GiB). Zero-copy: the buffers are handed to the kernel as they are.

    Raises:
        OSError: the write failed (ENOSPC, EIO, ...).
    """
    pending = [memoryview(b) for b in buffers if len(b)]
    while pending:
        written = os.writev(fd, pending[:_IOV_MAX])
        while written and pending:
            head = pending[0]
            if written >= len(head):
                written -= len(head)
                pending.pop(0)
            else:
                pending[0] = head[written:]
                written = 0


def read_exactly(fd: int, buffers: list[memoryview], position: int) -> int:
    """Fill ``buffers`` in order from ``fd`` at ``position``, resuming after short reads.

    Returns:
        The bytes read: less than the buffers' total only when the file ended first.

    Raises:
        OSError: the read failed.
    """
    pending = [b for b in buffers if len(b)]
    total = 0
    while pending:
        got = os.preadv(fd, pending[:_IOV_MAX], position)
        if got == 0:
            return total
        total += got
        position += got
        while got and pending:
            head = pending[0]
            if got >= len(head):
                got -= len(head)
                pending.pop(0)
            else:
                pending[0] = head[got:]
                got = 0
    return total


def fsync_directory(path: str) -> None:
    """Make the directory entries of ``path`` (creations, renames, unlinks) durable.

    Raises:
        OSError: the directory could not be opened or synced.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_header(fd: int, offset: int, file_length: int) -> Header | None:
    """The verified header of the object file open on ``fd``, or None when the file is not a
    complete, valid file for the object at ``offset``: an invalid header, one naming another
    offset, or a length other than ``header_size + payload_size`` (torn or overlong).

    Raises:
        OSError: a read failed.
    """
    fixed = os.pread(fd, FIXED.size, 0)
    header_size = header_size_of(fixed)
    if header_size is None or header_size > file_length:
        return None
    raw = bytearray(header_size)
    if read_exactly(fd, [memoryview(raw)], 0) != header_size:
        return None
    header = decode_header(raw)
    if header is None or header.offset != offset:
        return None
    if file_length != header.header_size + header.payload_size:
        return None
    return header


def payload_matches(fd: int, header: Header, chunk_bytes: int = 1 << 20) -> bool:
    """Whether the payload on ``fd`` hashes to the header's checksum (read in chunks of
    ``chunk_bytes``). O(payload_size).

    Raises:
        OSError: a read failed.
    """
    hasher = xxhash.xxh3_64()
    buffer = bytearray(min(chunk_bytes, max(header.payload_size, 1)))
    view = memoryview(buffer)
    position, remaining = header.header_size, header.payload_size
    while remaining:
        want = min(remaining, len(buffer))
        got = read_exactly(fd, [view[:want]], position)
        if got != want:
            return False
        hasher.update(view[:want])
        position += want
        remaining -= want
    return hasher.intdigest() == header.payload_checksum
