"""A client process driven by JSON lines on stdin, for integration tests.

Each request is ``{"op": ..., ...}``; each answer is one JSON line ``{"ok": true, "result": ...}``
or ``{"ok": false, "error": "..."}``. Values are generated deterministically from
(key, size) so two processes agree on content without shipping bytes through the test.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import numpy as np

from mooncake_py import MooncakeDistributedStore, ReplicateConfig


def value_for(key: str, size: int) -> bytes:
    """Deterministic content for ``key`` of ``size`` bytes."""
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def digest(data: bytes | memoryview) -> str:
    """Content hash used in answers."""
    return hashlib.sha256(data).hexdigest()


class Worker:
    """Holds one store and a registered scratch buffer."""

    def __init__(self) -> None:
        self.store = MooncakeDistributedStore()
        self.buffer = np.zeros(0, dtype=np.uint8)

    def op_setup(self, config: dict[str, Any], buffer_bytes: int = 64 << 20) -> int:
        code = self.store.setup(config)
        if code == 0:
            self.buffer = np.zeros(buffer_bytes, dtype=np.uint8)
            self.store.register_buffer(self.buffer.ctypes.data, buffer_bytes)
        return code

    def op_put(self, key: str, size: int, replica_num: int = 1) -> int:
        return self.store.put(key, value_for(key, size), ReplicateConfig(replica_num=replica_num))

    def op_put_from(self, keys: list[str], size: int, replica_num: int = 1) -> list[int]:
        ptrs = []
        for i, key in enumerate(keys):
            self.buffer[i * size : (i + 1) * size] = np.frombuffer(
                value_for(key, size), dtype=np.uint8
            )
            ptrs.append(self.buffer.ctypes.data + i * size)
        config = ReplicateConfig(replica_num=replica_num)
        return self.store.batch_put_from(keys, ptrs, [size] * len(keys), config)

    def op_get_digest(self, key: str) -> str:
        return digest(self.store.get(key))

    def op_get_into_digests(self, keys: list[str], size: int) -> list[Any]:
        ptrs = [self.buffer.ctypes.data + i * size for i in range(len(keys))]
        codes = self.store.batch_get_into(keys, ptrs, [size] * len(keys))
        out: list[Any] = []
        for i, code in enumerate(codes):
            out.append(
                digest(self.buffer[i * size : i * size + code].tobytes()) if code >= 0 else code
            )
        return out

    def op_expected_digest(self, key: str, size: int) -> str:
        return digest(value_for(key, size))

    def op_is_exist(self, key: str) -> int:
        return self.store.is_exist(key)

    def op_hostname(self) -> str:
        return self.store.get_hostname()

    def op_health(self) -> int:
        return self.store.health_check()

    def op_close(self) -> int:
        return self.store.close()


def main(worker: Worker | None = None) -> None:
    """Answer requests from stdin until ``close`` or EOF, with ``worker`` (a fresh
    :class:`Worker` by default; subclasses add operations)."""
    worker = worker or Worker()
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            result = getattr(worker, f"op_{op}")(**request)
            answer = {"ok": True, "result": result}
        except Exception as exc:  # reported to the test, which fails with it
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
        if op == "close":
            break


if __name__ == "__main__":
    main()
