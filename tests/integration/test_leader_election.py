"""Leader election on real etcd: one leader at a time, takeover after a leader dies, loss
detected within the TTL when etcd goes away, and a 3-member cluster that loses one member."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from mooncake_py.master.ha.election import LeaderElection
from mooncake_py.master.ha.etcd_client import EtcdClient
from mooncake_py.master.ha.etcd_log import EtcdLogStore
from tests.conftest import REPO_ROOT
from tests.conftest_etcd import etcd_cluster, etcd_server  # noqa: F401
from tests.etcd_server import EtcdCluster, EtcdServer

TTL_S = 2.0
CLUSTER = "election-test"


@pytest.fixture
async def elections() -> AsyncIterator[list[LeaderElection]]:
    """Elections the test creates (append to the list); all closed afterwards."""
    created: list[LeaderElection] = []
    yield created
    for election in created:
        await election.close()


def make(endpoints: str, address: str, created: list[LeaderElection]) -> LeaderElection:
    election = LeaderElection(endpoints, CLUSTER, address, ttl_s=TTL_S)
    created.append(election)
    return election


async def test_one_leader_among_three_campaigners(
    etcd_server: EtcdServer,  # noqa: F811
    elections: list[LeaderElection],
) -> None:
    candidates = [make(etcd_server.endpoint, f"10.0.0.{i}:50051", elections) for i in range(3)]
    campaigns = {asyncio.create_task(c.campaign()): c for c in candidates}
    done, pending = await asyncio.wait(campaigns, return_when=asyncio.FIRST_COMPLETED)
    winner = campaigns[done.pop()]
    # A full lease TTL later (several renewals), nobody else has won.
    await asyncio.sleep(TTL_S)
    assert all(not task.done() for task in pending)
    assert [c.is_leader for c in candidates].count(True) == 1
    assert await winner.current_leader() == winner.address

    first_revision = winner.leader_revision
    await winner.resign()
    await asyncio.wait_for(winner.wait_lost(), TTL_S)
    assert winner.lost_reason == "resigned"
    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    successor = campaigns[done.pop()]
    assert successor is not winner
    assert successor.leader_revision > first_revision
    assert await successor.current_leader() == successor.address
    assert [c.is_leader for c in candidates].count(True) == 1
    for task in pending:
        task.cancel()


@pytest.fixture
def worker_factory() -> Iterator[list[subprocess.Popen[str]]]:
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


async def test_takeover_within_two_ttls_after_the_leader_process_is_killed(
    etcd_server: EtcdServer,  # noqa: F811
    elections: list[LeaderElection],
    worker_factory: list[subprocess.Popen[str]],
) -> None:
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.election_worker",
            etcd_server.endpoint,
            CLUSTER,
            "10.0.0.1:50051",
            str(TTL_S),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    worker_factory.append(worker)
    assert worker.stdout is not None
    line = await asyncio.to_thread(worker.stdout.readline)
    assert line.startswith("leader "), line
    worker_revision = int(line.split()[1])

    standby = make(etcd_server.endpoint, "10.0.0.2:50051", elections)
    assert await standby.current_leader() == "10.0.0.1:50051"
    campaign = asyncio.create_task(standby.campaign())
    await asyncio.sleep(TTL_S)  # the live worker keeps its leadership meanwhile
    assert not campaign.done()

    os.kill(worker.pid, signal.SIGKILL)
    await asyncio.wait_for(campaign, 2 * TTL_S)
    assert standby.leader_revision > worker_revision
    assert await standby.current_leader() == "10.0.0.2:50051"


async def test_wait_lost_fires_within_the_ttl_when_etcd_is_killed(
    etcd_server: EtcdServer,  # noqa: F811
    elections: list[LeaderElection],
) -> None:
    leader = make(etcd_server.endpoint, "10.0.0.1:50051", elections)
    await leader.campaign()
    lost = asyncio.create_task(leader.wait_lost())
    await asyncio.sleep(TTL_S)  # renewals keep it leader
    assert not lost.done() and leader.is_leader

    etcd_server.kill()
    killed_at = time.monotonic()
    # The local deadline is the last renewal's send time + TTL, so at most TTL after the kill;
    # the slack only absorbs scheduling.
    await asyncio.wait_for(lost, TTL_S * 1.5)
    assert time.monotonic() - killed_at <= TTL_S * 1.5
    assert not leader.is_leader
    assert "TTL" in leader.lost_reason

    # etcd comes back with the old lease renewed (it restarts every lease's TTL): campaigning
    # again revokes it instead of waiting it out.
    old_revision = leader.leader_revision
    await asyncio.to_thread(etcd_server.start)
    await asyncio.wait_for(leader.campaign(), TTL_S)
    assert leader.is_leader and leader.leader_revision > old_revision


async def test_wait_lost_fires_when_the_key_is_taken(
    etcd_server: EtcdServer,  # noqa: F811
    elections: list[LeaderElection],
) -> None:
    leader = make(etcd_server.endpoint, "10.0.0.1:50051", elections)
    await leader.campaign()
    admin = EtcdClient(etcd_server.endpoint)
    try:
        await admin.lease_revoke(leader.lease_id)
    finally:
        await admin.close()
    await asyncio.wait_for(leader.wait_lost(), TTL_S)
    assert not leader.is_leader


async def test_three_member_cluster_keeps_a_leader_with_one_member_stopped(
    etcd_cluster: EtcdCluster,  # noqa: F811
    elections: list[LeaderElection],
) -> None:
    leader = make(etcd_cluster.endpoints, "10.0.0.1:50051", elections)
    await leader.campaign()
    store = EtcdLogStore(leader.client, CLUSTER, leader, close_client=False)
    await store.append(1, [b"before"])

    # Stop the member the leader talks to, so its renewals must fail over.
    connected = [m.endpoint for m in etcd_cluster.members].index(leader.client.endpoint)
    etcd_cluster.stop(connected)
    lost = asyncio.create_task(leader.wait_lost())
    await asyncio.sleep(2 * TTL_S)
    assert not lost.done(), leader.lost_reason
    assert leader.is_leader
    assert leader.client.endpoint != etcd_cluster.members[connected].endpoint
    await store.append(2, [b"after"])
    assert await store.records_after(0) == [(1, b"before"), (2, b"after")]

    standby = make(etcd_cluster.endpoints, "10.0.0.2:50051", elections)
    assert await standby.current_leader() == "10.0.0.1:50051"

    # With a second member gone there is no quorum: the leadership is lost within the TTL.
    survivors = [i for i in range(3) if i != connected]
    etcd_cluster.stop(survivors[0])
    await asyncio.wait_for(lost, TTL_S * 1.5)
    assert not leader.is_leader
