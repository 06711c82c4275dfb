"""What surviving the master costs, and how long a failover takes.

Run as ``python -m tests.bench.ha_bench [--rounds 3] [--puts 400] [--batches 16]
[--failovers 3] [--ttl 2] [--json FILE]`` (``make bench-ha``); needs Debian's etcd-server.

Throughput: per round, for each mode in turn (so the modes see the same machine load), a
fresh master and a client in this process run ``--puts`` sequential 4 KiB puts and
``--batches`` ``put_batch`` calls of 64 x 64 KiB values:

- ``memory``: the metadata lives in memory only (the default);
- ``snapshot``: ``--enable_snapshot``, every change fsynced to a local log first;
- ``ha``: ``--enable_ha`` on a local etcd, a leader and one standby following its log.

The report gives the medians over the rounds and each mode's ratio to ``memory``.

Failover: a leader and two standbys on etcd with a lease TTL of ``--ttl`` seconds; a client
(``etcd://``) puts 4 KiB values in a loop; the leader is killed with SIGKILL. Per failover:
the time until a standby holds the leader key, until it serves, and the client's longest gap
between two acknowledged puts; then the killed master comes back as a standby. Benchmarks
only: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from mooncake_py import MooncakeDistributedStore
from mooncake_py.ha_names import DEFAULT_CLUSTER_ID
from mooncake_py.master.server import free_port
from mooncake_py.testing import MasterProcess

KIB = 1024
SEGMENT = 512 << 20
MODES = ("memory", "snapshot", "ha")


def read_leader(endpoint: str, cluster_id: str = DEFAULT_CLUSTER_ID) -> str:
    """The leader key's value now ("" when there is none)."""
    from tests.etcd_server import leader_address

    return leader_address(endpoint, cluster_id)


@contextmanager
def masters(mode: str, etcd_endpoint: str, workdir: str) -> Iterator[MasterProcess]:
    """The master (the leader, for ``ha``) of one mode; standbys are stopped with it."""
    extra: list[MasterProcess] = []
    if mode == "memory":
        leader = MasterProcess(["--log_level", "WARNING"]).start()
    elif mode == "snapshot":
        leader = MasterProcess(
            ["--enable_snapshot", "--snapshot_dir", workdir, "--log_level", "WARNING"]
        ).start()
    else:
        args = ["--enable_ha", "--etcd_endpoints", etcd_endpoint, "--cluster_id", workdir[-12:]]
        args += ["--log_level", "WARNING"]
        leader = start_standby(args).wait_leading()
        extra.append(start_standby(args))
    try:
        yield leader
    finally:
        for process in (leader, *extra):
            process.stop()


def run_mode(mode: str, etcd_endpoint: str, puts: int, batches: int) -> dict[str, float]:
    """Puts per second and batch keys per second of one fresh master of ``mode``."""
    with tempfile.TemporaryDirectory() as workdir, masters(mode, etcd_endpoint, workdir) as m:
        store = MooncakeDistributedStore()
        config = {"master_server_address": m.address, "global_segment_size": SEGMENT}
        assert store.setup(config) == 0
        try:
            value = b"v" * (4 * KIB)
            store.put("warm", value)
            started = time.perf_counter()
            for i in range(puts):
                store.put(f"p{i}", value)
            put_rate = puts / (time.perf_counter() - started)
            big = [b"b" * (64 * KIB)] * 64
            started = time.perf_counter()
            for b in range(batches):
                store.put_batch([f"b{b}-{i}" for i in range(64)], big)
            batch_rate = batches * 64 / (time.perf_counter() - started)
        finally:
            store.close()
    return {"put_4KiB_ops_s": put_rate, "put_batch_64x64KiB_keys_s": batch_rate}


def failover_once(
    leader: MasterProcess, standbys: list[MasterProcess], etcd_endpoint: str, ttl_s: float
) -> tuple[dict[str, float], MasterProcess, list[MasterProcess]]:
    """Kill ``leader`` under a put loop; returns the figures, the new leader, the standbys."""
    store = MooncakeDistributedStore()
    config = {"master_server_address": f"etcd://{etcd_endpoint}", "global_segment_size": 64 << 20}
    assert store.setup(config) == 0
    acked: list[float] = []
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            if store.put(f"f{i}", b"w" * (4 * KIB)) == 0:
                acked.append(time.monotonic())
            i += 1

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    time.sleep(1.0)
    old = read_leader(etcd_endpoint)
    killed_at = time.monotonic()
    leader.stop(signal.SIGKILL)
    elected = _until(lambda: read_leader(etcd_endpoint) not in ("", old), 10 * ttl_s)
    new_address = read_leader(etcd_endpoint)
    new_leader = next(s for s in standbys if s.address == new_address)
    new_leader.wait_leading()
    serving = time.monotonic()
    _until(lambda: bool(acked) and acked[-1] > serving, 10 * ttl_s)
    time.sleep(0.5)
    stop.set()
    thread.join(timeout=30)
    store.close()
    gaps = [b - a for a, b in zip(acked, acked[1:], strict=False)]
    figures = {
        "elected_s": elected - killed_at,
        "serving_s": serving - killed_at,
        "client_gap_s": max(gaps) if gaps else float("nan"),
        "ttl_s": ttl_s,
    }
    rest = [s for s in standbys if s is not new_leader]
    return figures, new_leader, rest


def start_standby(args: list[str]) -> MasterProcess:
    """An HA master on a port chosen here, so that its address is known before it leads
    (``process.address``)."""
    port = free_port("127.0.0.1")
    process = MasterProcess([*args, "--port", str(port)]).start(standby=True)
    process.address = f"127.0.0.1:{port}"
    return process


def _until(condition: Callable[[], bool], timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.01)
    return time.monotonic()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--puts", type=int, default=400)
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--json", default="")
    options = parser.parse_args(argv)
    from tests.etcd_server import EtcdServer

    report: dict[str, Any] = {"throughput": {}, "failover": []}
    with EtcdServer() as etcd:
        samples: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for _ in range(options.rounds):
            for mode in MODES:
                samples[mode].append(run_mode(mode, etcd.endpoint, options.puts, options.batches))
        for mode in MODES:
            report["throughput"][mode] = {
                name: statistics.median(s[name] for s in samples[mode]) for name in samples[mode][0]
            }
        print(f"{'mode':10} {'put 4KiB ops/s':>16} {'ratio':>7} {'batch keys/s':>14} {'ratio':>7}")
        base = report["throughput"]["memory"]
        for mode in MODES:
            row = report["throughput"][mode]
            put, batch = row["put_4KiB_ops_s"], row["put_batch_64x64KiB_keys_s"]
            print(
                f"{mode:10} {put:16.0f} {put / base['put_4KiB_ops_s']:7.2f} "
                f"{batch:14.0f} {batch / base['put_batch_64x64KiB_keys_s']:7.2f}"
            )
        args = ["--enable_ha", "--etcd_endpoints", etcd.endpoint, "--ha_lease_ttl_sec"]
        args += [str(options.ttl), "--log_level", "WARNING"]
        leader = start_standby(args).wait_leading()
        standbys = [start_standby(args) for _ in range(2)]
        try:
            for _ in range(options.failovers):
                figures, leader, standbys = failover_once(
                    leader, standbys, etcd.endpoint, options.ttl
                )
                report["failover"].append(figures)
                print(
                    f"failover: elected {figures['elected_s']:.2f} s, serving "
                    f"{figures['serving_s']:.2f} s, longest client gap "
                    f"{figures['client_gap_s']:.2f} s (TTL {options.ttl:.0f} s)"
                )
                standbys.append(start_standby(args))
        finally:
            for process in (leader, *standbys):
                process.stop()
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
