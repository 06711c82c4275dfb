"""Store benchmark: mooncake-py's figures next to upstream Mooncake's and this machine's limits.

Run from the repository root::

    .venv/bin/python -m tests.bench.store_bench [--quick | --tiny] [--compare-mooncake]
        [--install-deps] [--upstream-venv DIR] [--baseline-rev REV] [--rows PATTERN[,PATTERN]]
        [--rounds N] [--json PATH] [--profile DIR]
    .venv/bin/python -m tests.bench.store_bench --list-rows [--quick | --tiny]
    .venv/bin/python -m tests.bench.store_bench compare A.json B.json
    .venv/bin/python -m tests.bench.store_bench compare-reference [--reference REF.json]
        [--threshold 0.10] [--strict] NEW.json

(the command line is :mod:`tests.bench.store_bench_cli`; the comparisons
:mod:`tests.bench.compare`).

One run measures, in one process tree:

1. the limits (memcpy, loopback socket stream and ping-pong, bare gRPC echoes; see
   :mod:`tests.bench.limits`), their reps split between checkpoints before, between and after
   the store phases;
2. mooncake-py (:mod:`tests.bench.worker` processes, a master on a free 127.0.0.1 port):
   - single process: the segment owner A ``put`` / ``get`` / ``put_from`` / ``get_into`` at
     4 KiB .. 16 MiB and the batch forms at 64 x 64 KiB, 16 x 1 MiB, 32 x 4 MiB; and rounds
     of ``get`` a 4 KiB key, ``remove`` it (forced), ``put`` it again (rounds/s);
   - cross-process, shared memory and then ``MOONCAKE_PY_FORCE_TCP=1``: A writes with
     ``batch_put_from``, B (no segment) reads with ``get_into`` / ``batch_get_into`` and writes
     into A's segment with ``put_from``;
   - metadata from B: ``is_exist`` (present / absent key), ``batch_is_exist`` (keys/s) of
     keys A wrote and read back (probed again every call), of keys A has just written and
     nobody has probed (cold: each key probed once) and of absent keys, and ``remove``, over
     the master's stream channel (the default) and over gRPC
     (``MOONCAKE_PY_MASTER_TRANSPORT=grpc``);
   - memory pressure: one client with a 256 MiB segment puts 1 GiB of 1 MiB values against a
     master with its default eviction, then reads every key back;
3. with ``--compare-mooncake``: upstream Mooncake Store (PyPI wheel in its own virtual
   environment, :mod:`tests.bench.upstream`) through the same worker code and on its own master
   (HTTP metadata server, protocol "tcp", loopback only), taking turns with mooncake-py round by
   round so that each ratio compares rounds run moments apart;
4. with ``--baseline-rev REV``: that git revision of mooncake-py, built once into a scratch
   directory (:mod:`tests.bench.baseline`), with its own master, through the same worker code
   and taking turns with the working tree the same way (on every path, forced TCP included).

``--rows`` restricts the run to the rows whose label or id matches a pattern (see
:mod:`tests.bench.rows`; ``--list-rows`` prints them): phases, rounds and limits no selected row
needs are skipped, and so is memory pressure. Some rows (cross-process 4 KiB ``get`` /
``get_into`` from B) are measured only when selected.

Keys are fresh every round and removed after it. The masters run with 1 s read leases and no
eviction (except memory pressure); A's segment is written end to end before anything is timed,
and the run keeps what A's segment holds under a budget (:mod:`.plan`). Every value read is
stamp-checked and one call per command is compared byte for byte.

The report (stdout) gives each figure, upstream's, the ratio (or "no difference" when it is
inside the run's noise), the matching limit and the fraction reached, then the performance
targets, then (with a baseline) the working tree's figure next to the baseline's and their
ratio. The JSON record (default ``bench-results/store-bench-<timestamp>.json``) holds every
figure (the baseline's under each row's ``baseline``, with ``baseline_ratio``; the revision and
its commit hash under ``baseline``) plus the machine and every side's package versions. Every
process started is stopped by its pid at the end, also on error; exit status 1 when a side's
reads failed verification, 2 when a pattern or the revision is unusable.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mooncake_py.testing import MasterProcess
from tests.bench import baseline as base
from tests.bench import limits as lim
from tests.bench import upstream as up
from tests.bench.common import MIB, Child, size_label
from tests.bench.phases import Team, pressure_rep, store_phase
from tests.bench.plan import Plan, SegmentBudget, Verification, echo_payloads, plan_for
from tests.bench.record import results_record
from tests.bench.report import (
    PY,
    UPSTREAM,
    RowAccumulator,
    limit_figure,
)
from tests.bench.rows import catalogue, select
from tests.bench.rows import upstream_peer as upstream_peer  # the record's pairing, re-exported

PHASE_GROUPS = ("local", "shm", "meta")  # the row groups the shm phase measures


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _stop_and_clean(child: Child) -> None:
    """Stop a child, then check that it left nothing in /dev/shm.

    Segments are memfds now: the kernel frees them with their last holder and a child never
    leaves a file. Builds from before that (a ``--baseline-rev`` side may be one) named a
    file ``/dev/shm/mooncake_py-<pid>-<uuid>`` per segment and left it behind when they died
    without closing their store: such a leftover is reported and deleted."""
    child.stop()
    for leftover in Path("/dev/shm").glob(f"mooncake_py-{child.pid}-*"):
        _log(f"{child.name} left {leftover} behind: deleting it")
        with contextlib.suppress(OSError):
            leftover.unlink()


@dataclasses.dataclass
class Side:
    """One implementation under test: how to start its clients, and what they measured."""

    name: str  # PY, UPSTREAM or BASELINE
    impl: str  # the worker's --impl ("py" for the working tree and the baseline)
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
        return {PY: "py", UPSTREAM: "up"}.get(self.name, "base")

    @property
    def is_py(self) -> bool:
        """A mooncake-py side (the working tree or a baseline revision)."""
        return self.impl == "py"

    def master_env(self) -> dict[str, str]:
        """The environment changes of this side's mooncake-py masters."""
        return {k: v for k, v in self.env.items() if v is not None}


class Bench:
    """One run: its processes, raw measurements and verification records."""

    def __init__(
        self,
        plan: Plan,
        stack: contextlib.ExitStack,
        logs: Path,
        profile: str,
        upstream_venv: Path | None = None,
        selected: set[str] | None = None,
        baseline: base.BaselineBuild | None = None,
    ) -> None:
        """Args:
        selected: the ids of the rows to measure (:func:`tests.bench.rows.select`); None:
            every default row, plus memory pressure.
        baseline: run this mooncake-py build as a third side, taking turns with the others.
        """
        self.plan = plan
        self.stack = stack
        self.logs = logs
        self.profile = profile
        self.upstream_venv = upstream_venv
        self.tag = f"bench-{os.getpid()}-{time.time_ns() // 1_000_000}"
        self.started = time.perf_counter()
        self.load_at_start = os.getloadavg()  # other programs' load, for reading the spreads
        self.raw_limits: dict[str, tuple[str, dict[str, Any]]] = {}
        self.definitions = catalogue(plan)
        self.restricted = selected is not None
        self.selected = select(self.definitions, None) if selected is None else selected
        self.baseline = baseline
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
        if baseline is not None:
            self.sides.append(
                Side(
                    base.BASELINE,
                    "py",
                    env=baseline.env(),
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

    def py_master(self, name: str, eviction: bool, side: Side) -> MasterProcess:
        """A mooncake-py master of ``side`` (its environment selects the working tree or the
        baseline) on a free port, started (three tries; each failure logged with the master's
        stderr)."""
        # Shorter read leases than the default (10 s): memory of removed keys comes back sooner.
        # No eviction unless asked: the run keeps A's segment under its budget itself.
        args = ["--log_level", "WARNING", "--default_kv_lease_ttl", f"{self.plan.lease_ms}ms"]
        if not eviction:
            args += ["--eviction_high_watermark_ratio", "1.0"]
        for attempt in range(1, 4):
            master = MasterProcess(args=args, env=side.master_env())
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
        for side in self.sides:
            if side.is_py:
                side.address = self.py_master(f"{side.short}-master", False, side).address
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
        needed = {self.definitions[row_id]["limit_id"] for row_id in self.selected}
        for limit_id, label, measure, args in measurements:
            if self.restricted and limit_id not in needed:
                continue  # only the limits of the selected rows
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

    # -- workload bookkeeping --------------------------------------------------------------

    def row(self, side: Side, row_id: str) -> RowAccumulator | None:
        """``side``'s accumulator for a row of the catalogue; None when it is not selected."""
        if row_id not in self.selected:
            return None
        if row_id not in side.rows:
            side.rows[row_id] = RowAccumulator(self.definitions[row_id])
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
        """The sides in the order they take round ``rnd``: the same order every round, so that
        every rep of every side runs right after another side's (rounds run back to back).

        An order alternating between rounds would run the first side of each round right after
        its own previous rep, with its processes and caches still warm; with an odd number of
        kept rounds one side gets that one time more, which moves its median (measured: 5 to 7%
        on cross-process 4 KiB gets when both sides ran the same build). Round ``rnd`` is
        accepted for callers that number their rounds; the first round is a warm-up in every
        mode that compares (its first side follows nobody).
        """
        del rnd  # the order does not depend on it (see above)
        return sides

    def wants(self, group: str, **fields: Any) -> bool:
        """Whether a selected row is in ``group`` and has each of ``fields``' values."""
        return any(
            row["group"] == group and all(row.get(k) == v for k, v in fields.items())
            for row in (self.definitions[row_id] for row_id in self.selected)
        )


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
    # upstream has no forced-TCP path: that phase is mooncake-py's (working tree and baseline)
    phases = [(bench.sides, "shm"), ([side for side in bench.sides if side.is_py], "tcp")]
    phases = [
        (sides, path)
        for sides, path in phases
        if any(bench.wants(group) for group in ((path,) if path == "tcp" else PHASE_GROUPS))
    ]
    parts = len(phases) + 1  # limits before, between and after the store phases
    for part, (sides, path) in enumerate(phases):
        bench.measure_limits(server, bench.payloads, part, parts)
        store_phase(bench, sides, path)
    if bench.upstream_master is not None:
        bench.upstream_master.stop()  # the pressure reps start their own masters
    for rep in range(0 if bench.restricted else plan.pressure_reps):
        for side in bench.turns(bench.sides, rep):
            pressure_rep(bench, side, rep)
    bench.measure_limits(server, bench.payloads, parts - 1, parts)
    lim.release_buffers()
    bench.note("done; stopping every process")


def run(
    quick: bool = False,
    tiny: bool = False,
    profile: str = "",
    upstream_venv: Path | None = None,
    rows: Sequence[str] | None = None,
    baseline_rev: str | None = None,
    rounds: int | None = None,
) -> dict[str, Any]:
    """Run the benchmark; returns the results record (see the module docstring).

    Args:
        upstream_venv: compare with upstream Mooncake from this virtual environment (checked
            by the caller with :func:`tests.bench.upstream.ensure`); None: no upstream side.
        rows: patterns selecting the rows to measure (:func:`tests.bench.rows.select`); the
            phases, limits and rounds no selected row needs are skipped, and so is memory
            pressure. None: every default row and memory pressure.
        baseline_rev: also measure this git revision of mooncake-py, built once into a scratch
            directory (:mod:`tests.bench.baseline`) that is removed at the end, also on error.
        rounds: timed rounds (reps) per workload instead of the mode's (more reps, steadier
            medians); None: the mode's.

    Raises:
        tests.bench.rows.NoSuchRows: a pattern selects nothing (before anything starts).
        tests.bench.baseline.BaselineUnavailable: the revision cannot be resolved or built.
    """
    plan = plan_for(quick, tiny)
    if rounds is not None:
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, not {rounds}")
        plan = dataclasses.replace(plan, rounds=rounds, call_reps=rounds)
    selected = None if rows is None else select(catalogue(plan), rows)
    revision = base.resolve(baseline_rev) if baseline_rev is not None else None
    wall_start = time.time()
    with contextlib.ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mooncake-bench-")))
        build = None
        if revision is not None:
            scratch = stack.enter_context(
                tempfile.TemporaryDirectory(prefix=f"mooncake-bench-baseline-{revision.short}-")
            )
            _log(f"building baseline {revision.rev} = {revision.short} ({revision.subject})")
            build = base.build(revision, Path(scratch))
        bench = Bench(plan, stack, logs, profile, upstream_venv, selected, build)
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
    return results_record(bench, wall_start)


def main(argv: list[str] | None = None) -> int:
    """The command line (:func:`tests.bench.store_bench_cli.main`): exit status 0, 1 when a
    side's reads failed verification, 2 when an argument is unusable."""
    from tests.bench.store_bench_cli import main as cli_main  # it imports this module

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
