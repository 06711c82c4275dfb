"""Claiming a disk-tier directory: one per store, exclusive across processes, found again after
a restart.

Several stores (usually several client processes on one host) may share a tier root. Each one
holds its own ``root/tier-<n>/`` with ``fcntl.flock(LOCK_EX | LOCK_NB)`` on
``root/tier-<n>/lock`` for its whole life, so no two stores ever share a directory. A process
that dies (even by SIGKILL) loses its lock with its descriptors, and the next store to look
takes that directory over, preferring directories that still hold objects, so a restarted
process finds its files again. A store may name its *owner* (its tenant, say): it then takes
only directories of that owner (recorded in ``root/tier-<n>/owner``) or empty ones, so one
tenant's restarted process never takes, and discards, another tenant's files. flock is the
only arbiter: every race (two processes creating the same ``tier-<n>``, one locking a
directory another has just made) ends with exactly one holder and the other trying the next
candidate.

Thread-safety: the functions share no state; the lock is per open file description, so two
stores in one process exclude each other as well as two processes do.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re

TIER_PREFIX = "tier-"
LOCK_FILE = "lock"
OWNER_FILE = "owner"
"""Who the directory's files belong to (as the claiming store named its owner)."""
OBJECTS_DIR = "objects"
"""Complete object files only."""
STAGING_DIR = "staging"
"""Files being written (anything here after a crash is garbage)."""

_TIER_NAME = re.compile(r"tier-(\d+)")
# Every failed round means another process claimed a directory meanwhile; far more rounds
# than that can happen would mean a loop, not contention.
_CLAIM_ROUNDS = 1000


def _tier_number(name: str) -> int | None:
    match = _TIER_NAME.fullmatch(name)
    return int(match[1]) if match else None


def _holds_objects(path: str) -> bool:
    try:
        with os.scandir(os.path.join(path, OBJECTS_DIR)) as entries:
            return any(True for _ in entries)
    except OSError:  # no objects/ yet (or unreadable): nothing to find again there
        return False


def _try_lock(path: str) -> int | None:
    """The descriptor of ``path/lock`` held exclusively, or None when another store holds it
    (or the directory vanished).

    Raises:
        OSError: the lock file could not be created or locked for another reason.
    """
    try:
        fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        os.close(fd)
        raise
    return fd


def _owner_of(path: str) -> str | None:
    """The owner recorded in a tier directory; None when none is."""
    try:
        with open(os.path.join(path, OWNER_FILE), encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def _may_take(path: str, owner: str | None) -> bool:
    """Whether a store of ``owner`` may claim ``path``: any store may when it names no owner;
    otherwise the directory is ``owner``'s, or holds no object (nothing of anyone's is lost)."""
    return owner is None or _owner_of(path) == owner or not _holds_objects(path)


def _record_owner(path: str, owner: str) -> None:
    """Write ``owner`` into the claimed directory (atomically)."""
    staged = os.path.join(path, f"{OWNER_FILE}.part")
    with open(staged, "w", encoding="utf-8") as handle:
        handle.write(owner)
    os.replace(staged, os.path.join(path, OWNER_FILE))


def claim_tier_directory(root: str, owner: str | None = None) -> tuple[str, int]:
    """Claim a tier directory under ``root`` (created if missing).

    Unlocked existing directories come first, those holding objects before empty ones, lowest
    number first; with none free, the next ``tier-<n>`` is created. With ``owner``, only the
    directories of that owner (or empty ones without an owner) are candidates, and the claimed
    one records it; an empty directory of another owner is taken over only when it holds no
    object.

    Returns:
        ``(directory path, lock descriptor)``; closing the descriptor releases the claim.

    Raises:
        OSError: ``root`` cannot be created or read, a lock file cannot be made, or no
            directory could be claimed after many rounds of contention.

    Complexity: O(directories under root) per round; one round without contention.
    """
    os.makedirs(root, exist_ok=True)
    for _ in range(_CLAIM_ROUNDS):
        tiers: list[tuple[int, str]] = []
        with os.scandir(root) as entries:
            for entry in entries:
                number = _tier_number(entry.name)
                if number is not None and entry.is_dir(follow_symlinks=False):
                    tiers.append((number, entry.path))
        for _, path in sorted(tiers, key=lambda tier: (not _holds_objects(tier[1]), tier[0])):
            if not _may_take(path, owner):
                continue
            fd = _try_lock(path)
            if fd is not None:
                if not _may_take(path, owner):  # its last holder wrote files meanwhile
                    os.close(fd)
                    continue
                if owner is not None and _owner_of(path) != owner:
                    _record_owner(path, owner)
                return path, fd
        number = max((n for n, _ in tiers), default=-1) + 1
        path = os.path.join(root, f"{TIER_PREFIX}{number}")
        try:
            os.mkdir(path)
        except FileExistsError:  # another process made it first: look again
            continue
        fd = _try_lock(path)
        if fd is not None:
            if owner is not None:
                _record_owner(path, owner)
            return path, fd
    raise OSError(errno.EAGAIN, f"no disk-tier directory could be claimed under {root}")
