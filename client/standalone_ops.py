"""What the standalone client service does for one attached connection: map the memory the
engine registered on it, translate the engine's addresses, and run whitelisted store calls.

:class:`ConnectionRegions` holds one connection's mappings of engine memory (each a memfd or
other shared file the engine sent). :func:`run_call` runs one ``call`` request through the
service's typed :class:`~mooncake_py.Client`, after rewriting every engine address into the
service's mapping of the same pages. An address range that is not wholly inside one mapping
of *this* connection becomes address 0, which the client refuses per key with
INVALID_PARAMS: a request can only reach memory its own connection registered.
``get_into_ranges`` (one base per buffer, offsets from it) is confined per range the same way.

Thread-safety: a :class:`ConnectionRegions` belongs to its connection's thread
(:attr:`ConnectionRegions.count` may be read from any thread).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import fcntl
import logging
import mmap
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mooncake_py.errors import ErrorCode, MooncakeError
from mooncake_py.types import ProbeLeaseMode, ReplicateConfig

from .ranged import RangedSessions
from .results import BatchResult

if TYPE_CHECKING:
    from .api import Client

log = logging.getLogger(__name__)

OK = int(ErrorCode.OK)
INVALID = int(ErrorCode.INVALID_PARAMS)
NO_SPACE = int(ErrorCode.NO_AVAILABLE_HANDLE)


class Budget(Protocol):
    """The service-wide cap on mapped engine memory."""

    def take(self, size: int) -> bool: ...

    def give(self, size: int) -> None: ...


@dataclass(slots=True)
class _Region:
    base: int  # the engine's address of the first byte
    size: int
    local: int  # the service's address of the same byte
    mapping: mmap.mmap
    anchor: Any  # the ctypes view that pins ``local``; dropped before unmapping


def _is_bool(*values: object) -> bool:
    # JSON true / false decode as bools, which are ints to Python but never addresses.
    return any(isinstance(v, bool) for v in values)


class ConnectionRegions:
    """The engine memory one connection registered, mapped into the service.

    Args:
        client: the service's client; each mapping is registered with it for zero-copy calls.
        budget: the service-wide cap, charged per mapping.
        pid: the engine process at the other end (SO_PEERCRED), for logs and stats.

    Lookups are O(log n) in the connection's regions (a sorted list of start addresses).
    """

    def __init__(self, client: Client, budget: Budget, pid: int) -> None:
        self._client = client
        self._budget = budget
        self.pid = pid
        self.declared_pool_bytes = 0
        self._starts: list[int] = []
        self._regions: list[_Region] = []

    @property
    def count(self) -> int:
        """Regions mapped now."""
        return len(self._regions)

    def register(self, base: object, size: object, fd: int) -> int:
        """Map ``size`` bytes of ``fd`` as the engine's ``[base, base + size)``.

        Returns:
            0; INVALID_PARAMS for a bad address or size, a descriptor that is not a memfd of
            at least ``size`` bytes sealed against shrinking (``F_SEAL_SHRINK``), or a range
            overlapping one this connection registered; NO_AVAILABLE_HANDLE when the
            service's cap is reached. The caller keeps ownership of ``fd`` (the mapping does
            not need it).
        """
        if not isinstance(base, int) or not isinstance(size, int) or _is_bool(base, size):
            return INVALID
        if base <= 0 or size <= 0:
            return INVALID
        try:
            info = os.fstat(fd)
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            return INVALID  # not a memfd (only memfds carry seals)
        # Without the shrink seal the engine could truncate the file under the mapping, and
        # the service's next copy would die of SIGBUS, taking every engine's objects along.
        if not seals & fcntl.F_SEAL_SHRINK or not stat.S_ISREG(info.st_mode):
            return INVALID
        if info.st_size < size:
            return INVALID
        index = bisect.bisect_right(self._starts, base)
        before = self._regions[index - 1] if index else None
        after = self._regions[index] if index < len(self._regions) else None
        if (before is not None and before.base + before.size > base) or (
            after is not None and base + size > after.base
        ):
            return INVALID
        if not self._budget.take(size):
            return NO_SPACE
        try:
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError):
            self._budget.give(size)
            return INVALID
        anchor = (ctypes.c_char * size).from_buffer(mapping)
        region = _Region(base, size, ctypes.addressof(anchor), mapping, anchor)
        try:
            self._client.register_buffer(region.local, size)
        except MooncakeError as exc:
            self._unmap(region)
            return exc.code
        self._starts.insert(index, base)
        self._regions.insert(index, region)
        return OK

    def unregister(self, base: object) -> int:
        """Unmap the region registered at exactly ``base``; 0, or INVALID_PARAMS if none."""
        if not isinstance(base, int) or isinstance(base, bool):
            return INVALID
        index = bisect.bisect_left(self._starts, base)
        if index == len(self._starts) or self._starts[index] != base:
            return INVALID
        del self._starts[index]
        self._unmap(self._regions.pop(index))
        return OK

    def translate(self, ptr: object, size: object) -> int:
        """The service's address of the engine's ``[ptr, ptr + size)``, or 0 unless the
        range lies wholly inside one region of this connection (size 0: its start must)."""
        if not isinstance(ptr, int) or not isinstance(size, int) or _is_bool(ptr, size):
            return 0
        if size < 0:
            return 0
        index = bisect.bisect_right(self._starts, ptr) - 1
        if index < 0:
            return 0
        region = self._regions[index]
        if ptr + size > region.base + region.size or ptr >= region.base + region.size:
            return 0
        return region.local + (ptr - region.base)

    def translate_all(self, ptrs: object, sizes: object) -> list[int]:
        """:meth:`translate` per pair; lists of different lengths give zeros (the client
        then refuses the call, as it would without a service).

        Raises:
            TypeError: ``ptrs`` or ``sizes`` is not a list.
        """
        if not isinstance(ptrs, list) or not isinstance(sizes, list):
            raise TypeError("buffer pointers and sizes must be lists")
        if len(ptrs) != len(sizes):
            return [0] * len(ptrs)
        return [self.translate(p, s) for p, s in zip(ptrs, sizes, strict=True)]

    def release_all(self) -> None:
        """Unmap every region (the connection ended). Never raises."""
        regions, self._regions, self._starts = self._regions, [], []
        for region in regions:
            self._unmap(region)

    def _unmap(self, region: _Region) -> None:
        with contextlib.suppress(MooncakeError):
            self._client.unregister_buffer(region.local)
        region.anchor = None
        with contextlib.suppress(BufferError):
            region.mapping.close()
        self._budget.give(region.size)


# -- calls -------------------------------------------------------------------------------------


def _config(value: object) -> ReplicateConfig | None:
    if value is None or isinstance(value, ReplicateConfig):
        return value
    raise TypeError("config must be a ReplicateConfig")


def _nested(regions: ConnectionRegions, all_ptrs: object, all_sizes: object) -> list[list[int]]:
    if not isinstance(all_ptrs, list) or not isinstance(all_sizes, list):
        raise TypeError("all_buffer_ptrs and all_sizes must be lists of lists")
    translated: list[list[int]] = []
    for ptrs, sizes in zip(all_ptrs, all_sizes, strict=False):
        if isinstance(ptrs, list) and isinstance(sizes, list) and len(ptrs) == len(sizes):
            translated.append([regions.translate(p, s) for p, s in zip(ptrs, sizes, strict=True)])
        else:
            translated.append([0] * (len(ptrs) if isinstance(ptrs, list) else 0))
    # Lists of different lengths at the top are the client's to refuse, as without a service.
    translated.extend([] for _ in range(len(all_ptrs) - len(translated)))
    return translated


Call = Callable[["Client", ConnectionRegions, list[Any]], Any]


def _put_batch(c: Client, _r: ConnectionRegions, a: list[Any]) -> Any:
    keys, values, config = a
    return c.put_batch(keys, values, _config(config))


def _upsert_batch(c: Client, _r: ConnectionRegions, a: list[Any]) -> Any:
    keys, values, config = a
    return c.upsert_batch(keys, values, _config(config))


def _put_parts(c: Client, _r: ConnectionRegions, a: list[Any]) -> Any:
    key, parts, config = a
    return c.put_parts(key, *parts, config=_config(config))


def _upsert_parts(c: Client, _r: ConnectionRegions, a: list[Any]) -> Any:
    key, parts, config = a
    return c.upsert_parts(key, *parts, config=_config(config))


def _batch_put_from(c: Client, r: ConnectionRegions, a: list[Any]) -> Any:
    keys, ptrs, sizes, config = a
    return c.batch_put_from(keys, r.translate_all(ptrs, sizes), sizes, _config(config))


def _batch_upsert_from(c: Client, r: ConnectionRegions, a: list[Any]) -> Any:
    keys, ptrs, sizes, config = a
    return c.batch_upsert_from(keys, r.translate_all(ptrs, sizes), sizes, _config(config))


def _batch_put_from_multi(c: Client, r: ConnectionRegions, a: list[Any]) -> Any:
    keys, all_ptrs, all_sizes, config = a
    local = _nested(r, all_ptrs, all_sizes)
    return c.batch_put_from_multi_buffers(keys, local, all_sizes, _config(config))


def _batch_get_into(c: Client, r: ConnectionRegions, a: list[Any]) -> Any:
    keys, ptrs, sizes = a
    return c.batch_get_into(keys, r.translate_all(ptrs, sizes), sizes)


def _batch_get_into_multi(c: Client, r: ConnectionRegions, a: list[Any]) -> Any:
    keys, all_ptrs, all_sizes, prefer = a
    local = _nested(r, all_ptrs, all_sizes)
    return c.batch_get_into_multi_buffers(keys, local, all_sizes, bool(prefer))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _confined_sizes(regions: ConnectionRegions, base: object, dst: object, sizes: object) -> object:
    """One key's range sizes for the read in the service, with -1 (which the ranged read
    refuses with INVALID_PARAMS) for each range whose destination ``[base + dst[j], +
    sizes[j])`` is not wholly inside a region of this connection, or is not where the
    service's address of ``base`` plus ``dst[j]`` lands. Anything malformed is left as it is
    for the read to refuse exactly as in-process."""
    if not isinstance(dst, list) or not isinstance(sizes, list) or len(dst) != len(sizes):
        return sizes
    if not isinstance(base, int) or isinstance(base, bool):
        return sizes  # the read refuses every range of a base that is not an address
    local_base = regions.translate(base, 0)
    confined: list[object] = []
    for offset, size in zip(dst, sizes, strict=True):
        if _is_int(offset) and _is_int(size) and offset >= 0 and size > 0:
            local = regions.translate(base + offset, size)
            inside = local_base != 0 and local == local_base + offset
            confined.append(size if inside else -1)
        else:
            confined.append(size)  # nothing is copied for these (or the read refuses them)
    return confined


def _get_into_ranges(c: Client, r: ConnectionRegions, a: list[Any]) -> Any:
    """``get_into_ranges`` with every destination confined to this connection's regions.

    Each buffer's base becomes the service's address of the same byte (0 when no region holds
    it; then every range of it is refused before an address is formed), and a range is copied
    only when it lies wholly inside one region of this connection: a base plus an offset must
    never reach memory of the service or of another engine.
    """
    buffer_ptrs, all_keys, all_dst, all_src, all_sizes = a
    if not all(isinstance(v, list) for v in (buffer_ptrs, all_dst, all_sizes)):
        raise TypeError("buffer_ptrs, all_dst_offsets and all_sizes must be lists")
    local_ptrs = [r.translate(p, 0) if _is_int(p) else p for p in buffer_ptrs]
    confined: list[Any] = []
    for b, per_key in enumerate(all_sizes):
        dst = all_dst[b] if b < len(all_dst) else None
        base = buffer_ptrs[b] if b < len(buffer_ptrs) else None
        if isinstance(per_key, list) and isinstance(dst, list) and len(per_key) == len(dst):
            pairs = zip(dst, per_key, strict=True)
            confined.append([_confined_sizes(r, base, d, n) for d, n in pairs])
        else:
            confined.append(per_key)  # a shape the read refuses as a whole
    sessions = RangedSessions(c)
    try:
        return sessions.get_into_ranges(local_ptrs, all_keys, all_dst, all_src, confined)
    finally:
        sessions.close()


def _batch_probe_key(c: Client, _r: ConnectionRegions, a: list[Any]) -> Any:
    keys, mode, candidate_size = a
    return c.batch_probe_key(keys, ProbeLeaseMode(mode), candidate_size)


CALLS: dict[str, Call] = {
    "put_batch": _put_batch,
    "upsert_batch": _upsert_batch,
    "put_parts": _put_parts,
    "upsert_parts": _upsert_parts,
    "batch_put_from": _batch_put_from,
    "batch_upsert_from": _batch_upsert_from,
    "batch_put_from_multi_buffers": _batch_put_from_multi,
    "get_batch": lambda c, _r, a: c.get_batch(*a),
    "batch_get_into": _batch_get_into,
    "batch_get_into_multi_buffers": _batch_get_into_multi,
    "get_into_ranges": _get_into_ranges,
    "batch_is_exist": lambda c, _r, a: c.batch_is_exist(*a),
    "probe_key": lambda c, _r, a: c.probe_key(*a),
    "batch_probe_key": _batch_probe_key,
    "get_size": lambda c, _r, a: c.get_size(*a),
    "batch_remove": lambda c, _r, a: c.batch_remove(*a),
    "remove_by_regex": lambda c, _r, a: c.remove_by_regex(*a),
    "remove_all": lambda c, _r, a: c.remove_all(*a),
}


def run_call(client: Client, regions: ConnectionRegions, message: dict[str, Any]) -> dict[str, Any]:
    """Run one whitelisted typed-client call for a connection.

    Args:
        message: ``{"m": name, "a": [args...]}``; addresses in the arguments are the
            engine's.

    Returns:
        The answer to send: ``{"r": value}`` (a :class:`BatchResult` as
        ``{"c": codes, "v": values}``), ``{"err": code, "msg": ..., "key": ...}`` for a
        :class:`MooncakeError`, or ``{"exc": "TypeError" | "ValueError", "msg": ...}`` for a
        bad argument (the engine raises the same type, as the in-process call would).
        An unknown name answers INVALID_PARAMS; nothing outside :data:`CALLS` can run.
    """
    name, args = message.get("m"), message.get("a")
    call = CALLS.get(name) if isinstance(name, str) else None
    if call is None or not isinstance(args, list):
        return {"err": INVALID, "msg": f"no such standalone call: {name!r}"}
    try:
        result = call(client, regions, args)
    except MooncakeError as exc:
        return {"err": exc.code, "msg": exc.detail, "key": exc.key}
    except (TypeError, ValueError) as exc:
        kind = "TypeError" if isinstance(exc, TypeError) else "ValueError"
        return {"exc": kind, "msg": str(exc)}
    except Exception:  # reported to the engine as a code; the service keeps serving
        log.exception("standalone call %s failed", name)
        return {"err": int(ErrorCode.INTERNAL_ERROR), "msg": f"{name} failed in the service"}
    if isinstance(result, BatchResult):
        return {"r": {"c": list(result.codes), "v": _plain(result.values)}}
    return {"r": _plain(result)}


def _plain(value: Any) -> Any:
    """Values as the wire carries them (pyarrow buffers and handles as bytes views)."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)) or value is None:
        return value
    if isinstance(value, (bool, int, float, str)):
        return value
    with contextlib.suppress(TypeError):
        return memoryview(value)
    raise TypeError(f"cannot send a {type(value).__name__}")
