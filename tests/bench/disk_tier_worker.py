"""A store client of the disk-tier benchmark, in its own process, driven by JSON lines on stdin.

Run as ``python -m tests.bench.disk_tier_worker [--impl py|upstream]`` (upstream in its own
virtual environment, as :mod:`tests.bench.worker`). It prints ``{"ready": ..., "versions": ...}``
once imported, then answers each command line with one JSON line (``{"error": ...}`` on
failure). Commands:

- ``setup``: join the store with upstream's dict form of ``setup`` (``config``: the keys, such
  as ``enable_ssd_offload`` and ``ssd_offload_path``), then register a buffer of ``buffer``
  bytes;
- ``write``: ``put_from`` keys ``<prefix>/<i>`` for ``i < n``, values of ``size`` bytes, one call
  per key, each timed; a failed put is counted by its code, not an error;
- ``read``: ``get_into`` the keys of ``order`` (indexes into ``<prefix>/<i>``), one call per
  read, each timed, every value compared byte for byte with what ``write`` stored. With
  ``split_by_master_counter`` (mooncake-py only) the master's ``disk_hits`` counter is read
  before and after every get, outside the timed call: since this process is the only reader,
  its change tells whether that get was served from a disk tier;
- ``quit`` (or stdin closing): close the store and exit.

Values are those of :mod:`tests.bench.worker` (a 16-byte stamp of the key, then a fixed
pseudo-random pattern), so every byte read is checked. Only numpy and the standard library are
imported besides the store, so that the module runs in upstream's virtual environment too.

Thread-safety: one command at a time, from the main thread.
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from tests.bench.worker import (
    OBJECT_NOT_FOUND,
    STAMP_BYTES,
    keys_of,
    pattern,
    serve_commands,
    stamp,
    store_class,
)

COMMANDS = ("setup", "write", "read")


class TierWorker:
    """One store client and its registered buffer (one value's room)."""

    def __init__(self, impl: str) -> None:
        self.impl = impl
        self.store = store_class(impl)()
        self.buffer = np.empty(0, dtype=np.uint8)
        self.base = 0
        self.pattern = np.empty(0, dtype=np.uint8)
        self.joined = False

    def setup(self, config: dict[str, Any], buffer: int) -> dict[str, Any]:
        """Join with ``setup(config)`` and register ``buffer`` bytes (touched up front).

        Raises:
            RuntimeError: setup or registration answered a non-zero code.
        """
        started = time.perf_counter()
        code = self.store.setup(dict(config))
        if code != 0:
            raise RuntimeError(f"setup failed with {code}")
        self.joined = True
        setup_s = time.perf_counter() - started
        self.buffer = np.ones(buffer, dtype=np.uint8)
        self.base = self.buffer.ctypes.data
        code = self.store.register_buffer(self.base, buffer)
        if code != 0:
            raise RuntimeError(f"register_buffer failed with {code}")
        self.pattern = pattern(buffer)
        return {"setup_s": setup_s}

    def _room(self, size: int) -> None:
        if size > self.buffer.size:
            raise ValueError(f"buffer of {self.buffer.size} bytes cannot hold {size}")

    def write(self, prefix: str, n: int, size: int) -> dict[str, Any]:
        """``put_from`` ``n`` fresh values of ``size`` bytes; per-call times and failures."""
        self._room(size)
        self.buffer[:size] = self.pattern[:size]
        times: list[float] = []
        failed: collections.Counter[int] = collections.Counter()
        started = time.perf_counter()
        for key in keys_of(prefix, n):
            self.buffer[:STAMP_BYTES] = np.frombuffer(stamp(key), np.uint8)
            began = time.perf_counter()
            code = self.store.put_from(key, self.base, size)
            times.append(time.perf_counter() - began)
            if code != 0:
                failed[code] += 1
        return {
            "times": times,
            "wall_s": time.perf_counter() - started,
            "failed": sum(failed.values()),
            "failed_codes": {str(k): v for k, v in sorted(failed.items())},
        }

    def _disk_hits(self) -> int:
        client = self.store.client
        return int(client.stats().get("disk_hits", 0)) if client is not None else 0

    def read(
        self,
        prefix: str,
        n: int,
        size: int,
        order: Sequence[int],
        split_by_master_counter: bool = False,
    ) -> dict[str, Any]:
        """``get_into`` the keys ``order`` names, verifying every byte of each value.

        Returns:
            ``times`` (per get, s), ``kinds`` (per get: ``m`` memory hit, ``d`` disk hit, ``h``
            hit of unknown tier, ``x`` miss, ``w`` wrong bytes), ``wall_s``, ``bytes_read``
            (bytes of verified values), ``missing`` / ``wrong`` / ``read_errors`` counts.
        Raises:
            ValueError: ``split_by_master_counter`` for upstream (it has no such counter).
        """
        if split_by_master_counter and self.impl != "py":
            raise ValueError("only mooncake-py's master counts disk hits per read")
        self._room(size)
        keys = keys_of(prefix, n)
        body = self.pattern[STAMP_BYTES:size]
        times: list[float] = []
        kinds: list[str] = []
        errors: collections.Counter[int] = collections.Counter()
        bytes_read = 0
        disk_hits = self._disk_hits() if split_by_master_counter else 0
        started = time.perf_counter()
        for index in order:
            key = keys[index]
            self.buffer[:STAMP_BYTES] = 0  # a get that writes nothing cannot pass the check
            began = time.perf_counter()
            code = self.store.get_into(key, self.base, size)
            times.append(time.perf_counter() - began)
            if code != size:
                kinds.append("x")
                if code != OBJECT_NOT_FOUND:
                    errors[code] += 1
                continue
            value = self.buffer[:size]
            if value[:STAMP_BYTES].tobytes() != stamp(key) or not np.array_equal(
                value[STAMP_BYTES:], body
            ):
                kinds.append("w")
                continue
            bytes_read += size
            if split_by_master_counter:
                after = self._disk_hits()
                kinds.append("d" if after > disk_hits else "m")
                disk_hits = after
            else:
                kinds.append("h")
        return {
            "times": times,
            "kinds": "".join(kinds),
            "wall_s": time.perf_counter() - started,
            "bytes_read": bytes_read,
            "missing": kinds.count("x") - sum(errors.values()),
            "wrong": kinds.count("w"),
            "read_errors": {str(k): v for k, v in sorted(errors.items())},
        }

    def close(self) -> None:
        """Leave the store (once)."""
        if self.joined:
            self.store.close()
            self.joined = False


def main(argv: list[str] | None = None) -> int:
    """Serve commands until ``quit`` or end of input; always close the store."""
    return serve_commands(TierWorker, COMMANDS, "disk-tier benchmark store client", argv)


if __name__ == "__main__":
    sys.exit(main())
