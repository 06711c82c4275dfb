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

The owner populates the segment at setup (:mod:`mooncake_py.client.prefault`; the
``prefault_segment`` setting, default on), so no write into it takes a page fault; a peer
mapping a populated segment maps it with ``MAP_POPULATE`` (page tables only: the pages exist).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import logging
import mmap
import os
import socket
import uuid
from pathlib import Path

from .prefault import SegmentMemoryError, fully_allocated, memory_shortfall, populate

log = logging.getLogger(__name__)

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


_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)

PEER_POPULATE_MAX_BYTES = 1 << 30
"""Largest segment a peer maps with ``MAP_POPULATE`` by default. Filling page tables costs
about 0.12 s per GiB at mapping time (measured), paid by the peer's first operation on the
segment; above this a peer maps lazily, so its first operation is not held up for seconds
and it pays only for the pages it touches."""


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
        map_populate: fill the page tables at once (``MAP_POPULATE``); None (the default)
            does so when ``size`` is at most :data:`PEER_POPULATE_MAX_BYTES` and the memfd's
            pages are all allocated already (a populated owner's segment): mapping then
            allocates nothing and charges nothing to this process, and costs less than the
            page faults it saves (measured: 0.15 s vs 0.48 s for mapping 1 GiB and writing
            into every page).

    Raises:
        OSError, ValueError: the descriptor cannot be mapped.

    Attributes:
        size: bytes mapped.
        address: address of the first byte in this process.
        view: a writable memoryview of the whole mapping.
        page_tables_populated: whether the mapping was made with ``MAP_POPULATE``.
    """

    def __init__(self, fd: int, size: int, map_populate: bool | None = None) -> None:
        if map_populate is None:
            map_populate = size <= PEER_POPULATE_MAX_BYTES and fully_allocated(fd, size)
        self.page_tables_populated = bool(map_populate and _MAP_POPULATE)
        flags = mmap.MAP_SHARED | (_MAP_POPULATE if self.page_tables_populated else 0)
        self._mapping = mmap.mmap(fd, size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
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
    close-on-exec, sealed at that size (see the module docstring), populated unless
    ``prefault`` is False.

    Args:
        size: bytes (> 0).
        prefault: allocate and write-map every page now
            (:func:`~mooncake_py.client.prefault.populate`, about 0.6 s per GiB) when the
            memory is available (else the segment is mapped lazily, with a warning); False
            leaves the pages to be allocated by the first write into each.

    Raises:
        ValueError: ``size`` is not positive.
        SegmentMemoryError: the memory could not be created or, though available, could not
            be populated (ENOMEM, a memfd limit, ...); nothing stays allocated.

    Attributes:
        segment_id: a fresh uuid4, as mounted on the master.
        fd: the memfd, handed to peers by :class:`~mooncake_py.client.local_share.LocalShareServer`
            (valid until :meth:`close`).
        sealed: whether the seals could be applied.
        populated_by: ``"madvise"`` or ``"touch"`` (how the pages were populated), or ``""``
            when ``prefault`` was False.
    """

    def __init__(self, size: int, prefault: bool = True) -> None:
        if size <= 0:
            raise ValueError(f"a segment needs a positive size, not {size}")
        self.segment_id = str(uuid.uuid4())
        self.fd = -1
        self.populated_by = ""
        shortfall = memory_shortfall(size) if prefault else ""
        if shortfall:
            # As before segments were populated: the pages come on first write (overcommit).
            log.warning("%s: mapping it lazily, not populating it", shortfall)
            prefault = False
        try:
            fd = os.memfd_create(
                MEMFD_PREFIX + self.segment_id,
                os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0),
            )
        except OSError as exc:
            raise SegmentMemoryError(f"cannot create a segment of {size} bytes: {exc}") from exc
        try:
            os.ftruncate(fd, size)
            self.sealed = _seal(fd)
            # The owner's own mapping is populated below, where failures are reported.
            super().__init__(fd, size, map_populate=False)
        except OSError as exc:
            os.close(fd)
            raise SegmentMemoryError(f"cannot map a segment of {size} bytes: {exc}") from exc
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        if prefault:
            try:
                self.populated_by = populate(self._mapping, self.address)
            except BaseException:
                self.close()  # unmaps and closes the memfd: its pages are freed
                raise

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
