"""Prefaulted segments: what populating at setup costs and what it saves.

Run from the repository root::

    .venv/bin/python -m tests.bench.prefault_bench [--rounds N] [--sizes MiB,MiB,...]
        [--skip-store]

Measures, with ``prefault`` on and off, medians of ``--rounds`` (default 5):

- segment creation (:class:`~mooncake_py.client.segment.LocalSegment`) for each size
  (default 256 MiB, 1 GiB, 4 GiB): memfd, seals, mapping and, when on, populating;
- a peer's mapping of a populated segment (:class:`~mooncake_py.client.segment.MappedMemory`)
  without and with ``MAP_POPULATE`` (off/on columns), alone and followed by one write into
  every page (the page faults a peer's first copies take, or not);
- first writes into a fresh store's own segment: ``batch_put_from`` of 32 x 4 MiB and
  ``put_from`` of 4 MiB, each round on a new store (setup with ``prefault_segment``; a real
  master in this process). The "resident" column reads the segment's Rss right after setup,
  so a setting that does not reach the segment shows as such.

Figures go to stdout as a table. Nothing is asserted: timings belong here, not in tests.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from mooncake_py import MooncakeDistributedStore
from mooncake_py.client.segment import MEMFD_PREFIX, LocalSegment, MappedMemory
from mooncake_py.testing import InProcessMaster

MIB = 1 << 20
VALUE_BYTES = 4 * MIB
BATCH = 32


def _median_seconds(run: Callable[[], float], rounds: int) -> float:
    return statistics.median(run() for _ in range(rounds))


def _segment_creation(size: int, prefault: bool) -> float:
    started = time.perf_counter()
    segment = LocalSegment(size, prefault=prefault)
    elapsed = time.perf_counter() - started
    segment.close()
    return elapsed


def _peer_mapping(size: int, map_populate: bool, touch: bool) -> float:
    """A peer's mapping of a populated segment, with or without ``MAP_POPULATE``, and with
    one write into every page (the faults its first copies would take) when ``touch``."""
    segment = LocalSegment(size)
    try:
        started = time.perf_counter()
        peer = MappedMemory(segment.fd, size, map_populate=map_populate)
        if touch:
            peer.view[0 : size : mmap.PAGESIZE] = bytes(len(range(0, size, mmap.PAGESIZE)))
        elapsed = time.perf_counter() - started
        peer.close()
        return elapsed
    finally:
        segment.close()


def _segment_rss() -> int:
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if "-" in fields[0] and not fields[0].endswith(":"):
            inside = len(fields) == 6 and f"/memfd:{MEMFD_PREFIX}" in fields[5]
        elif inside and fields[0] == "Rss:":
            total += int(fields[1]) * 1024
    return total


class _FreshStoreWrites:
    """Each call: a new store (fresh segment) writes from a registered source buffer."""

    def __init__(self, master: InProcessMaster, prefault: bool) -> None:
        self._master = master
        self._prefault = prefault
        self._source = (ctypes.c_char * (BATCH * VALUE_BYTES))()
        ctypes.memset(self._source, 0x5A, BATCH * VALUE_BYTES)
        self._source_ptr = ctypes.addressof(self._source)
        self.resident_after_setup: list[int] = []

    def _open(self) -> MooncakeDistributedStore:
        store = MooncakeDistributedStore()
        code = store.setup(
            {
                "local_hostname": "127.0.0.1",
                "metadata_server": "P2PHANDSHAKE",
                "global_segment_size": 2 * BATCH * VALUE_BYTES,
                "local_buffer_size": 16 * MIB,
                "master_server_address": self._master.address,
                "prefault_segment": self._prefault,
            }
        )
        if code != 0:
            raise RuntimeError(f"setup failed: {code}")
        self.resident_after_setup.append(_segment_rss())
        if store.register_buffer(self._source_ptr, BATCH * VALUE_BYTES) != 0:
            raise RuntimeError("register_buffer failed")
        return store

    def batch_put_from(self) -> float:
        store = self._open()
        try:
            keys = [f"prefault-batch-{i}" for i in range(BATCH)]
            ptrs = [self._source_ptr + i * VALUE_BYTES for i in range(BATCH)]
            started = time.perf_counter()
            codes = store.batch_put_from(keys, ptrs, [VALUE_BYTES] * BATCH)
            elapsed = time.perf_counter() - started
            if any(code != 0 for code in codes):
                raise RuntimeError(f"batch_put_from failed: {codes}")
            store.remove_all()
            return elapsed
        finally:
            store.close()

    def put_from(self) -> float:
        store = self._open()
        try:
            started = time.perf_counter()
            code = store.put_from("prefault-one", self._source_ptr, VALUE_BYTES)
            elapsed = time.perf_counter() - started
            if code != 0:
                raise RuntimeError(f"put_from failed: {code}")
            store.remove_all()
            return elapsed
        finally:
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="256,1024,4096", help="segment sizes in MiB")
    parser.add_argument("--skip-store", action="store_true", help="segment figures only")
    args = parser.parse_args()
    rounds = args.rounds
    print(f"medians of {rounds} rounds; off = prefault off, on = prefault on\n")
    print(f"{'row':<40} {'off':>12} {'on':>12} {'on/off':>8}")
    for size_mib in (int(text) for text in args.sizes.split(",")):
        size = size_mib * MIB
        off = _median_seconds(lambda: _segment_creation(size, False), rounds)  # noqa: B023
        on = _median_seconds(lambda: _segment_creation(size, True), rounds)  # noqa: B023
        print(f"{f'segment setup {size_mib} MiB':<40} {off * 1e3:>10.1f}ms {on * 1e3:>10.1f}ms")
        for touch in (False, True):
            off = _median_seconds(lambda: _peer_mapping(size, False, touch), rounds)  # noqa: B023
            on = _median_seconds(lambda: _peer_mapping(size, True, touch), rounds)  # noqa: B023
            label = f"peer map{' + touch every page' if touch else ''} {size_mib} MiB"
            print(f"{label:<40} {off * 1e3:>10.1f}ms {on * 1e3:>10.1f}ms {on / off:>7.2f}x")
    if args.skip_store:
        return
    with InProcessMaster() as master:
        writers = {prefault: _FreshStoreWrites(master, prefault) for prefault in (False, True)}
        rows = (
            (f"batch_put_from {BATCH} x 4 MiB, fresh", BATCH * VALUE_BYTES, "batch_put_from"),
            ("put_from 4 MiB, fresh", VALUE_BYTES, "put_from"),
        )
        for label, moved, method in rows:
            figures = {
                prefault: _median_seconds(getattr(writer, method), rounds)
                for prefault, writer in writers.items()
            }
            off_rate, on_rate = (moved / figures[p] / 1e9 for p in (False, True))
            print(
                f"{label:<40} {off_rate:>8.2f}GB/s {on_rate:>8.2f}GB/s {on_rate / off_rate:>7.2f}x"
            )
        for prefault, writer in writers.items():
            resident = statistics.median(writer.resident_after_setup) / MIB
            state = "on" if prefault else "off"
            print(f"segment resident right after setup, prefault {state}: {resident:.0f} MiB")


if __name__ == "__main__":
    main()
