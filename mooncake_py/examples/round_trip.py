"""Start a master and move values between two client processes, over shared memory and TCP.

``python -m mooncake_py.examples.round_trip [--values N] [--size BYTES]``

The writer process contributes a segment and stores N values; the reader process (which
contributes nothing) reads them back and checks each one's SHA-256. The run is repeated with
``MOONCAKE_PY_FORCE_TCP=1`` to exercise the cross-host path. Exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import sys
import time
from typing import Any

from mooncake_py import MooncakeDistributedStore
from mooncake_py.testing import MasterProcess


def _value(key: str, size: int) -> bytes:
    block = hashlib.sha256(key.encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def _client(role: str, master: str, keys: list[str], size: int, force_tcp: bool, out: Any) -> None:
    os.environ["MOONCAKE_PY_FORCE_TCP"] = "1" if force_tcp else "0"
    store = MooncakeDistributedStore()
    segment = 256 << 20 if role == "writer" else 0
    code = store.setup("127.0.0.1", "P2PHANDSHAKE", segment, 16 << 20, "tcp", "", master)
    if code != 0:
        out.put((role, f"setup failed: {code}", 0.0))
        return
    started = time.perf_counter()
    if role == "writer":
        failures = [k for k in keys if store.put(k, _value(k, size)) != 0]
        out.put((role, failures, time.perf_counter() - started))
        # Keep serving the segment until the reader is done.
        while store.is_exist("__reader_done__") != 1:
            time.sleep(0.05)
    else:
        while store.is_exist(keys[-1]) != 1:
            time.sleep(0.01)
        started = time.perf_counter()
        bad = [
            k
            for k in keys
            if hashlib.sha256(store.get(k)).digest() != hashlib.sha256(_value(k, size)).digest()
        ]
        elapsed = time.perf_counter() - started
        store.put("__reader_done__", b"1")
        out.put((role, bad, elapsed))
    store.close()


def run(values: int, size: int) -> int:
    """Run both rounds; returns 0 when every value read back intact."""
    context = mp.get_context("spawn")
    status = 0
    with MasterProcess() as master:
        print(f"master running at {master.address} (pid {master.pid})")
        for force_tcp in (False, True):
            path = "TCP" if force_tcp else "shared memory"
            keys = [f"{'tcp' if force_tcp else 'shm'}-{i}" for i in range(values)]
            results = context.Queue()
            procs = [
                context.Process(
                    target=_client, args=(role, master.address, keys, size, force_tcp, results)
                )
                for role in ("writer", "reader")
            ]
            for proc in procs:
                proc.start()
            outcome = {
                role: (problems, seconds)
                for role, problems, seconds in (results.get(timeout=120) for _ in procs)
            }
            for proc in procs:
                proc.join(timeout=60)
            w_problems, w_seconds = outcome["writer"]
            r_problems, r_seconds = outcome["reader"]
            mb = values * size / 1e6
            print(
                f"[{path}] writer pid {procs[0].pid}: {values} x {size} B put in {w_seconds:.3f} s "
                f"({mb / w_seconds:.0f} MB/s); reader pid {procs[1].pid}: read + SHA-256 "
                f"verified in {r_seconds:.3f} s ({mb / r_seconds:.0f} MB/s)"
            )
            if w_problems or r_problems:
                print(f"[{path}] FAILED: writer {w_problems!r} reader {r_problems!r}")
                status = 1
    print("round trip OK" if status == 0 else "round trip FAILED")
    return status


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--values", type=int, default=64, help="values per round (default 64)")
    parser.add_argument("--size", type=int, default=1 << 20, help="bytes per value (default 1 MiB)")
    options = parser.parse_args(argv)
    return run(options.values, options.size)


if __name__ == "__main__":
    sys.exit(main())
