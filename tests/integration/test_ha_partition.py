"""A network partition between three hosts: the leader's host is cut off from the etcd
majority; the leader stops serving within its lease, a master on the majority side takes over
with every acknowledged write, and the cut-off master, restarted once the network heals,
stands by.

The hosts are network namespaces this test makes itself (``ip netns``, veth pairs on a bridge,
which the test removes again): each runs one member of a three-member etcd cluster and one
master; the client runs in the test's own namespace, on the bridge. The partition takes the
leader host's link down. Needs root and iproute2; skipped otherwise unless
``MOONCAKE_PY_REQUIRE_NETNS=1``.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from mooncake_py.errors import UnavailableError
from mooncake_py.testing import MasterProcess, wait_until
from tests.etcd_server import leader_address
from tests.integration.test_ha_failover import answer, send
from tests.integration.test_metadata_restart import start_worker
from tests.line_worker import call_worker

TTL_S = 2.0
CLUSTER = "partition"
HOSTS = 3
MASTER_PORT = 50051
LOST_LEADERSHIP_EXIT = 3


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=20)


def _netns_usable() -> str:
    """Why namespaces cannot be used here ("" when they can)."""
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None:
        return "needs iproute2"
    name = f"mcprobe{os.getpid()}"
    try:
        _run("ip", "netns", "add", name)
        _run("ip", "netns", "del", name)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"ip netns does not work here: {exc}"
    return ""


@dataclass
class Hosts:
    """The namespaces, their addresses and what runs in them."""

    tag: str
    subnet: str
    etcd: list[subprocess.Popen[bytes]] = field(default_factory=list)
    data: list[str] = field(default_factory=list)

    def ns(self, i: int) -> str:
        return f"mc{self.tag}h{i}"

    def ip(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    @property
    def bridge_ip(self) -> str:
        return f"{self.subnet}.254"

    def link(self, i: int) -> str:
        """The root-namespace end of host ``i``'s veth pair."""
        return f"mc{self.tag}v{i}"

    @property
    def endpoints(self) -> str:
        return ";".join(f"{self.ip(i)}:2379" for i in range(HOSTS))

    def wrapper(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(i)]


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    reason = _netns_usable()
    if reason:
        if os.environ.get("MOONCAKE_PY_REQUIRE_NETNS") == "1":
            pytest.fail(f"network namespaces are required: {reason}")
        pytest.skip(reason)
    if shutil.which("etcd") is None:
        pytest.skip("needs etcd-server")
    tag = f"{os.getpid() % 10000}{random.randrange(100)}"
    net = Hosts(tag, f"10.{random.randrange(64, 250)}.{random.randrange(1, 250)}")
    bridge = f"mc{tag}br"
    try:
        _run("ip", "link", "add", bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{net.bridge_ip}/24", "dev", bridge)
        _run("ip", "link", "set", bridge, "up")
        for i in range(HOSTS):
            ns, outer, inner = net.ns(i), net.link(i), f"mc{tag}p{i}"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            _run("ip", "link", "set", inner, "netns", ns)
            _run("ip", "link", "set", outer, "master", bridge)
            _run("ip", "link", "set", outer, "up")
            _run(*net.wrapper(i), "ip", "addr", "add", f"{net.ip(i)}/24", "dev", inner)
            _run(*net.wrapper(i), "ip", "link", "set", inner, "up")
            _run(*net.wrapper(i), "ip", "link", "set", "lo", "up")
        cluster = ",".join(f"m{i}=http://{net.ip(i)}:2380" for i in range(HOSTS))
        for i in range(HOSTS):
            data = tempfile.mkdtemp(prefix="mc-etcd-")
            net.data.append(data)
            net.etcd.append(
                subprocess.Popen(
                    [
                        *net.wrapper(i),
                        "etcd",
                        "--name",
                        f"m{i}",
                        "--data-dir",
                        data,
                        "--listen-client-urls",
                        f"http://{net.ip(i)}:2379",
                        "--advertise-client-urls",
                        f"http://{net.ip(i)}:2379",
                        "--listen-peer-urls",
                        f"http://{net.ip(i)}:2380",
                        "--initial-advertise-peer-urls",
                        f"http://{net.ip(i)}:2380",
                        "--initial-cluster",
                        cluster,
                        "--initial-cluster-state",
                        "new",
                        "--heartbeat-interval",
                        "50",
                        "--election-timeout",
                        "500",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        wait_until(lambda: _healthy(net), timeout_s=30, what="the etcd cluster has a leader")
        yield net
    finally:
        for process in net.etcd:
            process.kill()
            process.wait(timeout=10)
        for i in range(HOSTS):
            subprocess.run(["ip", "netns", "del", net.ns(i)], capture_output=True)
            subprocess.run(["ip", "link", "del", net.link(i)], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
        for data in net.data:
            shutil.rmtree(data, ignore_errors=True)


def _healthy(net: Hosts) -> bool:
    try:
        _read_leader(net, range(HOSTS))
    except UnavailableError:
        return False
    return True


def _read_leader(net: Hosts, members: range | list[int]) -> str:
    """The leader key's value, read from the first of ``members`` that answers."""
    return leader_address(";".join(f"{net.ip(i)}:2379" for i in members), CLUSTER)


def _master(net: Hosts, i: int) -> MasterProcess:
    args = ["--rpc_address", net.ip(i), "--port", str(MASTER_PORT), "--enable_ha"]
    args += ["--etcd_endpoints", net.endpoints, "--cluster_id", CLUSTER]
    args += ["--ha_lease_ttl_sec", str(TTL_S), "--client_ttl", "30"]
    process = MasterProcess(args, wrapper=net.wrapper(i)).start(standby=True)
    process.address = f"{net.ip(i)}:{MASTER_PORT}"
    return process


def test_a_leader_cut_off_from_the_etcd_majority_steps_down(hosts: Hosts) -> None:
    masters = [_master(hosts, 0)]
    worker = None
    try:
        wait_until(lambda: _read_leader(hosts, [1, 2]) == masters[0].address, 20)
        masters[0].wait_leading()
        masters += [_master(hosts, 1), _master(hosts, 2)]
        worker = start_worker({"MC_STORE_CLUSTER_ID": CLUSTER})
        config = {
            "master_server_address": f"etcd://{hosts.endpoints}",
            "global_segment_size": 32 << 20,
            "local_hostname": hosts.bridge_ip,
        }
        assert call_worker(worker, "setup", config=config) == 0
        keys = [f"k{i}" for i in range(40)]
        tags = [["conv"] if i % 2 else [] for i in range(40)]
        assert call_worker(worker, "put", keys=keys, sizes=[3000] * 40, sessions=tags) == [0] * 40
        assert call_worker(worker, "pin", session_id="conv") == 0
        pinned = call_worker(worker, "session", session_id="conv")

        send(worker, "put_for", prefix="p", seconds=4 * TTL_S, size=1024)
        time.sleep(1.0)
        cut_at = time.monotonic()
        _run("ip", "link", "set", hosts.link(0), "down")  # host 0 is alone now
        # The cut-off leader cannot renew its lease: it stops serving (exits) within it.
        assert masters[0].process is not None
        masters[0].process.wait(timeout=6 * TTL_S)
        stepped_down_s = time.monotonic() - cut_at
        assert masters[0].process.returncode == LOST_LEADERSHIP_EXIT
        assert stepped_down_s < 2 * TTL_S + 2.0, stepped_down_s
        wait_until(
            lambda: _read_leader(hosts, [1, 2]) in {m.address for m in masters[1:]},
            timeout_s=10 * TTL_S,
            what="a master on the majority side leads",
        )
        new_leader = next(m for m in masters[1:] if m.address == _read_leader(hosts, [1, 2]))
        new_leader.wait_leading()

        written = answer(worker)
        # The client goes on: right after the takeover its writes succeed again.
        after = call_worker(worker, "put_for", prefix="q", seconds=1.0, size=1024)
        assert after and all(code == 0 for _, code in after), after
        written = [*written, *after]  # type: ignore[misc]
        acked = [key for key, code in written if code == 0]
        checked = [*keys, *acked]
        sizes = [3000] * len(keys) + [1024] * len(acked)
        verdicts = call_worker(worker, "check", keys=checked, sizes=sizes)
        assert [k for k, v in zip(checked, verdicts, strict=True) if v != "ok"] == []
        assert call_worker(worker, "session", session_id="conv") == pinned

        # The network heals; the cut-off master, restarted, stands by.
        _run("ip", "link", "set", hosts.link(0), "up")
        masters[0] = _master(hosts, 0)
        time.sleep(TTL_S)
        assert _read_leader(hosts, range(HOSTS)) == new_leader.address
        assert masters[0].process is not None and masters[0].process.poll() is None
    finally:
        if worker is not None:
            worker.kill()
            worker.wait(timeout=10)
        for master in masters:
            master.stop(signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
