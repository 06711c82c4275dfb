"""An owner, writer or reader process for the concurrency stress test.

Values are self-verifying: ``sha256(key)[:16] | sha256(payload)[:16] | payload``. A reader
that gets bytes back checks both digests, so a torn read (bytes of two writes) or a foreign
read (another key's bytes) is caught, whatever version of the key it saw.

Usage::

    python stress_worker.py owner MASTER SEGMENT_BYTES
    python stress_worker.py writer|reader MASTER SECONDS SEED

Every role prints ``ready`` once set up (an owner once its segment is mounted), then waits
for one line on stdin (or its end). For a writer or reader that line is the start signal: it
then works for SECONDS and prints one JSON line of counts. For an owner it is the stop
signal: the owner only hosts memory, and closes when told, so it outlives every other worker.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from collections import Counter

import numpy as np

from mooncake_py import MooncakeDistributedStore

KEYS = 64
SIZES = (4096, 65536, 300_000, 1 << 20)
READY = "ready"


def make_value(key: str, rng: random.Random) -> bytes:
    payload = rng.randbytes(rng.choice(SIZES) - 32)
    return (
        hashlib.sha256(key.encode()).digest()[:16] + hashlib.sha256(payload).digest()[:16] + payload
    )


def verify(key: str, data: bytes | memoryview) -> bool:
    data = bytes(data)
    if len(data) < 32:
        return False
    key_ok = data[:16] == hashlib.sha256(key.encode()).digest()[:16]
    return key_ok and data[16:32] == hashlib.sha256(data[32:]).digest()[:16]


def _set_up(master: str, segment_bytes: int) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    config = {"master_server_address": master, "global_segment_size": segment_bytes}
    assert store.setup(config) == 0
    return store


def _signal_ready_and_wait() -> None:
    print(READY, flush=True)
    sys.stdin.readline()


def host(master: str, segment_bytes: int) -> None:
    """Contribute a segment until told to stop."""
    store = _set_up(master, segment_bytes)
    _signal_ready_and_wait()
    store.close()


def work(role: str, master: str, seconds: float, seed: int) -> Counter[str]:
    """Write (put, upsert, remove) or read (get, get_into) random keys for ``seconds``."""
    rng = random.Random(seed)
    store = _set_up(master, 0)
    buffer = np.zeros(max(SIZES), np.uint8)
    store.register_buffer(buffer.ctypes.data, buffer.nbytes)
    counts: Counter[str] = Counter()
    _signal_ready_and_wait()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        key = f"stress-{rng.randrange(KEYS)}"
        if role == "writer":
            action = rng.choice(("put", "upsert", "upsert", "remove"))
            if action == "remove":
                code = store.remove(key, force=rng.random() < 0.5)
            elif action == "put":
                code = store.put(key, make_value(key, rng))
            else:
                code = store.upsert(key, make_value(key, rng))
            counts[f"{action}:{code}"] += 1
        elif rng.random() < 0.5:
            data = store.get(key)
            if not data:
                counts["get:miss"] += 1
            else:
                counts["get:ok" if verify(key, data) else "CORRUPT"] += 1
        else:
            code = store.get_into(key, buffer.ctypes.data, buffer.nbytes)
            if code < 0:
                counts[f"get_into:{code}"] += 1
            else:
                counts["get_into:ok" if verify(key, buffer[:code].data) else "CORRUPT"] += 1
    store.close()
    return counts


def main() -> None:
    role, master = sys.argv[1], sys.argv[2]
    if role == "owner":
        host(master, int(sys.argv[3]))
        return
    if role not in ("writer", "reader"):
        raise SystemExit(f"unknown role {role!r}")
    counts = work(role, master, float(sys.argv[3]), int(sys.argv[4]))
    print(json.dumps(dict(counts)), flush=True)


if __name__ == "__main__":
    main()
