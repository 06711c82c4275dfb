"""Per-key cost of small batches: put_batch / batch_is_exist / get_batch of many tiny values.

Run as ``python -m tests.bench.small_batch_bench [--keys 1024] [--size 64] [--rounds 7]
[--site DIR ...]``. Each ``--site`` is an installed copy of mooncake-py (``pip install
--no-deps --no-build-isolation --target DIR <source tree>``, as ``--baseline-rev`` of
:mod:`tests.bench.store_bench` builds one); without any, this environment's mooncake-py is
measured. Every round runs one measuring process per site, in turn, each against its own
master of the same site (a child process on a free 127.0.0.1 port), so sites that take turns
see the same machine load. The report gives, per site and operation, the medians over the
rounds of keys per second and of CPU microseconds per key of the client and of the master
(which a loaded machine disturbs far less than the rate), and, for every site after the first,
their ratios to the first.

A measuring process (``--measure``) joins the store with a segment, warms up with one batch,
then per operation runs ``--batches`` batches of ``--keys`` fresh keys of ``--size`` bytes and
prints its figures as one JSON line. Keys are removed after each round. Linux only (the
master's CPU time is read from ``/proc``). Benchmarks only: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE_TREE = Path(__file__).resolve().parents[2]
SEGMENT_BYTES = 512 * 1024 * 1024
LOCAL_BUFFER_BYTES = 64 * 1024 * 1024
OPERATIONS = ("put_batch", "batch_is_exist", "get_batch", "batch_remove")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def measure(keys_per_batch: int, size: int, batches: int, prefix: str) -> dict[str, float]:
    """Per operation of :data:`OPERATIONS`, in this process: ``<op>`` keys per second,
    ``<op>.client_us`` and ``<op>.master_us`` CPU microseconds per key of this process and of
    its master (figures the machine's load disturbs far less than the rate)."""
    from mooncake_py.client.compat import MooncakeDistributedStore
    from mooncake_py.testing import MasterProcess

    master = MasterProcess().start()
    store = MooncakeDistributedStore()
    try:
        code = store.setup(
            "127.0.0.1",
            "P2PHANDSHAKE",
            SEGMENT_BYTES,
            LOCAL_BUFFER_BYTES,
            "tcp",
            "",
            master.address,
        )
        if code != 0:
            raise RuntimeError(f"setup failed with {code}")
        value = memoryview(bytes(range(256)) * (size // 256 + 1))[:size]
        warm = [f"{prefix}/warm/{i}" for i in range(keys_per_batch)]
        if store.put_batch(warm, [value] * len(warm)) != 0:
            raise RuntimeError("warm-up put_batch failed")
        store.get_batch(warm)
        store.batch_remove(warm, True)
        key_sets = [
            [f"{prefix}/{b}/{i:06d}" for i in range(keys_per_batch)] for b in range(batches)
        ]
        values = [value] * keys_per_batch

        def put(keys: list[str]) -> None:
            if store.put_batch(keys, values) != 0:
                raise RuntimeError("put_batch failed")

        def exist(keys: list[str]) -> None:
            if any(found != 1 for found in store.batch_is_exist(keys)):
                raise RuntimeError("batch_is_exist missed a key")

        def get(keys: list[str]) -> None:
            if any(len(got) != size for got in store.get_batch(keys)):
                raise RuntimeError("get_batch returned a wrong value")

        def remove(keys: list[str]) -> None:
            store.batch_remove(keys, True)

        total = keys_per_batch * batches
        figures: dict[str, float] = {}
        for op, call in zip(OPERATIONS, (put, exist, get, remove), strict=True):
            client_cpu, master_cpu = time.process_time(), _process_cpu_s(master.pid)
            started = time.perf_counter()
            for keys in key_sets:
                call(keys)
            figures[op] = total / (time.perf_counter() - started)
            figures[f"{op}.client_us"] = (time.process_time() - client_cpu) * 1e6 / total
            figures[f"{op}.master_us"] = (_process_cpu_s(master.pid) - master_cpu) * 1e6 / total
        return figures
    finally:
        store.close()
        master.stop()


def run_site(site: Path | None, args: argparse.Namespace, round_index: int) -> dict[str, float]:
    """One measuring process over ``site`` (None: this environment's mooncake-py); its keys
    per second by operation."""
    env = dict(os.environ)
    if site is not None:
        # PYTHONSAFEPATH: neither the working directory nor the script's own directory may put
        # another mooncake-py in front of the site's.
        env.update(PYTHONPATH=str(site), PYTHONSAFEPATH="1")
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--measure",
        "--keys",
        str(args.keys),
        "--size",
        str(args.size),
        "--batches",
        str(args.batches),
        "--prefix",
        f"r{round_index}",
    ]
    done = subprocess.run(
        command,
        cwd=site or HERE_TREE,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{site}: measuring failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1024, help="keys per batch")
    parser.add_argument("--size", type=int, default=64, help="bytes per value")
    parser.add_argument("--batches", type=int, default=20, help="batches per operation")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--site", action="append", type=Path, help="installed copy (repeatable)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default="small", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.keys, args.size, args.batches, args.prefix)))
        return 0
    sites: list[Path | None] = [s.resolve() for s in args.site] if args.site else [None]
    figures: dict[Path | None, dict[str, list[float]]] = {site: {} for site in sites}
    for round_index in range(args.rounds):
        for site in sites:
            for name, value in run_site(site, args, round_index).items():
                figures[site].setdefault(name, []).append(value)
    first = sites[0]
    print(f"{args.keys} x {args.size} B per batch, {args.batches} batches, {args.rounds} rounds")
    for index, site in enumerate(sites):
        print(f"[{index}] {'this environment' if site is None else site}")
    print("medians: keys/s (min-max); client and master CPU us per key; ratio to [0]")
    for op in OPERATIONS:
        for index, site in enumerate(sites):
            rates = figures[site][op]
            rate = statistics.median(rates)
            client_us = statistics.median(figures[site][f"{op}.client_us"])
            master_us = statistics.median(figures[site][f"{op}.master_us"])
            line = (
                f"{op:15s}[{index}] {rate:8.0f} keys/s ({min(rates):.0f}-{max(rates):.0f})"
                f"  client {client_us:5.1f} us  master {master_us:5.1f} us"
            )
            if site is not first:
                base = figures[first]
                line += (
                    f"  rate {rate / statistics.median(base[op]):.2f}x"
                    f"  client {client_us / statistics.median(base[f'{op}.client_us']):.2f}x"
                    f"  master {master_us / statistics.median(base[f'{op}.master_us']):.2f}x"
                )
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
