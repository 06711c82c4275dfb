"""``MooncakeDistributedStore``: drop-in for upstream's Python store class.

Same method names, argument order, keyword names, defaults and return conventions as upstream
Mooncake's ``mooncake.store.MooncakeDistributedStore``:

- data calls return ints: 0 or a negative ``ErrorCode``; ``get_into`` returns the bytes read;
- ``get`` returns ``b""`` on a miss or any error, never None;
- ``put`` of an existing key returns 0 and keeps the old bytes (first writer wins);
- ``put_batch`` returns one int (the first error, or 0); the ``batch_*`` calls return lists;
- almost nothing raises: type errors raise ``TypeError`` and ``put_parts`` with a buffer that
  is not one-dimensional raises :class:`MooncakeError`, as upstream raises for those.

Methods called before ``setup`` (or after ``close``) return INVALID_PARAMS.

Zero-copy calls (``put_from``, ``get_into`` and their batch forms) take raw addresses, which
must lie inside a buffer registered with ``register_buffer``; others are rejected with
INVALID_PARAMS rather than risking a wild write.

Thread-safety: every method may be called from several threads at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from sortedcontainers import SortedDict

from mooncake_py.errors import ErrorCode, MooncakeError
from mooncake_py.types import ReplicateConfig

from .config import ClientConfig
from .core import ClientCore, config_for_keys
from .data_plane import view_of_address
from .sessions import KvSessionMethods

INVALID = int(ErrorCode.INVALID_PARAMS)
OK = int(ErrorCode.OK)

_POSITIONAL_SETUP = (
    "local_hostname",
    "metadata_server",
    "global_segment_size",
    "local_buffer_size",
    "protocol",
    "rdma_devices",
    "master_server_addr",
)


def _bytes_view(value: Any) -> memoryview:
    """A flat byte view of any C-contiguous buffer (bytes, bytearray, numpy array, ...)."""
    try:
        view = memoryview(value)
    except TypeError as exc:
        raise TypeError(
            f"expected a buffer (bytes, bytearray, memoryview, array), got {type(value).__name__}"
        ) from exc
    if not view.c_contiguous:
        raise TypeError("buffer must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


class MooncakeDistributedStore(KvSessionMethods):
    """A client of a mooncake-py store; see the module docstring for conventions."""

    def __init__(self) -> None:
        self._core: ClientCore | None = None
        self._lock = threading.Lock()
        self._registered: SortedDict = SortedDict()

    # ------------------------------------------------------------------------------------------
    # Lifecycle

    def setup(self, *args: Any, **kwargs: Any) -> int:
        """Join the store; returns 0 or a negative code.

        Forms (as upstream): ``setup(local_hostname, metadata_server, global_segment_size,
        local_buffer_size, protocol, rdma_devices, master_server_addr, engine=None,
        enable_ssd_offload=False, ssd_offload_path="", tenant_id="default", ...)``;
        ``setup(config_dict)``; and ``setup()``, which reads ``MOONCAKE_CONFIG_PATH`` or the
        ``MOONCAKE_*`` environment variables.
        """
        try:
            config = self._config_from_setup_args(args, kwargs)
        except MooncakeError as exc:
            return exc.code
        return self.setup_with_config(config)

    def setup_with_config(self, config: ClientConfig) -> int:
        """Join the store with an explicit :class:`ClientConfig`; returns 0 or a negative code."""
        with self._lock:
            if self._core is not None:
                return INVALID
            try:
                self._core = ClientCore(config)
            except MooncakeError as exc:
                return exc.code
            except OSError:
                return int(ErrorCode.INTERNAL_ERROR)
        return OK

    @staticmethod
    def _config_from_setup_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> ClientConfig:
        if not args and not kwargs:
            return ClientConfig.from_env()
        if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
            return ClientConfig.from_mapping(args[0])
        if len(args) > len(_POSITIONAL_SETUP) + 6:
            raise TypeError("setup() takes at most 13 positional arguments")
        values: dict[str, Any] = dict(zip(_POSITIONAL_SETUP, args, strict=False))
        values.update(kwargs)
        missing = [name for name in _POSITIONAL_SETUP if name not in values]
        if missing:
            raise TypeError(f"setup() missing arguments: {', '.join(missing)}")
        return ClientConfig.from_mapping(values)

    def close(self) -> int:
        """Leave the store: unmount the segment (its objects are dropped) and stop. Returns 0."""
        with self._lock:
            core, self._core = self._core, None
        if core is not None:
            core.close()
        return OK

    def health_check(self) -> int:
        """0 healthy, 1 not set up or closed, 2 master unreachable (last ping failed)."""
        core = self._core
        if core is None:
            return 1
        return 0 if core.heartbeat.master_reachable else 2

    def get_hostname(self) -> str:
        """The name of this client's segment (``host:port``), or "" before setup."""
        core = self._core
        return core.hostname if core is not None else ""

    # ------------------------------------------------------------------------------------------
    # Buffer registration

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Allow zero-copy calls on ``[buffer_ptr, buffer_ptr + size)``; returns 0 or -600."""
        if self._core is None or buffer_ptr <= 0 or size <= 0:
            return INVALID
        with self._lock:
            self._registered[buffer_ptr] = size
        return OK

    def unregister_buffer(self, buffer_ptr: int) -> int:
        """Forget a registered buffer; returns 0, or -600 when it was not registered."""
        with self._lock:
            return OK if self._registered.pop(buffer_ptr, None) is not None else INVALID

    def _registered_view(self, buffer_ptr: int, size: int) -> memoryview | None:
        if buffer_ptr <= 0 or size <= 0:
            return None
        with self._lock:
            index = self._registered.bisect_right(buffer_ptr) - 1
            if index < 0:
                return None
            start, length = self._registered.peekitem(index)
        if buffer_ptr + size > start + length:
            return None
        return view_of_address(buffer_ptr, size)

    # ------------------------------------------------------------------------------------------
    # Writes

    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Store ``value`` under ``key``; 0 on success or when the key exists, else negative."""
        return self._write([key], [[_bytes_view(value)]], config, upsert=False)[0]

    def put_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> int:
        """Store each value; returns 0 or the first per-key error."""
        return self._write_batch(keys, values, config, upsert=False)

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        """Store the concatenation of ``parts`` without joining them first.

        Raises:
            MooncakeError: a part is not a one-dimensional buffer (as upstream).
        """
        return self._write([key], [_parts_views(parts)], config, upsert=False)[0]

    def put_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        """Store ``size`` bytes read from registered memory at ``buffer_ptr``."""
        return self._write_from([key], [buffer_ptr], [size], config, upsert=False)[0]

    def batch_put_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Store each ``sizes[i]`` bytes at ``buffer_ptrs[i]`` under ``keys[i]``; per-key codes."""
        return self._write_from(keys, buffer_ptrs, sizes, config, upsert=False)

    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Create or replace ``key``; 0, OBJECT_REPLICA_BUSY (-714) while a reader holds it,
        or another negative code."""
        return self._write([key], [[_bytes_view(value)]], config, upsert=True)[0]

    def upsert_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> int:
        """Create or replace each key; returns 0 or the first per-key error."""
        return self._write_batch(keys, values, config, upsert=True)

    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        """Create or replace ``key`` with the concatenation of ``parts``."""
        return self._write([key], [_parts_views(parts)], config, upsert=True)[0]

    def upsert_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        """Create or replace ``key`` from registered memory."""
        return self._write_from([key], [buffer_ptr], [size], config, upsert=True)[0]

    def batch_upsert_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Create or replace each key from registered memory; per-key codes."""
        return self._write_from(keys, buffer_ptrs, sizes, config, upsert=True)

    def _write_batch(
        self,
        keys: Sequence[str],
        values: Sequence[Any],
        config: ReplicateConfig | None,
        upsert: bool,
    ) -> int:
        if len(keys) != len(values):
            return INVALID
        results = self._write(keys, [[_bytes_view(v)] for v in values], config, upsert)
        return next((code for code in results if code != OK), OK)

    def _write_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None,
        upsert: bool,
    ) -> list[int]:
        config = config or ReplicateConfig()
        tags = config.kv_sessions
        if not len(keys) == len(buffer_ptrs) == len(sizes) or (tags and len(tags) != len(keys)):
            return [INVALID] * len(keys)
        views = [self._registered_view(p, s) for p, s in zip(buffer_ptrs, sizes, strict=True)]
        valid = [i for i, v in enumerate(views) if v is not None]
        results = [INVALID] * len(keys)
        values = [[view] for view in views if view is not None]
        subset = config if len(valid) == len(keys) else config_for_keys(config, valid)
        written = self._write([keys[i] for i in valid], values, subset, upsert)
        for i, code in zip(valid, written, strict=True):
            results[i] = code
        return results

    def _write(
        self,
        keys: Sequence[str],
        values: list[list[memoryview]],
        config: ReplicateConfig | None,
        upsert: bool,
    ) -> list[int]:
        core = self._core
        if core is None or not _keys_ok(keys):
            return [INVALID] * len(keys)
        return core.put_many(keys, values, config or ReplicateConfig(), upsert)

    # ------------------------------------------------------------------------------------------
    # Reads

    def get(self, key: str) -> bytes:
        """The value of ``key``, or ``b""`` on a miss or any error."""
        return self.get_batch([key])[0] if isinstance(key, str) and key else b""

    def get_batch(self, keys: Sequence[str]) -> list[bytes]:
        """Values of ``keys``, ``b""`` for each miss; ``[b""]`` for an empty list (as upstream)."""
        core = self._core
        if core is None or not keys:
            return [b""]
        if not _keys_ok(keys):
            return [b""] * len(keys)
        started = time.monotonic()
        located = core.locate(keys)
        values = [b""] * len(keys)
        remote: list[int] = []
        for i, loc in enumerate(located):
            if loc.code != OK:
                continue
            mapped = next(filter(None, map(core.data.memory_of, loc.replicas)), None)
            if mapped is None:
                remote.append(i)
            else:
                values[i] = bytes(mapped[: loc.size])  # one copy, straight out of the segment
        if remote:
            buffers = [bytearray(located[i].size) for i in remote]
            codes = core.read_located(
                [located[i] for i in remote], [memoryview(b) for b in buffers], started
            )
            for i, buffer, code in zip(remote, buffers, codes, strict=True):
                if code >= 0:
                    values[i] = bytes(buffer)
        if len(remote) < len(keys) and core.lease_outlived(located, started):
            # Copies out of mapped segments are trusted only within their read lease.
            fetched = set(remote)
            values = [v if i in fetched else b"" for i, v in enumerate(values)]
        return values

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Read ``key`` into registered memory; returns the bytes read or a negative code."""
        return self.batch_get_into([key], [buffer_ptr], [size])[0]

    def batch_get_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        """Read each key into its buffer; per key the bytes read or a negative code.

        A buffer smaller than its object gives INVALID_PARAMS; a miss OBJECT_NOT_FOUND.
        """
        core = self._core
        if core is None or not len(keys) == len(buffer_ptrs) == len(sizes) or not _keys_ok(keys):
            return [INVALID] * len(keys)
        started = time.monotonic()
        located = core.locate(keys)
        results = [loc.code for loc in located]
        readable: list[int] = []
        views: list[memoryview] = []
        for i, loc in enumerate(located):
            if loc.code != OK:
                continue
            view = self._registered_view(buffer_ptrs[i], sizes[i]) if loc.size <= sizes[i] else None
            if view is None:
                results[i] = INVALID
                continue
            readable.append(i)
            views.append(view[: loc.size])
        codes = core.read_located([located[i] for i in readable], views, started)
        for i, code in zip(readable, codes, strict=True):
            results[i] = code
        return results

    def get_buffer(self, key: str) -> pa.Buffer | None:
        """The value as a ``pyarrow.Buffer``: zero-copy over a same-host replica (valid while
        its read lease holds), a copy otherwise; None on a miss or error."""
        return self.batch_get_buffer([key])[0]

    def batch_get_buffer(self, keys: Sequence[str]) -> list[pa.Buffer | None]:
        """:meth:`get_buffer` for each key, with one lookup."""
        core = self._core
        if core is None or not keys or not _keys_ok(keys):
            return [None] * len(keys)
        started = time.monotonic()
        located = core.locate(keys)
        results: list[pa.Buffer | None] = [None] * len(keys)
        copy_needed: list[int] = []
        for i, loc in enumerate(located):
            if loc.code != OK:
                continue
            mapped = next(filter(None, map(core.data.mapped_address, loc.replicas)), None)
            if mapped is None:
                copy_needed.append(i)
                continue
            address, owner = mapped
            results[i] = pa.foreign_buffer(address, loc.size, base=owner)
        if copy_needed:
            buffers = [bytearray(located[i].size) for i in copy_needed]
            codes = core.read_located(
                [located[i] for i in copy_needed], [memoryview(b) for b in buffers], started
            )
            for i, buffer, code in zip(copy_needed, buffers, codes, strict=True):
                if code >= 0:
                    results[i] = pa.py_buffer(buffer)
        return results

    # ------------------------------------------------------------------------------------------
    # Queries and removal

    def is_exist(self, key: str) -> int:
        """1 if ``key`` is readable (grants a read lease), 0 if not, negative on error."""
        return self.batch_is_exist([key])[0]

    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        """Per key 1, 0 or a negative code, in one round trip."""
        core = self._core
        if core is None or not _keys_ok(keys):
            return [INVALID] * len(keys)
        if not keys:
            return []
        try:
            if len(keys) == 1:
                return [core.master.exist_key(core.tenant, keys[0])]
            return core.master.batch_exist_key(core.tenant, keys)
        except MooncakeError as exc:
            return [exc.code] * len(keys)

    def get_size(self, key: str) -> int:
        """The size of ``key`` in bytes, or a negative code (grants a read lease)."""
        core = self._core
        if core is None or not _keys_ok([key]):
            return INVALID
        located = core.locate([key])[0]
        return located.size if located.code == OK else located.code

    def remove(self, key: str, force: bool = False) -> int:
        """Delete ``key``: 0, -704 missing, -706 leased (unless ``force``), -703 being written."""
        return self.batch_remove([key], force)[0]

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]:
        """Delete each key; per-key codes as :meth:`remove`."""
        core = self._core
        if core is None or not _keys_ok(keys):
            return [INVALID] * len(keys)
        if not keys:
            return []
        try:
            if len(keys) == 1:
                return [core.master.remove(core.tenant, keys[0], force)]
            return core.master.batch_remove(core.tenant, keys, force)
        except MooncakeError as exc:
            return [exc.code] * len(keys)

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Delete every key matching the pattern; the count removed, or -600 for a bad regex."""
        core = self._core
        if core is None or not isinstance(regex_pattern, str):
            return INVALID
        try:
            return core.master.remove_by_regex(core.tenant, regex_pattern, force)
        except MooncakeError as exc:
            return exc.code

    def remove_all(self, force: bool = False) -> int:
        """Delete every removable key of this tenant; the count removed."""
        core = self._core
        if core is None:
            return INVALID
        try:
            return core.master.remove_all(core.tenant, force)
        except MooncakeError as exc:
            return exc.code


def _parts_views(parts: Sequence[Any]) -> list[memoryview]:
    views = []
    for part in parts:
        view = memoryview(part)
        if view.ndim != 1:
            raise MooncakeError(ErrorCode.INVALID_PARAMS, "parts must be one-dimensional buffers")
        views.append(_bytes_view(view))
    return views


def _keys_ok(keys: Sequence[str]) -> bool:
    """Every key a non-empty string that encodes as UTF-8 (checked in bulk: batches of
    thousands of keys are common, and this runs before every call)."""
    try:
        joined = "\n".join(keys)
    except TypeError:
        return False
    if not all(keys):
        return False
    if joined.isascii():
        return True
    try:
        joined.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
