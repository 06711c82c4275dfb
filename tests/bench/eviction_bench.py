"""Eviction micro-benchmark: the master alone, in this process, no sockets.

Run from the repository root::

    .venv/bin/python -m tests.bench.eviction_bench [--objects N] [--value-bytes B]
        [--segments S] [--pinned-fraction F] [--tracemalloc] [--skip-check]

It builds a :class:`MasterService` (FakeClock, default eviction flags: watermark 0.90, ratio
0.05) whose segments are sized so that N objects fill them to about 93%, inserts the N objects
with ``batch_put_start`` / ``batch_put_end`` in batches of 10,000 (a fraction soft pinned, spread
evenly), and measures:

- master memory per object: the growth of the process's resident set over the insertion
  divided by N (and, with ``--tracemalloc``, the Python heap growth of a second, identical build
  measured with :mod:`tracemalloc`, which is exact but slow);
- insertion throughput of ``batch_put_start`` and ``batch_put_end`` (and the longest batch:
  each batch holds the service lock for its whole duration);
- a watermark pass run as the background loop runs it (``start_eviction`` then
  ``continue_eviction`` until done): the duration of every slice, i.e. the longest time other
  RPCs wait for the lock, as max / p99 / p50, and the pass in total;
- a whole pass in one ``evict_once`` call, after refilling over the watermark: what the stall
  would be without slices;
- writes into a completely full store, where every put evicts synchronously;
- the interpreter's cyclic GC pauses over the run (they stop every RPC as well).

The figures go to stdout as a small table.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.types import ReplicateConfig, SegmentInfo, SoftPinAction

BATCH = 10_000
ALIGN = 64
FILL = 0.93  # how full the N objects leave the store: just over the 0.90 watermark
STALL_BUDGET_MS = 20.0  # the bound on how long one pass may hold other RPCs


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def rss_bytes() -> int:
    """Resident set size of this process."""
    with open("/proc/self/statm", encoding="ascii") as handle:
        resident_pages = int(handle.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(0, math.ceil(fraction * len(ordered)) - 1)
    return ordered[rank]


class Store:
    """A master service with segments sized for ``objects`` values of ``value_bytes``."""

    def __init__(self, objects: int, value_bytes: int, segments: int) -> None:
        self.clock = FakeClock()
        self.service = MasterService(MasterConfig(), clock=self.clock)
        self.value_bytes = value_bytes
        per_object = -(-value_bytes // ALIGN) * ALIGN
        segment_bytes = -(-math.ceil(objects * per_object / FILL / segments) // ALIGN) * ALIGN
        for i in range(segments):
            info = SegmentInfo(
                id=f"seg-{i}",
                name=f"node-{i}",
                base=0x10000,
                size=segment_bytes,
                te_endpoint=f"127.0.0.1:{20000 + i}",
            )
            assert self.service.mount_segment(f"client-{i}", info) == ErrorCode.OK
        self.next_key = 0

    def insert(
        self,
        count: int,
        pinned_every: int = 0,
        on_batch: Callable[[float, float], None] | None = None,
    ) -> int:
        """Insert ``count`` fresh objects in batches; every ``pinned_every``-th is soft pinned.

        Returns the number of keys whose put_start succeeded.
        """
        plain = ReplicateConfig()
        pinned = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE)
        written = 0
        while count > 0:
            size = min(BATCH, count)
            first = self.next_key
            keys = [f"key-{first + i:09d}" for i in range(size)]
            self.next_key += size
            count -= size
            groups = [keys]
            if pinned_every:
                groups = [
                    [k for i, k in enumerate(keys) if (first + i) % pinned_every != 0],
                    [k for i, k in enumerate(keys) if (first + i) % pinned_every == 0],
                ]
            start_s = end_s = 0.0
            for group, config in zip(groups, (plain, pinned), strict=False):
                if not group:
                    continue
                began = time.perf_counter()
                results = self.service.batch_put_start(
                    "writer", "", group, [self.value_bytes] * len(group), config
                )
                middle = time.perf_counter()
                ok = [k for k, r in zip(group, results, strict=True) if r.code == ErrorCode.OK]
                codes = self.service.batch_put_end("writer", "", ok)
                ended = time.perf_counter()
                assert all(code == ErrorCode.OK for code in codes)
                written += len(ok)
                start_s += middle - began
                end_s += ended - middle
            if on_batch is not None:
                on_batch(start_s, end_s)
            self.clock.advance(0.001)
        return written

    def used(self) -> float:
        stats = self.service.stats()
        return stats["allocated_bytes"] / stats["capacity_bytes"]


def measure_heap(objects: int, value_bytes: int, segments: int, pinned_every: int) -> float:
    """Python heap bytes per object for a fresh, identical build (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store = Store(objects, value_bytes, segments)
    store.insert(objects, pinned_every)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del store
    return (after - before) / objects


class GcPauses:
    """Durations of the interpreter's cyclic garbage collections, by generation.

    A collection stops everything in the process, so it is a stall other RPCs see too.
    """

    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pauses[info["generation"]].append(time.perf_counter() - self._began)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self)

    def row(self) -> tuple[str, str]:
        full = self.pauses[2]
        young = self.pauses[0] + self.pauses[1]
        text = f"{len(full)} full collections, longest {max(full, default=0) * 1e3:.0f} ms"
        text += f"; {len(young)} young, longest {max(young, default=0) * 1e3:.1f} ms"
        return ("cyclic GC pauses during the run", text)


def run(args: argparse.Namespace) -> list[tuple[str, str]]:
    with GcPauses() as pauses:
        rows = _run(args)
    rows.insert(-1 if not args.skip_check else len(rows), pauses.row())
    if args.tracemalloc:
        _log("measuring the heap with tracemalloc (slow) ...")
        pinned_every = round(1 / args.pinned_fraction) if args.pinned_fraction > 0 else 0
        heap = measure_heap(args.objects, args.value_bytes, args.segments, pinned_every)
        rows.insert(3, ("master memory per object (tracemalloc)", f"{heap:.0f} B"))
    return rows


def _run(args: argparse.Namespace) -> list[tuple[str, str]]:
    n = args.objects
    pinned_every = round(1 / args.pinned_fraction) if args.pinned_fraction > 0 else 0
    rows: list[tuple[str, str]] = []

    # -- build -----------------------------------------------------------------------------
    gc.collect()
    rss_before = rss_bytes()
    store = Store(n, args.value_bytes, args.segments)
    service = store.service
    starts: list[float] = []
    ends: list[float] = []

    def record(start_s: float, end_s: float) -> None:
        starts.append(start_s)
        ends.append(end_s)

    _log(f"inserting {n:,} objects ...")
    written = store.insert(n, pinned_every, record)
    assert written == n, f"only {written} of {n} objects fit"
    gc.collect()
    rss_after = rss_bytes()
    stats = service.stats()
    rows.append(("objects / segments", f"{stats['objects']:,} / {stats['segments']}"))
    rows.append(("used after insert", f"{store.used():.4f}"))
    rows.append(
        ("master memory per object (RSS delta / N)", f"{(rss_after - rss_before) / n:.0f} B")
    )
    rows.append(("master RSS after insert", f"{rss_after / 2**20:.0f} MiB"))
    rows.append(
        (
            f"batch_put_start ({BATCH:,} keys/batch)",
            f"{n / sum(starts):,.0f} obj/s; batch p50 {statistics.median(starts) * 1e3:.1f} ms,"
            f" max {max(starts) * 1e3:.1f} ms",
        )
    )
    rows.append(
        (
            f"batch_put_end ({BATCH:,} keys/batch)",
            f"{n / sum(ends):,.0f} obj/s; batch p50 {statistics.median(ends) * 1e3:.1f} ms,"
            f" max {max(ends) * 1e3:.1f} ms",
        )
    )

    # -- a watermark pass in slices, as the background loop runs it -------------------------
    candidates = stats["eviction_candidates"]
    began = time.perf_counter()
    work = service.start_eviction()
    plan_s = time.perf_counter() - began
    assert work is not None, "the insert did not cross the watermark"
    slices: list[float] = []
    done = False
    while not done:
        began = time.perf_counter()
        done = service.continue_eviction(work, store.clock())
        slices.append(time.perf_counter() - began)
        if len(slices) > 1_000_000:
            raise RuntimeError(f"eviction pass does not finish: {work}")
    slice_ms = [s * 1e3 for s in slices]
    rows.append(
        (
            "pass: candidates / target / evicted",
            f"{candidates:,} / {work.target:,} / {work.evicted:,} (fallback {work.fallback})",
        )
    )
    rows.append(("pass: start_eviction", f"{plan_s * 1e3:.3f} ms"))
    rows.append(
        (
            f"pass: continue_eviction slice ({len(slices)} slices)",
            f"max {max(slice_ms):.2f} ms, p99 {percentile(slice_ms, 0.99):.2f} ms,"
            f" p50 {percentile(slice_ms, 0.5):.2f} ms",
        )
    )
    rows.append(
        (
            "pass: total of the slices",
            f"{sum(slice_ms):.0f} ms ({work.evicted / sum(slices):,.0f} evictions/s)",
        )
    )
    verdict = "within" if max(slice_ms) <= STALL_BUDGET_MS else "OVER"
    rows.append(("longest stall vs 20 ms bound", f"{max(slice_ms):.2f} ms: {verdict}"))
    rows.append(("used after the pass", f"{store.used():.4f}"))

    # -- a whole pass in one call ----------------------------------------------------------
    store.insert(work.evicted, pinned_every)
    assert store.used() > 0.9
    began = time.perf_counter()
    whole = service.evict_once(store.clock())
    whole_s = time.perf_counter() - began
    assert whole is not None
    rows.append(
        (
            "evict_once (whole pass, one lock hold)",
            f"{whole_s * 1e3:.0f} ms for {whole.evicted:,} evictions",
        )
    )

    # -- writes into a full store ----------------------------------------------------------
    stats = service.stats()
    per_object = -(-args.value_bytes // ALIGN) * ALIGN
    # Fill what is left (segments are equal, so this packs them exactly), then write on.
    store.insert((stats["capacity_bytes"] - stats["allocated_bytes"]) // per_object, 0)
    syncs_before = service.stats()["sync_evictions"]
    full_starts: list[float] = []
    store.insert(args.full_writes, 0, lambda start_s, _: full_starts.append(start_s))
    syncs = service.stats()["sync_evictions"] - syncs_before
    rows.append(
        (
            f"batch_put_start into a full store ({args.full_writes:,} keys)",
            f"{args.full_writes / sum(full_starts):,.0f} obj/s, {syncs:,} sync evictions;"
            f" batch max {max(full_starts) * 1e3:.1f} ms",
        )
    )

    if not args.skip_check:
        began = time.perf_counter()
        service.check()
        rows.append(
            ("service.check() (O(state), tests only)", f"{time.perf_counter() - began:.1f} s")
        )
    del store, service
    return rows


def table(rows: list[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in rows)
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  {'-' * 40}"]
    lines += [f"{name:<{width}}  {value}" for name, value in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--objects", type=int, default=1_000_000, help="objects to insert")
    parser.add_argument("--value-bytes", type=int, default=4096, help="size of each value")
    parser.add_argument("--segments", type=int, default=16, help="segments to spread them over")
    parser.add_argument(
        "--pinned-fraction",
        type=float,
        default=0.01,
        help="fraction of objects soft pinned (spread evenly; 0 for none)",
    )
    parser.add_argument(
        "--full-writes", type=int, default=BATCH, help="writes timed into a full store"
    )
    parser.add_argument(
        "--tracemalloc", action="store_true", help="also measure the heap with tracemalloc"
    )
    parser.add_argument("--skip-check", action="store_true", help="skip service.check()")
    args = parser.parse_args(argv)
    if args.objects < BATCH:
        parser.error(f"--objects must be at least {BATCH}")
    rows = run(args)
    print(
        f"eviction benchmark: {args.objects:,} objects of {args.value_bytes} B,"
        f" {args.segments} segments, {args.pinned_fraction:.0%} soft pinned,"
        f" Python {sys.version.split()[0]}"
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
