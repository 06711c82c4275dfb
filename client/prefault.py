"""Populating segment memory up front, so writes into a fresh segment take no page faults.

A memfd's pages are allocated on first touch: without help, the first write into each 4 KiB
page of a new segment stops for a page fault that allocates and zeroes it (and the first
touch of each page by a peer's mapping for another fault that fills its page table). An owner
that populates its segment at setup pays that once, in a few kernel calls spread over the
CPUs it may use, and every later copy runs at memory speed, as upstream's pinned, registered
segments do.

How (measured on Linux 6.18, 2 cores, see ``tests/bench/prefault_bench.py``): populating
costs about 0.6 s per GiB and core whichever way it is done (the kernel zeroes every page), so
the way is chosen for its failure mode, not its speed:

- ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14+) allocates and maps every page writable and
  *reports* failure (ENOMEM, EFAULT) instead of raising SIGBUS or quietly giving up;
- ``fallocate`` plus ``MAP_POPULATE`` costs the same, but ``MAP_POPULATE`` ignores failures;
- touching one byte per page (the fallback on older kernels) cannot fail cleanly: a page the
  kernel cannot allocate raises SIGBUS. Before any populating, :func:`memory_shortfall`
  therefore tells whether the segment is larger than the memory this process may still use
  (``MemAvailable``, and the remaining limit of its memory cgroup and every parent, page cache
  the kernel can reclaim not counted as used); such a segment is mapped lazily instead, as it
  was before segments were populated (overcommit), which is also what keeps a huge segment
  from waking the OOM killer.

Accounting: the pages are shared memory (``Shmem`` in ``/proc/meminfo``, ``shmem`` in the
cgroup's ``memory.stat``), charged to the cgroup of the process that first touches them. A
populated segment is therefore charged to its owner at setup, and a peer that maps it later
allocates nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import threading
from pathlib import Path

from mooncake_py.errors import ErrorCode, InternalError

MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
"""``madvise`` advice that allocates and write-maps a range (Linux 5.14+; the mmap module of
Python 3.11 does not export it, so its Linux value, 23, is the fallback)."""

PAGE_SIZE = mmap.PAGESIZE

POPULATE_CHUNK_BYTES = 64 << 20
"""Bytes populated per ``madvise`` call: the unit handed to populating threads, and what a
call interrupted (EINTR) repeats."""

MAX_POPULATE_THREADS = 8
"""At most this many threads populate one segment (page zeroing scales with cores until the
memory bandwidth is used up)."""

PREFAULT_ENV = "MOONCAKE_PY_PREFAULT_SEGMENT"
"""Environment variable of the ``prefault_segment`` setting (read by the client config)."""

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int

_UNLIMITED = 1 << 62  # cgroup v1 writes "no limit" as a number near 2**63

_UNSUPPORTED = frozenset({errno.EINVAL, errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP})
"""Answers of ``madvise`` on the first chunk meaning the advice is unknown (kernels before
5.14) or refused (a seccomp filter): populate by touching instead."""


class SegmentMemoryError(InternalError):
    """The segment's memory could not be created or populated (setup returns
    INTERNAL_ERROR, -1, for it; everything allocated for the segment is released)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INTERNAL_ERROR, message)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.detail,))


def available_memory() -> int | None:
    """Bytes this process may still allocate without pressure, or None where unknown.

    The smallest of ``MemAvailable`` (``/proc/meminfo``) and, for the memory cgroup of this
    process and each of its parents (v2 ``memory.max`` - ``memory.current``, v1
    ``memory.limit_in_bytes`` - ``memory.usage_in_bytes``), its remaining limit, with the
    reclaimable page cache (``inactive_file`` of ``memory.stat``) not counted as used. Never
    raises; a few small file reads per cgroup level.
    """
    figures = [_mem_available()]
    figures.extend(_cgroup_headroom())
    known = [figure for figure in figures if figure is not None]
    return min(known) if known else None


def _mem_available() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def _cgroup_headroom() -> list[int]:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    headroom: list[int] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # cgroup v2: the limits of every ancestor apply too
            root, names = Path("/sys/fs/cgroup"), ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            root = Path("/sys/fs/cgroup/memory")
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        directory = root / path.strip("/")
        while True:
            left = _headroom_of(directory, *names)
            if left is not None:
                headroom.append(left)
            if directory == root or root not in directory.parents:
                break
            directory = directory.parent
    return headroom


def _headroom_of(directory: Path, limit_name: str, usage_name: str) -> int | None:
    """One cgroup's limit minus its usage, reclaimable page cache not counted; None for no
    limit or unreadable files."""
    with contextlib.suppress(OSError, ValueError):
        limit_text = (directory / limit_name).read_text().strip()
        if limit_text == "max" or int(limit_text) >= _UNLIMITED:
            return None
        usage = int((directory / usage_name).read_text().strip())
        reclaimable = 0
        with contextlib.suppress(OSError, ValueError):
            for stat in (directory / "memory.stat").read_text().splitlines():
                name, _, value = stat.partition(" ")
                if name in ("inactive_file", "total_inactive_file"):
                    reclaimable = max(reclaimable, int(value))
        return max(0, int(limit_text) - max(0, usage - reclaimable))
    return None


def memory_shortfall(size: int) -> str:
    """Why ``size`` bytes cannot be populated now (a sentence), or "" when they can (or the
    figure is unknown). See :func:`available_memory`."""
    available = available_memory()
    if available is not None and size > available:
        return f"a segment of {size} bytes exceeds the {available} bytes available"
    return ""


def populate(mapping: mmap.mmap, address: int) -> str:
    """Allocate and write-map every page of ``mapping`` (a shared, writable mapping whose first
    byte is at ``address`` in this process).

    Uses ``MADV_POPULATE_WRITE`` over :data:`POPULATE_CHUNK_BYTES` chunks, taken in turn by
    up to :func:`populate_threads` threads (the kernel zeroes every page, so populating is
    bound by the cores doing it; the calls release the GIL). Where the kernel does not know
    the advice (EINVAL on the first chunk), writes a zero byte into each page instead (a fresh
    memfd is zero already, so no content changes). Ask :func:`memory_shortfall` first:
    the fallback cannot report an allocation failure. Call it before the mapping is shared
    (the fallback writes into it). O(pages) kernel work, about 0.6 s per GiB per core.

    Returns:
        ``"madvise"`` or ``"touch"``: how the pages were populated.

    Raises:
        SegmentMemoryError: the kernel could not allocate the pages (ENOMEM, EFAULT, ...);
            pages populated so far stay allocated until the mapping and memfd are released.
    """
    size = len(mapping)
    chunks = [
        (start, min(POPULATE_CHUNK_BYTES, size - start))
        for start in range(0, size, POPULATE_CHUNK_BYTES)
    ]
    first_error = _advise(address, *chunks[0])
    if first_error in _UNSUPPORTED:  # a kernel before 5.14, or a filter refusing the call
        _touch_every_page(mapping)
        return "touch"
    failures: list[tuple[int, int]] = [] if first_error == 0 else [(chunks[0][0], first_error)]
    pending = iter(chunks[1:])
    lock = threading.Lock()
    stopped = threading.Event()

    def work() -> None:
        while True:
            with lock:
                if failures or stopped.is_set():
                    return
                chunk = next(pending, None)
            if chunk is None:
                return
            error = _advise(address, *chunk)
            if error:
                with lock:
                    failures.append((chunk[0], error))

    workers = [
        threading.Thread(target=work, name=f"segment-populate-{n}", daemon=True)
        for n in range(min(populate_threads(), len(chunks) - 1))
    ]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        # Interrupted (KeyboardInterrupt in a join): no worker may go on advising a range the
        # caller is about to unmap. Each finishes the chunk it is on, then stops.
        stopped.set()
        for worker in workers:
            while worker.is_alive():
                with contextlib.suppress(KeyboardInterrupt):
                    worker.join()
    if failures:
        start, error = min(failures)
        raise SegmentMemoryError(
            f"populating the segment failed at byte {start} of {size}: "
            f"[Errno {error}] {os.strerror(error)}"
        )
    return "madvise"


def populate_threads() -> int:
    """Threads :func:`populate` uses: the CPUs this process may run on, at most
    :data:`MAX_POPULATE_THREADS`."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_POPULATE_THREADS, cpus))


def _advise(address: int, start: int, length: int) -> int:
    """``madvise(MADV_POPULATE_WRITE)`` on one chunk, repeated on EINTR; 0 or the errno."""
    while True:
        if _libc.madvise(address + start, length, MADV_POPULATE_WRITE) == 0:
            return 0
        error = ctypes.get_errno()
        if error != errno.EINTR:
            return error


def _touch_every_page(mapping: mmap.mmap) -> None:
    size = len(mapping)
    zeros = bytes(POPULATE_CHUNK_BYTES // PAGE_SIZE)
    # A chunk at a time: an extended-slice assignment is a C loop writing the first byte of
    # each page; between chunks other threads get the GIL, and no temporary grows with size.
    for start in range(0, size, POPULATE_CHUNK_BYTES):
        end = min(size, start + POPULATE_CHUNK_BYTES)
        mapping[start:end:PAGE_SIZE] = zeros[: len(range(start, end, PAGE_SIZE))]


def fully_allocated(fd: int, size: int) -> bool:
    """Whether the first ``size`` bytes of the memfd ``fd`` are allocated already (its
    ``st_blocks``), so that mapping them with ``MAP_POPULATE`` allocates nothing and only
    fills page tables. False where ``fstat`` fails. One syscall."""
    try:
        allocated = os.fstat(fd).st_blocks * 512
    except OSError:
        return False
    return allocated >= size
