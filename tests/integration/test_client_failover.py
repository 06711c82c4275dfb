"""Clients that find the leader master through etcd and follow it across a failover.

Real etcd (``tests.etcd_server``), real in-process masters, real stores and a real client
process. The leader key is written here, under an etcd lease, the way an elected master writes
it; a failover is the leader stopping, its key vanishing (its lease revoked) and, a moment
later, the key naming the other master.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator

import grpc
import pytest
from aetcd.rpc import rpc_pb2, rpc_pb2_grpc

from mooncake_py import Client, MooncakeDistributedStore
from mooncake_py._wire.rpcs import RPCS
from mooncake_py.client.config import ClientConfig
from mooncake_py.client.leader_follow import RETRY_POLICY
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.errors import ErrorCode, UnavailableError
from mooncake_py.ha_names import DEFAULT_CLUSTER_ID, leader_key
from mooncake_py.testing import InProcessMaster, MasterProcess, wait_until
from mooncake_py.types import ReplicateConfig, SegmentInfo
from tests.conftest import ClientProcess
from tests.etcd_server import EtcdCluster, EtcdServer, free_ports

SEGMENT_BYTES = 16 << 20
# Long enough that the key outlives the test unless revoked: revoking stands for expiry.
LEASE_TTL_S = 60


class LeaderKey:
    """Writes the leader key of one cluster as an elected master would (under a lease)."""

    def __init__(self, endpoint: str, cluster_id: str = DEFAULT_CLUSTER_ID) -> None:
        self._channel = grpc.insecure_channel(endpoint)
        self._kv = rpc_pb2_grpc.KVStub(self._channel)
        self._leases = rpc_pb2_grpc.LeaseStub(self._channel)
        self.key = leader_key(cluster_id)
        self._lease = 0

    def point_at(self, address: str) -> None:
        """Make ``address`` the leader (a new lease, as a new leader's)."""
        self.vacate()
        grant = self._leases.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=LEASE_TTL_S), timeout=5)
        self._lease = grant.ID
        put = rpc_pb2.PutRequest(key=self.key, value=address.encode(), lease=grant.ID)
        self._kv.Put(put, timeout=5)

    def vacate(self) -> None:
        """Revoke the leader's lease: the key vanishes, as when the leader's lease runs out."""
        if self._lease:
            self._leases.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=self._lease), timeout=5)
            self._lease = 0

    def point_at_later(self, address: str, delay_s: float) -> threading.Timer:
        """Name ``address`` after ``delay_s`` (a standby winning the election meanwhile)."""
        timer = threading.Timer(delay_s, self.point_at, (address,))
        timer.start()
        return timer

    def close(self) -> None:
        self._channel.close()


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    with EtcdServer() as server:
        yield server


@pytest.fixture
def two_masters() -> Iterator[tuple[InProcessMaster, InProcessMaster]]:
    first, second = InProcessMaster().start(), InProcessMaster().start()
    try:
        yield first, second
    finally:
        first.stop()
        second.stop()


@pytest.fixture
def key(etcd: EtcdServer) -> Iterator[LeaderKey]:
    writer = LeaderKey(etcd.endpoint)
    yield writer
    writer.close()


def _segment_names(master: InProcessMaster) -> set[str]:
    return {segment.name for segment, _, _, _ in master.service.segment_usage()}


def _store(address: str) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    config = {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": SEGMENT_BYTES,
        "local_buffer_size": SEGMENT_BYTES,
        "protocol": "tcp",
        "master_server_address": address,
    }
    assert store.setup(config) == 0
    return store


def test_every_rpc_has_a_retry_rule_with_a_reason() -> None:
    assert set(RETRY_POLICY) == set(RPCS)
    assert all(reason for _, reason in RETRY_POLICY.values())
    for name in ("Remove", "BatchRemove", "AttachKvSession", "CloseKvSession"):
        assert RETRY_POLICY[name][0] is False, name
    for name in ("Ping", "GetReplicaList", "ExistKey", "ListSegments", "ReMountSegment"):
        assert RETRY_POLICY[name][0] is True, name
    for name in ("PutStart", "BatchUpsertStart", "PutEnd", "BatchPutEnd", "PutRevoke"):
        assert RETRY_POLICY[name][0] is True, name


def test_write_ids_make_ending_a_write_safe_to_repeat(master: InProcessMaster) -> None:
    """What the retry table relies on for PutEnd and PutRevoke: a repeat of an end answers
    OK again, a late repeat never ends a later write of the key, and a repeated revoke
    changes nothing."""
    service = master.service
    info = SegmentInfo(id="seg", name="n", base=4096, size=1 << 20, te_endpoint="127.0.0.1:1")
    assert service.mount_segment("c", info) == 0
    first = service.upsert_start("c", "", "k", 100, ReplicateConfig())
    assert service.put_end("c", "", "k", first.write_id) == 0
    assert service.put_end("c", "", "k", first.write_id) == 0  # the repeat
    later = service.upsert_start("c", "", "k", 200, ReplicateConfig())
    assert later.code == 0
    assert service.put_end("c", "", "k", first.write_id) != 0  # not the later write's end
    assert service.object_of("", "k").is_writing()  # type: ignore[union-attr]
    assert service.put_revoke("c", "", "k", later.write_id) == 0
    before = service.stats()
    assert service.put_revoke("c", "", "k", later.write_id) != 0  # the repeat: no change
    assert service.stats() == before
    service.check()


def test_an_attempt_id_makes_a_repeated_start_find_its_write(master: InProcessMaster) -> None:
    """What the retry table relies on for PutStart: the same call repeated (same client, same
    attempt id) while its write is in flight gets that write again; another call of the key
    is refused as before, and a repeat after the write ended starts nothing."""
    service = master.service
    info = SegmentInfo(id="seg", name="n", base=4096, size=1 << 20, te_endpoint="127.0.0.1:1")
    assert service.mount_segment("c", info) == 0
    tagged = ReplicateConfig(kv_sessions=[["conv"]])
    first = service.put_start("c", "", "k", 100, tagged, 41)
    again = service.put_start("c", "", "k", 100, tagged, 41)
    assert first.code == again.code == 0
    assert again.write_id == first.write_id
    assert [(r.segment_id, r.offset) for r in again.replicas] == [
        (r.segment_id, r.offset) for r in first.replicas
    ]
    used = service.stats()["allocated_bytes"]
    assert service.put_start("c", "", "k", 100, tagged, 42).code != 0  # another call
    assert service.put_start("other", "", "k", 100, tagged, 41).code != 0  # another client
    assert service.upsert_start("c", "", "k", 100, tagged, 41).write_id == first.write_id
    assert service.stats()["allocated_bytes"] == used  # nothing reserved twice
    assert service.put_end("c", "", "k", first.write_id) == 0
    assert service.put_start("c", "", "k", 100, tagged, 41).code != 0  # ended: exists
    batch = service.batch_put_start("c", "", ["a", "b"], [10, 20], ReplicateConfig(), 7)
    repeat = service.batch_put_start("c", "", ["a", "b"], [10, 20], ReplicateConfig(), 7)
    assert [r.write_id for r in repeat] == [r.write_id for r in batch]
    code, session = service.sessions.get_kv_session("", "conv")
    assert code == 0 and session is not None and session.member_count == 1
    service.check()


@pytest.mark.timeout(120)
def test_a_store_follows_the_leader_to_the_standby(
    etcd: EtcdServer, key: LeaderKey, two_masters: tuple[InProcessMaster, InProcessMaster]
) -> None:
    first, second = two_masters
    key.point_at(first.address)
    store = _store(f"etcd://{etcd.endpoint}")
    try:
        hostname = store.get_hostname()
        assert store.put("before", b"on the first leader") == 0
        assert store.get("before") == b"on the first leader"
        assert hostname in _segment_names(first)
        assert hostname not in _segment_names(second)

        first.stop()
        key.vacate()
        timer = key.point_at_later(second.address, 0.5)
        # An idempotent read during the gap is retried until the standby leads: it answers
        # (these masters share no state, so the key is absent there) instead of RPC_FAIL.
        assert store.is_exist("before") == 0
        timer.join()
        # The heartbeat remounts the segment on the new leader, unasked.
        wait_until(lambda: hostname in _segment_names(second), 20, 0.05, "the segment remounts")
        assert store.put("after", b"on the second leader") == 0
        assert store.get("after") == b"on the second leader"
        assert store.health_check() == 0
        core = store.client._core if store.client is not None else None
        assert core is not None
        assert core.master.address == second.address
        wait_until(lambda: core.master.stream_connected, 10, 0.05, "the stream channel follows")
        assert store.get("after") == b"on the second leader"
    finally:
        store.close()


@pytest.mark.timeout(60)
def test_setup_without_a_leader_fails_with_a_clear_error(etcd: EtcdServer) -> None:
    config = ClientConfig(
        local_hostname="127.0.0.1",
        master_server_addr=f"etcd://{etcd.endpoint}",
        global_segment_size=0,
        local_buffer_size=0,
        rpc_timeout_s=1.0,
    )
    with pytest.raises(UnavailableError) as raised:
        Client(config)
    assert raised.value.code == ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS
    assert leader_key(DEFAULT_CLUSTER_ID).decode() in str(raised.value)
    assert etcd.endpoint in str(raised.value)

    store = MooncakeDistributedStore()
    code = store.setup(
        {
            "local_hostname": "127.0.0.1",
            "metadata_server": "P2PHANDSHAKE",
            "global_segment_size": 0,
            "local_buffer_size": 0,
            "master_server_address": f"etcd://{etcd.endpoint}",
            "rpc_timeout_s": 1.0,
        }
    )
    assert code == ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS
    store.close()


@pytest.mark.timeout(60)
def test_unreachable_etcd_fails_setup_with_an_etcd_error() -> None:
    (dead_port,) = free_ports(1)
    with pytest.raises(UnavailableError) as raised:
        MasterClient(f"etcd://127.0.0.1:{dead_port}", timeout_s=1.0)
    assert raised.value.code == ErrorCode.ETCD_OPERATION_ERROR
    assert f"127.0.0.1:{dead_port}" in str(raised.value)


@pytest.mark.timeout(60)
def test_a_dead_first_endpoint_is_passed_over(
    etcd: EtcdServer, key: LeaderKey, master: InProcessMaster
) -> None:
    (dead_port,) = free_ports(1)
    key.point_at(master.address)
    address = f"etcd://127.0.0.1:{dead_port};{etcd.endpoint}"
    client = MasterClient(address, timeout_s=5.0)
    try:
        assert client.address == master.address
        assert client.service_ready()
    finally:
        client.close()
    store = _store(address)
    try:
        assert store.put("k", b"v") == 0
        assert store.get("k") == b"v"
    finally:
        store.close()


@pytest.mark.timeout(60)
def test_the_cluster_id_comes_from_the_environment(
    etcd: EtcdServer, master: InProcessMaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = LeaderKey(etcd.endpoint, cluster_id="tenant-cluster")
    try:
        writer.point_at(master.address)
        with pytest.raises(UnavailableError):
            MasterClient(f"etcd://{etcd.endpoint}", timeout_s=0.5)
        monkeypatch.setenv("MC_STORE_CLUSTER_ID", "tenant-cluster")
        client = MasterClient(f"etcd://{etcd.endpoint}", timeout_s=5.0)
        assert client.address == master.address
        client.close()
    finally:
        writer.close()


@pytest.mark.timeout(60)
def test_a_write_that_never_reached_a_master_is_sent_to_the_next_leader(
    etcd: EtcdServer, key: LeaderKey, two_masters: tuple[InProcessMaster, InProcessMaster]
) -> None:
    first, second = two_masters
    key.point_at(first.address)
    first.stop()  # the key still names it: its lease has not run out
    client = MasterClient(f"etcd://{etcd.endpoint}", timeout_s=5.0, use_stream=False)
    try:
        timer = key.point_at_later(second.address, 0.5)
        # Remove is not idempotent, but a refused connection proves no master ran it.
        assert client.remove("default", "absent", False) == ErrorCode.OBJECT_NOT_FOUND
        timer.join()
        assert client.address == second.address
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_failures_after_the_request_left_are_retried_only_for_idempotent_rpcs(
    etcd: EtcdServer, key: LeaderKey, master: InProcessMaster, caplog: pytest.LogCaptureFixture
) -> None:
    key.point_at(master.address)
    client = MasterClient(
        f"etcd://{etcd.endpoint}", timeout_s=5.0, use_stream=False, retry_deadline_s=0.5
    )
    try:
        assert client.service_ready()
        # A deadline already past: the call ends in DEADLINE_EXCEEDED, which in general leaves
        # unknown whether the master ran it (the same answer as a timeout after sending).
        client.timeout_s = -1.0
        with caplog.at_level(logging.DEBUG, logger="mooncake_py.client.master_rpc"):
            with pytest.raises(UnavailableError) as raised:
                client.remove("default", "absent", False)
            assert raised.value.code == ErrorCode.RPC_TIMEOUT
            assert "retrying" not in caplog.text
            with pytest.raises(UnavailableError) as raised:
                client.probe_key("default", "absent")
            assert raised.value.code == ErrorCode.RPC_TIMEOUT
            assert "ProbeKey to" in caplog.text and "retrying" in caplog.text
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_plain_address_is_never_retried(master: InProcessMaster) -> None:
    address = master.address
    client = MasterClient(address, timeout_s=5.0, use_stream=False)
    assert not client.follows_leader
    master.stop()
    with pytest.raises(UnavailableError):
        client.probe_key("default", "absent")
    assert client.address == address
    client.close()


@pytest.mark.timeout(120)
def test_a_client_process_follows_the_leader(
    etcd: EtcdServer,
    key: LeaderKey,
    two_masters: tuple[InProcessMaster, InProcessMaster],
    client_processes: list[ClientProcess],
) -> None:
    first, second = two_masters
    key.point_at(first.address)
    worker = ClientProcess()
    client_processes.append(worker)
    config = {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": SEGMENT_BYTES,
        "local_buffer_size": SEGMENT_BYTES,
        "protocol": "tcp",
        "master_server_address": f"etcd://{etcd.endpoint}",
    }
    assert worker.call("setup", config=config) == 0
    assert worker.call("put", key="one", size=4096) == 0
    assert len(_segment_names(first)) == 1

    first.stop()
    key.vacate()
    key.point_at_later(second.address, 0.5).join()
    wait_until(lambda: len(_segment_names(second)) == 1, 20, 0.05, "the worker remounts")
    assert worker.call("put", key="two", size=4096) == 0
    assert second.service.reads.probe_key("default", "two") == 1


@pytest.mark.timeout(90)
def test_the_leader_is_read_from_a_cluster_with_a_member_down(master: InProcessMaster) -> None:
    with EtcdCluster(3) as cluster:
        first_member = cluster.members[0].endpoint
        writer = LeaderKey(first_member)
        try:
            writer.point_at(master.address)
        finally:
            writer.close()
        cluster.stop(0)
        store = _store(cluster.endpoints)
        try:
            assert store.put("k", b"v") == 0
            assert store.get("k") == b"v"
        finally:
            store.close()


@pytest.mark.timeout(120)
def test_a_store_rides_through_the_death_of_an_ha_leader(etcd: EtcdServer) -> None:
    # Real HA masters: the first leads, the second stands by following the replicated log.
    args = ["--enable_ha", "--etcd_endpoints", etcd.endpoint, "--ha_lease_ttl_sec", "2"]
    leader = MasterProcess(args).start(standby=True).wait_leading()
    standby = MasterProcess(args)
    try:
        standby.start(standby=True)
        store = _store(f"etcd://{etcd.endpoint}")
        try:
            assert store.put("before", b"acknowledged, so replicated") == 0
            leader.stop(signal.SIGKILL)
            # Retried until the standby has taken over (its lease wait included).
            assert store.get("before") == b"acknowledged, so replicated"
            standby.wait_leading()
            core = store.client._core if store.client is not None else None
            assert core is not None and core.master.address == standby.address
            assert store.put("after", b"written on the new leader") == 0
            assert store.get("after") == b"written on the new leader"
        finally:
            store.close()
    finally:
        leader.stop(signal.SIGKILL)
        standby.stop()
