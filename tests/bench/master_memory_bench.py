"""Master memory per object, and the master's per-key cost of writes: in this process, no sockets.

Run from the repository root::

    .venv/bin/python -m tests.bench.master_memory_bench [--objects N] [--ten-million] [--rates]
        [--value-bytes B] [--segments S] [--tracemalloc-objects M] [--skip-memory]
        [--write-cost] [--write-keys K] [--rounds R] [--profile FILE] [--baseline-rev REV]

**Memory.** It builds a :class:`MasterService` (FakeClock, ``S`` segments sized to hold the
objects), writes N objects with ``batch_put_start`` / ``batch_put_end`` in batches of 1,000 (the
client id and tenant are fresh strings per batch, as each decoded request carries its own), and
reports the growth of the resident set (``VmRSS`` of ``/proc/self/status``, after
``gc.collect()``) divided by N, and the batched put rate of that write. ``--rates`` then
measures, on that master at that size, the rates of single puts and of existence checks
(``batch_exist_key`` in batches of 1,000, and ``exist_key``) over 200,000 keys. A second
build of M objects (default 200,000) under :mod:`tracemalloc` gives the Python heap per
object, the top allocating lines per object, and a breakdown by structure (object records,
replica records and their containers, keys, keys several tenants share, the object table,
the eviction policy, the allocators with the segment index they hold, the tenant tallies):
shallow sizes of every object reachable from each structure, each object counted once, in
the first structure that reaches it.

**Write cost.** ``--write-cost`` times, on a fresh service per round, K keys (default 200,000)
through ``batch_put_start`` + ``batch_put_end`` (batches of 1,000) and through single
``put_start`` + ``put_end``, and prints the median per-key cost of each call. With
``--baseline-rev REV`` every round runs once in a subprocess on that git revision (exported
and installed as ``store_bench --baseline-rev`` does) and once on the working tree, taking
turns, and the medians of both sides and their ratio are printed. ``--profile FILE`` writes a
cProfile of one round of the working tree and prints its top entries.

The 10M build (``--ten-million``, which implies ``--rates``) needs several GB of memory and
minutes; nothing runs it in CI.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import math
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.state.objects import ObjectMetadata as ObjectMetadataType
from mooncake_py.types import ReplicateConfig, SegmentInfo

BATCH = 1_000
ALIGN = 64


def rss_bytes() -> int:
    """``VmRSS`` of this process, from ``/proc/self/status``."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def build_service(objects: int, value_bytes: int, segments: int) -> tuple[MasterService, FakeClock]:
    """A service with ``segments`` segments that together hold ``objects`` values, half full."""
    clock = FakeClock()
    service = MasterService(MasterConfig(), clock=clock)
    per_object = -(-value_bytes // ALIGN) * ALIGN
    segment_bytes = -(-math.ceil(2 * objects * per_object / segments) // ALIGN) * ALIGN
    for i in range(segments):
        info = SegmentInfo(
            id=f"seg-{i}",
            name=f"node-{i}",
            base=0x10000,
            size=segment_bytes,
            te_endpoint=f"127.0.0.1:{20000 + i}",
        )
        assert service.mount_segment(f"client-{i}", info) == ErrorCode.OK
    return service, clock


def fresh(text: str) -> str:
    """A new string equal to ``text``, as decoding a request makes one."""
    return text.encode().decode()


def write_objects(service: MasterService, clock: FakeClock, count: int, value_bytes: int) -> None:
    """Write ``count`` objects in batches of :data:`BATCH`, each batch its own request."""
    config = ReplicateConfig()
    for first in range(0, count, BATCH):
        keys = [f"key-{i:010d}" for i in range(first, min(first + BATCH, count))]
        client, tenant = fresh("writer-0"), fresh("")
        results = service.batch_put_start(client, tenant, keys, [value_bytes] * len(keys), config)
        assert all(r.code == ErrorCode.OK for r in results)
        ids = [r.write_id for r in results]
        codes = service.batch_put_end(fresh("writer-0"), fresh(""), keys, ids)
        assert all(c == ErrorCode.OK for c in codes)
        clock.advance(0.001)


def measure_rss(
    objects: int, value_bytes: int, segments: int, rates: bool = False
) -> dict[str, float]:
    """RSS growth per object over writing ``objects`` objects, and the batched put rate of
    that write; with ``rates`` also the rates at that size of single puts and of existence
    checks, batched and single (:func:`measure_rates`), measured after the RSS."""
    service, clock = build_service(objects, value_bytes, segments)
    gc.collect()
    before = rss_bytes()
    began = time.perf_counter()
    write_objects(service, clock, objects, value_bytes)
    elapsed = time.perf_counter() - began
    gc.collect()
    after = rss_bytes()
    assert len(service._state.objects) == objects  # noqa: SLF001
    figures = {"rss_per_object": (after - before) / objects, "batch_puts_per_s": objects / elapsed}
    if rates:
        figures.update(measure_rates(service, clock, objects, value_bytes))
    del service
    return figures


RATE_KEYS = 200_000
"""Keys each rate at size is measured over (single puts, existence checks)."""


def measure_rates(
    service: MasterService, clock: FakeClock, objects: int, value_bytes: int
) -> dict[str, float]:
    """Per-second rates on a master already holding ``objects`` objects: single puts
    (put_start + put_end) of :data:`RATE_KEYS` new keys, batched existence checks
    (batch_exist_key, batches of :data:`BATCH`) and single ones (exist_key) of
    :data:`RATE_KEYS` stored keys spread over the whole key space, by one reading client."""
    config = ReplicateConfig()
    count = min(RATE_KEYS, objects)
    began = time.perf_counter()
    for i in range(objects, objects + count):
        key = f"key-{i:010d}"
        result = service.put_start("writer-1", "", key, value_bytes, config)
        assert service.put_end("writer-1", "", key, result.write_id) == ErrorCode.OK
    single_puts = count / (time.perf_counter() - began)
    stride = max(1, objects // count)
    keys = [f"key-{i:010d}" for i in range(0, objects, stride)][:count]
    reads = service.reads
    began = time.perf_counter()
    for first in range(0, len(keys), BATCH):
        found = reads.batch_exist_key("", keys[first : first + BATCH], "reader")
        assert all(code == 1 for code in found)
    batch_exists = len(keys) / (time.perf_counter() - began)
    clock.advance(1.0)
    began = time.perf_counter()
    for key in keys:
        assert reads.exist_key("", key, "reader") == 1
    single_exists = len(keys) / (time.perf_counter() - began)
    return {
        "single_puts_per_s": single_puts,
        "batch_exists_per_s": batch_exists,
        "single_exists_per_s": single_exists,
    }


def structures(service: MasterService) -> list[tuple[str, Iterable[Any], bool]]:
    """The master's per-object structures, as (name, roots, walk) in breakdown order: a
    walked structure counts what it reaches, the others their roots alone."""
    state = service._state  # noqa: SLF001 - the benchmark looks inside on purpose
    table = state.objects
    metas = table.snapshot()
    replicas = [r for m in metas for r in m.replicas]
    # A single replica is held by the record itself; only other counts have a tuple.
    containers = [m._replicas for m in metas if isinstance(m._replicas, tuple)]  # noqa: SLF001
    return [
        ("ObjectMetadata records", metas, False),
        ("replica containers (tuples of 0 or 2+)", containers, False),
        ("Replica records", replicas, False),
        ("keys (str)", [m.key for m in metas], False),
        # The table files records by key; a key several tenants hold has a dict of them.
        ("keys shared by tenants (dicts)", _shared_keys(table), False),
        ("record fields (ints, floats, strs)", _fields(metas, replicas), False),
        ("object table dict", [table._objects], True),  # noqa: SLF001
        ("processing index", [table._processing], True),  # noqa: SLF001
        ("eviction policy (LRU)", [state.policy], True),
        (
            "allocators (with the segment index)",
            [m.allocator for m in state.segments.all_segments()],
            True,
        ),
        ("tenant tallies", [table.tallies], True),
        ("read leases", [state.reads], True),
        ("session registry", [state.sessions], True),
    ]


def _shared_keys(table: Any) -> list[Any]:
    held = table._objects.values()  # noqa: SLF001 - the benchmark looks inside on purpose
    return [h for h in held if isinstance(h, dict)]


def _fields(metas: list[Any], replicas: list[Any]) -> list[Any]:
    values: list[Any] = []
    for record in (*metas, *replicas):
        for klass in type(record).__mro__:
            for name in getattr(klass, "__slots__", ()):
                value = getattr(record, name, None)
                if not isinstance(value, (tuple, list, ObjectMetadataType)):
                    values.append(value)
    return values


def breakdown(service: MasterService, objects: int) -> list[tuple[str, float]]:
    """Bytes per object of each structure (shallow sizes of what it reaches, each object
    once, immortal small ints and singletons excluded)."""
    seen: set[int] = {id(None), id(True), id(False)}
    seen.update(id(i) for i in range(-5, 257))
    return [
        (name, _reach(roots, seen, walk) / objects) for name, roots, walk in structures(service)
    ]


def _reach(roots: Iterable[Any], seen: set[int], walk: bool) -> int:
    total = 0
    stack = list(roots)
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, type) or _is_function(item):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if not walk:
            continue
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif hasattr(item, "__slots__") or hasattr(item, "__dict__"):
            # Iterators (itertools.count) and C containers without either are not walked.
            stack.extend(_members(item))
    return total


def _is_function(item: Any) -> bool:
    """Functions and bound methods lead back to their owners: not part of a structure."""
    return callable(item) and not hasattr(item, "__len__")


def _members(item: Any) -> list[Any]:
    if hasattr(item, "__dict__"):
        return list(vars(item).values())
    return [
        getattr(item, name, None)
        for klass in type(item).__mro__
        for name in getattr(klass, "__slots__", ())
    ]


def measure_heap(objects: int, value_bytes: int, segments: int, top: int) -> dict[str, Any]:
    """tracemalloc's view of writing ``objects`` objects: heap per object, top lines, and the
    structure breakdown."""
    service, clock = build_service(objects, value_bytes, segments)
    gc.collect()
    tracemalloc.start()
    first = tracemalloc.take_snapshot()
    write_objects(service, clock, objects, value_bytes)
    gc.collect()
    second = tracemalloc.take_snapshot()
    heap = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    lines = [
        (f"{s.traceback[0].filename.split('/work/main/')[-1]}:{s.traceback[0].lineno}", s.size_diff)
        for s in second.compare_to(first, "lineno")[:top]
    ]
    return {
        "heap_per_object": heap / objects,
        "top_lines": [(where, size / objects) for where, size in lines],
        "breakdown": breakdown(service, objects),
    }


# -- write cost ------------------------------------------------------------------------------


def write_cost_round(keys: int, profile: str | None = None) -> dict[str, float]:
    """Per-key microseconds of each write call over ``keys`` keys, on fresh services."""
    config = ReplicateConfig()
    figures: dict[str, float] = {}
    service, clock = build_service(keys, 4096, 4)
    names = [f"key-{i:010d}" for i in range(keys)]
    profiler = cProfile.Profile() if profile else None
    start_s = end_s = 0.0
    for first in range(0, keys, BATCH):
        batch = names[first : first + BATCH]
        if profiler:
            profiler.enable()
        began = time.perf_counter()
        results = service.batch_put_start("writer", "", batch, [4096] * len(batch), config)
        middle = time.perf_counter()
        service.batch_put_end("writer", "", batch, [r.write_id for r in results])
        ended = time.perf_counter()
        if profiler:
            profiler.disable()
        start_s += middle - began
        end_s += ended - middle
        clock.advance(0.001)
    figures["batch_put_start"] = start_s / keys * 1e6
    figures["batch_put_end"] = end_s / keys * 1e6
    # The first service's records must be gone before the singles are timed, or collecting
    # them lands in the middle of the second measurement.
    del service, results
    gc.collect()
    service, clock = build_service(keys, 4096, 4)
    single = keys // 4
    start_s = end_s = 0.0
    for name in names[:single]:
        began = time.perf_counter()
        result = service.put_start("writer", "", name, 4096, config)
        middle = time.perf_counter()
        service.put_end("writer", "", name, result.write_id)
        end_s += time.perf_counter() - middle
        start_s += middle - began
    figures["put_start"] = start_s / single * 1e6
    figures["put_end"] = end_s / single * 1e6
    if profiler and profile:
        profiler.dump_stats(profile)
    return figures


def _run_side(argv: list[str], env: dict[str, str] | None) -> dict[str, float]:
    command = [sys.executable, "-m", "tests.bench.master_memory_bench", *argv]
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    figures: dict[str, float] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


def compare_write_cost(args: argparse.Namespace) -> None:
    """Rounds taking turns between the baseline revision and the working tree."""
    import os

    from tests.bench import baseline

    revision = baseline.resolve(args.baseline_rev)
    with tempfile.TemporaryDirectory(prefix="mmb-baseline-") as scratch:
        built = baseline.build(revision, Path(scratch))
        theirs_env = {**os.environ, **{k: v for k, v in built.env().items() if v is not None}}
        argv = ["--one-round", "--write-keys", str(args.write_keys)]
        ours: list[dict[str, float]] = []
        theirs: list[dict[str, float]] = []
        for round_number in range(args.rounds):
            theirs.append(_run_side(argv, theirs_env))
            ours.append(_run_side(argv, None))
            print(f"round {round_number + 1}: baseline {theirs[-1]}  ours {ours[-1]}", flush=True)
    print(f"\nper-key cost, median of {args.rounds} rounds (baseline {revision.short}):")
    for call in ours[0]:
        mine = statistics.median(r[call] for r in ours)
        base = statistics.median(r[call] for r in theirs)
        print(f"  {call:16s} {base:7.2f} us -> {mine:7.2f} us  ({base / mine:.2f}x faster)")


def report_write_cost(args: argparse.Namespace) -> None:
    rounds = [write_cost_round(args.write_keys) for _ in range(args.rounds)]
    print(f"per-key cost, median of {args.rounds} rounds over {args.write_keys} keys:")
    for call in rounds[0]:
        print(f"  {call:16s} {statistics.median(r[call] for r in rounds):7.2f} us")
    if args.profile:
        write_cost_round(args.write_keys, args.profile)
        print(f"\ncProfile of batch_put_start + batch_put_end ({args.profile}), top by tottime:")
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(15)


def report_memory(args: argparse.Namespace) -> None:
    figures = measure_rss(args.objects, args.value_bytes, args.segments, args.rates)
    print(f"RSS delta per object at {args.objects} objects: {figures['rss_per_object']:.0f} B")
    print(f"batched puts while writing them: {figures['batch_puts_per_s']:,.0f} keys/s")
    for name in ("single_puts_per_s", "batch_exists_per_s", "single_exists_per_s"):
        if name in figures:
            what = name.removesuffix("_per_s").replace("_", " ")
            print(f"{what} at {args.objects} objects: {figures[name]:,.0f} keys/s", flush=True)
    if args.tracemalloc_objects:
        heap = measure_heap(args.tracemalloc_objects, args.value_bytes, args.segments, args.top)
        n = args.tracemalloc_objects
        print(f"\ntracemalloc at {n} objects: {heap['heap_per_object']:.0f} B heap per object")
        print("top allocating lines (B per object):")
        for where, size in heap["top_lines"]:
            print(f"  {size:7.1f}  {where}")
        print("by structure (B per object, shallow sizes, each object once):")
        for name, size in heap["breakdown"]:
            print(f"  {size:7.1f}  {name}")
        total = sum(size for _, size in heap["breakdown"])
        print(f"  {total:7.1f}  total")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--ten-million", action="store_true", help="--objects 10000000 --rates")
    parser.add_argument(
        "--rates",
        action="store_true",
        help="also single put and existence check rates at that size",
    )
    parser.add_argument("--value-bytes", type=int, default=4096)
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument("--tracemalloc-objects", type=int, default=200_000)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--write-cost", action="store_true")
    parser.add_argument("--write-keys", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--baseline-rev", default=None)
    parser.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_round:
        print(json.dumps(write_cost_round(args.write_keys)))
        return
    if args.ten_million:
        args.objects = 10_000_000
        args.rates = True
    if not args.skip_memory:
        report_memory(args)
    if args.write_cost:
        if args.baseline_rev:
            compare_write_cost(args)
        else:
            report_write_cost(args)


if __name__ == "__main__":
    main()
