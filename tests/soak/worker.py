"""One soak client process: mixed store operations for a while, checking every byte it reads.

Every value carries its own digest (:func:`make_value`, :func:`check_value`)::

    MAGIC(4) | key length(u16) | key | payload | blake2b(everything before, 16 bytes)

so a reader detects a torn value, another key's value, or stray bytes, whoever wrote them; a
stale but complete version of the key passes (this checks integrity, not recency).

Usage: ``python -m tests.soak.worker SPEC_JSON``. ``SPEC_JSON`` holds ``master``, ``index``,
``clients`` (how many workers run, so this one reads the others' keys too), ``seconds``,
``seed``, ``segment_bytes`` and ``keys`` (keys per worker). ``MOONCAKE_PY_FORCE_TCP=1`` in
the environment sends its transfers over TCP. At the end it prints one JSON line: ``ops`` (by
kind), ``errors`` (``"op:CODE"`` counts), ``wrong_reads``, ``wrong_examples``, ``exceptions``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from mooncake_py import ErrorCode, MooncakeDistributedStore, MooncakeError, ReplicateConfig

MAGIC = b"SOAK"
DIGEST = 16
SIZES = ((256, 4096), (4096, 65_536), (65_536, 262_144), (262_144, 1 << 20))
SIZE_WEIGHTS = (50, 35, 13, 2)
BUFFER_BYTES = 8 << 20
BATCH = 8


def make_value(key: str, rng: random.Random) -> bytes:
    """A value for ``key`` of a random size, carrying its key and digest."""
    low, high = rng.choices(SIZES, SIZE_WEIGHTS)[0]
    encoded = key.encode()
    head = MAGIC + struct.pack("<H", len(encoded)) + encoded
    body = head + rng.randbytes(max(0, rng.randint(low, high) - len(head) - DIGEST))
    return body + hashlib.blake2b(body, digest_size=DIGEST).digest()


def check_value(key: str, data: bytes | memoryview) -> str | None:
    """None when ``data`` is a complete value of ``key``; else what is wrong with it."""
    data = bytes(data)
    encoded = key.encode()
    head = MAGIC + struct.pack("<H", len(encoded)) + encoded
    if len(data) < len(head) + DIGEST:
        return f"{len(data)} bytes: too short"
    if not data.startswith(head):
        return f"header {data[: len(head)]!r}: not {key!r}'s"
    if hashlib.blake2b(data[:-DIGEST], digest_size=DIGEST).digest() != data[-DIGEST:]:
        return f"{len(data)} bytes: digest mismatch"
    return None


class Soak:
    """The store of this process, its registered buffer and the tallies."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.index = int(spec["index"])
        self.clients = int(spec["clients"])
        self.keys = int(spec["keys"])
        self.rng = random.Random(int(spec["seed"]))
        self.store = MooncakeDistributedStore()
        config = {
            "local_hostname": "127.0.0.1",
            "metadata_server": "P2PHANDSHAKE",
            "global_segment_size": int(spec["segment_bytes"]),
            "master_server_address": spec["master"],
        }
        code = self.store.setup(config)
        if code != 0:
            raise SystemExit(f"setup failed: {code}")
        self.buffer = np.zeros(BUFFER_BYTES, np.uint8)
        self.base = self.buffer.ctypes.data
        assert self.store.register_buffer(self.base, BUFFER_BYTES) == 0
        self.ops: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.exceptions: Counter[str] = Counter()
        self.wrong: list[str] = []
        self.sessions: list[str] = []
        self.session_serial = 0

    # -- keys and checks ----------------------------------------------------------------------

    def own_key(self) -> str:
        return f"w{self.index}/{self.rng.randrange(self.keys)}"

    def any_key(self) -> str:
        return f"w{self.rng.randrange(self.clients)}/{self.rng.randrange(self.keys)}"

    def code(self, op: str, code: int) -> None:
        if code < 0:
            self.errors[f"{op}:{ErrorCode.name_of(code)}"] += 1

    def verify(self, op: str, key: str, data: bytes | memoryview) -> None:
        problem = check_value(key, data)
        if problem is not None:
            self.wrong.append(f"{op} {key}: {problem}")

    def stage(self, values: list[bytes]) -> list[int]:
        """Copy ``values`` into the registered buffer, one after another; their addresses."""
        addresses, offset = [], 0
        for value in values:
            self.buffer[offset : offset + len(value)] = np.frombuffer(value, np.uint8)
            addresses.append(self.base + offset)
            offset += len(value)
        return addresses

    # -- operations ---------------------------------------------------------------------------

    def op_put(self) -> None:
        key = self.own_key()
        self.code("put", self.store.put(key, make_value(key, self.rng)))

    def op_upsert(self) -> None:
        key = self.own_key()
        self.code("upsert", self.store.upsert(key, make_value(key, self.rng)))

    def op_put_batch(self) -> None:
        keys = list({self.own_key() for _ in range(BATCH)})
        self.code("put_batch", self.store.put_batch(keys, [make_value(k, self.rng) for k in keys]))

    def op_put_from(self) -> None:
        keys = list({self.own_key() for _ in range(self.rng.randint(1, BATCH))})
        values = [make_value(k, self.rng) for k in keys]
        codes = self.store.batch_put_from(keys, self.stage(values), [len(v) for v in values])
        for code in codes:
            self.code("put_from", code)

    def op_get(self) -> None:
        key = self.any_key()
        data = self.store.get(key)
        if data:
            self.verify("get", key, data)

    def op_get_batch(self) -> None:
        keys = list({self.any_key() for _ in range(BATCH)})
        for key, data in zip(keys, self.store.get_batch(keys), strict=True):
            if data:
                self.verify("get_batch", key, data)

    def op_get_into(self) -> None:
        keys = list({self.any_key() for _ in range(self.rng.randint(1, 4))})
        slot = BUFFER_BYTES // 4
        addresses = [self.base + i * slot for i in range(len(keys))]
        counts = self.store.batch_get_into(keys, addresses, [slot] * len(keys))
        for i, (key, count) in enumerate(zip(keys, counts, strict=True)):
            if count > 0:
                self.verify("get_into", key, self.buffer[i * slot : i * slot + count].tobytes())
            elif count != ErrorCode.OBJECT_NOT_FOUND:
                self.code("get_into", count)

    def op_remove(self) -> None:
        code = self.store.remove(self.own_key(), force=self.rng.random() < 0.5)
        if code != ErrorCode.OBJECT_NOT_FOUND:
            self.code("remove", code)

    def op_is_exist(self) -> None:
        keys = [self.any_key() for _ in range(BATCH)]
        for code in self.store.batch_is_exist(keys):
            self.code("is_exist", code)
        self.code("probe_key", self.store.probe_key(self.any_key()))

    def op_session(self) -> None:
        """Tagged writes into a new session, pin it; release (or close) the oldest."""
        self.session_serial += 1
        session = f"w{self.index}-s{self.session_serial}"
        keys = [f"w{self.index}/sess/{self.session_serial}/{i}" for i in range(4)]
        values = [make_value(k, self.rng) for k in keys]
        config = ReplicateConfig(kv_sessions=[[session]] * len(keys))
        self.code("session_put", self.store.put_batch(keys, values, config))
        try:
            self.store.attach_kv_session(session, [self.own_key()])
            self.store.pin_kv_session(session)
            self.sessions.append(session)
            for key in keys[:2]:
                data = self.store.get(key)
                if data:
                    self.verify("session_get", key, data)
            if len(self.sessions) > 4:
                oldest = self.sessions.pop(0)
                if self.rng.random() < 0.7:
                    self.store.release_kv_session(oldest)
                else:
                    self.store.unpin_kv_session(oldest)
                    self.store.close_kv_session(oldest)
        except MooncakeError as exc:
            self.errors[f"session:{ErrorCode.name_of(exc.code)}"] += 1

    def op_remove_by_regex(self) -> None:
        count = self.store.remove_by_regex(f"^w{self.index}/{self.rng.randrange(10)}")
        self.code("remove_by_regex", count)

    def run(self, seconds: float) -> dict[str, Any]:
        table: list[tuple[str, Callable[[], None], int]] = [
            ("put", self.op_put, 14),
            ("upsert", self.op_upsert, 5),
            ("put_batch", self.op_put_batch, 5),
            ("put_from", self.op_put_from, 8),
            ("get", self.op_get, 20),
            ("get_batch", self.op_get_batch, 8),
            ("get_into", self.op_get_into, 12),
            ("remove", self.op_remove, 6),
            ("is_exist", self.op_is_exist, 8),
            ("session", self.op_session, 3),
            ("remove_by_regex", self.op_remove_by_regex, 1),
        ]
        names = [t[0] for t in table]
        calls = {t[0]: t[1] for t in table}
        weights = [t[2] for t in table]
        deadline = time.monotonic() + seconds
        started = time.monotonic()
        while time.monotonic() < deadline:
            for name in self.rng.choices(names, weights, k=64):
                try:
                    calls[name]()
                except Exception as exc:  # noqa: BLE001 - counted and reported: a finding
                    self.exceptions[f"{name}:{type(exc).__name__}: {exc}"[:200]] += 1
                    if sum(self.exceptions.values()) <= 3:
                        traceback.print_exc(file=sys.stderr)
                self.ops[name] += 1
        elapsed = time.monotonic() - started
        for session in self.sessions:
            try:
                self.store.release_kv_session(session)
            except MooncakeError as exc:
                self.errors[f"session:{ErrorCode.name_of(exc.code)}"] += 1
        self.store.close()
        return {
            "index": self.index,
            "tcp": os.environ.get("MOONCAKE_PY_FORCE_TCP") == "1",
            "seconds": round(elapsed, 2),
            "ops": dict(self.ops),
            "errors": dict(self.errors),
            "exceptions": dict(self.exceptions),
            "wrong_reads": len(self.wrong),
            "wrong_examples": self.wrong[:10],
        }


def main() -> None:
    spec = json.loads(sys.argv[1])
    report = Soak(spec).run(float(spec["seconds"]))
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
