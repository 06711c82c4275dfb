"""Client memory: the segment a client contributes, and mappings of peers' segments.

A segment is a file in ``/dev/shm`` created with owner-only permissions and mapped into the
owning process. The owner serves it to remote clients over TCP; clients on the same host map
the same file and copy directly, one memcpy and no socket. The file name carries the owner's pid
so that files left behind by a crashed owner can be found and removed
(:func:`remove_stale_segment_files`).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import mmap
import os
import socket
import threading
import uuid
from pathlib import Path

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "mooncake_py-"


def host_id() -> str:
    """An id shared by every process that sees the same ``/dev/shm`` on this machine.

    Machine id plus boot id plus the inode of ``/dev/shm``: containers on one machine that do
    not share ``/dev/shm`` get different ids, and a reboot changes the id.
    """
    parts = [socket.gethostname()]
    for path in ("/etc/machine-id", "/proc/sys/kernel/random/boot_id"):
        with contextlib.suppress(OSError):
            parts.append(Path(path).read_text().strip())
    with contextlib.suppress(OSError):
        stat = SHM_DIR.stat()
        parts.append(f"{stat.st_dev}:{stat.st_ino}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def _address_of(mapping: mmap.mmap) -> tuple[int, ctypes.Array[ctypes.c_char]]:
    """Address of a mapping's first byte, and the ctypes view that pins it (keep it alive)."""
    anchor = (ctypes.c_char * len(mapping)).from_buffer(mapping)
    return ctypes.addressof(anchor), anchor


class MappedFile:
    """A shared-memory file mapped read-write into this process.

    Attributes:
        path: the file.
        size: bytes mapped.
        address: address of the first byte in this process.
        view: a writable memoryview of the whole mapping.
    """

    def __init__(self, path: str, size: int, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size < size:
                raise OSError(f"{path} is smaller than the segment it should hold")
            self._mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            if create:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise
        os.close(fd)
        self.path = path
        self.size = size
        self.address, self._anchor = _address_of(self._mapping)
        self.view = memoryview(self._mapping)

    def close(self) -> None:
        """Unmap. Raises nothing; a mapping still exported elsewhere is left to the GC."""
        self.view.release()
        del self._anchor
        with contextlib.suppress(BufferError):
            self._mapping.close()


class LocalSegment(MappedFile):
    """The segment this client contributes: a new ``/dev/shm`` file, mode 0600.

    Args:
        size: bytes (> 0).
    """

    def __init__(self, size: int) -> None:
        self.segment_id = str(uuid.uuid4())
        path = str(SHM_DIR / f"{SHM_PREFIX}{os.getpid()}-{self.segment_id}")
        super().__init__(path, size, create=True)

    def close(self) -> None:
        """Unmap and delete the file."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        super().close()


class PeerMappings:
    """Mappings of other clients' segments on this host, opened on first use. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_segment: dict[str, MappedFile] = {}

    def get(self, segment_id: str, path: str, size_at_least: int) -> MappedFile | None:
        """The mapping of ``path`` (cached per segment id), or None when it cannot be opened."""
        with self._lock:
            mapped = self._by_segment.get(segment_id)
            if mapped is not None and mapped.size >= size_at_least:
                return mapped
        if not path.startswith(str(SHM_DIR) + "/" + SHM_PREFIX):
            return None
        try:
            size = os.stat(path).st_size
            mapped = MappedFile(path, size, create=False)
        except (OSError, ValueError):
            return None
        if mapped.size < size_at_least:
            mapped.close()
            return None
        with self._lock:
            previous = self._by_segment.get(segment_id)
            self._by_segment[segment_id] = mapped
        if previous is not None:
            previous.close()
        return mapped

    def forget(self, segment_id: str) -> None:
        """Drop a mapping (its owner went away)."""
        with self._lock:
            mapped = self._by_segment.pop(segment_id, None)
        if mapped is not None:
            mapped.close()

    def prune(self) -> list[str]:
        """Forget mappings whose owner process has died, deleting their files (crash recovery).

        Returns:
            The segment ids forgotten. Complexity: O(mappings).
        """
        with self._lock:
            dead = [sid for sid, m in self._by_segment.items() if not _owner_alive(m.path)]
        for segment_id in dead:
            mapped = self._by_segment.get(segment_id)
            if mapped is not None:
                with contextlib.suppress(OSError):
                    os.unlink(mapped.path)
            self.forget(segment_id)
        return dead

    def close(self) -> None:
        """Drop every mapping."""
        with self._lock:
            mappings = list(self._by_segment.values())
            self._by_segment.clear()
        for mapped in mappings:
            mapped.close()


def remove_stale_segment_files() -> list[str]:
    """Delete segment files whose owner process no longer exists; returns the paths removed."""
    removed: list[str] = []
    for path in SHM_DIR.glob(f"{SHM_PREFIX}*"):
        if _owner_alive(str(path)):
            continue
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(str(path))
    return removed


def _owner_alive(path: str) -> bool:
    """False when ``path`` names a segment file whose owner process no longer exists."""
    pid_text = Path(path).name[len(SHM_PREFIX) :].split("-", 1)[0]
    return not pid_text.isdigit() or _process_alive(int(pid_text))


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
