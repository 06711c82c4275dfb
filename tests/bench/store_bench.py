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
from pathlib import Path
from typing import Any

from mooncake_py._proto import master_pb2 as pb
from mooncake_py.testing import MasterProcess
from tests.bench import limits as lim
from tests.bench.common import FORCE_TCP_ENV, GIB, KIB, MIB, ROOT, Child, size_label
from tests.bench.report import RowAccumulator, limit_figure, machine, packages, table, values_text


@dataclasses.dataclass(frozen=True)
class Plan:
    """How much of everything one run does."""

    mode: str
    sizes: tuple[int, ...]
    batches: dict[int, int]
    values: dict[int, int]
    rounds: int
    warmup: int
    segment: int
    memcpy_sizes: tuple[int, ...]
    memcpy_reps: int
    stream_bytes: int
    stream_reps: int
    ping_calls: int
    echo_calls: int
    exist_calls: int
    batch_exist_sizes: tuple[int, ...]
    batch_exist_calls: dict[int, int]
    call_reps: int
    meta_value: int = 64


def plan_for(quick: bool, tiny: bool) -> Plan:
    """Full run (a few minutes), ``quick`` (under a minute) or ``tiny`` (plumbing only)."""
    sizes = (1 * MIB, 4 * MIB)
    full = Plan(
        mode="full",
        sizes=sizes,
        batches={1 * MIB: 16, 4 * MIB: 32},
        values=dict.fromkeys(sizes, 128),
        rounds=5,
        warmup=1,
        segment=1 * GIB,
        memcpy_sizes=(16 * MIB, 256 * MIB),
        memcpy_reps=21,
        stream_bytes=256 * MIB,
        stream_reps=11,
        ping_calls=1000,
        echo_calls=500,
        exist_calls=500,
        batch_exist_sizes=(128, 1024),
        batch_exist_calls={128: 50, 1024: 10},
        call_reps=5,
    )
    if quick and not tiny:
        return dataclasses.replace(
            full,
            mode="quick",
            values=dict.fromkeys(sizes, 32),
            rounds=3,
            memcpy_reps=7,
            stream_bytes=128 * MIB,
            stream_reps=5,
            ping_calls=500,
            echo_calls=300,
            exist_calls=300,
            batch_exist_calls={128: 20, 1024: 5},
            call_reps=3,
        )
    if not tiny:
        return full
    small = (64 * KIB, 256 * KIB)
    return dataclasses.replace(
        full,
        mode="tiny",
        sizes=small,
        batches=dict.fromkeys(small, 4),
        values=dict.fromkeys(small, 8),
        rounds=1,
        warmup=0,
        segment=64 * MIB,
        memcpy_sizes=(1 * MIB, 4 * MIB),
        memcpy_reps=3,
        stream_bytes=4 * MIB,
        stream_reps=2,
        ping_calls=50,
        echo_calls=50,
        exist_calls=30,
        batch_exist_sizes=(16, 64),
        batch_exist_calls={16: 3, 64: 3},
        call_reps=2,
    )


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Verification:
    """What the readers checked, over the whole run."""

    def __init__(self) -> None:
        self.stamps_checked = 0
        self.full_checked = 0
        self.error_count = 0
        self.errors: list[str] = []

    def absorb(self, answer: dict[str, Any]) -> dict[str, Any]:
        self.stamps_checked += answer.get("stamps_checked", 0)
        self.full_checked += answer.get("full_checked", 0)
        errors = answer.get("errors", [])
        self.error_count += answer.get("error_count", len(errors))
        self.errors += errors[: max(0, 50 - len(self.errors))]
        return answer

    def summary(self) -> dict[str, Any]:
        ok = self.error_count == 0 and self.stamps_checked > 0 and self.full_checked > 0
        return {
            "ok": ok,
            "stamps_checked": self.stamps_checked,
            "full_checked": self.full_checked,
            "error_count": self.error_count,
            "errors": self.errors,
        }


class Bench:
    """One run: its processes, raw measurements and verification record."""

    def __init__(self, plan: Plan, stack: contextlib.ExitStack, logs: Path, profile: str) -> None:
        self.plan = plan
        self.stack = stack
        self.logs = logs
        self.profile = profile
        self.tag = f"bench-{os.getpid()}-{time.time_ns() // 1_000_000}"
        self.started = time.perf_counter()
        self.limits: dict[str, dict[str, Any]] = {}
        self.rows: dict[str, RowAccumulator] = {}
        self.check = Verification()
        self.pids: dict[str, int] = {}
        self.master_stderr: collections.deque[str] = collections.deque(maxlen=50)

    def note(self, message: str) -> None:
        _log(f"[{time.perf_counter() - self.started:6.1f}s] {message}")

    # -- processes -------------------------------------------------------------------------

    def child(self, name: str, module: str, env: dict[str, str | None] | None = None) -> Child:
        child = Child(name, module, env=env, log_dir=self.logs)
        self.stack.callback(child.stop)
        self.pids[name] = child.pid
        return child

    def start_master(self) -> str:
        master = MasterProcess(args=["--log_level", "WARNING"])
        self.stack.callback(master.stop)
        master.start()
        self.pids["master"] = master.pid
        stderr = master.process.stderr if master.process else None
        if stderr is not None:  # drained so that the master never blocks on a full pipe
            threading.Thread(target=self.master_stderr.extend, args=(stderr,), daemon=True).start()
        return master.address

    # -- limits ----------------------------------------------------------------------------

    def measure_limits(self, server: dict[str, Any], echo_payloads: dict[str, int]) -> None:
        plan = self.plan
        for size in plan.memcpy_sizes:
            self.note(f"limit: memcpy {size_label(size)}")
            raw = lim.memcpy(size, plan.memcpy_reps)
            self._limit(f"memcpy_{size_label(size)}", f"memcpy {size_label(size)} (1 thread)", raw)
        for size in plan.sizes:
            self.note(f"limit: socket stream {size_label(size)}")
            raw = lim.stream(
                server["stream_port"],
                size,
                plan.stream_bytes,
                plan.stream_reps,
                max(plan.batches.values()),
            )
            label = f"socket stream {size_label(size)} msgs (2 procs)"
            self._limit(f"stream_{size_label(size)}", label, raw)
        self.note("limit: socket ping-pong")
        raw = lim.pingpong(server["pong_port"], plan.ping_calls, plan.call_reps)
        self._limit("pingpong", f"socket ping-pong {lim.PING_BYTES}B", raw)
        for name, payload in echo_payloads.items():
            self.note(f"limit: grpc echo {payload} B")
            raw = lim.grpc_echo(server["grpc_port"], payload, plan.echo_calls, plan.call_reps)
            self._limit(f"grpc_echo_{name}", f"grpc echo {payload}B ({name} size)", raw)

    def _limit(self, limit_id: str, label: str, raw: dict[str, Any]) -> None:
        self.limits[limit_id] = limit_figure(raw, label)

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

    def data_phase(self, path: str, a: Child, b: Child) -> None:
        """A writes, B reads; B writes into A's segment. Keys are fresh every round."""
        plan = self.plan
        title = "shm" if path == "shm" else "TCP"
        for size in plan.sizes:
            label, batch, n = size_label(size), plan.batches[size], plan.values[size]

            def limit_of(nbytes: int, label: str = label) -> str:
                return self.memcpy_limit(nbytes) if path == "shm" else f"stream_{label}"

            common = {"path": path, "size": size, "unit": "MB/s"}
            rows = {
                "a_put": self.row(
                    f"{path}.a.batch_put_from.{label}",
                    **common,
                    op="batch_put_from",
                    batch=batch,
                    label=f"{title} A batch_put_from {label} x{batch}",
                    limit_id=limit_of(size * batch),
                ),
                "get": self.row(
                    f"{path}.b.get_into.{label}",
                    **common,
                    op="get_into",
                    batch=1,
                    label=f"{title} B get_into {label}",
                    limit_id=limit_of(size),
                ),
                "batch_get": self.row(
                    f"{path}.b.batch_get_into.{label}",
                    **common,
                    op="batch_get_into",
                    batch=batch,
                    label=f"{title} B batch_get_into {label} x{batch}",
                    limit_id=limit_of(size * batch),
                ),
                "b_put": self.row(
                    f"{path}.b.put_from.{label}",
                    **common,
                    op="put_from",
                    batch=1,
                    label=f"{title} B put_from {label} (into A)",
                    limit_id=limit_of(size),
                ),
            }
            for rnd in range(plan.warmup + plan.rounds):
                keep = rnd >= plan.warmup
                self.note(f"{path} {label} round {rnd + 1}/{plan.warmup + plan.rounds}")
                prefix = f"{self.tag}/{path}/{label}/r{rnd}"
                for who, worker, key_batch, row_name, kind in (
                    ("a", a, batch, "a_put", "put"),
                    ("a", b, 1, "get", "get"),
                    ("a", b, batch, "batch_get", "get"),
                    ("b", b, 1, "b_put", "put"),
                    ("b", b, batch, "", "get"),  # read B's values back: verification only
                ):
                    answer = self.check.absorb(
                        worker.call(
                            cmd=kind, prefix=f"{prefix}/{who}", n=n, size=size, batch=key_batch
                        )
                    )
                    if keep and row_name:
                        rows[row_name].add(answer)
                    if row_name == "batch_get" or not row_name:
                        self.check.absorb(b.call(cmd="remove", prefix=f"{prefix}/{who}", n=n))

    def metadata_phase(self, a: Child, b: Child) -> None:
        """is_exist from B (present / absent key), then batch_is_exist of each size."""
        plan = self.plan
        keys = max(plan.batch_exist_sizes)
        prefix, absent = f"{self.tag}/meta", f"{self.tag}/absent"
        self.note(f"metadata: writing {keys} small keys")
        self.check.absorb(
            a.call(cmd="put", prefix=prefix, n=keys, size=plan.meta_value, batch=min(keys, 256))
        )
        present_row = self.row(
            "meta.is_exist.present",
            op="is_exist",
            unit="ops/s",
            batch=1,
            label="is_exist (present key), B",
            limit_id="grpc_echo_ExistKey",
        )
        absent_row = self.row(
            "meta.is_exist.absent",
            op="is_exist",
            unit="ops/s",
            batch=1,
            label="is_exist (absent key), B",
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
                label=f"batch_is_exist {size} keys, B",
                limit_id=f"grpc_echo_BatchExistKey{size}",
                limit_scale=size,
            )
            for rep in range(plan.call_reps + 1):
                answer = self.check.absorb(
                    b.call(
                        cmd="batch_exist", prefix=prefix, n=size, calls=plan.batch_exist_calls[size]
                    )
                )
                if rep:
                    row.add(answer, work_per_call=size)
        self.check.absorb(b.call(cmd="remove", prefix=prefix, n=keys))

    def setup_pair(self, master: str, a: Child, b: Child) -> None:
        buffer = max(size * self.plan.batches[size] for size in self.plan.sizes)
        buffer = max(buffer, 256 * self.plan.meta_value)
        for worker, segment in ((a, self.plan.segment), (b, 0)):
            profile = str(Path(self.profile) / f"{worker.name}.prof") if self.profile else ""
            worker.call(cmd="setup", master=master, segment=segment, buffer=buffer, profile=profile)


def echo_payloads(tag: str, batch_sizes: tuple[int, ...]) -> dict[str, int]:
    """Serialized sizes of the master requests the metadata rows make (the echo payloads)."""
    key = f"{tag}/meta/{0:06d}"
    sizes = {"ExistKey": pb.KeyRequest(key=key, tenant_id="default").ByteSize()}
    for n in batch_sizes:
        keys = [f"{tag}/meta/{i:06d}" for i in range(n)]
        sizes[f"BatchExistKey{n}"] = pb.BatchKeysRequest(keys=keys, tenant_id="default").ByteSize()
    return sizes


def run(quick: bool = False, tiny: bool = False, profile: str = "") -> dict[str, Any]:
    """Run the whole benchmark; returns the results record (see the module docstring)."""
    plan = plan_for(quick, tiny)
    wall_start = time.time()
    with contextlib.ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mooncake-bench-")))
        bench = Bench(plan, stack, logs, profile)
        bench.note(f"mode {plan.mode}: starting the master and the client processes")
        limit_server = bench.child("limits", "tests.bench.limits")
        pairs = {
            path: (
                bench.child(f"{path}-A", "tests.bench.worker", env={FORCE_TCP_ENV: force}),
                bench.child(f"{path}-B", "tests.bench.worker", env={FORCE_TCP_ENV: force}),
            )
            for path, force in (("shm", None), ("tcp", "1"))
        }
        master = bench.start_master()
        server = limit_server.receive(timeout_s=60)
        for a, b in pairs.values():
            a.receive(timeout_s=60)
            b.receive(timeout_s=60)
        payloads = echo_payloads(bench.tag, plan.batch_exist_sizes)
        bench.measure_limits(server, payloads)
        limit_server.stop()
        for path, (a, b) in pairs.items():
            bench.note(f"{path}: joining the store")
            bench.setup_pair(master, a, b)
            bench.data_phase(path, a, b)
            if path == "shm":
                bench.metadata_phase(a, b)
            b.stop()
            a.stop()
        bench.note("done; stopping the master")
    figures = [acc.figure(bench.limits) for acc in bench.rows.values()]
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
            "echo_payload_bytes": payloads,
        },
        "limits": bench.limits,
        "rows": figures,
        "verification": bench.check.summary(),
        "pids": bench.pids,
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
