"""A client process for ``test_stress_readers_writers.py``: threads doing seeded random
operations on a small, colliding key space, checking every byte they read.

Values carry their own integrity information (:func:`make_value`, :func:`check_value`)::

    MAGIC(4) | nonce(u64) | total length(u64) | key length(u16) | key | payload | digest(16)

The payload is ``shake_128(key | nonce)`` stretched to its length, so it is a function of the
header alone, and the digest is ``blake2b(everything before it, 16 bytes)``. A reader checks
that the length matches, that the key is the one it asked for, the digest, and the payload.
A value torn between two writes (of the same key, or of another key that reused the memory)
or another key's bytes therefore never passes; a stale but complete version of the key does
(this checks integrity, not recency).

Usage (the parent speaks one JSON line per step over stdin/stdout)::

    python -m tests.stress._rw_worker SPEC_JSON

``SPEC_JSON`` holds ``master``, ``worker`` (index), ``seed``, ``seconds``, ``threads``,
``shared`` (all threads use one store, i.e. one client id; else one store per thread),
``segments`` (bytes each store contributes, one per store), ``force_tcp`` and ``keys``.
The worker prints ``{"ready": ...}`` once its stores are set up, waits for a line on stdin
(the start signal), runs its threads for ``seconds``, prints ``{"counts": ..., "wrong": ...,
"errors": ...}``, then waits for another line (the close signal, so no client leaves while
others still work), closes its stores and prints ``{"closed": true}``.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from mooncake_py import ErrorCode, MooncakeDistributedStore

MAGIC = b"MCRW"
HEADER = struct.Struct("<4sQQH")
DIGEST_BYTES = 16
HOT_SIZES = (32_768, 100_000, 200_000)
"""Keys ``rw-0`` .. ``rw-2`` get a large share of all operations (concurrent upserts of one
key and reads racing them), and each always has the same size, so that an upsert of one
rewrites its object in place."""
HOT_KEYS = len(HOT_SIZES)
HOT_SHARE = 0.3
SIZE_RANGES = ((2_000, 8_000), (16_000, 64_000), (64_000, 256_000))
"""Sizes of the other keys' values: one of these ranges at random, then uniform within it."""
MAX_VALUE = SIZE_RANGES[-1][1]
BATCH_KEYS = 3
"""Keys per ``batch_get_into`` / ``batch_is_exist`` call."""
OPS: tuple[tuple[str, int], ...] = (
    ("put", 8),
    ("upsert", 12),
    ("upsert_from", 5),
    ("get", 22),
    ("get_into", 16),
    ("batch_get_into", 10),
    ("batch_is_exist", 6),
    ("remove", 4),
    ("remove_force", 4),
)
SAMPLES = 10
"""Wrong reads and exceptions kept in full per worker (all are counted)."""


def working_set_bytes(keys: int) -> int:
    """Bytes that one value of each of ``keys`` keys takes, on average (hot keys included)."""
    mean = sum((low + high) / 2 for low, high in SIZE_RANGES) / len(SIZE_RANGES)
    return int(sum(HOT_SIZES) + (keys - HOT_KEYS) * mean)


def value_size(key: str, rng: random.Random) -> int:
    """The size of a new value of ``key`` (bytes, header and digest included): fixed for a
    hot key, random otherwise."""
    index = int(key.rsplit("-", 1)[1])
    if index < HOT_KEYS:
        return HOT_SIZES[index]
    low, high = rng.choice(SIZE_RANGES)
    return rng.randrange(low, high)


def _payload(key_bytes: bytes, nonce: int, size: int) -> bytes:
    return hashlib.shake_128(key_bytes + nonce.to_bytes(8, "little")).digest(size)


def make_value(key: str, nonce: int, size: int) -> bytes:
    """A self-verifying value of exactly ``size`` bytes for ``key``, version ``nonce``.

    Raises:
        ValueError: ``size`` is too small to hold the header, the key and the digest.
    """
    key_bytes = key.encode()
    fixed = HEADER.size + len(key_bytes) + DIGEST_BYTES
    if size < fixed:
        raise ValueError(f"a value of {key!r} needs at least {fixed} bytes, not {size}")
    head = HEADER.pack(MAGIC, nonce, size, len(key_bytes)) + key_bytes
    body = head + _payload(key_bytes, nonce, size - fixed)
    return body + hashlib.blake2b(body, digest_size=DIGEST_BYTES).digest()


def check_value(key: str, data: bytes | memoryview) -> str | None:
    """None when ``data`` is a complete value written for ``key``; else why it is not.

    Never raises, whatever ``data`` holds.
    """
    data = bytes(data)
    if len(data) < HEADER.size + DIGEST_BYTES:
        return f"short: {len(data)} bytes"
    magic, nonce, length, key_len = HEADER.unpack_from(data)
    if magic != MAGIC:
        return f"bad magic {magic!r}"
    if length != len(data):
        return f"length: header says {length}, read {len(data)}"
    start = HEADER.size
    stored_key = data[start : start + key_len]
    if stored_key != key.encode():
        return f"foreign: asked {key!r}, got bytes of {stored_key[:40]!r}"
    body, digest = data[:-DIGEST_BYTES], data[-DIGEST_BYTES:]
    if hashlib.blake2b(body, digest_size=DIGEST_BYTES).digest() != digest:
        return f"digest mismatch (torn?) nonce={nonce:#x} length={length}"
    payload_start = start + key_len
    if body[payload_start:] != _payload(stored_key, nonce, len(body) - payload_start):
        return f"payload differs from its header nonce={nonce:#x}"
    return None


def code_name(code: int) -> str:
    """``OBJECT_NOT_FOUND`` for -704; the number for an unknown code."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


class Recorder:
    """Counts and samples of one worker, shared by its threads (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.wrong: list[dict[str, Any]] = []
        self.wrong_count = 0
        self.errors: list[str] = []
        self.error_count = 0
        self._seen_errors: set[str] = set()

    def count(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1

    def wrong_read(self, op: str, key: str, reason: str, head: bytes) -> None:
        with self._lock:
            self.counts[f"{op}:WRONG"] += 1
            self.wrong_count += 1
            if len(self.wrong) < SAMPLES:
                self.wrong.append({"op": op, "key": key, "reason": reason, "head": head.hex()})

    def error(self, op: str, summary: str, details: str) -> None:
        """Count an exception; keep ``details`` for the first few distinct ``summary`` lines."""
        with self._lock:
            self.counts[f"{op}:EXCEPTION"] += 1
            self.error_count += 1
            seen = f"{op}: {summary}"
            if seen not in self._seen_errors and len(self.errors) < SAMPLES:
                self._seen_errors.add(seen)
                self.errors.append(f"{seen}\n{details}")


class Actor:
    """One thread's state: its store, its registered buffer, its RNG and version counter."""

    def __init__(
        self,
        store: MooncakeDistributedStore,
        worker: int,
        thread: int,
        seed: int,
        keys: int,
        recorder: Recorder,
    ) -> None:
        self.store = store
        self.rng = random.Random(seed * 1000 + thread)
        self.nonce_base = (worker << 48) | (thread << 40)
        self.versions = 0
        self.keys = keys
        self.recorder = recorder
        self.buffer = np.zeros(BATCH_KEYS * MAX_VALUE, dtype=np.uint8)
        self.base = self.buffer.ctypes.data
        code = store.register_buffer(self.base, self.buffer.nbytes)
        if code != 0:
            raise RuntimeError(f"register_buffer failed with {code}")
        self._ops = [name for name, _ in OPS]
        self._weights = [weight for _, weight in OPS]

    def key(self) -> str:
        if self.rng.random() < HOT_SHARE:
            return f"rw-{self.rng.randrange(HOT_KEYS)}"
        return f"rw-{self.rng.randrange(self.keys)}"

    def distinct_keys(self, n: int) -> list[str]:
        chosen: list[str] = []
        while len(chosen) < n:
            key = self.key()
            if key not in chosen:
                chosen.append(key)
        return chosen

    def new_value(self, key: str) -> bytes:
        self.versions += 1
        return make_value(key, self.nonce_base | self.versions, value_size(key, self.rng))

    def _verify(self, op: str, key: str, data: bytes | memoryview) -> None:
        reason = check_value(key, data)
        if reason is None:
            self.recorder.count(f"{op}:ok")
        else:
            self.recorder.wrong_read(op, key, reason, bytes(data[:64]))

    def _record_code(self, op: str, code: int) -> None:
        self.recorder.count(f"{op}:{'ok' if code == 0 else code_name(code)}")

    def step(self) -> None:
        op = self.rng.choices(self._ops, self._weights)[0]
        try:
            getattr(self, f"do_{op}")()
        except Exception as exc:  # the drop-in API returns codes; any exception is a bug
            self.recorder.error(op, f"{type(exc).__name__}: {exc}", traceback.format_exc())

    def do_put(self) -> None:
        key = self.key()
        self._record_code("put", self.store.put(key, self.new_value(key)))

    def do_upsert(self) -> None:
        key = self.key()
        self._record_code("upsert", self.store.upsert(key, self.new_value(key)))

    def do_upsert_from(self) -> None:
        key = self.key()
        value = self.new_value(key)
        self.buffer[: len(value)] = np.frombuffer(value, dtype=np.uint8)
        self._record_code("upsert_from", self.store.upsert_from(key, self.base, len(value)))

    def do_get(self) -> None:
        key = self.key()
        data = self.store.get(key)
        if not data:
            self.recorder.count("get:miss")
        else:
            self._verify("get", key, data)

    def _read_into(self, op: str, keys: list[str], codes: list[int]) -> None:
        for slot, (key, code) in enumerate(zip(keys, codes, strict=True)):
            if code < 0:
                self.recorder.count(f"{op}:{code_name(code)}")
            elif code == 0:
                self.recorder.wrong_read(op, key, "0 bytes read", b"")
            else:
                start = slot * MAX_VALUE
                self._verify(op, key, self.buffer[start : start + code].data)

    def do_get_into(self) -> None:
        key = self.key()
        self.buffer[:MAX_VALUE] = 0  # stale bytes of an earlier read must not pass
        code = self.store.get_into(key, self.base, MAX_VALUE)
        self._read_into("get_into", [key], [code])

    def do_batch_get_into(self) -> None:
        keys = self.distinct_keys(BATCH_KEYS)
        self.buffer[:] = 0
        ptrs = [self.base + slot * MAX_VALUE for slot in range(len(keys))]
        codes = self.store.batch_get_into(keys, ptrs, [MAX_VALUE] * len(keys))
        self._read_into("batch_get_into", keys, codes)

    def do_batch_is_exist(self) -> None:
        keys = self.distinct_keys(BATCH_KEYS)
        for code in self.store.batch_is_exist(keys):
            name = {1: "present", 0: "absent"}.get(code) or code_name(code)
            self.recorder.count(f"batch_is_exist:{name}")

    def do_remove(self) -> None:
        self._record_code("remove", self.store.remove(self.key()))

    def do_remove_force(self) -> None:
        self._record_code("remove_force", self.store.remove(self.key(), force=True))


def _set_up(master: str, segment: int, force_tcp: bool) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    config = {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": segment,
        "master_server_address": master,
        "force_tcp": force_tcp,
    }
    code = store.setup(config)
    if code != 0:
        raise RuntimeError(f"setup failed with {code}")
    return store


def run(
    spec: dict[str, Any], wait: Callable[[], None], say: Callable[[dict[str, Any]], None]
) -> int:
    """Set up, work, report and close as the module docstring describes; returns 0, or 1
    when a thread died outside an operation."""
    threads = int(spec["threads"])
    segments = list(spec["segments"])
    stores_needed = 1 if spec["shared"] else threads
    if len(segments) != stores_needed:
        raise ValueError(f"{stores_needed} store(s) need {stores_needed} segment sizes")
    stores = [_set_up(spec["master"], size, bool(spec["force_tcp"])) for size in segments]
    recorder = Recorder()
    actors = [
        Actor(
            stores[0 if spec["shared"] else t],
            int(spec["worker"]),
            t,
            int(spec["seed"]),
            int(spec["keys"]),
            recorder,
        )
        for t in range(threads)
    ]
    say({"ready": True, "clients": len({s.get_hostname() for s in stores})})
    wait()
    deadline = time.monotonic() + float(spec["seconds"])
    crashed: list[str] = []

    def loop(actor: Actor) -> None:
        try:
            while time.monotonic() < deadline:
                actor.step()
        except BaseException:  # reported to the parent
            crashed.append(traceback.format_exc())

    workers = [
        threading.Thread(target=loop, args=(a,), name=f"rw-{i}") for i, a in enumerate(actors)
    ]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    say(
        {
            "counts": dict(recorder.counts),
            "wrong": recorder.wrong,
            "wrong_count": recorder.wrong_count,
            "errors": recorder.errors + crashed,
            "error_count": recorder.error_count + len(crashed),
        }
    )
    wait()
    for store in stores:
        store.close()
    say({"closed": True})
    return 1 if crashed else 0


def main() -> int:
    spec = json.loads(sys.argv[1])

    def say(message: dict[str, Any]) -> None:
        print(json.dumps(message), flush=True)

    def wait() -> None:
        sys.stdin.readline()

    return run(spec, wait, say)


if __name__ == "__main__":
    sys.exit(main())
