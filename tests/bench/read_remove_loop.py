"""Put, read once, force-remove, repeat: how the read lease decides whether the loop works.

Run as ``python -m tests.bench.read_remove_loop [options]`` from the repository root (it is a
benchmark, not a test). For each lease in ``--leases`` (milliseconds) it starts a master
subprocess with ``--default_kv_lease_ttl LEASE`` and one client process contributing a
``--segment-mib`` segment (1 GiB), which runs ``--rounds`` rounds of:

1. ``put`` ``--values`` values of ``--value-mib`` MiB (keys ``rrl/0`` .. ``rrl/N-1``, the same
   keys every round);
2. ``get`` each key once and compare every byte with what this round wrote;
3. ``batch_remove(keys, force=True)``.

(Its timed counterpart, one small key per round, is the store benchmark's row
``local.read_remove_write.4KiB``: ``get``, forced ``remove``, ``put`` again, in rounds/s, for
mooncake-py and upstream taking turns; see :mod:`tests.bench.store_bench`.)

A get fails when it returns empty bytes, or bytes other than this round's value ("stale" when
they are an earlier round's value of the key, e.g. because a put reported 0 but kept the old
bytes, "wrong" otherwise). The table gives, per lease: puts ok / failed, gets ok / failed
(of them: empty although the put returned 0, stale, wrong), removes that failed, get latency
(median / max ms) and the seconds the rounds took.

``--pressure`` adds a memory-pressure run per lease, on a fresh master with a client of
``--pressure-segment-mib`` (256 MiB): ``--pressure-factor`` (3) times the segment is written
in ``--pressure-value-mib`` (1 MiB) values, keys cycling over ``--pressure-keys`` names (default
twice what the segment holds), each read back with ``get`` right after its put; then
``remove_all()`` (without force) and the objects still present are counted with
``batch_is_exist`` over every key (and, for mooncake-py, the master's object count).

``--compare-mooncake`` runs the same loops against upstream Mooncake Store when it is usable:
``mooncake.store`` importable by this interpreter or by the interpreter of upstream's virtual
environment (:func:`tests.bench.upstream.default_venv`, ``--upstream-venv``), and its
``mooncake_master`` found; otherwise it says what is missing and runs mooncake-py alone.
Nothing is installed.

The client runs in a child process (this module with ``--child``) that imports only the
standard library, numpy, :mod:`tests.bench.common`, :mod:`tests.bench.worker` and the store,
so it runs in upstream's virtual environment too. Child output (stderr) and the masters' logs
go to ``--log-dir`` (default: a fresh temporary directory, printed).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.bench.common import MIB, protocol_stdout, reply
from tests.bench.worker import store_class, versions

STAMP_BYTES = 16
PATTERN_SEED = 7_000_001
EXIST_CHUNK = 256
CHILD_TIMEOUT_S = 3600.0
PY = "mooncake-py"
UPSTREAM = "upstream"


# ----------------------------------------------------------------------------------------------
# Child side: one store, driven by JSON lines on stdin.


def stamp(key: str, generation: int) -> bytes:
    """The first bytes of the value ``key`` gets in round (or write) ``generation``."""
    return hashlib.blake2b(f"{key}#{generation}".encode(), digest_size=STAMP_BYTES).digest()


def body(size: int) -> bytes:
    """The pseudo-random bytes every value shares (its first 16 bytes are then replaced)."""
    return np.random.default_rng(PATTERN_SEED).integers(0, 256, size, dtype=np.uint8).tobytes()


def _code_counts(codes: Counter[int]) -> dict[str, int]:
    return {str(code): count for code, count in sorted(codes.items())}


class LoopClient:
    """The child's store and its commands (each returns one JSON-able dict)."""

    def __init__(self, impl: str) -> None:
        self.impl = impl
        self.store = store_class("upstream" if impl == UPSTREAM else "py")()
        self.ready = False

    def setup(self, master: str, segment: int, metadata: str, local_buffer: int) -> dict[str, Any]:
        """Join the store contributing ``segment`` bytes.

        Raises:
            RuntimeError: setup returned a nonzero code.
        """
        started = time.perf_counter()
        code = self.store.setup("127.0.0.1", metadata, segment, local_buffer, "tcp", "", master)
        if code != 0:
            raise RuntimeError(f"setup failed with {code}")
        self.ready = True
        return {"setup_s": time.perf_counter() - started, "hostname": self.store.get_hostname()}

    def loop(self, rounds: int, values: int, value_bytes: int) -> dict[str, Any]:
        """The put / get / batch_remove(force=True) rounds; counts of every outcome."""
        shared = body(value_bytes)[STAMP_BYTES:]
        keys = [f"rrl/{i}" for i in range(values)]
        put_codes: Counter[int] = Counter()
        remove_codes: Counter[int] = Counter()
        gets = Counter[str]()
        round_s: list[float] = []
        get_ms: list[float] = []
        started = time.perf_counter()
        for generation in range(rounds):
            begun = time.perf_counter()
            failed_puts: set[str] = set()
            for key in keys:
                code = self.store.put(key, stamp(key, generation) + shared)
                put_codes[code] += 1
                if code != 0:
                    failed_puts.add(key)
            for key in keys:
                called = time.perf_counter()
                data = self.store.get(key)
                get_ms.append((time.perf_counter() - called) * 1000.0)
                outcome = self._classify(key, data, generation, shared)
                gets[outcome + ("_after_failed_put" if key in failed_puts else "")] += 1
            for code in self.store.batch_remove(keys, True):
                remove_codes[int(code)] += 1
            round_s.append(time.perf_counter() - begun)
        seconds = time.perf_counter() - started
        return {
            "puts_ok": put_codes[0],
            "puts_failed": sum(put_codes.values()) - put_codes[0],
            "put_codes": _code_counts(put_codes),
            "gets": dict(gets),
            "removes_failed": sum(remove_codes.values()) - remove_codes[0],
            "remove_codes": _code_counts(remove_codes),
            "seconds": seconds,
            "round_s": round_s,
            "get_ms_p50": float(np.median(get_ms)) if get_ms else 0.0,
            "get_ms_max": max(get_ms, default=0.0),
        }

    @staticmethod
    def _classify(key: str, data: bytes, generation: int, shared: bytes) -> str:
        """``ok`` (every byte is this round's), ``empty``, ``stale`` (an earlier round's
        value of the key) or ``wrong`` (anything else)."""
        if not data:
            return "empty"
        if data == stamp(key, generation) + shared:
            return "ok"
        head = data[:STAMP_BYTES]
        earlier = any(head == stamp(key, g) for g in range(generation))
        if earlier and len(data) == STAMP_BYTES + len(shared) and data[STAMP_BYTES:] == shared:
            return "stale"
        return "wrong"

    def pressure(self, writes: int, keys: int, value_bytes: int) -> dict[str, Any]:
        """Write ``writes`` values cycling over ``keys`` names, each read back right away;
        then ``remove_all()`` and count what is left."""
        shared = body(value_bytes)[STAMP_BYTES:]
        names = [f"rrp/{i}" for i in range(keys)]
        put_codes: Counter[int] = Counter()
        gets = Counter[str]()
        started = time.perf_counter()
        for i in range(writes):
            key = names[i % keys]
            expected = stamp(key, 0) + shared  # the same bytes for every write of a key
            code = self.store.put(key, expected)
            put_codes[code] += 1
            data = self.store.get(key)
            if not data:
                outcome = "empty"
            elif data == expected:
                outcome = "ok"
            else:
                outcome = "wrong"
            gets[f"{outcome}{'' if code == 0 else '_after_failed_put'}"] += 1
        seconds = time.perf_counter() - started
        removed = self.store.remove_all()
        present = 0
        exist_errors: Counter[int] = Counter()
        for start in range(0, keys, EXIST_CHUNK):
            for code in self.store.batch_is_exist(names[start : start + EXIST_CHUNK]):
                if code == 1:
                    present += 1
                elif code < 0:
                    exist_errors[int(code)] += 1
        master_objects = None
        client = getattr(self.store, "client", None)
        if client is not None and hasattr(client, "stats"):
            master_objects = int(client.stats().get("objects", -1))
        return {
            "writes": writes,
            "keys": keys,
            "puts_ok": put_codes[0],
            "puts_failed": writes - put_codes[0],
            "put_codes": _code_counts(put_codes),
            "gets": dict(gets),
            "seconds": seconds,
            "remove_all": int(removed),
            "present_after_remove_all": present,
            "exist_errors": _code_counts(exist_errors),
            "master_objects": master_objects,
        }

    def close(self) -> None:
        if self.ready:
            self.store.close()
            self.ready = False


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def child_main(impl: str) -> int:
    """Serve ``setup`` / ``loop`` / ``pressure`` / ``quit`` commands; always close the store."""
    out = protocol_stdout()
    signal.signal(signal.SIGTERM, _raise_exit)
    try:
        client = LoopClient(impl)
    except Exception as exc:  # an import or load failure, answered so the parent can tell
        reply(out, {"error": f"{impl} store unavailable: {type(exc).__name__}: {exc}"})
        return 1
    reply(out, {"ready": True, "pid": os.getpid(), "versions": versions(_worker_impl(impl))})
    try:
        for line in sys.stdin:
            command: dict[str, Any] = json.loads(line)
            name = command.pop("cmd")
            if name == "quit":
                reply(out, {"ok": True})
                break
            try:
                if name not in ("setup", "loop", "pressure"):
                    raise ValueError(f"unknown command {name!r}")
                reply(out, getattr(client, name)(**command))
            except Exception as exc:  # answered, so the parent reports it
                reply(out, {"error": f"{name}: {type(exc).__name__}: {exc}"})
    finally:
        client.close()
    return 0


def _worker_impl(impl: str) -> str:
    return "upstream" if impl == UPSTREAM else "py"


# ----------------------------------------------------------------------------------------------
# Parent side.


@dataclass
class Side:
    """One implementation to run: its name, the interpreter of its client, its venv."""

    name: str
    python: str
    venv: Path | None = None


def _upstream_side(venv_arg: Path | None) -> tuple[Side | None, str]:
    """Upstream's side if it is usable here, else None and why not."""
    from tests.bench import upstream as up

    if venv_arg is None and importlib.util.find_spec("mooncake") is not None:
        here = Path(sys.prefix)
        if importlib.util.find_spec("mooncake.store") and up.master_binary(here) is not None:
            return Side(UPSTREAM, sys.executable, here), ""
    venv = (venv_arg or up.default_venv()).resolve()
    try:
        python = up.ensure(venv, install_deps=False)
    except up.UpstreamUnavailable as exc:
        return None, str(exc)
    return Side(UPSTREAM, str(python), venv), ""


class _Master:
    """A started master of either implementation, with what to tell its clients."""

    def __init__(self, side: Side, lease_ms: int, log_dir: Path, name: str) -> None:
        self.metadata = "P2PHANDSHAKE"
        self.flags: list[str] = []
        if side.name == UPSTREAM:
            from tests.bench import upstream as up

            assert side.venv is not None
            self.upstream: Any = up.UpstreamMaster(
                side.venv, log_dir / f"{name}.log", lease_ms, eviction=True
            ).start()
            self.address = self.upstream.address
            self.metadata = self.upstream.metadata
            self.flags = [f"--default_kv_lease_ttl={lease_ms}", "(upstream eviction defaults)"]
            self.py: Any = None
        else:
            from mooncake_py.testing import MasterProcess

            self.flags = ["--default_kv_lease_ttl", str(lease_ms)]
            self.py = MasterProcess(args=self.flags).start()
            self.address = self.py.address
            self.upstream = None

    def stop(self) -> None:
        (self.py or self.upstream).stop()


def py_master_settings(lease_ms: int) -> dict[str, Any]:
    """The mooncake-py master's effective settings for ``--default_kv_lease_ttl lease_ms``."""
    try:
        from mooncake_py.master.config import parse_args

        config = parse_args(["--default_kv_lease_ttl", str(lease_ms)])
    except Exception as exc:  # the report says so instead of failing the benchmark
        return {"error": f"{type(exc).__name__}: {exc}"}
    names = (
        "default_kv_lease_ttl",
        "eviction_high_watermark_ratio",
        "eviction_ratio",
        "put_start_discard_timeout_sec",
        "put_start_release_timeout_sec",
        "allocation_strategy",
        "client_ttl",
        "allow_evict_soft_pinned_objects",
    )
    return {name: getattr(config, name) for name in names if hasattr(config, name)}


def _run_one(
    side: Side,
    lease_ms: int,
    log_dir: Path,
    kind: str,
    segment: int,
    local_buffer: int,
    command: dict[str, Any],
) -> dict[str, Any]:
    """Start a master and a client child, run one command, stop both (by pid)."""
    from tests.bench import upstream as up
    from tests.bench.common import Child, ChildError

    name = f"{'up' if side.name == UPSTREAM else 'py'}-{kind}-{lease_ms}ms"
    master = _Master(side, lease_ms, log_dir, f"{name}-master")
    env: dict[str, str | None] = dict(up.CLIENT_ENV) if side.name == UPSTREAM else {}
    child = Child(
        name,
        "tests.bench.read_remove_loop",
        args=["--child", "--impl", side.name],
        env=env,
        log_dir=log_dir,
        python=side.python,
    )
    try:
        hello = child.receive(120)
        setup = child.call(
            120,
            cmd="setup",
            master=master.address,
            segment=segment,
            metadata=master.metadata,
            local_buffer=local_buffer,
        )
        result = child.call(CHILD_TIMEOUT_S, **command)
        child.call(30, cmd="quit")
        return {
            **result,
            "lease_ms": lease_ms,
            "master_flags": master.flags,
            "setup_s": setup["setup_s"],
            "versions": hello.get("versions", {}),
        }
    except ChildError as exc:
        return {"lease_ms": lease_ms, "error": str(exc), "master_flags": master.flags}
    finally:
        child.stop()
        master.stop()


def _loop_table(side: str, rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"read-remove loop, {side}",
        f"{'lease':>9} | {'puts ok/failed':>14} | {'gets ok/failed':>14} | "
        f"{'empty*/stale/wrong':>18} | {'rm failed':>9} | {'get ms p50/max':>14} | {'seconds':>8}",
    ]
    for row in rows:
        lease = f"{row['lease_ms']} ms"
        if "error" in row:
            lines.append(f"{lease:>9} | ERROR: {row['error'].splitlines()[0]}")
            continue
        gets = row["gets"]
        ok = gets.get("ok", 0)
        failed = sum(gets.values()) - ok
        stale = gets.get("stale", 0) + gets.get("stale_after_failed_put", 0)
        wrong = gets.get("wrong", 0) + gets.get("wrong_after_failed_put", 0)
        detail = f"{gets.get('empty', 0)}/{stale}/{wrong}"
        lines.append(
            f"{lease:>9} | {row['puts_ok']:>6}/{row['puts_failed']:<7} | {ok:>6}/{failed:<7} | "
            f"{detail:>18} | {row['removes_failed']:>9} | "
            f"{row['get_ms_p50']:>6.1f}/{row['get_ms_max']:<7.1f} | {row['seconds']:>8.2f}"
        )
    lines.append("  empty*: get returned b'' although this round's put of the key returned 0")
    for row in rows:
        if "error" not in row and (row["puts_failed"] or row["removes_failed"]):
            lines.append(
                f"  {row['lease_ms']} ms: put codes {row['put_codes']}, "
                f"remove codes {row['remove_codes']}, gets {row['gets']}"
            )
    return lines


def _pressure_table(side: str, rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"memory pressure, {side}",
        f"{'lease':>9} | {'puts ok/failed':>14} | {'gets ok/failed':>14} | "
        f"{'failed after ok put':>19} | {'remove_all':>10} | {'remain':>6} | "
        f"{'master objs':>11} | {'seconds':>8}",
    ]
    for row in rows:
        lease = f"{row['lease_ms']} ms"
        if "error" in row:
            lines.append(f"{lease:>9} | ERROR: {row['error'].splitlines()[0]}")
            continue
        gets = row["gets"]
        ok = gets.get("ok", 0) + gets.get("ok_after_failed_put", 0)
        failed = sum(gets.values()) - ok
        after_ok = gets.get("empty", 0) + gets.get("wrong", 0)
        objects = "-" if row["master_objects"] is None else str(row["master_objects"])
        lines.append(
            f"{lease:>9} | {row['puts_ok']:>6}/{row['puts_failed']:<7} | {ok:>6}/{failed:<7} | "
            f"{after_ok:>19} | {row['remove_all']:>10} | {row['present_after_remove_all']:>6} | "
            f"{objects:>11} | {row['seconds']:>8.2f}"
        )
    for row in rows:
        if "error" not in row:
            lines.append(
                f"  {row['lease_ms']} ms: {row['writes']} writes over {row['keys']} keys, "
                f"put codes {row['put_codes']}, gets {row['gets']}"
                + (f", exist errors {row['exist_errors']}" if row["exist_errors"] else "")
            )
    return lines


def parse_leases(text: str) -> list[int]:
    """``"10000,100,1"`` -> ``[10000, 100, 1]``.

    Raises:
        argparse.ArgumentTypeError: an entry is not a non-negative integer.
    """
    try:
        leases = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ms: {text!r}") from None
    if not leases or any(lease < 0 for lease in leases):
        raise argparse.ArgumentTypeError(f"leases must be >= 0 ms: {text!r}")
    return leases


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.read_remove_loop",
        description="put / get once / batch_remove(force=True) rounds at several read leases",
    )
    parser.add_argument("--leases", type=parse_leases, default=[10000, 100, 1], help="ms list")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--values", type=int, default=8, help="values per round")
    parser.add_argument("--value-mib", type=int, default=16)
    parser.add_argument("--segment-mib", type=int, default=1024)
    parser.add_argument("--pressure", action="store_true", help="add the memory-pressure runs")
    parser.add_argument("--pressure-segment-mib", type=int, default=256)
    parser.add_argument("--pressure-value-mib", type=int, default=1)
    parser.add_argument("--pressure-factor", type=int, default=3, help="bytes written / segment")
    parser.add_argument("--pressure-keys", type=int, default=0, help="0: 2 x segment / value")
    parser.add_argument("--skip-loop", action="store_true", help="only the pressure runs")
    parser.add_argument("--compare-mooncake", action="store_true", help="also run upstream")
    parser.add_argument("--upstream-venv", type=Path, default=None)
    parser.add_argument("--log-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", default=PY, choices=(PY, UPSTREAM), help=argparse.SUPPRESS)
    return parser


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every requested loop and pressure run; print the report; return the results."""
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="read-remove-loop-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    sides = [Side(PY, sys.executable)]
    notes: list[str] = []
    if args.compare_mooncake:
        upstream, why = _upstream_side(args.upstream_venv)
        if upstream is None:
            notes.append(f"--compare-mooncake: upstream not run.\n{why}")
        else:
            sides.append(upstream)
    value = args.value_mib * MIB
    pressure_value = args.pressure_value_mib * MIB
    pressure_segment = args.pressure_segment_mib * MIB
    pressure_keys = args.pressure_keys or 2 * pressure_segment // pressure_value
    pressure_writes = args.pressure_factor * pressure_segment // pressure_value
    print(f"logs: {log_dir}", flush=True)
    print(
        f"loop: {args.rounds} rounds x {args.values} values x {args.value_mib} MiB, segment "
        f"{args.segment_mib} MiB; leases {args.leases} ms"
        + (
            f"; pressure: segment {args.pressure_segment_mib} MiB, {pressure_writes} writes of "
            f"{args.pressure_value_mib} MiB over {pressure_keys} keys"
            if args.pressure
            else ""
        ),
        flush=True,
    )
    for lease in args.leases:
        print(f"mooncake-py master at lease {lease} ms: {py_master_settings(lease)}", flush=True)
    results: dict[str, Any] = {"loop": {}, "pressure": {}, "notes": notes}
    for side in sides:
        for lease in args.leases:
            if not args.skip_loop:
                print(f"[{side.name}] loop at lease {lease} ms ...", flush=True)
                row = _run_one(
                    side,
                    lease,
                    log_dir,
                    "loop",
                    args.segment_mib * MIB,
                    max(2 * value, 64 * MIB),
                    {
                        "cmd": "loop",
                        "rounds": args.rounds,
                        "values": args.values,
                        "value_bytes": value,
                    },
                )
                results["loop"].setdefault(side.name, []).append(row)
            if args.pressure:
                print(f"[{side.name}] pressure at lease {lease} ms ...", flush=True)
                row = _run_one(
                    side,
                    lease,
                    log_dir,
                    "pressure",
                    pressure_segment,
                    max(2 * pressure_value, 64 * MIB),
                    {
                        "cmd": "pressure",
                        "writes": pressure_writes,
                        "keys": pressure_keys,
                        "value_bytes": pressure_value,
                    },
                )
                results["pressure"].setdefault(side.name, []).append(row)
    lines: list[str] = [""]
    for side_name, rows in results["loop"].items():
        lines += _loop_table(side_name, rows) + [""]
    for side_name, rows in results["pressure"].items():
        lines += _pressure_table(side_name, rows) + [""]
    for side_name in {**results["loop"], **results["pressure"]}:
        rows = results["loop"].get(side_name, []) + results["pressure"].get(side_name, [])
        flags = {row["lease_ms"]: " ".join(row["master_flags"]) for row in rows}
        lines.append(f"{side_name} master flags per lease: {flags}")
        found = next((row["versions"] for row in rows if row.get("versions")), None)
        if found:
            lines.append(f"{side_name} client versions: {found}")
    lines += notes
    print("\n".join(lines), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    """Entry point: the benchmark, or (``--child``) the client process it drives."""
    args = build_parser().parse_args(argv)
    if args.child:
        return child_main(args.impl)
    results = run(args)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
