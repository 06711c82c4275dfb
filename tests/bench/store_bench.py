"""Store benchmark: mooncake-py's figures next to upstream Mooncake's and this machine's limits.

Run from the repository root::

    .venv/bin/python -m tests.bench.store_bench [--quick | --tiny] [--compare-mooncake]
        [--install-deps] [--upstream-venv DIR] [--json PATH] [--profile DIR]
    .venv/bin/python -m tests.bench.store_bench compare A.json B.json

One run measures, in one process tree:

1. the limits (memcpy, loopback socket stream and ping-pong, bare gRPC echoes; see
   :mod:`tests.bench.limits`), their reps split between checkpoints before, between and after
   the store phases;
2. mooncake-py (:mod:`tests.bench.worker` processes, a master on a free 127.0.0.1 port):
   - single process: the segment owner A ``put`` / ``get`` / ``put_from`` / ``get_into`` at
     4 KiB .. 16 MiB and the batch forms at 64 x 64 KiB, 16 x 1 MiB, 32 x 4 MiB;
   - cross-process, shared memory and then ``MOONCAKE_PY_FORCE_TCP=1``: A writes with
     ``batch_put_from``, B (no segment) reads with ``get_into`` / ``batch_get_into`` and writes
     into A's segment with ``put_from``;
   - metadata from B: ``is_exist`` (present / absent key), ``batch_is_exist`` (keys/s) and
     ``remove``, over the master's stream channel (the default) and over gRPC
     (``MOONCAKE_PY_MASTER_TRANSPORT=grpc``);
   - memory pressure: one client with a 256 MiB segment puts 1 GiB of 1 MiB values against a
     master with its default eviction, then reads every key back;
3. with ``--compare-mooncake``: upstream Mooncake Store (PyPI wheel in its own virtual
   environment, :mod:`tests.bench.upstream`) through the same worker code and on its own master
   (HTTP metadata server, protocol "tcp", loopback only), taking turns with mooncake-py round by
   round so that each ratio compares rounds run moments apart.

Keys are fresh every round and removed after it. The masters run with 1 s read leases and no
eviction (except memory pressure); A's segment is written end to end before anything is timed,
and the run keeps what A's segment holds under a budget (:mod:`.plan`). Every value read is
stamp-checked and one call per command is compared byte for byte.

The report (stdout) gives each figure, upstream's, the ratio (or "no difference" when it is
inside the run's noise), the matching limit and the fraction reached, then the performance
targets. The JSON record (default ``bench-results/store-bench-<timestamp>.json``) holds every figure
plus the machine and both implementations' package versions. Every process started is stopped
by its pid at the end, also on error.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mooncake_py.testing import MasterProcess
from tests.bench import limits as lim
from tests.bench import upstream as up
from tests.bench.common import FORCE_TCP_ENV, MIB, ROOT, Child, size_label
from tests.bench.plan import Plan, SegmentBudget, Verification, echo_payloads, plan_for
from tests.bench.report import (
    PY,
    UPSTREAM,
    RowAccumulator,
    compare_table,
    context_lines,
    evaluate_targets,
    limit_figure,
    machine,
    packages,
    pressure_summary,
    row_record,
    table,
    values_text,
)

TRANSPORT_ENV = "MOONCAKE_PY_MASTER_TRANSPORT"
GROUP_ORDER = {"local": 0, "shm": 1, "tcp": 2, "meta": 3}


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _stop_and_clean(child: Child) -> None:
    """Stop a child; if it died without closing its store, delete the segment file it left
    (``/dev/shm/mooncake_py-<pid>-<uuid>``, as :mod:`mooncake_py.client.segment` names them)."""
    child.stop()
    for leftover in Path("/dev/shm").glob(f"mooncake_py-{child.pid}-*"):
        with contextlib.suppress(OSError):
            leftover.unlink()


def upstream_peer(row_id: str) -> str | None:
    """The upstream row a mooncake-py row is compared with: upstream has one cross-process path
    (TCP) and one master transport, measured under the shm / default-transport ids."""
    if row_id.startswith("tcp.a."):
        return None  # upstream's segment owner writes its own segment locally, never over TCP
    if row_id.startswith("tcp."):
        row_id = "shm." + row_id[4:]
    return row_id.removesuffix(".grpc")


@dataclasses.dataclass
class Side:
    """One implementation under test: how to start its clients, and what they measured."""

    name: str  # PY or UPSTREAM
    impl: str  # the worker's --impl
    python: str | None = None  # None: this interpreter
    env: dict[str, str | None] = dataclasses.field(default_factory=dict)
    address: str = ""
    metadata: str = "P2PHANDSHAKE"
    local_buffer: int = 0
    rows: dict[str, RowAccumulator] = dataclasses.field(default_factory=dict)
    check: Verification = dataclasses.field(default_factory=Verification)
    versions: dict[str, Any] = dataclasses.field(default_factory=dict)
    prefill: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    waits: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    waited_s: float = 0.0
    pressure: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    budget: SegmentBudget | None = None  # of the current phase's A
    team: Team | None = None  # the current phase's processes

    @property
    def short(self) -> str:
        return "py" if self.name == PY else "up"


@dataclasses.dataclass
class Team:
    """One side's processes in one phase: A owns the segment, B has none; ``readers`` are the
    metadata callers (B, and for mooncake-py a B that talks gRPC to the master)."""

    path: str
    a: Child
    b: Child
    readers: list[tuple[str, Child]]


class Bench:
    """One run: its processes, raw measurements and verification records."""

    def __init__(
        self,
        plan: Plan,
        stack: contextlib.ExitStack,
        logs: Path,
        profile: str,
        upstream_venv: Path | None = None,
    ) -> None:
        self.plan = plan
        self.stack = stack
        self.logs = logs
        self.profile = profile
        self.upstream_venv = upstream_venv
        self.tag = f"bench-{os.getpid()}-{time.time_ns() // 1_000_000}"
        self.started = time.perf_counter()
        self.raw_limits: dict[str, tuple[str, dict[str, Any]]] = {}
        self.definitions: dict[str, dict[str, Any]] = {}
        self.pids: dict[str, int] = {}
        self.payloads: dict[str, int] = {}
        self.master_stderr: collections.deque[str] = collections.deque(maxlen=50)
        self.upstream_master: up.UpstreamMaster | None = None
        self.sides = [Side(PY, "py", local_buffer=plan.buffer_bytes() + 16 * MIB)]
        if upstream_venv is not None:
            self.sides.append(
                Side(
                    UPSTREAM,
                    "upstream",
                    python=str(up.venv_python(upstream_venv)),
                    env=dict(up.CLIENT_ENV),
                    local_buffer=plan.buffer_bytes() + 16 * MIB,
                )
            )

    def note(self, message: str) -> None:
        _log(f"[{time.perf_counter() - self.started:6.1f}s] {message}")

    def side(self, name: str) -> Side | None:
        return next((side for side in self.sides if side.name == name), None)

    # -- processes -------------------------------------------------------------------------

    def child(
        self,
        name: str,
        module: str,
        args: Sequence[str] = (),
        env: dict[str, str | None] | None = None,
        python: str | None = None,
    ) -> Child:
        child = Child(name, module, args=args, env=env, log_dir=self.logs, python=python)
        self.stack.callback(_stop_and_clean, child)
        self.pids[name] = child.pid
        return child

    def worker(self, side: Side, name: str, env: dict[str, str | None] | None = None) -> Child:
        """A worker process of ``side`` (not set up yet)."""
        return self.child(
            f"{side.short}-{name}",
            "tests.bench.worker",
            args=["--impl", side.impl],
            env={**side.env, **(env or {})},
            python=side.python,
        )

    def setup(self, side: Side, joining: Sequence[tuple[Child, int, int]]) -> None:
        """Wait for each worker to start, then join ``side``'s store, all at once.

        Args:
            joining: per worker, the segment bytes it contributes and its buffer bytes.
        """
        for worker, _, _ in joining:
            ready = worker.receive(timeout_s=120)
            side.versions = side.versions or ready.get("versions", {})
        for worker, segment, buffer in joining:
            profile = str(Path(self.profile) / f"{worker.name}.prof") if self.profile else ""
            worker.send(
                cmd="setup",
                master=side.address,
                metadata=side.metadata,
                segment=segment,
                buffer=buffer,
                local_buffer=side.local_buffer if segment else 16 * MIB,
                profile=profile,
            )
        for worker, _, _ in joining:
            worker.receive(timeout_s=120)

    def py_master(self, name: str, eviction: bool) -> MasterProcess:
        """A mooncake-py master on a free port, started (three tries; each failure logged with
        the master's stderr)."""
        # Shorter read leases than the default (10 s): memory of removed keys comes back sooner.
        # No eviction unless asked: the run keeps A's segment under its budget itself.
        args = ["--log_level", "WARNING", "--default_kv_lease_ttl", f"{self.plan.lease_ms}ms"]
        if not eviction:
            args += ["--eviction_high_watermark_ratio", "1.0"]
        for attempt in range(1, 4):
            master = MasterProcess(args=args)
            self.stack.callback(master.stop)
            try:
                master.start()
            except RuntimeError as exc:
                stderr = master.process.stderr if master.process else None
                detail = stderr.read()[-2000:] if stderr is not None else ""
                _log(f"{name}: {exc} (attempt {attempt}/3); stderr: {detail!r}")
                continue
            self.pids[name] = master.pid
            stderr = master.process.stderr if master.process else None
            if stderr is not None:  # drained so that the master never blocks on a full pipe
                threading.Thread(
                    target=self.master_stderr.extend, args=(stderr,), daemon=True
                ).start()
            return master
        raise RuntimeError(f"{name}: the mooncake-py master did not start")

    def upstream_master_for(self, name: str, eviction: bool) -> up.UpstreamMaster:
        assert self.upstream_venv is not None
        master = up.UpstreamMaster(
            self.upstream_venv, self.logs / f"{name}.log", self.plan.lease_ms, eviction
        )
        self.stack.callback(master.stop)
        master.start()
        self.pids[name] = master.pid
        return master

    def start_masters(self) -> None:
        py = self.sides[0]
        py.address = self.py_master("py-master", eviction=False).address
        upstream = self.side(UPSTREAM)
        if upstream is not None:
            master = self.upstream_master_for("up-master", eviction=False)
            self.upstream_master = master
            upstream.address, upstream.metadata = master.address, master.metadata

    # -- limits ----------------------------------------------------------------------------

    def measure_limits(
        self, server: dict[str, Any], payloads: dict[str, int], part: int, parts: int
    ) -> None:
        """Part ``part`` (0-based) of ``parts`` of each limit's reps. The parts are taken before,
        between and after the store phases, so that the limits see the same (noisy, shared)
        machine as the workloads they are compared with.
        """
        plan = self.plan

        def reps(total: int) -> int:
            return max(1, total // parts + (part < total % parts))

        when = "before the workloads" if part == 0 else f"checkpoint {part + 1}/{parts}"
        self.note(f"limits ({when}): memcpy, socket stream, ping-pong, grpc echo")
        measurements: list[tuple[str, str, Any, tuple[Any, ...]]] = []
        for size in plan.memcpy_sizes:
            label = size_label(size)
            measurements.append(
                (f"memcpy_{label}", f"memcpy {label}", lim.memcpy, (size, reps(plan.memcpy_reps)))
            )
        largest, piece = max(plan.memcpy_sizes), max(plan.sizes)
        label = f"{size_label(largest)}_{size_label(piece)}"
        measurements.append(
            (
                f"memcpy_{label}",
                f"memcpy {size_label(largest)}/{size_label(piece)}",
                lim.memcpy,
                (largest, reps(plan.memcpy_reps), piece),
            )
        )
        slots = max(plan.batches.values())
        for size in plan.sizes:
            label = size_label(size)
            stream_args = (server["stream_port"], size, plan.stream_bytes, reps(plan.stream_reps))
            measurements.append(
                (f"stream_{label}", f"stream {label} msgs", lim.stream, (*stream_args, slots))
            )
        ping_args = (server["pong_port"], plan.ping_calls, reps(plan.call_reps))
        measurements.append(("pingpong", f"ping-pong {lim.PING_BYTES}B", lim.pingpong, ping_args))
        port, calls = server["grpc_port"], plan.echo_calls
        for name, payload in payloads.items():
            echo_args = (port, payload, calls, reps(plan.call_reps))
            measurements.append(
                (f"grpc_echo_{name}", f"grpc echo {payload}B", lim.grpc_echo, echo_args)
            )
        payload = payloads["ExistKey"]
        for bidi, kind in ((False, "unary"), (True, "bidi")):
            aio_args = (port, payload, calls, reps(plan.call_reps), bidi)
            label = f"grpc.aio {kind} {payload}B"
            measurements.append((f"grpc_aio_{kind}_ExistKey", label, lim.grpc_aio, aio_args))
        for limit_id, label, measure, args in measurements:
            started = time.perf_counter()
            raw = measure(*args)
            raw["seconds"] = time.perf_counter() - started
            self._limit(limit_id, label, raw)

    def _limit(self, limit_id: str, label: str, raw: dict[str, Any]) -> None:
        known = self.raw_limits.get(limit_id)
        if known is None:
            self.raw_limits[limit_id] = (label, raw)
            return
        for name in ("times", "rates", "rates_Bps", "seconds"):
            if name in raw:
                known[1][name] += raw[name]

    def limit_figures(self) -> dict[str, dict[str, Any]]:
        return {key: limit_figure(raw, label) for key, (label, raw) in self.raw_limits.items()}

    def memcpy_limit(self, size: int, batch: int = 1) -> str:
        """The memcpy limit for a call moving ``batch`` values of ``size`` bytes: the smallest
        measured size that holds them; past the smallest, a batch of the pieces measured
        (the largest cross-process value) compares with that size copied in such pieces."""
        sizes = sorted(self.plan.memcpy_sizes)
        nbytes = size * batch
        if batch > 1 and nbytes > sizes[0] and size == max(self.plan.sizes):
            return f"memcpy_{size_label(sizes[-1])}_{size_label(size)}"
        return f"memcpy_{size_label(next((s for s in sizes if s >= nbytes), sizes[-1]))}"

    # -- workload bookkeeping --------------------------------------------------------------

    def row(self, side: Side, row_id: str, **fields: Any) -> RowAccumulator:
        """``side``'s accumulator for a row; the first definition of a row id is kept."""
        definition = self.definitions.setdefault(row_id, {"id": row_id, **fields})
        if row_id not in side.rows:
            side.rows[row_id] = RowAccumulator(definition)
        return side.rows[row_id]

    def command(
        self,
        side: Side,
        worker: Child,
        kind: str,
        prefix: str,
        n: int,
        size: int,
        batch: int,
        row: RowAccumulator | None = None,
        mode: str = "zero",
    ) -> dict[str, Any]:
        """One put/get command of ``n`` keys; its calls become one rep of ``row``."""
        answer = side.check.absorb(
            worker.call(cmd=kind, prefix=prefix, n=n, size=size, batch=batch, mode=mode)
        )
        if row is not None:
            row.add(answer)
        return answer

    def put(
        self,
        side: Side,
        worker: Child,
        prefix: str,
        n: int,
        size: int,
        batch: int,
        row: RowAccumulator | None = None,
        mode: str = "zero",
    ) -> dict[str, Any]:
        budget = side.budget
        assert budget is not None, "open_phase() first"
        waited = budget.waited_s
        budget.reserve(n * size)
        if budget.waited_s > waited:
            side.waits.append((prefix, round(budget.waited_s - waited, 3)))
        return self.command(side, worker, "put", prefix, n, size, batch, row, mode)

    def remove(self, side: Side, worker: Child, prefix: str, n: int, size: int) -> None:
        side.check.absorb(worker.call(cmd="remove", prefix=prefix, n=n))
        assert side.budget is not None
        side.budget.removed(n * size)

    @staticmethod
    def turns(sides: Sequence[Side], rnd: int) -> Sequence[Side]:
        """The sides in the order they take round ``rnd``: alternating, so that neither always
        runs right after the other."""
        return sides if rnd % 2 == 0 else list(reversed(sides))

    # -- phases ----------------------------------------------------------------------------

    def open_phase(self, sides: Sequence[Side], path: str) -> None:
        """Start every side's A and B (and mooncake-py's gRPC reader on the shm path), join
        them all at once, then pre-fill each side's A."""
        plan = self.plan
        tcp = path == "tcp"
        buffer = plan.buffer_bytes()
        for side in sides:
            env: dict[str, str | None] = {FORCE_TCP_ENV: "1"} if tcp else {}
            a = self.worker(side, f"{path}-A", env)
            b = self.worker(side, f"{path}-B", env)
            readers = [("", b)]
            if side.name == PY and not tcp:
                grpc_reader = self.worker(side, f"{path}-B-grpc", {TRANSPORT_ENV: "grpc"})
                readers.append((".grpc", grpc_reader))
            side.team = Team(path, a, b, readers)
        for side in sides:
            assert side.team is not None
            self.note(f"{side.name} {path}: joining the store")
            team = side.team
            joining = [(team.a, plan.segment, buffer), (team.b, 0, buffer)]
            self.setup(side, joining + [(reader, 0, 1 * MIB) for _, reader in team.readers[1:]])
        for side in sides:
            assert side.team is not None
            # mooncake-py's B maps A's segment on the shm path: it pre-fills through it too
            team = side.team
            fillers = (team.a, team.b) if side.name == PY and path == "shm" else (team.a,)
            self.join(side, path, team.a, fillers)

    def close_phase(self, sides: Sequence[Side]) -> None:
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

    def join(self, side: Side, path: str, a: Child, fillers: Sequence[Child]) -> None:
        """A's segment is written end to end by each of ``fillers`` (A, and on the shm path B
        through its own mapping), so that no timed call pays first-touch page faults. Nothing
        reads those keys, so removing them frees their memory at once. Failed writes are
        counted, not errors (upstream's allocator may not fit a completely full segment)."""
        plan = self.plan
        side.budget = SegmentBudget(plan.segment, plan.budget)
        size = max(plan.sizes)
        batch = plan.batches[size]
        n = max(1, int(plan.segment * plan.prefill) // size)
        self.note(f"{side.name} {path}: pre-filling A's segment ({n} x {size_label(size)})")
        record: dict[str, float] = {"bytes": n * size}
        for who, worker in zip("ab", fillers, strict=False):
            prefix = f"{self.tag}/{side.short}/{path}/prefill-{who}"
            answer = worker.call(
                cmd="put", prefix=prefix, n=n, size=size, batch=batch, tolerant=True
            )
            record[f"{who}_put_s"] = sum(answer["times"])
            record[f"{who}_failed"] = answer.get("failed", 0)
            removed = worker.call(cmd="remove", prefix=prefix, n=n, tolerant=True)
            record[f"{who}_remove_failed"] = removed.get("failed", 0)
        side.prefill[path] = record

    def local_round(self, side: Side, rnd: int) -> None:
        """Single process: A writes and reads its own segment, copying and zero-copy calls."""
        plan = self.plan
        assert side.team is not None
        a = side.team.a
        keep = rnd >= plan.warmup
        singles = (("copy", "put", "get"), ("zero", "put_from", "get_into"))
        batches = (("copy", "put_batch", "get_batch"), ("zero", "batch_put_from", "batch_get_into"))
        for size in plan.local_sizes:
            label, n = size_label(size), plan.local_calls[size]
            small = size < MIB
            unit = "ops/s" if small else "MB/s"
            limit_id = "pingpong" if small else self.memcpy_limit(size)
            for mode, put_op, get_op in singles:
                rows = [
                    self.row(
                        side,
                        f"local.{op}.{label}",
                        group="local",
                        label=f"{op} {label}",
                        op=op,
                        size=size,
                        batch=1,
                        unit=unit,
                        limit_id=limit_id,
                    )
                    for op in (put_op, get_op)
                ]
                prefix = f"{self.tag}/{side.short}/local/{label}/{mode}/r{rnd}"
                self.put(side, a, prefix, n, size, 1, rows[0] if keep else None, mode)
                self.command(side, a, "get", prefix, n, size, 1, rows[1] if keep else None, mode)
                self.remove(side, a, prefix, n, size)
        for count, size, calls in plan.local_batches:
            label = f"{count}x{size_label(size)}"
            n = count * calls
            for mode, put_op, get_op in batches:
                rows = [
                    self.row(
                        side,
                        f"local.{op}.{label}",
                        group="local",
                        label=f"{op} {count} x {size_label(size)}",
                        op=op,
                        size=size,
                        batch=count,
                        unit="MB/s",
                        limit_id=self.memcpy_limit(size, count),
                    )
                    for op in (put_op, get_op)
                ]
                prefix = f"{self.tag}/{side.short}/local/{label}/{mode}/r{rnd}"
                self.put(side, a, prefix, n, size, count, rows[0] if keep else None, mode)
                get_row = rows[1] if keep else None
                self.command(side, a, "get", prefix, n, size, count, get_row, mode)
                self.remove(side, a, prefix, n, size)

    def data_round(self, side: Side, size: int, rnd: int) -> None:
        """A writes, B reads; B writes into A's segment. Keys are fresh every round."""
        plan = self.plan
        assert side.team is not None
        a, b, path = side.team.a, side.team.b, side.team.path
        title = "shm" if path == "shm" else "TCP"
        label, batch, n = size_label(size), plan.batches[size], plan.values[size]

        def limit_of(count: int) -> str:
            return self.memcpy_limit(size, count) if path == "shm" else f"stream_{label}"

        common = {"group": path, "path": path, "size": size, "unit": "MB/s"}
        a_put = self.row(
            side,
            f"{path}.a.batch_put_from.{label}",
            **common,
            op="batch_put_from",
            batch=batch,
            label=f"{title} A batch_put_from {batch} x {label}",
            limit_id=limit_of(batch),
        )
        get = self.row(
            side,
            f"{path}.b.get_into.{label}",
            **common,
            op="get_into",
            batch=1,
            label=f"{title} B get_into {label}",
            limit_id=limit_of(1),
        )
        batch_get = self.row(
            side,
            f"{path}.b.batch_get_into.{label}",
            **common,
            op="batch_get_into",
            batch=batch,
            label=f"{title} B batch_get_into {batch} x {label}",
            limit_id=limit_of(batch),
        )
        b_put = self.row(
            side,
            f"{path}.b.put_from.{label}",
            **common,
            op="put_from",
            batch=1,
            label=f"{title} B put_from {label} (into A)",
            limit_id=limit_of(1),
        )
        keep = rnd >= plan.warmup
        prefix = f"{self.tag}/{side.short}/{path}/{label}/r{rnd}"
        self.put(side, a, f"{prefix}/a", n, size, batch, a_put if keep else None)
        self.command(side, b, "get", f"{prefix}/a", n, size, 1, get if keep else None)
        self.command(side, b, "get", f"{prefix}/a", n, size, batch, batch_get if keep else None)
        self.remove(side, b, f"{prefix}/a", n, size)
        self.put(side, b, f"{prefix}/b", n, size, 1, b_put if keep else None)
        self.command(side, b, "get", f"{prefix}/b", n, size, batch)  # verification only
        self.remove(side, b, f"{prefix}/b", n, size)

    def metadata_keys(self, side: Side) -> tuple[str, str, int]:
        """The present-key prefix, the absent-key prefix and the key count of ``side``."""
        keys = max(self.plan.batch_exist_sizes)
        return f"{self.tag}/{side.short}/meta", f"{self.tag}/{side.short}/absent", keys

    def metadata_rep(self, side: Side, rep: int) -> None:
        """From each reader (variant "" = default master transport, ".grpc" = gRPC): is_exist of
        a present and an absent key, batch_is_exist of each size, and remove of fresh keys.
        Rep 0 warms up."""
        plan = self.plan
        assert side.team is not None
        prefix, absent, keys = self.metadata_keys(side)
        for variant, reader in side.team.readers:
            grpc = variant == ".grpc"
            how = " (gRPC)" if grpc else (" (stream)" if side.name == PY else "")
            small_limit = "grpc_echo_ExistKey" if grpc else "pingpong"
            for state, key_prefix, expect in (("present", prefix, 1), ("absent", absent, 0)):
                row = self.row(
                    side,
                    f"meta.is_exist.{state}{variant}",
                    group="meta",
                    op="is_exist",
                    unit="ops/s",
                    batch=1,
                    label=f"B is_exist, {state} key{how}",
                    limit_id=small_limit,
                )
                command: dict[str, Any] = {"prefix": key_prefix, "n": keys, "expect": expect}
                answer = side.check.absorb(
                    reader.call(cmd="exist", calls=plan.exist_calls, **command)
                )
                if rep:
                    row.add(answer)
            for size in plan.batch_exist_sizes:
                row = self.row(
                    side,
                    f"meta.batch_is_exist.{size}{variant}",
                    group="meta",
                    op="batch_is_exist",
                    unit="keys/s",
                    batch=size,
                    label=f"B batch_is_exist {size} keys{how}",
                    limit_id=f"grpc_echo_BatchExistKey{size}",
                    limit_scale=size,
                )
                calls = plan.batch_exist_calls[size]
                answer = side.check.absorb(
                    reader.call(cmd="batch_exist", prefix=prefix, n=size, calls=calls)
                )
                if rep:
                    row.add(answer, keys_per_call=size)
            row = self.row(
                side,
                f"meta.remove{variant}",
                group="meta",
                op="remove",
                unit="ops/s",
                batch=1,
                label=f"B remove{how}",
                limit_id=small_limit,
            )
            removed = f"{self.tag}/{side.short}/rm{variant}/r{rep}"
            answer = side.check.absorb(
                reader.call(
                    cmd="remove_each", prefix=removed, n=plan.remove_calls, size=plan.meta_value
                )
            )
            if rep:
                row.add(answer)

    def store_phase(self, sides: Sequence[Side], path: str) -> None:
        """Every side's A and B on one path, taking turns round by round so that each ratio
        compares rounds run moments apart (the machine's load drifts)."""
        plan = self.plan
        self.open_phase(sides, path)
        total = plan.warmup + plan.rounds
        if path == "shm":
            for rnd in range(total):
                self.note(f"{path} single process round {rnd + 1}/{total}")
                for side in self.turns(sides, rnd):
                    self.local_round(side, rnd)
        for size in plan.sizes:
            for rnd in range(total):
                self.note(f"{path} {size_label(size)} round {rnd + 1}/{total}")
                for side in self.turns(sides, rnd):
                    self.data_round(side, size, rnd)
        if path == "shm":
            for side in sides:
                assert side.team is not None
                prefix, _, keys = self.metadata_keys(side)
                self.put(side, side.team.a, prefix, keys, plan.meta_value, min(keys, 256))
            for rep in range(plan.call_reps + 1):
                self.note(f"{path} metadata rep {rep + 1}/{plan.call_reps + 1}")
                for side in self.turns(sides, rep):
                    self.metadata_rep(side, rep)
            for side in sides:
                assert side.team is not None
                prefix, _, keys = self.metadata_keys(side)
                self.remove(side, side.team.a, prefix, keys, plan.meta_value)
        self.close_phase(sides)

    def pressure_rep(self, side: Side, rep: int) -> None:
        """A fresh master (default eviction) and one client with a small segment: put far more
        than it holds, then read everything back."""
        plan = self.plan
        name = f"{side.short}-pressure-{rep}"
        self.note(f"{side.name} memory pressure rep {rep + 1}/{plan.pressure_reps}")
        master: MasterProcess | up.UpstreamMaster
        if side.name == PY:
            master = self.py_master(f"{name}-master", eviction=True)
            address, metadata = master.address, side.metadata
        else:
            master = self.upstream_master_for(f"{name}-master", eviction=True)
            address, metadata = master.address, master.metadata
        worker = self.worker(side, "pressure")
        started = time.perf_counter()
        saved = side.address, side.metadata
        side.address, side.metadata = address, metadata
        try:
            self.setup(side, [(worker, plan.pressure_segment, plan.pressure_value)])
        finally:
            side.address, side.metadata = saved
        n = plan.pressure_bytes // plan.pressure_value
        answer = side.check.absorb(
            worker.call(
                cmd="pressure",
                prefix=f"{self.tag}/{side.short}/pressure/r{rep}",
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


def _run_phases(bench: Bench) -> None:
    plan = bench.plan
    bench.note(f"mode {plan.mode}: starting the masters and the limit servers")
    limit_servers = [
        bench.child(f"limits-{role}", "tests.bench.limits", args=[role])
        for role in ("sockets", "grpc")
    ]
    bench.start_masters()
    server = {k: v for child in limit_servers for k, v in child.receive(timeout_s=60).items()}
    bench.payloads = echo_payloads(bench.tag, plan.batch_exist_sizes)
    py = bench.sides[0]
    phases = [(bench.sides, "shm"), ([py], "tcp")]
    parts = len(phases) + 1  # limits before, between and after the store phases
    for part, (sides, path) in enumerate(phases):
        bench.measure_limits(server, bench.payloads, part, parts)
        bench.store_phase(sides, path)
    if bench.upstream_master is not None:
        bench.upstream_master.stop()  # the pressure reps start their own masters
    for rep in range(plan.pressure_reps):
        for side in bench.turns(bench.sides, rep):
            bench.pressure_rep(side, rep)
    bench.measure_limits(server, bench.payloads, parts - 1, parts)
    lim.release_buffers()
    bench.note("done; stopping every process")


def _results(bench: Bench, wall_start: float) -> dict[str, Any]:
    plan = bench.plan
    limits = bench.limit_figures()
    py, upstream = bench.sides[0], bench.side(UPSTREAM)
    rows = []
    ordered = sorted(
        bench.definitions.values(), key=lambda d: GROUP_ORDER.get(d.get("group", ""), 9)
    )
    for definition in ordered:
        ours = py.rows.get(definition["id"])
        if ours is None or not ours.reps:
            continue
        peer = upstream_peer(definition["id"])
        theirs = upstream.rows.get(peer) if upstream is not None and peer else None
        rows.append(row_record({**definition, "upstream_id": peer}, ours, theirs, limits))
    versions = {PY: {**packages(), **py.versions}}
    if upstream is not None:
        versions[UPSTREAM] = upstream.versions
    results: dict[str, Any] = {
        "schema": 2,
        "mode": plan.mode,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(wall_start)),
        "duration_s": time.time() - wall_start,
        "compared": upstream is not None,
        "machine": machine(),
        "packages": packages(),
        "versions": versions,
        "params": {
            **{k: v for k, v in dataclasses.asdict(plan).items() if k not in ("values",)},
            "values": values_text(plan.sizes, plan.values),
            "values_per_round": {size_label(s): n for s, n in plan.values.items()},
            "echo_payload_bytes": bench.payloads,
        },
        "limits": limits,
        "rows": rows,
        "pressure": {side.name: pressure_summary(side.pressure) for side in bench.sides},
        "verification": {side.name: side.check.summary() for side in bench.sides},
        "pids": bench.pids,
        "budget_wait_s": sum(side.waited_s for side in bench.sides),
        "budget_waits": {side.name: side.waits for side in bench.sides},
        "prefill": {side.name: side.prefill for side in bench.sides},
    }
    if upstream is not None and bench.upstream_venv is not None:
        master = bench.upstream_master
        results["upstream_setup"] = {
            "venv": str(bench.upstream_venv),
            "package": f"{up.PACKAGE}=={up.VERSION}",
            "master": str(master.binary) if master else None,
            "master_args": master._args(0, 0, 0)[1:] if master else None,
            "client_env": up.CLIENT_ENV,
            "client_setup": {"protocol": "tcp", "local_hostname": "127.0.0.1"},
        }
    results["targets"] = evaluate_targets(results)
    results["targets_context"] = context_lines(results)
    return results


def run(
    quick: bool = False,
    tiny: bool = False,
    profile: str = "",
    upstream_venv: Path | None = None,
) -> dict[str, Any]:
    """Run the whole benchmark; returns the results record (see the module docstring).

    Args:
        upstream_venv: compare with upstream Mooncake from this virtual environment (checked
            by the caller with :func:`tests.bench.upstream.ensure`); None: mooncake-py only.
    """
    plan = plan_for(quick, tiny)
    wall_start = time.time()
    with contextlib.ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mooncake-bench-")))
        bench = Bench(plan, stack, logs, profile, upstream_venv)
        try:
            _run_phases(bench)
        except BaseException:
            if bench.master_stderr:
                _log("mooncake-py master's last stderr lines:\n" + "".join(bench.master_stderr))
            for log in sorted(logs.glob("*.log")):
                tail = log.read_text(errors="replace").splitlines()[-5:]
                if tail:
                    _log(f"--- {log.name} (last lines)\n" + "\n".join(tail))
            raise
    return _results(bench, wall_start)


def default_json_path() -> Path:
    return ROOT / "bench-results" / f"store-bench-{time.strftime('%Y%m%d-%H%M%S')}.json"


def compare_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="store_bench compare", description="ratio table B / A between two result files"
    )
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    first, second = (json.loads(path.read_text()) for path in (args.a, args.b))
    print(compare_table(first, second, (str(args.a), str(args.b))))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "compare":
        return compare_main(argv[1:])
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n", 1)[0],
        epilog="'store_bench compare A.json B.json' prints the ratio table between two runs.",
    )
    parser.add_argument("--quick", action="store_true", help="fewer iterations (< 60 s)")
    parser.add_argument("--tiny", action="store_true", help="plumbing check on small values")
    parser.add_argument("--json", type=Path, default=None, help="where to write the JSON record")
    parser.add_argument("--profile", default="", help="directory for workers' cProfile dumps")
    parser.add_argument(
        "--compare-mooncake",
        action="store_true",
        help="also run upstream Mooncake Store (PyPI wheel, own venv) with the same workloads",
    )
    parser.add_argument(
        "--install-deps",
        action="store_true",
        help="create upstream's venv, pip-install its wheel and apt-get libibverbs1 when "
        "missing (implies --compare-mooncake)",
    )
    parser.add_argument(
        "--upstream-venv",
        type=Path,
        default=None,
        help=f"upstream's virtual environment (default ${up.VENV_ENV} or {up.DEFAULT_VENV})",
    )
    args = parser.parse_args(argv)

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through run(), which stops every process

    signal.signal(signal.SIGTERM, terminate)
    upstream_venv = None
    if args.compare_mooncake or args.install_deps:
        upstream_venv = (args.upstream_venv or up.default_venv()).resolve()
        try:
            up.ensure(upstream_venv, args.install_deps)
        except up.UpstreamUnavailable as exc:
            print(str(exc), file=sys.stderr)
            return 2
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        args.profile = str(Path(args.profile).resolve())
    results = run(args.quick, args.tiny, args.profile, upstream_venv)
    path: Path = args.json or default_json_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, sort_keys=False) + "\n")
    print(table(results))
    print(f"\nJSON: {path}")
    return 0 if results["verification"][PY]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
