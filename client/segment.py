"""Client memory: the segment a client contributes, as anonymous shared memory.

A segment is a memfd (``memfd_create``): shared memory with no name in any file system. The
owner maps it ``MAP_SHARED`` and serves it to remote clients over TCP; same-host peers that
hold a capability for it get its file descriptor from the owner over a local socket
(:mod:`mooncake_py.client.local_share`) and map the same pages, so their copies are one memcpy
and no socket. Nothing is ever created in ``/dev/shm``: when the last process holding the
memfd or a mapping of it exits (``kill -9`` included) the kernel frees the memory, and no file
can be left behind.

The memfd is sealed against shrinking and growing (``F_SEAL_SHRINK | F_SEAL_GROW``, then
``F_SEAL_SEAL``) where the kernel supports seals: no holder of the descriptor can truncate the
pages under another's mapping (which would raise SIGBUS there) or change the seals.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import mmap
import os
import socket
import uuid
from pathlib import Path

MEMFD_PREFIX = "mooncake_py/"
"""The memfd's name starts with this, followed by the segment id (it shows in
``/proc/<pid>/maps`` as ``/memfd:mooncake_py/<id> (deleted)``; it names nothing)."""

SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0)
"""The seal a peer requires before it maps a handed-over segment (0: no seals here)."""
SEALS = SEAL_SHRINK | getattr(fcntl, "F_SEAL_GROW", 0) | getattr(fcntl, "F_SEAL_SEAL", 0)
"""Seals added to a segment's memfd: its size is fixed for good, and the seals with it."""


def host_id() -> str:
    """An id shared by every process that can take part in a same-host handover here.

    Machine id plus boot id plus the network namespace: the handover socket lives in the
    abstract Unix namespace, which is per network namespace, so containers on one machine
    that do not share one get different ids, and a reboot changes the id.
    """
    parts = [socket.gethostname()]
    for path in ("/etc/machine-id", "/proc/sys/kernel/random/boot_id"):
        with contextlib.suppress(OSError):
            parts.append(Path(path).read_text().strip())
    with contextlib.suppress(OSError):
        stat = os.stat("/proc/self/ns/net")
        parts.append(f"net:{stat.st_dev}:{stat.st_ino}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def _address_of(mapping: mmap.mmap) -> tuple[int, ctypes.Array[ctypes.c_char]]:
    """Address of a mapping's first byte, and the ctypes view that pins it (keep it alive)."""
    anchor = (ctypes.c_char * len(mapping)).from_buffer(mapping)
    return ctypes.addressof(anchor), anchor


class MappedMemory:
    """Shared memory (a memfd's pages) mapped read-write into this process.

    Args:
        fd: the descriptor to map; the caller keeps ownership of it (the mapping holds its
            own duplicate, released by :meth:`close`).
        size: bytes to map (> 0, at most the descriptor's size).

    Raises:
        OSError, ValueError: the descriptor cannot be mapped.

    Attributes:
        size: bytes mapped.
        address: address of the first byte in this process.
        view: a writable memoryview of the whole mapping.
    """

    def __init__(self, fd: int, size: int) -> None:
        self._mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.size = size
        self.address, self._anchor = _address_of(self._mapping)
        self.view = memoryview(self._mapping)

    def close(self) -> None:
        """Unmap. Raises nothing; a mapping still exported elsewhere is left to the GC."""
        self.view.release()
        del self._anchor
        with contextlib.suppress(BufferError):
            self._mapping.close()


class LocalSegment(MappedMemory):
    """The segment this client contributes: a new memfd of ``size`` bytes, zero-filled,
    close-on-exec, sealed at that size (see the module docstring).

    Args:
        size: bytes (> 0).

    Raises:
        ValueError: ``size`` is not positive.
        OSError: the memory could not be created (``ENOMEM``, a memfd limit, ...).

    Attributes:
        segment_id: a fresh uuid4, as mounted on the master.
        fd: the memfd, handed to peers by :class:`~mooncake_py.client.local_share.LocalShareServer`
            (valid until :meth:`close`).
        sealed: whether the seals could be applied.
    """

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError(f"a segment needs a positive size, not {size}")
        self.segment_id = str(uuid.uuid4())
        fd = os.memfd_create(
            MEMFD_PREFIX + self.segment_id, os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0)
        )
        try:
            os.ftruncate(fd, size)
            self.sealed = _seal(fd)
            super().__init__(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def close(self) -> None:
        """Unmap and close the memfd (the memory is freed once no peer maps it). Idempotent."""
        if self.fd < 0:
            return
        super().close()
        os.close(self.fd)
        self.fd = -1


def _seal(fd: int) -> bool:
    """Apply :data:`SEALS` to ``fd``; False where the kernel or platform has no seals."""
    add_seals = getattr(fcntl, "F_ADD_SEALS", None)
    if add_seals is None or not SEALS:
        return False
    try:
        fcntl.fcntl(fd, add_seals, SEALS)
    except OSError:  # EINVAL: a kernel (or file system) without seals
        return False
    return True


def seals_of(fd: int) -> int | None:
    """The seals on ``fd``, or None where the platform cannot tell."""
    get_seals = getattr(fcntl, "F_GET_SEALS", None)
    if get_seals is None:
        return None
    try:
        return int(fcntl.fcntl(fd, get_seals))
    except OSError:
        return None
