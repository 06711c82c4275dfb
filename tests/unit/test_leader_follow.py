"""The pure rules of following a leader: cluster id, retry deadline, what proves "never sent"."""

from __future__ import annotations

import pytest

from mooncake_py.client.leader_discovery import LeaderDiscovery, resolve_cluster_id
from mooncake_py.client.leader_follow import (
    DEFAULT_RETRY_DEADLINE_S,
    LEADER_LEASE_TTL_S,
    grpc_never_reached,
    retried_on_any_failure,
    retry_deadline_s,
)
from mooncake_py.errors import InvalidParamsError
from mooncake_py.ha_names import DEFAULT_CLUSTER_ID


def test_cluster_id_explicit_then_environment_then_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MC_STORE_CLUSTER_ID", raising=False)
    assert resolve_cluster_id() == DEFAULT_CLUSTER_ID
    monkeypatch.setenv("MC_STORE_CLUSTER_ID", "from-env/")
    assert resolve_cluster_id() == "from-env"
    assert resolve_cluster_id("explicit") == "explicit"


def test_retry_deadline_explicit_then_environment_then_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MOONCAKE_PY_MASTER_RETRY_DEADLINE_S", raising=False)
    assert retry_deadline_s() == DEFAULT_RETRY_DEADLINE_S > 2 * LEADER_LEASE_TTL_S
    monkeypatch.setenv("MOONCAKE_PY_MASTER_RETRY_DEADLINE_S", "3.5")
    assert retry_deadline_s() == 3.5
    assert retry_deadline_s(0.0) == 0.0
    with pytest.raises(ValueError):
        retry_deadline_s(-1.0)
    with pytest.raises(ValueError):
        retry_deadline_s(float("nan"))


def test_only_a_failed_connect_proves_a_request_was_never_sent() -> None:
    refused = (
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
        "Failed to connect to remote host: Connection refused"
    )
    assert grpc_never_reached(refused)
    assert not grpc_never_reached("Socket closed")
    assert not grpc_never_reached("GOAWAY received")
    assert not grpc_never_reached(
        "this master lost the leadership: the call's changes were not replicated"
    )


def test_unknown_rpcs_are_not_retried_after_they_may_have_run() -> None:
    assert retried_on_any_failure("GetReplicaList")
    assert not retried_on_any_failure("Remove")
    assert not retried_on_any_failure("SomeFutureRpc")


def test_an_etcd_address_without_endpoints_is_refused() -> None:
    with pytest.raises(InvalidParamsError):
        LeaderDiscovery("etcd://")
    with pytest.raises(InvalidParamsError):
        LeaderDiscovery("etcd://host-without-port")
