"""Append latency and group-commit throughput of the etcd log store on this machine's disk.

``python -m tests.bench.etcd_append_bench [--rounds N] [--members 1|3]`` starts a real etcd
(fsync on, data dir in the system temp dir: set ``TMPDIR`` to measure another disk), appends
through a fenced :class:`~mooncake_py.master.ha.etcd_log.EtcdLogStore` and prints a table:

- the median (and p90) latency of one append of one record of 1 KiB and of 64 KiB;
- group commit: appends of 16, 128 and 1024 records of 1 KiB (one or several txns), as
  records per second and MiB/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterator

from mooncake_py.master.ha.election import LeaderElection
from mooncake_py.master.ha.etcd_log import EtcdLogStore
from tests.etcd_server import ETCD_BINARY, EtcdCluster, EtcdServer

CLUSTER = "bench"
KIB = 1024


@contextlib.contextmanager
def running_etcd(members: int) -> Iterator[str]:
    """The endpoints of a fresh etcd of ``members`` members (fsync on)."""
    if members == 1:
        with EtcdServer() as server:
            yield server.endpoint
    else:
        with EtcdCluster(members) as cluster:
            yield cluster.endpoints


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(endpoints: str, rounds: int) -> list[tuple[str, str, str]]:
    """Rows of (case, latency, throughput)."""
    election = LeaderElection(endpoints, CLUSTER, "127.0.0.1:0", ttl_s=10.0)
    await election.campaign()
    store = EtcdLogStore(election.client, CLUSTER, election, close_client=False)
    rows: list[tuple[str, str, str]] = []
    seq = 1
    try:
        for size in (1 * KIB, 64 * KIB):
            record = os.urandom(size)
            times = []
            for _ in range(rounds):
                started = time.perf_counter()
                await store.append(seq, [record])
                times.append(time.perf_counter() - started)
                seq += 1
            median = statistics.median(times)
            rows.append(
                (
                    f"1 record x {size // KIB} KiB",
                    f"median {median * 1e3:.2f} ms, p90 {quantile(times, 0.9) * 1e3:.2f} ms",
                    f"{1 / median:,.0f} appends/s",
                )
            )
        record = os.urandom(KIB)
        for group in (16, 128, 1024):
            batch = [record] * group
            times = []
            for _ in range(max(3, rounds // 10)):
                started = time.perf_counter()
                await store.append(seq, batch)
                times.append(time.perf_counter() - started)
                seq += group
            median = statistics.median(times)
            mib_per_s = group * KIB / median / (1 << 20)
            rows.append(
                (
                    f"group of {group} x 1 KiB",
                    f"median {median * 1e3:.2f} ms",
                    f"{group / median:,.0f} records/s, {mib_per_s:.1f} MiB/s",
                )
            )
    finally:
        await election.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="appends per latency case")
    parser.add_argument("--members", type=int, default=1, choices=(1, 3))
    args = parser.parse_args()
    if not os.path.exists(ETCD_BINARY):
        print(f"etcd is not installed at {ETCD_BINARY} (Debian package etcd-server)")
        return 2
    with running_etcd(args.members) as endpoints:
        rows = asyncio.run(measure(endpoints, args.rounds))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    print(f"etcd log store appends ({args.members} member(s), fsync on, TMPDIR disk)")
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        print("  ".join(cells).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
