"""KV session benchmark: pin/unpin latency, attach throughput, memory per membership, eviction.

Run from the repository root::

    .venv/bin/python -m tests.bench.session_bench [--quick] [--json PATH]

One run measures four figures:

1. **Pin/unpin latency** through the real client API (``pin_kv_session`` /
   ``unpin_kv_session`` of a :class:`MooncakeDistributedStore` in this process) against a
   master child process (:class:`MasterProcess`) over loopback. A 1-member session is compared
   with a big one (100,000 members, written with tagged ``put_batch`` calls of tiny values,
   1,000 keys per call). The two sessions are interleaved call by call (the order flips every
   iteration) so that drift and bursts of load on the machine hit both alike; the report gives
   p50/p99 of each and the big/small ratios (the target: within 1.2x), pooled and as
   the median of per-round ratios. The same comparison is also made in process, on the memory
   build of (3), without sockets: the master's own share of a call.
2. **Attach throughput**: the big session's keys attached to fresh sessions with
   ``attach_kv_session`` in batches of 1,024 through the same client (median keys/s over the
   repetitions, and per-call p50/p99).
3. **Master memory per membership**: an in-process :class:`MasterService` (no sockets) holding
   N objects, each then attached to 10 sessions of N members (10 N memberships). Measured twice
   on fresh, identical builds: the Python heap growth under :mod:`tracemalloc` (exact; also
   split into the first membership of an object, which allocates its session set, and the later
   ones) and the resident-set growth without tracemalloc. Both are divided by the membership
   count and set against the memory of one object without sessions.
4. **Eviction pass time**: an in-process :class:`MasterService` on a FakeClock, with 16 fake
   segments sized so the objects (4 KiB each) fill them to about 93% (past the 0.90 watermark).
   A watermark pass is run the way the background loop runs it (``start_eviction`` then
   ``continue_eviction`` slices until done): total pass time and the longest slice (how long
   other RPCs wait for the lock), in wall time, and the slices' CPU time as well (which other
   processes on a busy machine do not inflate). Three stores: no sessions; every object in one
   of S sessions (consecutive keys share a session) with none pinned; the same with every other
   session pinned. Each case runs several passes (refilling past the watermark between them,
   and re-pinning the same sessions) and reports medians, plus the ratio to the no-session
   case.

``--quick`` shrinks the eviction stores to 100,000 objects / 10,000 sessions, the memory build
to 10,000 objects, and the repetition counts (under a minute); the full run uses 1,000,000
objects / 100,000 sessions. The table (stdout) gives medians and ratios measured on this machine
only; the JSON record (default ``bench-results/session-bench-<timestamp>.json``) holds every
figure, the parameters, the machine and the package versions. The master child process is
stopped by its pid at the end, also on error.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import math
import os
import resource
import signal
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mooncake_py import MooncakeDistributedStore, ReplicateConfig
from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.testing import MasterProcess
from mooncake_py.types import SegmentInfo
from tests.bench.common import ROOT, latency_summary
from tests.bench.report import machine, packages

MIB = 1 << 20
ALIGN = 64  # the allocator's alignment: every allocation is rounded up to it
ATTACH_BATCH = 1024
PUT_BATCH = 1000
INSERT_BATCH = 10_000
EVICT_VALUE_BYTES = 4096
EVICT_SEGMENTS = 16
FILL = 0.93  # how full the objects leave the eviction store: just over the 0.90 watermark
PIN_RATIO_TARGET = 1.2  # the bound on big/small pin latency
SLICE_BUDGET_MS = 20.0  # longest lock hold of one eviction slice we flag
TENANT = ""  # the default tenant
RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)


@dataclasses.dataclass(frozen=True)
class Params:
    """Sizes and repetition counts of one run."""

    mode: str
    big_members: int  # members of the big session (pin/unpin)
    pin_rounds: int  # alternating rounds; each round times pin_calls pins and unpins per session
    pin_calls: int
    pin_warmup: int
    attach_reps: int  # fresh sessions the big session's keys are attached to
    mem_objects: int  # objects of the memory build; each joins mem_sessions sessions
    mem_sessions: int
    evict_objects: int
    evict_sessions: int
    evict_passes: int


FULL = Params(
    mode="full",
    big_members=100_000,
    pin_rounds=20,
    pin_calls=100,
    pin_warmup=200,
    attach_reps=3,
    mem_objects=100_000,
    mem_sessions=10,
    evict_objects=1_000_000,
    evict_sessions=100_000,
    evict_passes=3,
)
QUICK = Params(
    mode="quick",
    big_members=100_000,
    pin_rounds=10,
    pin_calls=50,
    pin_warmup=100,
    attach_reps=1,
    mem_objects=10_000,
    mem_sessions=10,
    evict_objects=100_000,
    evict_sessions=10_000,
    evict_passes=3,
)


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
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


class GcWatch:
    """Counts and times the interpreter's cyclic collections while enabled (they stall RPCs)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._began))

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self)

    def summary(self) -> dict[str, Any]:
        full = [s for generation, s in self.pauses if generation == 2]
        return {
            "collections": len(self.pauses),
            "full_collections": len(full),
            "longest_ms": max((s for _, s in self.pauses), default=0.0) * 1e3,
        }


# ------------------------------------------------------------------------------------------------
# 1 and 2: the client API against a master child process


def _client(address: str, segment_bytes: int) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    config = {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": segment_bytes,
        "master_server_address": address,
    }
    code = store.setup(config)
    if code != 0:
        raise RuntimeError(f"client setup failed: {ErrorCode.name_of(code)}")
    return store


def measure_pins(
    set_pin: Callable[[str, bool], object],
    small: str,
    big: str,
    rounds: int,
    calls: int,
    warmup: int,
) -> dict[str, Any]:
    """Pin then unpin each session in turn, ``rounds`` x ``calls`` times, timing every call.

    The two sessions are interleaved call by call (the order flips every iteration), so drift
    and bursts of load on the machine hit both alike.
    """
    clock = time.perf_counter
    samples: dict[str, dict[str, list[float]]] = {s: {"pin": [], "unpin": []} for s in (small, big)}
    round_ratios: dict[str, list[float]] = {"pin": [], "unpin": []}
    for _ in range(warmup):
        for session in (small, big):
            set_pin(session, True)
            set_pin(session, False)
    for _ in range(rounds):
        first = {s: len(samples[s]["pin"]) for s in (small, big)}
        for i in range(calls):
            for session in (small, big) if i % 2 == 0 else (big, small):
                began = clock()
                set_pin(session, True)
                middle = clock()
                set_pin(session, False)
                ended = clock()
                samples[session]["pin"].append(middle - began)
                samples[session]["unpin"].append(ended - middle)
        for op in ("pin", "unpin"):
            medians = {s: statistics.median(samples[s][op][first[s] :]) for s in (small, big)}
            round_ratios[op].append(ratio(medians[big], medians[small]))
    figures: dict[str, Any] = {"rounds": rounds, "calls_per_round": calls}
    for op in ("pin", "unpin"):
        small_fig = latency_summary(samples[small][op])
        big_fig = latency_summary(samples[big][op])
        figures[op] = {
            "small": small_fig,
            "big": big_fig,
            "ratio_p50": ratio(big_fig["p50_us"], small_fig["p50_us"]),
            "ratio_p99": ratio(big_fig["p99_us"], small_fig["p99_us"]),
            "ratio_median_of_rounds": statistics.median(round_ratios[op]),
        }
    return figures


def bench_client(params: Params) -> dict[str, Any]:
    """Pin/unpin latency (1 vs many members) and attach throughput, over loopback."""
    n = params.big_members
    # Each tiny value takes one 64-byte block; room for all of them with a wide margin.
    segment_bytes = max(64 * MIB, 4 * n * ALIGN)
    master = MasterProcess(args=["--log_level", "WARNING"])
    master.start()
    result: dict[str, Any] = {"master_pid": master.pid}
    store: MooncakeDistributedStore | None = None
    try:
        store = _client(master.address, segment_bytes)
        core = store.client._core if store.client is not None else None
        result["stream_channel"] = bool(core is not None and core.master.stream_connected)

        # -- build: a 1-member session and an n-member one, with tagged writes ------------------
        small, big = "bench-small", "bench-big"
        code = store.put("small-000000", b"s", ReplicateConfig(kv_sessions=[[small]]))
        if code != 0:
            raise RuntimeError(f"tagged put failed: {ErrorCode.name_of(code)}")
        keys = [f"big-{i:06d}" for i in range(n)]
        _log(f"client: writing {n:,} tagged objects in batches of {PUT_BATCH:,} ...")
        put_times: list[float] = []
        for first in range(0, n, PUT_BATCH):
            batch = keys[first : first + PUT_BATCH]
            config = ReplicateConfig(kv_sessions=[[big]] * len(batch))
            began = time.perf_counter()
            code = store.put_batch(batch, [b"x"] * len(batch), config)
            put_times.append(time.perf_counter() - began)
            if code != 0:
                raise RuntimeError(f"tagged put_batch failed: {ErrorCode.name_of(code)}")
        members = {s: store.get_kv_session(s).member_count for s in (small, big)}
        if members != {small: 1, big: n}:
            raise RuntimeError(f"unexpected session sizes {members}")
        result["tagged_put"] = {
            "keys": n,
            "batch": PUT_BATCH,
            "keys_per_s": n / sum(put_times),
            "batch_ms": latency_summary(put_times),
        }

        # -- pin / unpin latency, the two sessions interleaved -----------------------------------
        _log("client: pin/unpin latency ...")
        pin, unpin = store.pin_kv_session, store.unpin_kv_session

        def set_pin(session: str, pinned: bool) -> object:
            return pin(session) if pinned else unpin(session)

        latency = measure_pins(
            set_pin, small, big, params.pin_rounds, params.pin_calls, params.pin_warmup
        )
        if any(store.get_kv_session(s).pinned for s in (small, big)):
            raise RuntimeError("a session stayed pinned after the measurement")
        result["pin_latency"] = {"small_members": 1, "big_members": n, **latency}

        # -- attach throughput ---------------------------------------------------------------------
        _log(f"client: attaching {n:,} keys in batches of {ATTACH_BATCH} ...")
        reps: list[dict[str, Any]] = []
        for rep in range(params.attach_reps):
            session = f"bench-attach-{rep}"
            calls: list[float] = []
            for first in range(0, n, ATTACH_BATCH):
                batch = keys[first : first + ATTACH_BATCH]
                began = time.perf_counter()
                codes = store.attach_kv_session(session, batch)
                calls.append(time.perf_counter() - began)
                if any(codes):
                    raise RuntimeError(f"attach failed: {sorted(set(codes))}")
            if store.get_kv_session(session).member_count != n:
                raise RuntimeError(f"session {session} did not get {n} members")
            reps.append({"keys_per_s": n / sum(calls), "call": latency_summary(calls)})
        result["attach"] = {
            "keys": n,
            "batch": ATTACH_BATCH,
            "reps": reps,
            "keys_per_s_median": statistics.median(r["keys_per_s"] for r in reps),
            "call_p50_us_median": statistics.median(r["call"]["p50_us"] for r in reps),
            "call_p99_us_median": statistics.median(r["call"]["p99_us"] for r in reps),
        }
    finally:
        try:
            if store is not None:
                store.close()
        finally:
            result["master_exit"] = master.stop()
    return result


# ------------------------------------------------------------------------------------------------
# In-process stores (3 and 4)


class Store:
    """A master service on a FakeClock with equal fake segments sized for ``capacity`` bytes."""

    def __init__(self, capacity: int, segments: int) -> None:
        self.clock = FakeClock()
        self.service = MasterService(MasterConfig(), clock=self.clock)
        segment_bytes = -(-math.ceil(capacity / segments) // ALIGN) * ALIGN
        for i in range(segments):
            info = SegmentInfo(
                id=f"seg-{i}",
                name=f"node-{i}",
                base=0x10000,
                size=segment_bytes,
                te_endpoint=f"127.0.0.1:{20000 + i}",
            )
            assert self.service.mount_segment(f"owner-{i}", info) == ErrorCode.OK
        self.next_key = 0

    def insert(
        self, count: int, size: int, tags: Callable[[int], list[str]] | None = None
    ) -> float:
        """Write ``count`` fresh objects in batches; ``tags(index)`` gives each one's sessions.

        Returns the seconds spent in batch_put_start and batch_put_end.
        """
        spent = 0.0
        while count > 0:
            batch = min(INSERT_BATCH, count)
            first = self.next_key
            indices = range(first, first + batch)
            keys = [f"key-{i:09d}" for i in indices]
            config = ReplicateConfig()
            if tags is not None:
                config.kv_sessions = [tags(i) for i in indices]
            began = time.perf_counter()
            results = self.service.batch_put_start("writer", TENANT, keys, [size] * batch, config)
            bad = [r.code for r in results if r.code != ErrorCode.OK]
            if bad:
                raise RuntimeError(f"put_start failed: {ErrorCode.name_of(bad[0])} x{len(bad)}")
            codes = self.service.batch_put_end("writer", TENANT, keys)
            spent += time.perf_counter() - began
            assert all(code == ErrorCode.OK for code in codes)
            self.next_key += batch
            count -= batch
            self.clock.advance(0.001)
        return spent

    def used(self) -> float:
        stats = self.service.stats()
        return stats["allocated_bytes"] / stats["capacity_bytes"]


# ------------------------------------------------------------------------------------------------
# 3: master memory per membership


def _attach_all(service: MasterService, keys: Sequence[str], session: str) -> float:
    began = time.perf_counter()
    for first in range(0, len(keys), ATTACH_BATCH):
        codes = service.sessions.attach_kv_session(
            TENANT, session, keys[first : first + ATTACH_BATCH]
        )
        if any(codes):
            raise RuntimeError(f"in-process attach failed: {sorted(set(codes))}")
    return time.perf_counter() - began


def _memory_store(params: Params) -> tuple[Store, list[str]]:
    n = params.mem_objects
    store = Store(capacity=2 * n * ALIGN, segments=1)
    store.insert(n, 1)
    return store, [f"key-{i:09d}" for i in range(n)]


def bench_memory(params: Params) -> dict[str, Any]:
    """Bytes per membership: RSS growth of one build, tracemalloc growth of a second one."""
    n, sessions = params.mem_objects, params.mem_sessions
    memberships = n * sessions
    _log(f"memory: {n:,} objects x {sessions} sessions (RSS) ...")
    gc.collect()
    rss_empty = rss_bytes()
    store, keys = _memory_store(params)
    gc.collect()
    rss_objects = rss_bytes()
    attach_s = sum(_attach_all(store.service, keys, f"mem-{s}") for s in range(sessions))
    gc.collect()
    rss_sessions = rss_bytes()
    assert store.service.sessions.get_kv_session(TENANT, "mem-0")[1].member_count == n  # type: ignore[union-attr]
    # The same comparison as over loopback, without sockets: the master's own cost.
    assert store.service.sessions.attach_kv_session(TENANT, "mem-small", keys[:1]) == [0]
    set_pin = functools.partial(store.service.sessions.set_kv_session_pin, TENANT)
    in_process = measure_pins(set_pin, "mem-small", "mem-0", 20, 500, 1000)
    del store, set_pin
    gc.collect()

    _log(f"memory: {n:,} objects x {sessions} sessions (tracemalloc) ...")
    tracemalloc.start()
    traced_empty = tracemalloc.get_traced_memory()[0]
    store, keys = _memory_store(params)
    gc.collect()
    traced_objects = tracemalloc.get_traced_memory()[0]
    _attach_all(store.service, keys, "mem-0")
    gc.collect()
    traced_first = tracemalloc.get_traced_memory()[0]
    for s in range(1, sessions):
        _attach_all(store.service, keys, f"mem-{s}")
    gc.collect()
    traced_all = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del store
    gc.collect()

    heap_per_object = (traced_objects - traced_empty) / n
    heap_per_membership = (traced_all - traced_objects) / memberships
    rss_per_object = (rss_objects - rss_empty) / n
    rss_per_membership = (rss_sessions - rss_objects) / memberships
    return {
        "objects": n,
        "sessions": sessions,
        "memberships": memberships,
        "in_process_attach_keys_per_s": memberships / attach_s,
        "heap_bytes_per_membership": heap_per_membership,
        "heap_bytes_first_membership": (traced_first - traced_objects) / n,
        "heap_bytes_later_membership": (traced_all - traced_first) / (memberships - n)
        if sessions > 1
        else None,
        "heap_bytes_per_object": heap_per_object,
        "heap_membership_to_object": ratio(heap_per_membership, heap_per_object),
        "rss_bytes_per_membership": rss_per_membership,
        "rss_bytes_per_object": rss_per_object,
        "rss_membership_to_object": ratio(rss_per_membership, rss_per_object),
        "in_process_pin": {"small_members": 1, "big_members": n, **in_process},
    }


# ------------------------------------------------------------------------------------------------
# 4: eviction pass time


@dataclasses.dataclass(frozen=True)
class EvictionCase:
    name: str
    sessions: int  # 0: untagged objects
    pinned_every: int  # pin sessions whose index is a multiple of this (0: none)


def _run_pass(store: Store) -> dict[str, Any]:
    """One watermark pass as the background loop runs it, timed slice by slice."""
    service = store.service
    candidates = service.stats()["eviction_candidates"]
    gc.collect()
    with GcWatch() as watch:
        began = time.perf_counter()
        work = service.start_eviction()
        plan_s = time.perf_counter() - began
        if work is None:
            raise RuntimeError(f"no pass started at {store.used():.4f} used")
        slices: list[float] = []
        cpu: list[float] = []
        worst_cpu = (0.0, 0.0, 0)  # CPU s, of which system s, minor page faults
        done = False
        while not done:
            usage = resource.getrusage(RUSAGE_THREAD)
            began, began_cpu = time.perf_counter(), time.thread_time()
            done = service.continue_eviction(work, store.clock())
            slices.append(time.perf_counter() - began)
            cpu.append(time.thread_time() - began_cpu)
            if cpu[-1] > worst_cpu[0]:
                after = resource.getrusage(RUSAGE_THREAD)
                system = after.ru_stime - usage.ru_stime
                worst_cpu = (cpu[-1], system, after.ru_minflt - usage.ru_minflt)
            if len(slices) > 1_000_000:
                raise RuntimeError(f"eviction pass does not finish: {work}")
    slice_ms = [s * 1e3 for s in slices]
    return {
        "candidates": candidates,
        "target": work.target,
        "evicted": work.evicted,
        "fallback": work.fallback,
        "start_ms": plan_s * 1e3,
        "slices": len(slices),
        "total_ms": plan_s * 1e3 + sum(slice_ms),
        "max_slice_ms": max(slice_ms),
        "p99_slice_ms": percentile(slice_ms, 0.99),
        "p50_slice_ms": percentile(slice_ms, 0.5),
        # CPU time of this thread: what the slice cost without time lost to other processes.
        "max_slice_cpu_ms": max(cpu) * 1e3,
        "p99_slice_cpu_ms": percentile(cpu, 0.99) * 1e3,
        "total_cpu_ms": sum(cpu) * 1e3,
        # The slice that used most CPU: how much of it was in the kernel, and its page faults.
        "max_cpu_slice_system_ms": worst_cpu[1] * 1e3,
        "max_cpu_slice_minor_faults": worst_cpu[2],
        "gc": watch.summary(),
        "used_after": store.used(),
    }


def bench_eviction_case(params: Params, case: EvictionCase) -> dict[str, Any]:
    n = params.evict_objects
    per_object = -(-EVICT_VALUE_BYTES // ALIGN) * ALIGN
    store = Store(capacity=math.ceil(n * per_object / FILL), segments=EVICT_SEGMENTS)
    tags: Callable[[int], list[str]] | None = None
    if case.sessions:
        per_session = max(1, n // case.sessions)
        count = case.sessions

        def tags(index: int) -> list[str]:
            return [f"sess-{(index // per_session) % count}"]

    def repin(service: MasterService) -> int:
        if not case.pinned_every:
            return 0
        pinned = 0
        for s in range(0, case.sessions, case.pinned_every):
            code = service.sessions.set_kv_session_pin(TENANT, f"sess-{s}", True)
            pinned += code == ErrorCode.OK
        return pinned

    _log(f"eviction [{case.name}]: inserting {n:,} objects ...")
    insert_s = store.insert(n, EVICT_VALUE_BYTES, tags)
    stats = store.service.stats()
    sessions_live = len(store.service._state.sessions)
    pinned = repin(store.service)
    passes: list[dict[str, Any]] = []
    for index in range(params.evict_passes):
        if index:
            store.insert(passes[-1]["evicted"], EVICT_VALUE_BYTES, tags)
            pinned = repin(store.service)
        figures = _run_pass(store)
        figures["pinned_sessions"] = pinned
        passes.append(figures)
        _log(
            f"eviction [{case.name}] pass {index + 1}: {figures['total_ms']:.0f} ms,"
            f" max slice {figures['max_slice_ms']:.2f} ms, evicted {figures['evicted']:,}"
        )
    result = {
        "case": case.name,
        "objects": stats["objects"],
        "sessions": sessions_live,
        "pinned_sessions": pinned,
        "used_before": stats["allocated_bytes"] / stats["capacity_bytes"],
        "insert_objects_per_s": n / insert_s,
        "passes": passes,
        "total_ms_median": statistics.median(p["total_ms"] for p in passes),
        "max_slice_ms_median": statistics.median(p["max_slice_ms"] for p in passes),
        "max_slice_ms_max": max(p["max_slice_ms"] for p in passes),
        "max_slice_cpu_ms_max": max(p["max_slice_cpu_ms"] for p in passes),
        "max_slice_cpu_ms_median": statistics.median(p["max_slice_cpu_ms"] for p in passes),
        "total_cpu_ms_median": statistics.median(p["total_cpu_ms"] for p in passes),
        "p99_slice_ms_median": statistics.median(p["p99_slice_ms"] for p in passes),
        "slices_median": statistics.median(p["slices"] for p in passes),
        "evicted_median": statistics.median(p["evicted"] for p in passes),
    }
    del store
    gc.collect()
    return result


def bench_eviction(params: Params) -> dict[str, Any]:
    cases = (
        EvictionCase("no sessions", 0, 0),
        EvictionCase("sessions, none pinned", params.evict_sessions, 0),
        EvictionCase("sessions, half pinned", params.evict_sessions, 2),
    )
    results = [bench_eviction_case(params, case) for case in cases]
    base = results[0]
    for result in results:
        result["total_ratio_to_no_sessions"] = ratio(
            result["total_ms_median"], base["total_ms_median"]
        )
        result["max_slice_ratio_to_no_sessions"] = ratio(
            result["max_slice_ms_median"], base["max_slice_ms_median"]
        )
        result["total_cpu_ratio_to_no_sessions"] = ratio(
            result["total_cpu_ms_median"], base["total_cpu_ms_median"]
        )
        result["max_slice_cpu_ratio_to_no_sessions"] = ratio(
            result["max_slice_cpu_ms_median"], base["max_slice_cpu_ms_median"]
        )
    return {
        "objects": params.evict_objects,
        "sessions": params.evict_sessions,
        "value_bytes": EVICT_VALUE_BYTES,
        "segments": EVICT_SEGMENTS,
        "passes_per_case": params.evict_passes,
        "cases": results,
    }


# ------------------------------------------------------------------------------------------------
# Report


def anomalies(results: dict[str, Any]) -> list[str]:
    notes: list[str] = []
    pins = results["client"]["pin_latency"]
    for op in ("pin", "unpin"):
        if pins[op]["ratio_p50"] > PIN_RATIO_TARGET:
            notes.append(
                f"{op} p50 big/small ratio {pins[op]['ratio_p50']:.2f}x > {PIN_RATIO_TARGET}x"
            )
        if pins[op]["ratio_p99"] > PIN_RATIO_TARGET:
            notes.append(
                f"{op} p99 big/small ratio {pins[op]['ratio_p99']:.2f}x > {PIN_RATIO_TARGET}x"
                " (tail; compare the median of per-round ratios)"
            )
    for case in results["eviction"]["cases"]:
        if case["max_slice_cpu_ms_max"] > SLICE_BUDGET_MS:
            worst = max(case["passes"], key=lambda p: p["max_slice_cpu_ms"])
            notes.append(
                f"eviction [{case['case']}]: a slice used {case['max_slice_cpu_ms_max']:.1f} ms"
                f" of CPU > {SLICE_BUDGET_MS:.0f} ms ({worst['max_cpu_slice_system_ms']:.1f} ms"
                f" in the kernel, {worst['max_cpu_slice_minor_faults']} minor page faults,"
                f" {worst['gc']['collections']} GC collections in that pass)"
            )
        elif case["max_slice_ms_max"] > SLICE_BUDGET_MS:
            notes.append(
                f"eviction [{case['case']}]: a slice took {case['max_slice_ms_max']:.1f} ms"
                f" > {SLICE_BUDGET_MS:.0f} ms of wall time, but no slice used more than"
                f" {case['max_slice_cpu_ms_max']:.1f} ms of CPU (preempted)"
            )
        slices = [p["slices"] for p in case["passes"]]
        if slices[-1] > 1.2 * slices[0]:
            notes.append(
                f"eviction [{case['case']}]: each pass walks more candidates than the one"
                f" before (slices {' -> '.join(map(str, slices))})"
            )
        for number, figures in enumerate(case["passes"], 1):
            if figures["gc"]["full_collections"]:
                notes.append(
                    f"eviction [{case['case']}] pass {number}: full GC during the pass"
                    f" (longest collection {figures['gc']['longest_ms']:.0f} ms)"
                )
    return notes


def table(results: dict[str, Any]) -> str:
    rows: list[tuple[str, str]] = []
    client = results["client"]
    pins = client["pin_latency"]
    big = pins["big_members"]
    for op in ("pin", "unpin"):
        small_fig, big_fig = pins[op]["small"], pins[op]["big"]
        rows.append(
            (
                f"{op}_kv_session p50 / p99, 1 member",
                f"{small_fig['p50_us']:.0f} / {small_fig['p99_us']:.0f} us"
                f" ({small_fig['calls']} calls)",
            )
        )
        rows.append(
            (
                f"{op}_kv_session p50 / p99, {big:,} members",
                f"{big_fig['p50_us']:.0f} / {big_fig['p99_us']:.0f} us ({big_fig['calls']} calls)",
            )
        )
        rows.append(
            (
                f"{op}: ratio big/small",
                f"p50 {pins[op]['ratio_p50']:.2f}x, p99 {pins[op]['ratio_p99']:.2f}x,"
                f" median of per-round p50 ratios {pins[op]['ratio_median_of_rounds']:.2f}x"
                f" (target <= {PIN_RATIO_TARGET}x)",
            )
        )
    local = results["memory"]["in_process_pin"]
    rows.append(
        (
            f"in-process pin / unpin p50, 1 vs {local['big_members']:,} members",
            f"pin {local['pin']['small']['p50_us']:.2f} / {local['pin']['big']['p50_us']:.2f} us"
            f" ({local['pin']['ratio_p50']:.2f}x); unpin {local['unpin']['small']['p50_us']:.2f}"
            f" / {local['unpin']['big']['p50_us']:.2f} us ({local['unpin']['ratio_p50']:.2f}x)",
        )
    )
    attach = client["attach"]
    rows.append(
        (
            f"attach_kv_session, batches of {attach['batch']}",
            f"{attach['keys_per_s_median']:,.0f} keys/s (median of {len(attach['reps'])});"
            f" call p50 {attach['call_p50_us_median'] / 1e3:.2f} ms,"
            f" p99 {attach['call_p99_us_median'] / 1e3:.2f} ms",
        )
    )
    tagged = client["tagged_put"]
    rows.append(
        (
            f"tagged put_batch of {tagged['batch']:,} (context)",
            f"{tagged['keys_per_s']:,.0f} keys/s;"
            f" call p50 {tagged['batch_ms']['p50_us'] / 1e3:.1f} ms",
        )
    )
    memory = results["memory"]
    layout = f"{memory['objects']:,} obj x {memory['sessions']} sessions"
    rows.append(
        (
            f"memory per membership, heap ({layout})",
            f"{memory['heap_bytes_per_membership']:.0f} B"
            f" (first per object {memory['heap_bytes_first_membership']:.0f} B,"
            f" later {memory['heap_bytes_later_membership']:.0f} B);"
            f" {memory['heap_membership_to_object']:.2f}x an object's"
            f" {memory['heap_bytes_per_object']:.0f} B",
        )
    )
    rows.append(
        (
            "memory per membership, RSS delta",
            f"{memory['rss_bytes_per_membership']:.0f} B;"
            f" {memory['rss_membership_to_object']:.2f}x an object's"
            f" {memory['rss_bytes_per_object']:.0f} B",
        )
    )
    eviction = results["eviction"]
    rows.append(
        (
            "eviction store",
            f"{eviction['objects']:,} objects of {eviction['value_bytes']} B,"
            f" {eviction['sessions']:,} sessions, {eviction['passes_per_case']} passes per case",
        )
    )
    for case in eviction["cases"]:
        rows.append(
            (
                f"eviction pass: {case['case']}, wall",
                f"total {case['total_ms_median']:.0f} ms"
                f" ({case['total_ratio_to_no_sessions']:.2f}x);"
                f" max slice {case['max_slice_ms_median']:.2f} ms"
                f" ({case['max_slice_ratio_to_no_sessions']:.2f}x, worst"
                f" {case['max_slice_ms_max']:.2f}); {case['slices_median']:.0f} slices,"
                f" {case['evicted_median']:,.0f} evicted",
            )
        )
        rows.append(
            (
                "  CPU time",
                f"total {case['total_cpu_ms_median']:.0f} ms"
                f" ({case['total_cpu_ratio_to_no_sessions']:.2f}x);"
                f" max slice {case['max_slice_cpu_ms_median']:.2f} ms"
                f" ({case['max_slice_cpu_ratio_to_no_sessions']:.2f}x, worst"
                f" {case['max_slice_cpu_ms_max']:.2f})",
            )
        )
        rows.append(
            (
                "  each pass: wall / CPU ms, slices",
                ", ".join(
                    f"{p['total_ms']:.0f} / {p['total_cpu_ms']:.0f}, {p['slices']}"
                    for p in case["passes"]
                )
                + f" ({case['sessions']:,} sessions live, {case['pinned_sessions']:,} pinned)",
            )
        )
    width = max(len(name) for name, _ in rows)
    load = results["load_average_before"][0], results["load_average_after"][0]
    head = (
        f"session benchmark ({results['mode']}), Python {results['machine']['python']},"
        f" {results['machine']['cpu_count']} CPUs, 1-min load {load[0]:.1f} before /"
        f" {load[1]:.1f} after; medians unless stated, this machine only"
    )
    lines = [head, f"{'metric':<{width}}  value", f"{'-' * width}  {'-' * 50}"]
    lines += [f"{name:<{width}}  {value}" for name, value in rows]
    notes = results["anomalies"]
    lines.append("anomalies: " + ("; ".join(notes) if notes else "none"))
    return "\n".join(lines)


def run(params: Params) -> dict[str, Any]:
    wall_start = time.time()
    load_before = os.getloadavg()
    phase_s: dict[str, float] = {}
    began = time.perf_counter()
    client = bench_client(params)
    phase_s["client"] = time.perf_counter() - began
    began = time.perf_counter()
    memory = bench_memory(params)
    phase_s["memory"] = time.perf_counter() - began
    began = time.perf_counter()
    eviction = bench_eviction(params)
    phase_s["eviction"] = time.perf_counter() - began
    results: dict[str, Any] = {
        "schema": 1,
        "mode": params.mode,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(wall_start)),
        "duration_s": 0.0,
        "machine": machine(),
        "packages": packages(),
        "params": dataclasses.asdict(params),
        "phase_s": phase_s,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "client": client,
        "memory": memory,
        "eviction": eviction,
    }
    results["anomalies"] = anomalies(results)
    results["duration_s"] = time.time() - wall_start
    return results


def default_json_path() -> Path:
    return ROOT / "bench-results" / f"session-bench-{time.strftime('%Y%m%d-%H%M%S')}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--quick", action="store_true", help="100,000 objects / 10,000 sessions (< 60 s)"
    )
    parser.add_argument("--json", type=Path, default=None, help="where to write the JSON record")
    args = parser.parse_args(argv)

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through bench_client, which stops the master

    signal.signal(signal.SIGTERM, terminate)
    results = run(QUICK if args.quick else FULL)
    path: Path = args.json or default_json_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    print(f"\nJSON: {path} ({results['duration_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
