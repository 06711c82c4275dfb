"""An engine process attached to a standalone client service, driven by JSON lines on stdin.

Requests and answers as in ``client_worker.py``. The engine does what SGLang's
``standalone_storage`` path does: allocate its host pool with ``MooncakeHostMemAllocator``
before attaching, ``setup_dummy``, the warm-up (``put``, ``is_exist``, ``get``),
``register_buffer`` of the whole pool, then zero-copy batches on pool pages. Values come from
``value_for(key, size)`` so processes agree on content without shipping bytes through the test.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
from typing import Any

import numpy as np

# Run as a script: this directory is on sys.path, so the sibling worker's helpers import.
from client_worker import digest, value_for

from mooncake_py import MooncakeDistributedStore, ReplicateConfig
from mooncake_py.client.compat_standalone import MooncakeHostMemAllocator, StandaloneCalls

if not hasattr(MooncakeDistributedStore, "setup_dummy"):
    # When the drop-in class does not list the mixin among its bases, add it here.
    class MooncakeDistributedStore(StandaloneCalls, MooncakeDistributedStore):
        pass


class Engine:
    """One store attached with ``setup_dummy`` and a host pool from the allocator."""

    def __init__(self) -> None:
        self.store = MooncakeDistributedStore()
        self.allocator = MooncakeHostMemAllocator()
        self.pool_ptr = 0
        self.pool = np.zeros(0, dtype=np.uint8)

    def op_setup(self, address: str, pool_bytes: int = 8 << 20) -> int:
        # SGLang allocates the host KV pool first, then sets up the store.
        self.pool_ptr = self.allocator.alloc(pool_bytes)
        array = (ctypes.c_uint8 * pool_bytes).from_address(self.pool_ptr)
        self.pool = np.frombuffer(array, dtype=np.uint8)
        code = self.store.setup_dummy(pool_bytes, 16 << 20, address)
        if code != 0:
            return code
        warm = f"warmup-{os.getpid()}"
        assert self.store.put(warm, bytes(4096)) == 0
        assert self.store.is_exist(warm) == 1
        assert self.store.get(warm) == bytes(4096)
        return self.store.register_buffer(self.pool_ptr, pool_bytes)

    def _fill(self, keys: list[str], size: int, offset: int = 0) -> list[int]:
        ptrs = []
        for i, key in enumerate(keys):
            start = offset + i * size
            self.pool[start : start + size] = np.frombuffer(value_for(key, size), np.uint8)
            ptrs.append(self.pool_ptr + start)
        return ptrs

    def op_put_from(self, keys: list[str], size: int) -> list[int]:
        # As SGLang's batch_set_v1: write only the keys the store does not hold yet.
        exists = self.store.batch_is_exist(keys)
        missing = [i for i, e in enumerate(exists) if e != 1]
        ptrs = self._fill(keys, size)
        config = ReplicateConfig(replica_num=1)
        written = self.store.batch_put_from(
            [keys[i] for i in missing], [ptrs[i] for i in missing], [size] * len(missing), config
        )
        codes = [0] * len(keys)
        for i, code in zip(missing, written, strict=True):
            codes[i] = code
        return codes

    def op_put_from_threads(self, keys: list[str], size: int, threads: int) -> list[int]:
        ptrs = self._fill(keys, size)
        codes: list[int] = [1] * len(keys)

        def write(lane: int) -> None:
            for i in range(lane, len(keys), threads):
                codes[i] = self.store.put_from(keys[i], ptrs[i], size)

        workers = [threading.Thread(target=write, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return codes

    def op_start_streaming(self, prefix: str, size: int, batch: int) -> int:
        """Write ``prefix-0``, ``prefix-1``, ... in batches from a background thread until
        the process dies (the test kills it mid-write)."""

        def stream() -> None:
            for n in range(1 << 30):
                keys = [f"{prefix}-{n * batch + j}" for j in range(batch)]
                self.store.batch_put_from(keys, self._fill(keys, size), [size] * batch)

        threading.Thread(target=stream, daemon=True).start()
        return 0

    def op_get_into_digests(self, keys: list[str], size: int) -> list[Any]:
        base = len(self.pool) // 2  # the upper half: never where this engine wrote values
        ptrs = [self.pool_ptr + base + i * size for i in range(len(keys))]
        self.pool[base : base + len(keys) * size] = 0
        codes = self.store.batch_get_into(keys, ptrs, [size] * len(keys))
        out: list[Any] = []
        for i, code in enumerate(codes):
            start = base + i * size
            out.append(digest(self.pool[start : start + code].tobytes()) if code > 0 else code)
        return out

    def op_put_multi(self, keys: list[str], size: int) -> list[int]:
        half = size // 2
        ptrs = self._fill(keys, size)
        # Store each value from two parts, the second half written before the first.
        all_ptrs = [[p, p + half] for p in ptrs]
        return self.store.batch_put_from_multi_buffers(
            keys, all_ptrs, [[half, size - half]] * len(keys)
        )

    def op_get_multi_digests(self, keys: list[str], size: int) -> list[Any]:
        scratch = self.store.alloc_from_mem_pool(2 * size * len(keys))
        view = np.frombuffer(
            (ctypes.c_uint8 * (2 * size * len(keys))).from_address(scratch), np.uint8
        )
        half = size // 2
        # Scatter each object over two ranges far apart in the scratch buffer.
        all_ptrs = [
            [scratch + i * size, scratch + (len(keys) + i) * size] for i in range(len(keys))
        ]
        codes = self.store.batch_get_into_multi_buffers(
            keys, all_ptrs, [[half, size - half]] * len(keys)
        )
        out: list[Any] = []
        for i, code in enumerate(codes):
            if code < 0:
                out.append(code)
                continue
            first = view[i * size : i * size + half].tobytes()
            second = view[(len(keys) + i) * size : (len(keys) + i) * size + size - half].tobytes()
            out.append(digest(first + second))
        assert self.allocator.free(scratch) == 0
        return out

    def op_put(self, key: str, size: int) -> int:
        return self.store.put(key, value_for(key, size))

    def op_get_digest(self, key: str) -> str:
        return digest(self.store.get(key))

    def op_value_digest(self, key: str, size: int) -> str:
        return digest(value_for(key, size))

    def op_value_digests(self, keys: list[str], size: int) -> list[str]:
        return [digest(value_for(k, size)) for k in keys]

    def op_pool_address(self) -> int:
        return self.pool_ptr

    def op_foreign(self, address: int, size: int) -> dict[str, Any]:
        """Zero-copy calls on memory this engine did not register (another process's, a
        private numpy buffer, an unregistered allocation)."""
        private = np.zeros(size, dtype=np.uint8)
        unregistered = self.allocator.alloc(size)
        result = {
            "get_other": self.store.get_into("shared-0", address, size),
            "put_other": self.store.put_from("stolen", address, size),
            "register_private": self.store.register_buffer(private.ctypes.data, size),
            "get_private": self.store.get_into("shared-0", private.ctypes.data, size),
            "get_unregistered": self.store.get_into("shared-0", unregistered, size),
            "past_pool_end": self.store.put_from(
                "past-end", self.pool_ptr + len(self.pool) - 16, 32
            ),
        }
        self.allocator.free(unregistered)
        return result

    def op_pool_alloc(self, size: int) -> int:
        return self.store.alloc_from_mem_pool(size)

    def op_stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self.store.client.service_stats()
        return stats

    def op_pid(self) -> int:
        return os.getpid()

    def op_exists(self, keys: list[str]) -> list[int]:
        return self.store.batch_is_exist(keys)

    def op_close(self) -> int:
        return self.store.close()


def main() -> None:
    engine = Engine()
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            answer = {"ok": True, "result": getattr(engine, f"op_{op}")(**request)}
        except Exception as exc:  # reported to the test, which fails with it
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
        if op == "close":
            break


if __name__ == "__main__":
    main()
