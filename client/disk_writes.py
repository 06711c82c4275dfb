"""Writing one disk-tier object file, and the checks a write batch makes first, for
:class:`~mooncake_py.client.disk_store.DiskStore`.

Thread-safety: no shared state; the store serialises its write batches itself.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from typing import Any

from sortedcontainers import SortedDict

from .disk_format import write_all

log = logging.getLogger(__name__)


def unlink_quietly(path: str) -> None:
    """Unlink ``path`` if it exists; a failure is logged, never raised (a cleanup path must
    not turn one item's error into an exception)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning("disk tier: cannot remove %s: %s", path, exc)


def remove_any(path: str) -> None:
    """Remove a file, link or directory tree (what a scan finds where it does not belong)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        unlink_quietly(path)


def byte_view(data: memoryview | bytes) -> memoryview | None:
    """``data`` as a flat view of bytes without copying, or None if it is not contiguous
    (or a view already released)."""
    try:
        view = memoryview(data)
    except ValueError:
        return None
    if not view.c_contiguous:
        return None
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def overlaps(index: SortedDict, offset: int, size: int, size_of: Callable[[Any], int]) -> bool:
    """Whether ``[offset, offset + size)`` meets a range of ``index`` (start -> value,
    ``size_of(value)`` its length); an empty range counts as its start, so two objects never
    share a start. O(log n)."""
    if offset in index:
        return True
    at = index.bisect_right(offset)
    if at:
        before, value = index.peekitem(at - 1)
        if before + size_of(value) > offset:
            return True
    return at < len(index) and index.peekitem(at)[0] < offset + size


def write_file(path: str, header: bytes, payload: memoryview, fsync: bool) -> bool:
    """Create (or replace) ``path`` holding ``header`` then ``payload``, written from the
    buffers in place, and sync it when ``fsync``.

    Returns:
        True when written; False after an I/O error, or when ``payload`` was released under
        the write (logged), with ``path`` removed.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, [header, payload])
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except (OSError, ValueError) as exc:  # ValueError: the payload's view was released
        log.warning("disk tier: cannot write %s: %s", path, exc)
        unlink_quietly(path)
        return False
    return True
