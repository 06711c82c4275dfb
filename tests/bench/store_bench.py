"""Store benchmark: mooncake-py's figures next to what this machine can do without it.

Run from the repository root::

    .venv/bin/python -m tests.bench.store_bench [--quick] [--json PATH] [--profile DIR]

It measures the limits (memcpy, loopback socket stream and ping-pong, bare gRPC echo; see
:mod:`tests.bench.limits`), then starts a master and client processes
(:mod:`tests.bench.worker`) on 127.0.0.1 and measures, first over shared memory and then with
``MOONCAKE_PY_FORCE_TCP=1``:

- A (owns a segment) writing with ``batch_put_from``; B (no segment) reading with ``get_into``
  and ``batch_get_into``, and writing with ``put_from`` (its values land in A's segment);
- ``is_exist`` (present and absent key) and ``batch_is_exist`` latency from B.

Keys are fresh every round and removed after it (``batch_remove(force=True)``). The master runs
with 1 s read leases and no eviction; A's segment is written end to end before anything is timed
(first writes into fresh shared memory are many times slower here), and the run keeps what A's
segment holds, including removed-but-still-leased memory, under a budget (:mod:`.plan`).

Every value read is stamp-checked, one call per round is compared byte for byte. The report
(stdout) gives each figure, the matching limit and the fraction reached; the JSON record (default
``bench-results/store-bench-<timestamp>.json``) holds every figure plus the machine and package
versions. Every process started is stopped by its pid at the end, also on error.
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
from tests.bench.common import FORCE_TCP_ENV, ROOT, Child, size_label
from tests.bench.plan import Plan, SegmentBudget, Verification, echo_payloads, plan_for
from tests.bench.report import RowAccumulator, limit_figure, machine, packages, table, values_text


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _stop_and_clean(child: Child) -> None:
    """Stop a child; if it died without closing its store, delete the segment file it left
    (``/dev/shm/mooncake_py-<pid>-<uuid>``, as :mod:`mooncake_py.client.segment` names them)."""
    child.stop()
    for leftover in Path("/dev/shm").glob(f"mooncake_py-{child.pid}-*"):
        with contextlib.suppress(OSError):
            leftover.unlink()


class Bench:
    """One run: its processes, raw measurements and verification record."""

    def __init__(self, plan: Plan, stack: contextlib.ExitStack, logs: Path, profile: str) -> None:
        self.plan = plan
        self.stack = stack
        self.logs = logs
        self.profile = profile
        self.tag = f"bench-{os.getpid()}-{time.time_ns() // 1_000_000}"
        self.started = time.perf_counter()
        self.raw_limits: dict[str, tuple[str, dict[str, Any]]] = {}
        self.rows: dict[str, RowAccumulator] = {}
        self.check = Verification()
        self.budget = SegmentBudget(plan.segment, plan.budget, plan.lease_ms)
        self.pair: tuple[Child, Child] | None = None
        self.waited_s = 0.0
        self.prefill: dict[str, dict[str, float]] = {}
        self.waits: list[tuple[str, float]] = []  # (keys about to be written, seconds waited)
        self.pids: dict[str, int] = {}
        self.payloads: dict[str, int] = {}
        self.master_stderr: collections.deque[str] = collections.deque(maxlen=50)

    def note(self, message: str) -> None:
        _log(f"[{time.perf_counter() - self.started:6.1f}s] {message}")

    # -- processes -------------------------------------------------------------------------

    def child(
        self,
        name: str,
        module: str,
        args: Sequence[str] = (),
        env: dict[str, str | None] | None = None,
    ) -> Child:
        child = Child(name, module, args=args, env=env, log_dir=self.logs)
        self.stack.callback(_stop_and_clean, child)
        self.pids[name] = child.pid
        return child

    def master(self) -> MasterProcess:
        """The master, not started yet; registered now so that it is stopped last."""
        # Shorter read leases than the default (10 s): memory of removed keys comes back sooner.
        # No eviction: the run keeps A's segment under its budget itself, and pre-fills all of it.
        args = ["--log_level", "WARNING", "--default_kv_lease_ttl", f"{self.plan.lease_ms}ms"]
        master = MasterProcess(args=[*args, "--eviction_high_watermark_ratio", "1.0"])
        self.stack.callback(master.stop)
        return master

    def start_master(self, master: MasterProcess) -> str:
        master.start()
        self.pids["master"] = master.pid
        stderr = master.process.stderr if master.process else None
        if stderr is not None:  # drained so that the master never blocks on a full pipe
            threading.Thread(target=self.master_stderr.extend, args=(stderr,), daemon=True).start()
        return master.address

    # -- limits ----------------------------------------------------------------------------

    def measure_limits(self, server: dict[str, Any], payloads: dict[str, int], half: int) -> None:
        """Half of each limit's reps: ``half`` 0 runs before the workloads, 1 after them, so
        that the limits see the same (noisy) machine as the workloads they are compared with.
        """
        plan = self.plan

        def reps(total: int) -> int:
            return max(1, (total + 1 - half) // 2)

        when = "before" if half == 0 else "after"
        self.note(f"limits ({when} the workloads): memcpy, socket stream, ping-pong, grpc echo")
        for size in plan.memcpy_sizes:
            raw = lim.memcpy(size, reps(plan.memcpy_reps))
            self._limit(f"memcpy_{size_label(size)}", f"memcpy {size_label(size)}", raw)
        for size in plan.sizes:
            slots = max(plan.batches.values())
            port = server["stream_port"]
            raw = lim.stream(port, size, plan.stream_bytes, reps(plan.stream_reps), slots)
            self._limit(f"stream_{size_label(size)}", f"stream {size_label(size)} msgs", raw)
        raw = lim.pingpong(server["pong_port"], plan.ping_calls, reps(plan.call_reps))
        self._limit("pingpong", f"ping-pong {lim.PING_BYTES}B", raw)
        for name, payload in payloads.items():
            raw = lim.grpc_echo(server["grpc_port"], payload, plan.echo_calls, reps(plan.call_reps))
            self._limit(f"grpc_echo_{name}", f"grpc echo {payload}B", raw)

    def _limit(self, limit_id: str, label: str, raw: dict[str, Any]) -> None:
        known = self.raw_limits.get(limit_id)
        if known is None:
            self.raw_limits[limit_id] = (label, raw)
            return
        for name in ("times", "rates", "rates_Bps"):
            if name in raw:
                known[1][name] += raw[name]

    def limit_figures(self) -> dict[str, dict[str, Any]]:
        return {key: limit_figure(raw, label) for key, (label, raw) in self.raw_limits.items()}

    def memcpy_limit(self, nbytes: int) -> str:
        """The memcpy limit for a call moving ``nbytes``: the smallest measured size that holds
        them, else the largest."""
        sizes = sorted(self.plan.memcpy_sizes)
        return f"memcpy_{size_label(next((s for s in sizes if s >= nbytes), sizes[-1]))}"

    # -- workloads -------------------------------------------------------------------------

    def row(self, row_id: str, **fields: Any) -> RowAccumulator:
        if row_id not in self.rows:
            self.rows[row_id] = RowAccumulator({"id": row_id, **fields})
        return self.rows[row_id]

    def command(
        self,
        worker: Child,
        kind: str,
        prefix: str,
        n: int,
        size: int,
        batch: int,
        row: RowAccumulator | None = None,
    ) -> dict[str, Any]:
        """One put/get command of ``n`` keys; its calls become one rep of ``row``."""
        answer = self.check.absorb(
            worker.call(cmd=kind, prefix=prefix, n=n, size=size, batch=batch)
        )
        if row is not None:
            row.add(answer)
        return answer

    def workers(self) -> tuple[Child, Child]:
        """A and B of the current phase."""
        assert self.pair is not None, "join() first"
        return self.pair

    def put(
        self,
        worker: Child,
        prefix: str,
        n: int,
        size: int,
        batch: int,
        row: RowAccumulator | None = None,
    ) -> dict[str, Any]:
        waited = self.budget.waited_s
        self.budget.reserve(n * size)
        if self.budget.waited_s > waited:
            self.waits.append((prefix, round(self.budget.waited_s - waited, 3)))
        return self.command(worker, "put", prefix, n, size, batch, row)

    def remove(self, prefix: str, n: int, size: int, leased: bool = True) -> None:
        self.check.absorb(self.workers()[1].call(cmd="remove", prefix=prefix, n=n))
        self.budget.removed(n * size, leased)

    def join(self, master: str, path: str, a: Child, b: Child) -> None:
        """Both clients join; then A's segment is written end to end, by A and (over shared
        memory) by B through its own mapping, so that no timed call pays first-touch page
        faults. Nothing reads those keys, so removing them frees their memory at once.
        """
        plan = self.plan
        self.pair = (a, b)
        self.budget = SegmentBudget(plan.segment, plan.budget, plan.lease_ms)
        buffer = max(size * plan.batches[size] for size in plan.sizes)
        buffer = max(buffer, 256 * plan.meta_value)
        for worker, segment in ((a, plan.segment), (b, 0)):
            profile = str(Path(self.profile) / f"{worker.name}.prof") if self.profile else ""
            worker.call(cmd="setup", master=master, segment=segment, buffer=buffer, profile=profile)
        size = max(plan.sizes)
        batch = plan.batches[size]
        n = max(1, int(plan.segment * plan.prefill) // size)
        self.note(f"{path}: pre-filling A's segment ({n} x {size_label(size)})")
        self.budget.capacity = max(self.budget.capacity, n * size)
        record: dict[str, float] = {"bytes": n * size}
        for who, worker in (("a", a), ("b", b)) if path == "shm" else (("a", a),):
            prefix = f"{self.tag}/{path}/prefill-{who}"
            record[f"{who}_put_s"] = sum(self.put(worker, prefix, n, size, batch)["times"])
            self.remove(prefix, n, size, leased=False)
        self.budget.capacity = int(plan.segment * plan.budget)
        self.prefill[path] = record

    def data_phase(self, path: str) -> None:
        """A writes, B reads; B writes into A's segment. Keys are fresh every round."""
        plan = self.plan
        a, b = self.workers()
        title = "shm" if path == "shm" else "TCP"
        for size in plan.sizes:
            label, batch, n = size_label(size), plan.batches[size], plan.values[size]

            def limit_of(nbytes: int, label: str = label) -> str:
                return self.memcpy_limit(nbytes) if path == "shm" else f"stream_{label}"

            common = {"path": path, "size": size, "unit": "MB/s"}
            a_put = self.row(
                f"{path}.a.batch_put_from.{label}",
                **common,
                op="batch_put_from",
                batch=batch,
                label=f"{title} A batch_put_from {label} x{batch}",
                limit_id=limit_of(size * batch),
            )
            get = self.row(
                f"{path}.b.get_into.{label}",
                **common,
                op="get_into",
                batch=1,
                label=f"{title} B get_into {label}",
                limit_id=limit_of(size),
            )
            batch_get = self.row(
                f"{path}.b.batch_get_into.{label}",
                **common,
                op="batch_get_into",
                batch=batch,
                label=f"{title} B batch_get_into {label} x{batch}",
                limit_id=limit_of(size * batch),
            )
            b_put = self.row(
                f"{path}.b.put_from.{label}",
                **common,
                op="put_from",
                batch=1,
                label=f"{title} B put_from {label} (into A)",
                limit_id=limit_of(size),
            )
            for rnd in range(plan.warmup + plan.rounds):
                keep = rnd >= plan.warmup
                self.note(f"{path} {label} round {rnd + 1}/{plan.warmup + plan.rounds}")
                prefix = f"{self.tag}/{path}/{label}/r{rnd}"
                self.put(a, f"{prefix}/a", n, size, batch, a_put if keep else None)
                self.command(b, "get", f"{prefix}/a", n, size, 1, get if keep else None)
                self.command(b, "get", f"{prefix}/a", n, size, batch, batch_get if keep else None)
                self.remove(f"{prefix}/a", n, size)
                self.put(b, f"{prefix}/b", n, size, 1, b_put if keep else None)
                self.command(b, "get", f"{prefix}/b", n, size, batch)  # verification only
                self.remove(f"{prefix}/b", n, size)

    def metadata_phase(self) -> None:
        """is_exist from B (present / absent key), then batch_is_exist of each size."""
        plan = self.plan
        a, b = self.workers()
        keys = max(plan.batch_exist_sizes)
        prefix, absent = f"{self.tag}/meta", f"{self.tag}/absent"
        self.note(f"metadata: writing {keys} small keys")
        self.put(a, prefix, keys, plan.meta_value, min(keys, 256))
        present_row = self.row(
            "meta.is_exist.present",
            op="is_exist",
            unit="ops/s",
            batch=1,
            label="B is_exist, present key",
            limit_id="grpc_echo_ExistKey",
        )
        absent_row = self.row(
            "meta.is_exist.absent",
            op="is_exist",
            unit="ops/s",
            batch=1,
            label="B is_exist, absent key",
            limit_id="grpc_echo_ExistKey",
        )
        self.note("metadata: is_exist")
        for rep in range(plan.call_reps + 1):  # rep 0 warms up
            for row, key_prefix, expect in ((present_row, prefix, 1), (absent_row, absent, 0)):
                answer = self.check.absorb(
                    b.call(
                        cmd="exist",
                        prefix=key_prefix,
                        n=keys,
                        calls=plan.exist_calls,
                        expect=expect,
                    )
                )
                if rep:
                    row.add(answer, work_per_call=1)
        for size in plan.batch_exist_sizes:
            self.note(f"metadata: batch_is_exist {size}")
            row = self.row(
                f"meta.batch_is_exist.{size}",
                op="batch_is_exist",
                unit="keys/s",
                batch=size,
                label=f"B batch_is_exist {size} keys",
                limit_id=f"grpc_echo_BatchExistKey{size}",
                limit_scale=size,
            )
            calls = plan.batch_exist_calls[size]
            for rep in range(plan.call_reps + 1):
                answer = self.check.absorb(
                    b.call(cmd="batch_exist", prefix=prefix, n=size, calls=calls)
                )
                if rep:
                    row.add(answer, work_per_call=size)
        self.remove(prefix, keys, plan.meta_value)


def _run_phases(bench: Bench) -> None:
    plan = bench.plan
    bench.note(f"mode {plan.mode}: starting the master and the client processes")
    master = bench.master()
    limit_servers = [
        bench.child(f"limits-{role}", "tests.bench.limits", args=[role])
        for role in ("sockets", "grpc")
    ]
    pairs = {
        path: (
            bench.child(f"{path}-A", "tests.bench.worker", env={FORCE_TCP_ENV: force}),
            bench.child(f"{path}-B", "tests.bench.worker", env={FORCE_TCP_ENV: force}),
        )
        for path, force in (("shm", None), ("tcp", "1"))
    }
    address = bench.start_master(master)
    server = {k: v for child in limit_servers for k, v in child.receive(timeout_s=60).items()}
    for a, b in pairs.values():
        a.receive(timeout_s=60)
        b.receive(timeout_s=60)
    bench.payloads = echo_payloads(bench.tag, plan.batch_exist_sizes)
    bench.measure_limits(server, bench.payloads, half=0)
    for path, (a, b) in pairs.items():
        bench.note(f"{path}: joining the store")
        bench.join(address, path, a, b)
        bench.data_phase(path)
        if path == "shm":
            bench.metadata_phase()
        bench.waited_s += bench.budget.waited_s
        b.stop()
        a.stop()
    bench.measure_limits(server, bench.payloads, half=1)
    bench.note("done; stopping the master")


def run(quick: bool = False, tiny: bool = False, profile: str = "") -> dict[str, Any]:
    """Run the whole benchmark; returns the results record (see the module docstring)."""
    plan = plan_for(quick, tiny)
    wall_start = time.time()
    with contextlib.ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mooncake-bench-")))
        bench = Bench(plan, stack, logs, profile)
        try:
            _run_phases(bench)
        except BaseException:
            if bench.master_stderr:
                _log("master's last stderr lines:\n" + "".join(bench.master_stderr))
            raise
    limits = bench.limit_figures()
    order = {"shm": 0, "tcp": 1}
    rows = sorted(bench.rows.values(), key=lambda acc: order.get(acc.row.get("path", ""), 2))
    figures = [acc.figure(limits) for acc in rows]
    return {
        "schema": 1,
        "mode": plan.mode,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(wall_start)),
        "duration_s": time.time() - wall_start,
        "machine": machine(),
        "packages": packages(),
        "params": {
            **{k: v for k, v in dataclasses.asdict(plan).items() if k not in ("values",)},
            "values": values_text(plan.sizes, plan.values),
            "values_per_round": {size_label(s): n for s, n in plan.values.items()},
            "echo_payload_bytes": bench.payloads,
        },
        "limits": limits,
        "rows": figures,
        "verification": bench.check.summary(),
        "pids": bench.pids,
        "budget_wait_s": bench.waited_s,
        "budget_waits": bench.waits,
        "prefill": bench.prefill,
    }


def default_json_path() -> Path:
    return ROOT / "bench-results" / f"store-bench-{time.strftime('%Y%m%d-%H%M%S')}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (< 60 s)")
    parser.add_argument("--tiny", action="store_true", help="plumbing check on small values")
    parser.add_argument("--json", type=Path, default=None, help="where to write the JSON record")
    parser.add_argument("--profile", default="", help="directory for workers' cProfile dumps")
    args = parser.parse_args(argv)

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through run(), which stops every process

    signal.signal(signal.SIGTERM, terminate)
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        args.profile = str(Path(args.profile).resolve())
    results = run(quick=args.quick, tiny=args.tiny, profile=args.profile)
    path: Path = args.json or default_json_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    print(table(results))
    print(f"\nJSON: {path}")
    return 0 if results["verification"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
