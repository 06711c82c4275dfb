"""Tokens and tenants: no call made with tenant A's token reaches anything of tenant B."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mooncake_py import ErrorCode, MooncakeDistributedStore, MooncakeError, ReplicateConfig
from mooncake_py._wire.frames import (
    STATUS_PERMISSION_DENIED,
    STATUS_UNAUTHENTICATED,
    STATUS_UNDECODABLE,
)
from mooncake_py._wire.rpcs import RPCS
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.client.stream_client import ChannelClient, ChannelError
from mooncake_py.errors import AuthenticationError, PermissionDeniedError
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.metrics import RpcCounters
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.transport.auth import Caller, TokenAuthority
from mooncake_py.master.transport.pipeline import CallPipeline, Rejection
from mooncake_py.testing import InProcessMaster

TOKENS = {"token-a": "tenant-a", "token-b": "tenant-b"}


@pytest.fixture
def auth_master(tmp_path: Path) -> Iterator[InProcessMaster]:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(TOKENS))
    with InProcessMaster(auth_tokens_file=str(path)) as master:
        yield master
        master.service.check()


def _store(address: str, token: str, transport: str, **extra: object) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    config = {
        "master_server_address": address,
        "global_segment_size": 8 << 20,
        "auth_token": token,
        "master_transport": transport,
        **extra,
    }
    assert store.setup(config) == 0
    return store


@pytest.mark.parametrize("transport", ["auto", "grpc"])
def test_tenant_isolation_matrix(auth_master: InProcessMaster, transport: str) -> None:
    a = _store(auth_master.address, "token-a", transport)
    b = _store(auth_master.address, "token-b", transport)
    try:
        tagged = ReplicateConfig(kv_sessions=[["conv"]])
        assert a.put("secret", b"of A", tagged) == 0
        assert a.put("same-key", b"A") == 0 and b.put("same-key", b"B") == 0
        assert a.get("same-key") == b"A" and b.get("same-key") == b"B"
        a.pin_kv_session("conv")

        # Reads, queries and removes of B never see A's objects.
        assert b.get("secret") == b""
        assert b.is_exist("secret") == 0 and b.batch_is_exist(["secret"]) == [0]
        assert b.get_size("secret") == ErrorCode.OBJECT_NOT_FOUND
        assert b.get_buffer("secret") is None
        assert b.remove("secret", force=True) == ErrorCode.OBJECT_NOT_FOUND
        assert b.batch_remove(["secret"], force=True) == [ErrorCode.OBJECT_NOT_FOUND]
        assert b.remove_by_regex(".*", force=True) == 1  # only B's own "same-key"
        assert b.remove_all(force=True) == 0
        assert b.upsert("secret", b"overwrite?") == 0  # creates B's own "secret"
        # Sessions of A are invisible to B: get, keys, pin, unpin, update, close, attach, list.
        for call in (
            b.get_kv_session,
            b.pin_kv_session,
            b.unpin_kv_session,
            b.list_kv_session_keys,
        ):
            with pytest.raises(MooncakeError, match="SESSION_NOT_FOUND"):
                call("conv")
        assert b.update_kv_session("conv", []) == 0 and b.close_kv_session("conv") == 0
        assert b.attach_kv_session("conv", ["secret"]) == [0]  # B's own "secret", B's own "conv"
        assert [i.session_id for i in b.list_kv_sessions()[0]] == ["conv"]
        assert b.release_kv_session("conv").released_objects == 1
        assert b.release_stale_kv_sessions(0, include_pinned=True).released_objects == 0
        assert b.release_all_kv_sessions(confirm=True).released_objects == 0
        assert b.release_kv_cache(keep_pinned=False).released_objects == 0

        # A's data and session survived all of it.
        assert a.get("secret") == b"of A"
        info = a.get_kv_session("conv")
        assert info.pinned and info.member_count == 1
        assert a.list_kv_session_keys("conv").keys == ["secret"]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("use_stream", [True, False])
def test_missing_bad_and_foreign_tokens_are_refused(
    auth_master: InProcessMaster, use_stream: bool
) -> None:
    for token in ("", "wrong"):
        client = MasterClient(auth_master.address, use_stream=use_stream, token=token)
        with pytest.raises(AuthenticationError, match="UNAUTHENTICATED"):
            client.service_ready()
        client.close()
    client = MasterClient(auth_master.address, use_stream=use_stream, token="token-a")
    if use_stream:
        assert client.connect_stream()
    # Both transports carry the master's reason along with the status.
    with pytest.raises(PermissionDeniedError, match="PERMISSION_DENIED: .*another tenant"):
        client.exist_key("tenant-b", "same-key", "auth-test")
    with pytest.raises(PermissionDeniedError, match="PERMISSION_DENIED"):
        client.batch_probe_key("tenant-b", ["same-key"], "auth-test")
    assert client.exist_key("tenant-a", "nothing", "auth-test") == 0
    assert client.probe_key("", "nothing") == 0  # no tenant named: the token's applies
    # EndReads names no tenant: a token passes it, and ids unknown to the master expire.
    assert client.end_reads("auth-test", [12345]) == [ErrorCode.LEASE_EXPIRED]
    client.close()
    # The store reports refusals as codes or exceptions, never as another tenant's data.
    assert (
        MooncakeDistributedStore().setup(
            {"master_server_address": auth_master.address, "global_segment_size": 0}
        )
        == ErrorCode.RPC_FAIL
    )
    foreign = _store(
        auth_master.address, "token-a", "auto" if use_stream else "grpc", tenant_id="tenant-b"
    )
    assert foreign.put("x", b"y") == ErrorCode.RPC_FAIL
    with pytest.raises(PermissionDeniedError):
        foreign.get_kv_session("conv")
    foreign.close()


def test_raw_grpc_without_metadata_is_unauthenticated(auth_master: InProcessMaster) -> None:
    channel = grpc.insecure_channel(auth_master.address)
    call = channel.unary_unary(
        "/mooncake_py.v1.MasterService/RemoveAll",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    # Authentication comes first: not even undecodable bytes tell a caller without a token more.
    for payload in (b"", b"\xff\xfe\xfd\x00garbage"):
        with pytest.raises(grpc.RpcError) as caught:
            call(payload, timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    channel.close()


def test_stream_calls_before_authenticate_are_refused(auth_master: InProcessMaster) -> None:
    port = auth_master._server.fast_port  # noqa: SLF001 - the bound port
    anonymous = ChannelClient("127.0.0.1", port, 5.0)
    for payload in (b"", b"\xff\xfe\xfd\x00garbage"):
        with pytest.raises(ChannelError, match="missing or invalid token") as caught:
            anonymous.call(b"RemoveAll", payload)
        assert caught.value.status == STATUS_UNAUTHENTICATED
    anonymous.close()
    with pytest.raises(ChannelError) as caught:
        ChannelClient("127.0.0.1", port, 5.0, token="wrong").call(b"RemoveAll", b"")
    assert caught.value.status == STATUS_UNAUTHENTICATED
    tenant_a = ChannelClient("127.0.0.1", port, 5.0, token="token-a")
    with pytest.raises(ChannelError, match="undecodable") as caught:
        tenant_a.call(b"ExistKey", b"\x12\x03\xff\xfe\xfd")
    assert caught.value.status == STATUS_UNDECODABLE
    foreign = RPCS["ExistKey"].args.encode("tenant-b", "k", "").SerializeToString()
    with pytest.raises(ChannelError, match="another tenant") as caught:
        tenant_a.call(b"ExistKey", foreign)
    assert caught.value.status == STATUS_PERMISSION_DENIED
    tenant_a.close()


def test_the_pipeline_refuses_in_order_and_counts_only_what_ran() -> None:
    counters = RpcCounters()
    pipeline = CallPipeline(
        MasterService(MasterConfig(auth_tokens_file="tokens.json")),
        TokenAuthority(TOKENS),
        counters,
    )
    exist = pipeline.calls["ExistKey"]
    garbage = b"\x12\x03\xff\xfe\xfd"
    assert pipeline.authenticate(None) is None and pipeline.authenticate("wrong") is None
    caller_b = pipeline.authenticate_bearer("Bearer token-b", "ipv4:10.0.0.7:4242")
    assert caller_b == Caller("tenant-b", False, "10.0.0.7", authenticated=True)
    caller_a = pipeline.authenticate("token-a")
    assert caller_a is not None and caller_a.tenant == "tenant-a" and not caller_a.admin
    assert pipeline.call(exist, garbage, None)[0] is Rejection.UNAUTHENTICATED
    rejection, text = pipeline.call(exist, garbage, caller_a)
    assert rejection is Rejection.UNDECODABLE and text.startswith(b"undecodable request: ")
    foreign = RPCS["ExistKey"].args.encode("tenant-b", "k", "").SerializeToString()
    assert pipeline.call(exist, foreign, caller_a)[0] is Rejection.PERMISSION_DENIED
    unnamed = RPCS["ExistKey"].args.encode("", "k", "").SerializeToString()
    rejection, answer = pipeline.call(exist, unnamed, caller_a)
    assert (
        rejection is None
        and RPCS["ExistKey"].result.decode(RPCS["ExistKey"].response_type.FromString(answer)) == 0
    )
    assert counters.requests == {"ExistKey": 1} and counters.failures == {}
