"""A store client in its own process, driven by JSON-lines commands on stdin.

Run as ``python -m tests.bench.worker``; it prints ``{"ready": ...}`` once imported, then
answers each command line with one JSON line (``{"error": ...}`` on failure). Commands:

- ``setup``: join the store (``master``, ``segment`` bytes, ``buffer`` bytes to register);
- ``put``: write ``n`` keys ``<prefix>/<i>`` of ``size`` bytes from the registered buffer,
  ``batch`` per call (1 = ``put_from``, more = ``batch_put_from``);
- ``get``: read them back with ``get_into`` (batch 1) or ``batch_get_into``, checking each
  value's stamp and, once per command, every byte;
- ``exist`` / ``batch_exist``: ``is_exist`` / ``batch_is_exist`` latency;
- ``remove``: ``batch_remove(..., force=True)``;
- ``quit`` (or stdin closing): close the store and exit.

Values: the first 16 bytes are a hash of the key (the stamp), the rest is a fixed pseudo-random
pattern shared by every worker, so a reader knows every expected byte. ``MOONCAKE_PY_FORCE_TCP``
in the environment selects the TCP path, as for any client.
"""

from __future__ import annotations

import cProfile
import hashlib
import json
import os
import signal
import sys
import time
from typing import Any

import numpy as np

from mooncake_py.client.store import MooncakeDistributedStore
from tests.bench.common import FORCE_TCP_ENV, protocol_stdout, reply

STAMP_BYTES = 16
PATTERN_SEED = 20240601
COMMANDS = ("setup", "put", "get", "exist", "batch_exist", "remove")


def stamp(key: str) -> bytes:
    """The per-key stamp stored in a value's first 16 bytes."""
    return hashlib.blake2b(key.encode(), digest_size=STAMP_BYTES).digest()


def pattern(size: int) -> np.ndarray:
    """The shared value body: ``size`` pseudo-random bytes (the first 16 are overwritten)."""
    return np.random.default_rng(PATTERN_SEED).integers(0, 256, size=size, dtype=np.uint8)


def keys_of(prefix: str, n: int) -> list[str]:
    """The keys a command covers."""
    return [f"{prefix}/{i:06d}" for i in range(n)]


class Worker:
    """One store client plus its registered buffer."""

    def __init__(self) -> None:
        self.store = MooncakeDistributedStore()
        self.buffer = np.empty(0, dtype=np.uint8)
        self.base = 0
        self.pattern = np.empty(0, dtype=np.uint8)
        self.profile: cProfile.Profile | None = None
        self.profile_path = ""
        self.ready = False

    # -- commands ------------------------------------------------------------------------------

    def setup(self, master: str, segment: int, buffer: int, profile: str = "") -> dict[str, Any]:
        code = self.store.setup("127.0.0.1", "P2PHANDSHAKE", segment, 0, "tcp", "", master)
        if code != 0:
            raise RuntimeError(f"setup failed with {code}")
        self.ready = True
        self.buffer = np.zeros(buffer, dtype=np.uint8)  # zeros + fill: pages touched up front
        self.buffer.fill(1)
        self.base = self.buffer.ctypes.data
        code = self.store.register_buffer(self.base, buffer)
        if code != 0:
            raise RuntimeError(f"register_buffer failed with {code}")
        self.pattern = pattern(buffer)
        if profile:
            self.profile, self.profile_path = cProfile.Profile(), profile
        return {"hostname": self.store.get_hostname(), "force_tcp": os.environ.get(FORCE_TCP_ENV)}

    def _timed(self, call: Any, *args: Any) -> tuple[Any, float]:
        profile = self.profile
        if profile is not None:
            profile.enable()
        started = time.perf_counter()
        result = call(*args)
        elapsed = time.perf_counter() - started
        if profile is not None:
            profile.disable()
        return result, elapsed

    def put(self, prefix: str, n: int, size: int, batch: int) -> dict[str, Any]:
        self._check_room(size, batch)
        for slot in range(batch):
            self.buffer[slot * size : (slot + 1) * size] = self.pattern[:size]
        keys = keys_of(prefix, n)
        times: list[float] = []
        failures: list[str] = []
        for start in range(0, n, batch):
            chunk = keys[start : start + batch]
            for slot, key in enumerate(chunk):
                offset = slot * size
                self.buffer[offset : offset + STAMP_BYTES] = np.frombuffer(stamp(key), np.uint8)
            ptrs = [self.base + slot * size for slot in range(len(chunk))]
            if batch == 1:
                code, elapsed = self._timed(self.store.put_from, chunk[0], ptrs[0], size)
                codes = [code]
            else:
                codes, elapsed = self._timed(
                    self.store.batch_put_from, chunk, ptrs, [size] * len(chunk)
                )
            times.append(elapsed)
            failures += [f"put {k}: {c}" for k, c in zip(chunk, codes, strict=True) if c != 0]
        return {"times": times, "bytes_per_call": [size * batch] * len(times), "errors": failures}

    def get(self, prefix: str, n: int, size: int, batch: int) -> dict[str, Any]:
        self._check_room(size, batch)
        keys = keys_of(prefix, n)
        body = self.pattern[STAMP_BYTES:size]
        times: list[float] = []
        failures: list[str] = []
        stamps_checked = full_checked = 0
        for start in range(0, n, batch):
            chunk = keys[start : start + batch]
            ptrs = [self.base + slot * size for slot in range(len(chunk))]
            full = start == 0  # once per command: clear the slots first, then compare every byte
            if full:
                self.buffer[: len(chunk) * size] = 0
            if batch == 1:
                code, elapsed = self._timed(self.store.get_into, chunk[0], ptrs[0], size)
                codes = [code]
            else:
                codes, elapsed = self._timed(
                    self.store.batch_get_into, chunk, ptrs, [size] * len(chunk)
                )
            times.append(elapsed)
            for slot, (key, code) in enumerate(zip(chunk, codes, strict=True)):
                offset = slot * size
                if code != size:
                    failures.append(f"get {key}: {code}")
                    continue
                if self.buffer[offset : offset + STAMP_BYTES].tobytes() != stamp(key):
                    failures.append(f"get {key}: wrong stamp")
                    continue
                stamps_checked += 1
                if full:
                    value = self.buffer[offset + STAMP_BYTES : offset + size]
                    if not np.array_equal(value, body):
                        failures.append(f"get {key}: content differs")
                        continue
                    full_checked += 1
        return {
            "times": times,
            "bytes_per_call": [size * batch] * len(times),
            "errors": failures[:20],
            "error_count": len(failures),
            "stamps_checked": stamps_checked,
            "full_checked": full_checked,
        }

    def exist(self, prefix: str, n: int, calls: int, expect: int) -> dict[str, Any]:
        keys = keys_of(prefix, n)
        times: list[float] = []
        wrong = 0
        for i in range(calls):
            code, elapsed = self._timed(self.store.is_exist, keys[i % n])
            times.append(elapsed)
            wrong += code != expect
        return {"times": times, "error_count": wrong, "errors": [f"{wrong} wrong"] if wrong else []}

    def batch_exist(self, prefix: str, n: int, calls: int) -> dict[str, Any]:
        keys = keys_of(prefix, n)
        times: list[float] = []
        wrong = 0
        for _ in range(calls):
            codes, elapsed = self._timed(self.store.batch_is_exist, keys)
            times.append(elapsed)
            wrong += sum(code != 1 for code in codes)
        return {"times": times, "error_count": wrong, "errors": [f"{wrong} wrong"] if wrong else []}

    def remove(self, prefix: str, n: int) -> dict[str, Any]:
        codes = self.store.batch_remove(keys_of(prefix, n), force=True)
        bad = [c for c in codes if c != 0]
        return {"removed": len(codes) - len(bad), "errors": [f"remove: {bad[:5]}"] if bad else []}

    def _check_room(self, size: int, batch: int) -> None:
        if size * batch > self.buffer.size:
            raise ValueError(f"buffer of {self.buffer.size} bytes cannot hold {batch} x {size}")

    def close(self) -> None:
        if self.profile is not None and self.profile_path:
            self.profile.dump_stats(self.profile_path)
            self.profile = None
        if self.ready:
            self.store.close()
            self.ready = False


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    """Serve commands until ``quit`` or end of input; always close the store."""
    out = protocol_stdout()
    signal.signal(signal.SIGTERM, _raise_exit)
    worker = Worker()
    reply(out, {"ready": True, "pid": os.getpid()})
    try:
        for line in sys.stdin:
            command: dict[str, Any] = json.loads(line)
            name = command.pop("cmd")
            if name == "quit":
                reply(out, {"ok": True})
                break
            if name not in COMMANDS:
                reply(out, {"error": f"unknown command {name!r}"})
                continue
            try:
                result = getattr(worker, name)(**command)
            except Exception as exc:  # answered, so the parent reports it
                reply(out, {"error": f"{name}: {type(exc).__name__}: {exc}"})
                continue
            reply(out, result)
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
