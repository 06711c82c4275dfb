"""Masters on etcd: the leader dies under a mixed workload and a standby takes over with every
acknowledged write, every session and pin, and exact session accounting; clients go on
without restarting; the dead master comes back as a standby.

Real parts: Debian's etcd-server (``tests/etcd_server.py``), three masters as subprocesses
(``--enable_ha``), two client processes (:mod:`tests.integration.ha_worker`) that reach the
masters through ``etcd://``. The leader is killed with SIGKILL.
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from mooncake_py.master.server import free_port
from mooncake_py.testing import MasterProcess, wait_until
from tests.etcd_server import EtcdServer, leader_address
from tests.integration.test_metadata_restart import start_worker
from tests.line_worker import call_worker

TTL_S = 2.0
CLUSTER = "failover"


def read_leader(etcd: EtcdServer) -> str:
    return leader_address(etcd.endpoint, CLUSTER)


def start_master(etcd: EtcdServer, port: int = 0) -> MasterProcess:
    """An HA master on a port chosen here (its address is known before it leads)."""
    port = port or free_port("127.0.0.1")
    args = ["--enable_ha", "--etcd_endpoints", etcd.endpoint, "--cluster_id", CLUSTER]
    args += ["--ha_lease_ttl_sec", str(TTL_S), "--port", str(port), "--client_ttl", "20"]
    process = MasterProcess(args).start(standby=True)
    process.address = f"127.0.0.1:{port}"
    return process


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    with EtcdServer() as server:
        yield server


@pytest.fixture
def cluster(etcd: EtcdServer) -> Iterator[list[MasterProcess]]:
    masters = [start_master(etcd)]
    wait_until(lambda: read_leader(etcd) == masters[0].address, 20, what="the first leads")
    masters[0].wait_leading()
    masters += [start_master(etcd), start_master(etcd)]
    yield masters
    for master in masters:
        master.stop()


def ha_worker(
    etcd: EtcdServer, workers: list[subprocess.Popen[str]], transport: str = "auto"
) -> subprocess.Popen[str]:
    # Upstream's variable names the cluster whose leader key the client reads.
    worker = start_worker(
        {"MC_STORE_CLUSTER_ID": CLUSTER, "MOONCAKE_PY_MASTER_TRANSPORT": transport}
    )
    workers.append(worker)
    config = {"master_server_address": f"etcd://{etcd.endpoint}", "global_segment_size": 32 << 20}
    assert call_worker(worker, "setup", config=config) == 0
    return worker


def send(worker: subprocess.Popen[str], op: str, **kwargs: object) -> None:
    """Start a request without waiting for its answer."""
    assert worker.stdin is not None
    worker.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
    worker.stdin.flush()


def answer(worker: subprocess.Popen[str]) -> object:
    assert worker.stdout is not None
    reply = json.loads(worker.stdout.readline())
    assert reply["ok"], reply
    return reply["result"]


def test_a_standby_takes_over_with_every_acknowledged_write(
    etcd: EtcdServer, cluster: list[MasterProcess], workers: list[subprocess.Popen[str]]
) -> None:
    leader, *standbys = cluster
    writer, other = ha_worker(etcd, workers), ha_worker(etcd, workers)
    keys = [f"k{i}" for i in range(60)]
    sizes = [512 + 97 * i for i in range(60)]
    tags = [[f"conv-{i % 3}"] + (["both"] if i % 7 == 0 else []) for i in range(60)]
    assert call_worker(writer, "put", keys=keys, sizes=sizes, sessions=tags) == [0] * 60
    others = [f"o{i}" for i in range(20)]
    o_sizes = [2048] * 20
    o_tags = [["conv-1"]] * 20
    assert (
        call_worker(other, "put", keys=others, sizes=o_sizes, sessions=o_tags, local=True)
        == [0] * 20
    )
    assert call_worker(writer, "remove", key="k3") == 0
    assert call_worker(writer, "pin", session_id="conv-1") == 0
    pinned = call_worker(writer, "session", session_id="conv-1")
    shared = call_worker(writer, "session", session_id="both")

    # Both clients write through the failover; the leader dies in the middle.
    send(writer, "put_for", prefix="w", seconds=3 * TTL_S + 2, size=1024)
    send(other, "put_for", prefix="x", seconds=3 * TTL_S + 2, size=4096)
    time.sleep(1.0)
    killed_at = time.monotonic()
    assert leader.stop(signal.SIGKILL) == -signal.SIGKILL
    wait_until(
        lambda: read_leader(etcd) in {s.address for s in standbys},
        timeout_s=10 * TTL_S,
        what="a standby leads",
    )
    took_over_s = time.monotonic() - killed_at
    # Within two lease TTLs (the lease runs out, then the standby's election and restore).
    assert took_over_s < 2 * TTL_S + 1.0, took_over_s
    new_leader = next(s for s in standbys if s.address == read_leader(etcd))
    new_leader.wait_leading()
    written = [*answer(writer), *answer(other)]  # type: ignore[misc]
    acked = [key for key, code in written if code == 0]
    assert any(key.startswith("w-") for key in acked) and any(k.startswith("x-") for k in acked)
    # Writes went on after the takeover, from the same client processes.
    assert written[-1][1] == 0

    # Every write acknowledged before, during or after the kill reads back byte-exact.
    survivors = [k for k in keys if k != "k3"]
    sizes_of = dict(zip(keys, sizes, strict=True)) | dict.fromkeys(others, 2048)
    sizes_of |= {k: 1024 for k in acked if k.startswith("w-")}
    sizes_of |= {k: 4096 for k in acked if k.startswith("x-")}
    checked = [*survivors, *others, *acked]
    verdicts = call_worker(writer, "check", keys=checked, sizes=[sizes_of[k] for k in checked])
    assert [k for k, v in zip(checked, verdicts, strict=True) if v != "ok"] == []
    assert call_worker(writer, "exist", keys=["k3"]) == [0]
    # Sessions and pins, with exact accounting.
    assert call_worker(other, "session", session_id="conv-1") == pinned
    assert call_worker(other, "session", session_id="both") == shared

    # The killed master, restarted, stands by.
    port = int(leader.address.rsplit(":", 1)[1])
    cluster.append(start_master(etcd, port))
    assert read_leader(etcd) == new_leader.address


@pytest.mark.parametrize("transport", ["auto", "grpc"])
def test_no_answer_before_the_log_holds_the_change(
    etcd: EtcdServer,
    cluster: list[MasterProcess],
    workers: list[subprocess.Popen[str]],
    transport: str,
) -> None:
    """With etcd frozen, a put is not acknowledged (the leader cannot store its record); once
    etcd runs again the put completes and is durable. Over the stream channel (``auto``) and
    over gRPC."""
    writer = ha_worker(etcd, workers, transport)
    assert call_worker(writer, "put", keys=["warm"], sizes=[100], sessions=[[]]) == [0]
    assert etcd.process is not None
    etcd.process.send_signal(signal.SIGSTOP)
    try:
        send(writer, "put", keys=["frozen"], sizes=[100], sessions=[[]])
        assert writer.stdout is not None
        # Well within the lease (renewed every TTL/3): the leader itself stays in office.
        ready, _, _ = select.select([writer.stdout], [], [], 0.5)
        assert not ready, "a put was acknowledged while its record could not be stored"
    finally:
        etcd.process.send_signal(signal.SIGCONT)
    assert answer(writer) == [0]
    assert call_worker(writer, "check", keys=["frozen"], sizes=[100]) == ["ok"]
