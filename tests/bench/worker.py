"""A store client in its own process, driven by JSON-lines commands on stdin.

Run as ``python -m tests.bench.worker [--impl py|upstream]``: ``py`` drives mooncake-py
(``mooncake_py.client.compat``), ``upstream`` drives upstream Mooncake
(``mooncake.store``, run with the interpreter of its own virtual environment). Both classes
have the same methods, so the same code measures either. The worker prints
``{"ready": ..., "versions": ...}`` once imported, then answers each command line with one JSON
line (``{"error": ...}`` on failure). Commands:

- ``setup``: join the store (``master``, ``metadata`` server, ``segment`` bytes to contribute,
  ``local_buffer`` bytes for upstream's copying calls, ``buffer`` bytes to register);
- ``put``: write ``n`` keys ``<prefix>/<i>`` of ``size`` bytes, ``batch`` per call:
  ``mode="zero"``: ``put_from`` / ``batch_put_from`` from the registered buffer;
  ``mode="copy"``: ``put`` / ``put_batch`` of a view of it;
- ``get``: read them back (``get_into`` / ``batch_get_into``, or ``get`` / ``get_batch``),
  checking each value's stamp and, once per command, every byte;
- ``exist`` / ``batch_exist``: ``is_exist`` / ``batch_is_exist`` latency (``batch_exist``
  with ``distinct``: each call probes keys of its own, once; ``expect`` 0: every key absent);
- ``read_remove_write``: per key, one timed round of ``get`` (stamp-checked), forced
  ``remove`` and ``put`` of the key's next value;
- ``remove``: ``batch_remove(..., force=True)`` (untimed cleanup);
- ``remove_each``: write ``n`` small keys (untimed), then time ``remove`` of each;
- ``pressure``: ``put_from`` ``n`` values into a store that holds far fewer, then read every
  key back and check every byte of each one still readable;
- ``quit`` (or stdin closing): close the store and exit.

Values: the first 16 bytes are a hash of the key (the stamp), the rest is a fixed pseudo-random
pattern shared by every worker, so a reader knows every expected byte. ``MOONCAKE_PY_FORCE_TCP``
in the environment selects mooncake-py's TCP path, as for any client.

This module imports only numpy and the standard library besides the store, so that it runs in
upstream's virtual environment too.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import hashlib
import importlib.metadata
import json
import os
import platform
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tests.bench.common import FORCE_TCP_ENV, protocol_stdout, reply

STAMP_BYTES = 16
PATTERN_SEED = 20240601
OBJECT_NOT_FOUND = -704
REMOVE_CHUNK = 256
COMMANDS = (
    "setup",
    "put",
    "get",
    "exist",
    "batch_exist",
    "remove",
    "remove_each",
    "read_remove_write",
    "pressure",
)
IMPLEMENTATIONS = ("py", "upstream")


def stamp(key: str) -> bytes:
    """The per-key stamp stored in a value's first 16 bytes."""
    return hashlib.blake2b(key.encode(), digest_size=STAMP_BYTES).digest()


def pattern(size: int) -> np.ndarray:
    """The shared value body: ``size`` pseudo-random bytes (the first 16 are overwritten)."""
    return np.random.default_rng(PATTERN_SEED).integers(0, 256, size=size, dtype=np.uint8)


def keys_of(prefix: str, n: int) -> list[str]:
    """The keys a command covers."""
    return [f"{prefix}/{i:06d}" for i in range(n)]


def store_class(impl: str) -> Any:
    """The ``MooncakeDistributedStore`` class of an implementation."""
    if impl == "upstream":
        from mooncake.store import MooncakeDistributedStore as Upstream  # type: ignore

        return Upstream
    from mooncake_py.client.compat import MooncakeDistributedStore

    return MooncakeDistributedStore


def versions(impl: str) -> dict[str, Any]:
    """Interpreter and package versions of this worker's environment."""
    names = ["numpy"]
    if impl == "py":
        names += ["mooncake-py", "grpcio", "protobuf", "pyarrow"]
    else:
        names += sorted(
            {
                dist.metadata["Name"]
                for dist in importlib.metadata.distributions()
                if (dist.metadata["Name"] or "").lower().startswith("mooncake-transfer-engine")
            }
        )
    found: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable}
    if impl == "py":  # which tree the package came from: the working tree or a baseline build
        import mooncake_py

        found["package_dir"] = os.path.dirname(os.path.abspath(mooncake_py.__file__))
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def _summary(failures: list[str], **extra: Any) -> dict[str, Any]:
    return {"errors": failures[:20], "error_count": len(failures), **extra}


class Worker:
    """One store client plus its registered buffer."""

    def __init__(self, impl: str) -> None:
        self.impl = impl
        self.store = store_class(impl)()
        self.buffer = np.empty(0, dtype=np.uint8)
        self.base = 0
        self.pattern = np.empty(0, dtype=np.uint8)
        self.profile: cProfile.Profile | None = None
        self.profile_path = ""
        self.ready = False

    # -- commands ------------------------------------------------------------------------------

    def setup(
        self,
        master: str,
        segment: int,
        buffer: int,
        metadata: str = "P2PHANDSHAKE",
        local_buffer: int = 0,
        profile: str = "",
    ) -> dict[str, Any]:
        started = time.perf_counter()
        code = self.store.setup("127.0.0.1", metadata, segment, local_buffer, "tcp", "", master)
        if code != 0:
            raise RuntimeError(f"setup failed with {code}")
        setup_s = time.perf_counter() - started
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
        return {
            "hostname": self.store.get_hostname(),
            "force_tcp": os.environ.get(FORCE_TCP_ENV),
            "setup_s": setup_s,
        }

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

    def _stamp_slot(self, slot: int, size: int, key: str) -> None:
        offset = slot * size
        self.buffer[offset : offset + STAMP_BYTES] = np.frombuffer(stamp(key), np.uint8)

    def put(
        self,
        prefix: str,
        n: int,
        size: int,
        batch: int,
        mode: str = "zero",
        tolerant: bool = False,
    ) -> dict[str, Any]:
        """Write ``n`` fresh keys; ``tolerant``: failed puts are counted, not errors."""
        self._check_room(size, batch)
        for slot in range(batch):
            self.buffer[slot * size : (slot + 1) * size] = self.pattern[:size]
        keys = keys_of(prefix, n)
        times: list[float] = []
        failures: list[str] = []
        view = self.buffer.data
        for start in range(0, n, batch):
            chunk = keys[start : start + batch]
            for slot, key in enumerate(chunk):
                self._stamp_slot(slot, size, key)
            if mode == "copy":
                values = [view[slot * size : (slot + 1) * size] for slot in range(len(chunk))]
                if batch == 1:
                    code, elapsed = self._timed(self.store.put, chunk[0], values[0])
                else:
                    code, elapsed = self._timed(self.store.put_batch, chunk, values)
                codes = [code] * len(chunk)  # put_batch answers one code for the batch
            else:
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
        bytes_per_call = [size * batch] * len(times)
        if tolerant:
            return {"times": times, "bytes_per_call": bytes_per_call, "failed": len(failures)}
        return _summary(failures, times=times, bytes_per_call=bytes_per_call)

    def get(self, prefix: str, n: int, size: int, batch: int, mode: str = "zero") -> dict[str, Any]:
        self._check_room(size, batch)
        keys = keys_of(prefix, n)
        body = self.pattern[STAMP_BYTES:size]
        times: list[float] = []
        failures: list[str] = []
        stamps_checked = full_checked = 0
        for start in range(0, n, batch):
            chunk = keys[start : start + batch]
            full = start == 0  # once per command: clear the slots first, then compare every byte
            if mode == "copy":
                if batch == 1:
                    value, elapsed = self._timed(self.store.get, chunk[0])
                    values = [value]
                else:
                    values, elapsed = self._timed(self.store.get_batch, chunk)
                arrays = [np.frombuffer(v, dtype=np.uint8) for v in values]
                codes = [len(v) if len(v) else OBJECT_NOT_FOUND for v in values]
            else:
                ptrs = [self.base + slot * size for slot in range(len(chunk))]
                if full:
                    self.buffer[: len(chunk) * size] = 0
                if batch == 1:
                    code, elapsed = self._timed(self.store.get_into, chunk[0], ptrs[0], size)
                    codes = [code]
                else:
                    codes, elapsed = self._timed(
                        self.store.batch_get_into, chunk, ptrs, [size] * len(chunk)
                    )
                arrays = [self.buffer[s * size : (s + 1) * size] for s in range(len(chunk))]
            times.append(elapsed)
            for key, code, value in zip(chunk, codes, arrays, strict=True):
                if code != size or value.size != size:
                    failures.append(f"get {key}: {code}")
                    continue
                if value[:STAMP_BYTES].tobytes() != stamp(key):
                    failures.append(f"get {key}: wrong stamp")
                    continue
                stamps_checked += 1
                if full:
                    if not np.array_equal(value[STAMP_BYTES:], body):
                        failures.append(f"get {key}: content differs")
                        continue
                    full_checked += 1
        return _summary(
            failures,
            times=times,
            bytes_per_call=[size * batch] * len(times),
            stamps_checked=stamps_checked,
            full_checked=full_checked,
        )

    def exist(self, prefix: str, n: int, calls: int, expect: int) -> dict[str, Any]:
        keys = keys_of(prefix, n)
        times: list[float] = []
        wrong = 0
        for i in range(calls):
            code, elapsed = self._timed(self.store.is_exist, keys[i % n])
            times.append(elapsed)
            wrong += code != expect
        return {"times": times, "error_count": wrong, "errors": [f"{wrong} wrong"] if wrong else []}

    def batch_exist(
        self, prefix: str, n: int, calls: int, expect: int = 1, distinct: bool = False
    ) -> dict[str, Any]:
        """Time ``calls`` calls of ``batch_is_exist`` over ``n`` keys each.

        Args:
            expect: the code every key must answer (1 present, 0 absent); others are counted
                as errors.
            distinct: call ``i`` probes keys ``i * n .. (i + 1) * n - 1`` of ``prefix`` (each
                key probed once: a cold probe when they were just written by another client);
                False: every call probes keys ``0 .. n - 1`` again.
        """
        keys = keys_of(prefix, n * calls if distinct else n)
        times: list[float] = []
        wrong = 0
        for i in range(calls):
            chunk = keys[i * n : (i + 1) * n] if distinct else keys
            codes, elapsed = self._timed(self.store.batch_is_exist, chunk)
            times.append(elapsed)
            wrong += sum(code != expect for code in codes)
        return {"times": times, "error_count": wrong, "errors": [f"{wrong} wrong"] if wrong else []}

    def remove(self, prefix: str, n: int, tolerant: bool = False) -> dict[str, Any]:
        keys = keys_of(prefix, n)
        codes: list[int] = []
        for start in range(0, n, REMOVE_CHUNK):
            codes += self.store.batch_remove(keys[start : start + REMOVE_CHUNK], True)
        bad = [c for c in codes if c != 0]
        if tolerant:
            return {"removed": len(codes) - len(bad), "failed": len(bad), "errors": []}
        return {"removed": len(codes) - len(bad), "errors": [f"remove: {bad[:5]}"] if bad else []}

    def remove_each(self, prefix: str, n: int, size: int) -> dict[str, Any]:
        """Write ``n`` keys of ``size`` bytes (untimed), then time one ``remove`` per key."""
        written = self.put(prefix, n, size, min(n, REMOVE_CHUNK))
        failures = list(written["errors"])
        times: list[float] = []
        for key in keys_of(prefix, n):
            code, elapsed = self._timed(self.store.remove, key)
            times.append(elapsed)
            if code != 0:
                failures.append(f"remove {key}: {code}")
        return _summary(failures, times=times)

    def read_remove_write(self, prefix: str, n: int, size: int) -> dict[str, Any]:
        """Per key of ``prefix`` (``n`` keys of ``size`` bytes, written here untimed first), one
        timed round: ``get`` it, ``remove(key, force=True)`` (the read just taken would
        otherwise hold the key for its lease), then ``put`` its next value (another stamp).
        Each ``get`` must see the initial value's stamp; a final ``get`` of every key compares
        the value its round wrote byte for byte, so a put that kept the old bytes is caught.

        Returns: one time per round (get + remove + put) and the verification counts.
        """
        self._check_room(size, 1)
        keys = keys_of(prefix, n)
        written = self.put(prefix, n, size, min(n, REMOVE_CHUNK), mode="copy")
        failures = list(written["errors"])
        body = self.pattern[STAMP_BYTES:size]
        next_value = np.empty(size, dtype=np.uint8)
        next_value[STAMP_BYTES:] = body
        times: list[float] = []
        checked = 0
        for key in keys:
            next_value[:STAMP_BYTES] = np.frombuffer(stamp(f"{key}#next"), np.uint8)
            started = time.perf_counter()
            value = self.store.get(key)
            removed = self.store.remove(key, True)
            put = self.store.put(key, next_value.data)
            times.append(time.perf_counter() - started)
            if len(value) != size or bytes(value[:STAMP_BYTES]) != stamp(key):
                failures.append(f"read_remove_write get {key}: {len(value)} bytes, wrong stamp")
            else:
                checked += 1
            if removed != 0 or put != 0:
                failures.append(f"read_remove_write {key}: remove {removed}, put {put}")
        full = 0
        for key in keys:
            value = np.frombuffer(self.store.get(key), dtype=np.uint8)
            if value.size == size and value[:STAMP_BYTES].tobytes() == stamp(f"{key}#next"):
                full += int(np.array_equal(value[STAMP_BYTES:], body))
            else:
                failures.append(f"read_remove_write reread {key}: not the last round's value")
        return _summary(failures, times=times, stamps_checked=checked, full_checked=full)

    def pressure(self, prefix: str, n: int, size: int) -> dict[str, Any]:
        """``put_from`` ``n`` fresh values of ``size`` bytes, then read every key back."""
        self._check_room(size, 1)
        self.buffer[:size] = self.pattern[:size]
        keys = keys_of(prefix, n)
        put_codes: list[int] = []
        times: list[float] = []
        started = time.perf_counter()
        for key in keys:
            self._stamp_slot(0, size, key)
            code, elapsed = self._timed(self.store.put_from, key, self.base, size)
            put_codes.append(code)
            times.append(elapsed)
        put_s = time.perf_counter() - started
        body = self.pattern[STAMP_BYTES:size]
        correct = wrong = missing = 0
        read_codes: collections.Counter[int] = collections.Counter()
        failures: list[str] = []
        started = time.perf_counter()
        for key in keys:
            self.buffer[:size] = 0
            code = self.store.get_into(key, self.base, size)
            if code == OBJECT_NOT_FOUND:
                missing += 1
                continue
            if code != size:
                read_codes[code] += 1
                continue
            value = self.buffer[:size]
            if value[:STAMP_BYTES].tobytes() == stamp(key) and np.array_equal(
                value[STAMP_BYTES:], body
            ):
                correct += 1
            else:
                wrong += 1
                failures.append(f"pressure {key}: content differs")
        verify_s = time.perf_counter() - started
        failed_codes = collections.Counter(c for c in put_codes if c != 0)
        return _summary(
            failures,
            puts=n,
            value_bytes=size,
            failed_puts=sum(failed_codes.values()),
            failed_codes={str(k): v for k, v in sorted(failed_codes.items())},
            readable=correct + wrong,
            correct=correct,
            wrong=wrong,
            missing=missing,
            read_errors={str(k): v for k, v in sorted(read_codes.items())},
            put_s=put_s,
            verify_s=verify_s,
            times=times,
            stamps_checked=correct,
            full_checked=correct,
        )

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


def serve_commands(
    make_worker: Callable[[str], Any],
    commands: Sequence[str],
    description: str,
    argv: list[str] | None = None,
) -> int:
    """A store client process's loop: build ``make_worker(impl)`` (``--impl``), then answer
    each JSON command line (``{"cmd": NAME, ...}``, NAME one of ``commands`` or ``quit``) with
    the worker's result until ``quit`` or end of input; always close the worker."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--impl", choices=IMPLEMENTATIONS, default="py")
    args = parser.parse_args(argv)
    out = protocol_stdout()
    signal.signal(signal.SIGTERM, _raise_exit)
    try:
        worker = make_worker(args.impl)
    except Exception as exc:  # an import or load failure, answered so the parent can tell
        reply(out, {"error": f"{args.impl} store unavailable: {type(exc).__name__}: {exc}"})
        return 1
    reply(out, {"ready": True, "pid": os.getpid(), "versions": versions(args.impl)})
    try:
        for line in sys.stdin:
            command: dict[str, Any] = json.loads(line)
            name = command.pop("cmd")
            if name == "quit":
                reply(out, {"ok": True})
                break
            if name not in commands:
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


def main(argv: list[str] | None = None) -> int:
    """Serve commands until ``quit`` or end of input; always close the store."""
    return serve_commands(Worker, COMMANDS, "benchmark store client", argv)


if __name__ == "__main__":
    sys.exit(main())
