"""The store phases of a benchmark run: each side's processes on one path (shared memory or
forced TCP), the rounds they take turns on, and the metadata reps.

Every function takes the run (:class:`tests.bench.store_bench.Bench`) first: it starts and
stops the processes through it and records each answer in its rows, so that the run's
bookkeeping (row selection, budgets, verification) stays in one place.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mooncake_py.testing import MasterProcess
from tests.bench import upstream as up
from tests.bench.common import FORCE_TCP_ENV, MIB, Child, size_label
from tests.bench.plan import SegmentBudget
from tests.bench.rows import ROUND_TRIP_SIZES, SMALL_SIZES, small_calls

if TYPE_CHECKING:
    from tests.bench.store_bench import Bench, Side

TRANSPORT_ENV = "MOONCAKE_PY_MASTER_TRANSPORT"


@dataclasses.dataclass
class Team:
    """One side's processes in one phase: A owns the segment, B has none; ``readers`` are the
    metadata callers (B, and for mooncake-py a B that talks gRPC to the master)."""

    path: str
    a: Child
    b: Child
    readers: list[tuple[str, Child]]


def open_phase(bench: Bench, sides: Sequence[Side], path: str) -> None:
    """Start every side's A and B (and mooncake-py's gRPC reader on the shm path), join
    them all at once, then pre-fill each side's A."""
    plan = bench.plan
    tcp = path == "tcp"
    buffer = plan.buffer_bytes()
    for side in sides:
        env: dict[str, str | None] = {FORCE_TCP_ENV: "1"} if tcp else {}
        a = bench.worker(side, f"{path}-A", env)
        b = bench.worker(side, f"{path}-B", env)
        readers = [("", b)]
        if side.is_py and not tcp and bench.wants("meta", variant=".grpc"):
            grpc_reader = bench.worker(side, f"{path}-B-grpc", {TRANSPORT_ENV: "grpc"})
            readers.append((".grpc", grpc_reader))
        side.team = Team(path, a, b, readers)
    for side in sides:
        assert side.team is not None
        bench.note(f"{side.name} {path}: joining the store")
        team = side.team
        joining = [(team.a, plan.segment, buffer), (team.b, 0, buffer)]
        bench.setup(side, joining + [(reader, 0, 1 * MIB) for _, reader in team.readers[1:]])
    for side in sides:
        assert side.team is not None
        # mooncake-py's B maps A's segment on the shm path: it pre-fills through it too
        team = side.team
        fillers = (team.a, team.b) if side.is_py and path == "shm" else (team.a,)
        join(bench, side, path, team.a, fillers)


def close_phase(bench: Bench, sides: Sequence[Side]) -> None:
    for side in sides:
        team, side.team = side.team, None
        if team is None:
            continue
        if side.budget is not None:
            side.waited_s += side.budget.waited_s
        for _, reader in reversed(team.readers[1:]):
            reader.stop()
        team.b.stop()
        team.a.stop()


def join(bench: Bench, side: Side, path: str, a: Child, fillers: Sequence[Child]) -> None:
    """A's segment is written end to end by each of ``fillers`` (A, and on the shm path B
    through its own mapping), so that no timed call pays first-touch page faults. Nothing
    reads those keys, so removing them frees their memory at once. Failed writes are
    counted, not errors (upstream's allocator may not fit a completely full segment)."""
    plan = bench.plan
    side.budget = SegmentBudget(plan.segment, plan.budget)
    size = max(plan.sizes)
    batch = plan.batches[size]
    n = max(1, int(plan.segment * plan.prefill) // size)
    bench.note(f"{side.name} {path}: pre-filling A's segment ({n} x {size_label(size)})")
    record: dict[str, float] = {"bytes": n * size}
    for who, worker in zip("ab", fillers, strict=False):
        prefix = f"{bench.tag}/{side.short}/{path}/prefill-{who}"
        answer = worker.call(cmd="put", prefix=prefix, n=n, size=size, batch=batch, tolerant=True)
        record[f"{who}_put_s"] = sum(answer["times"])
        record[f"{who}_failed"] = answer.get("failed", 0)
        removed = worker.call(cmd="remove", prefix=prefix, n=n, tolerant=True)
        record[f"{who}_remove_failed"] = removed.get("failed", 0)
    side.prefill[path] = record


def local_round(bench: Bench, side: Side, rnd: int) -> None:
    """Single process: A writes and reads its own segment, copying and zero-copy calls
    (a put/get pair is skipped when neither of its rows is selected)."""
    plan = bench.plan
    assert side.team is not None
    a = side.team.a
    keep = rnd >= plan.warmup
    singles = (("copy", "put", "get"), ("zero", "put_from", "get_into"))
    batches = (("copy", "put_batch", "get_batch"), ("zero", "batch_put_from", "batch_get_into"))
    work = [
        (size, 1, plan.local_calls[size], size_label(size), singles) for size in plan.local_sizes
    ]
    work += [
        (size, count, count * calls, f"{count}x{size_label(size)}", batches)
        for count, size, calls in plan.local_batches
    ]
    for size, batch, n, label, pairs in work:
        for mode, put_op, get_op in pairs:
            put_row = bench.row(side, f"local.{put_op}.{label}")
            get_row = bench.row(side, f"local.{get_op}.{label}")
            if put_row is None and get_row is None:
                continue
            prefix = f"{bench.tag}/{side.short}/local/{label}/{mode}/r{rnd}"
            bench.put(side, a, prefix, n, size, batch, put_row if keep else None, mode)
            get_kept = get_row if keep else None
            bench.command(side, a, "get", prefix, n, size, batch, get_kept, mode)
            bench.remove(side, a, prefix, n, size)


def data_round(bench: Bench, side: Side, rnd: int, size: int) -> None:
    """A writes, B reads; B writes into A's segment. Keys are fresh every round. Reads of
    unselected rows are left out, but what is written is always read back once."""
    plan = bench.plan
    assert side.team is not None
    a, b, path = side.team.a, side.team.b, side.team.path
    label, batch, n = size_label(size), plan.batches[size], plan.values[size]
    a_put = bench.row(side, f"{path}.a.batch_put_from.{label}")
    get = bench.row(side, f"{path}.b.get_into.{label}")
    batch_get = bench.row(side, f"{path}.b.batch_get_into.{label}")
    b_put = bench.row(side, f"{path}.b.put_from.{label}")
    keep = rnd >= plan.warmup
    prefix = f"{bench.tag}/{side.short}/{path}/{label}/r{rnd}"
    if a_put or get or batch_get:
        bench.put(side, a, f"{prefix}/a", n, size, batch, a_put if keep else None)
        if get:
            bench.command(side, b, "get", f"{prefix}/a", n, size, 1, get if keep else None)
        if batch_get or not get:  # untimed when not selected: every write is read back
            row = batch_get if keep else None
            bench.command(side, b, "get", f"{prefix}/a", n, size, batch, row)
        bench.remove(side, b, f"{prefix}/a", n, size)
    if b_put:
        bench.put(side, b, f"{prefix}/b", n, size, 1, b_put if keep else None)
        bench.command(side, b, "get", f"{prefix}/b", n, size, batch)  # verification only
        bench.remove(side, b, f"{prefix}/b", n, size)


def round_trip_round(bench: Bench, side: Side, rnd: int) -> None:
    """Single process: A takes rounds of ``get`` a key, ``remove`` it (forced), ``put`` it
    again, one timed round per key (the worker's ``read_remove_write``); as many rounds as
    the single-value rows of the size make calls."""
    plan = bench.plan
    assert side.team is not None and side.budget is not None
    a = side.team.a
    for size in ROUND_TRIP_SIZES:
        label = size_label(size)
        row = bench.row(side, f"local.read_remove_write.{label}")
        if row is None:
            continue
        n = plan.local_calls.get(size, min(plan.local_calls.values()))
        prefix = f"{bench.tag}/{side.short}/local/rrw-{label}/r{rnd}"
        side.budget.reserve(n * size)
        answer = side.check.absorb(a.call(cmd="read_remove_write", prefix=prefix, n=n, size=size))
        if rnd >= plan.warmup:
            row.add(answer)
        bench.remove(side, a, prefix, n, size)


def small_round(bench: Bench, side: Side, rnd: int) -> None:
    """Opt-in rows: A writes small values (untimed), B reads each one with ``get`` and
    with ``get_into``."""
    plan = bench.plan
    assert side.team is not None
    a, b, path = side.team.a, side.team.b, side.team.path
    keep = rnd >= plan.warmup
    n = small_calls(plan)
    for size in SMALL_SIZES:
        label = size_label(size)
        reads = [
            (mode, bench.row(side, f"{path}.b.{op}.{label}"))
            for mode, op in (("copy", "get"), ("zero", "get_into"))
        ]
        if not any(row for _, row in reads):
            continue
        prefix = f"{bench.tag}/{side.short}/{path}/small-{label}/r{rnd}"
        bench.put(side, a, prefix, n, size, min(n, 64))
        for mode, row in reads:
            if row is not None:
                bench.command(side, b, "get", prefix, n, size, 1, row if keep else None, mode)
        bench.remove(side, b, prefix, n, size)


def metadata_keys(bench: Bench, side: Side) -> tuple[str, str, int]:
    """The present-key prefix, the absent-key prefix and the key count of ``side``."""
    keys = max(bench.plan.batch_exist_sizes)
    return f"{bench.tag}/{side.short}/meta", f"{bench.tag}/{side.short}/absent", keys


def batch_probe(
    bench: Bench, side: Side, reader: Child, probe: str, size: int, where: str
) -> dict[str, Any]:
    """One rep of ``batch_is_exist`` calls of ``size`` keys from ``reader``, its answer.

    Args:
        probe: "" (warm: the metadata keys A wrote and read back, probed again every call),
            "cold." (A writes fresh keys, one set per call, untimed, right before; each set
            is probed once and removed after) or "miss." (fresh absent keys, one set per
            call).
        where: what makes the rep's cold and missing keys its own (variant and rep).
    """
    assert side.team is not None
    calls = bench.plan.batch_exist_calls[size]
    if not probe:
        prefix = metadata_keys(bench, side)[0]
        return side.check.absorb(reader.call(cmd="batch_exist", prefix=prefix, n=size, calls=calls))
    keys = f"{bench.tag}/{side.short}/{probe.rstrip('.')}{size}{where}"
    command: dict[str, Any] = {
        "cmd": "batch_exist",
        "prefix": keys,
        "n": size,
        "calls": calls,
        "distinct": True,
    }
    if probe == "miss.":
        return side.check.absorb(reader.call(**command, expect=0))
    a, value = side.team.a, bench.plan.meta_value
    bench.put(side, a, keys, size * calls, value, min(size, 256))
    try:
        return side.check.absorb(reader.call(**command, expect=1))
    finally:
        bench.remove(side, a, keys, size * calls, value)


def metadata_rep(bench: Bench, side: Side, rep: int) -> None:
    """From each reader (variant "" = default master transport, ".grpc" = gRPC): is_exist of
    a present and an absent key, batch_is_exist of each size (warm, cold and all-absent
    keys, :func:`batch_probe`), and remove of fresh keys
    (each only when its row is selected). Rep 0 warms up."""
    plan = bench.plan
    assert side.team is not None
    prefix, absent, keys = metadata_keys(bench, side)
    for variant, reader in side.team.readers:
        for state, key_prefix, expect in (("present", prefix, 1), ("absent", absent, 0)):
            row = bench.row(side, f"meta.is_exist.{state}{variant}")
            if row is None:
                continue
            command: dict[str, Any] = {"prefix": key_prefix, "n": keys, "expect": expect}
            answer = side.check.absorb(reader.call(cmd="exist", calls=plan.exist_calls, **command))
            if rep:
                row.add(answer)
        for size in plan.batch_exist_sizes:
            for probe in ("", "cold.", "miss."):
                row = bench.row(side, f"meta.batch_is_exist.{probe}{size}{variant}")
                if row is None:
                    continue
                answer = batch_probe(bench, side, reader, probe, size, f"{variant}/r{rep}")
                if rep:
                    row.add(answer, keys_per_call=size)
        row = bench.row(side, f"meta.remove{variant}")
        if row is None:
            continue
        removed = f"{bench.tag}/{side.short}/rm{variant}/r{rep}"
        answer = side.check.absorb(
            reader.call(
                cmd="remove_each", prefix=removed, n=plan.remove_calls, size=plan.meta_value
            )
        )
        if rep:
            row.add(answer)


def store_phase(bench: Bench, sides: Sequence[Side], path: str) -> None:
    """Every side's A and B on one path, taking turns round by round so that each ratio
    compares rounds run moments apart (the machine's load drifts). Workloads without a
    selected row are skipped."""
    plan = bench.plan
    open_phase(bench, sides, path)
    total = plan.warmup + plan.rounds
    rounds: list[tuple[str, Any]] = []
    if path == "shm" and bench.wants("local"):
        rounds.append(("single process", functools.partial(local_round, bench)))
    if path == "shm" and bench.wants("local", op="read_remove_write"):
        rounds.append(("get, remove, put", functools.partial(round_trip_round, bench)))
    if bench.wants(path, opt_in=True):
        rounds.append(("small values", functools.partial(small_round, bench)))
    for size in plan.sizes:
        if bench.wants(path, size=size, opt_in=None):
            rounds.append((size_label(size), functools.partial(data_round, bench, size=size)))
    for title, measure in rounds:
        for rnd in range(total):
            bench.note(f"{path} {title} round {rnd + 1}/{total}")
            for side in bench.turns(sides, rnd):
                measure(side, rnd)
    if path == "shm" and bench.wants("meta"):
        for side in sides:
            assert side.team is not None
            prefix, _, keys = metadata_keys(bench, side)
            batch = min(keys, 256)
            bench.put(side, side.team.a, prefix, keys, plan.meta_value, batch)
            # read back once (untimed), so that a metadata-only run verifies values too
            bench.command(side, side.team.a, "get", prefix, keys, plan.meta_value, batch)
        for rep in range(plan.call_reps + 1):
            bench.note(f"{path} metadata rep {rep + 1}/{plan.call_reps + 1}")
            for side in bench.turns(sides, rep):
                metadata_rep(bench, side, rep)
        for side in sides:
            assert side.team is not None
            prefix, _, keys = metadata_keys(bench, side)
            bench.remove(side, side.team.a, prefix, keys, plan.meta_value)
    close_phase(bench, sides)


def pressure_rep(bench: Bench, side: Side, rep: int) -> None:
    """A fresh master (default eviction) and one client with a small segment: put far more
    than it holds, then read everything back."""
    plan = bench.plan
    name = f"{side.short}-pressure-{rep}"
    bench.note(f"{side.name} memory pressure rep {rep + 1}/{plan.pressure_reps}")
    master: MasterProcess | up.UpstreamMaster
    if side.is_py:
        master = bench.py_master(f"{name}-master", eviction=True, side=side)
        address, metadata = master.address, side.metadata
    else:
        master = bench.upstream_master_for(f"{name}-master", eviction=True)
        address, metadata = master.address, master.metadata
    worker = bench.worker(side, "pressure")
    started = time.perf_counter()
    saved = side.address, side.metadata
    side.address, side.metadata = address, metadata
    try:
        bench.setup(side, [(worker, plan.pressure_segment, plan.pressure_value)])
    finally:
        side.address, side.metadata = saved
    n = plan.pressure_bytes // plan.pressure_value
    answer = side.check.absorb(
        worker.call(
            cmd="pressure",
            prefix=f"{bench.tag}/{side.short}/pressure/r{rep}",
            n=n,
            size=plan.pressure_value,
            timeout_s=900,
        )
    )
    wall = time.perf_counter() - started
    worker.stop()
    master.stop()
    times = answer.pop("times")
    answer["wall_s"] = answer["put_s"] + answer["verify_s"]
    answer["with_setup_s"] = wall
    answer["put_p50_us"] = sorted(times)[len(times) // 2] * 1e6 if times else None
    answer["put_max_us"] = max(times) * 1e6 if times else None
    side.pressure.append(answer)
