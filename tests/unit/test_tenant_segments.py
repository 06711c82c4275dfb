"""Segments belong to a principal: roles in the tokens file, client ids bound to tenants,
placement and eviction scoped to the segments a tenant may use, scoped views, and endpoint
attribution (service level and the call pipeline, no sockets; time on a FakeClock)."""

from __future__ import annotations

import json
import random
import socket
from pathlib import Path
from typing import Any

import pytest

from mooncake_py._wire.rpcs import RPCS
from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import ConfigError, MasterConfig
from mooncake_py.master.metrics import RpcCounters
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.state.clients import ClientRegistry
from mooncake_py.master.transport.auth import (
    Caller,
    Principal,
    TokenAuthority,
    endpoint_attributed,
    host_of_peer,
)
from mooncake_py.master.transport.pipeline import CallPipeline, Rejection
from mooncake_py.types import ReplicateConfig, SegmentInfo

MIB = 1 << 20
OK = ErrorCode.OK
TOKENS: dict[str, str | Principal] = {
    "token-a": "tenant-a",
    "token-b": "tenant-b",
    "token-admin": Principal("ops", admin=True),
}


def make_service(**overrides: Any) -> tuple[MasterService, FakeClock]:
    clock = FakeClock()
    config = MasterConfig(auth_tokens_file="tokens.yaml", **overrides)
    return MasterService(config, clock=clock, rng=random.Random(7)), clock


def seg(seg_id: str, size: int = MIB, shared: bool = False) -> SegmentInfo:
    return SegmentInfo(
        id=seg_id,
        name=f"name-{seg_id}",
        base=0x1000,
        size=size,
        te_endpoint="127.0.0.1:1",
        host_id="host",
        shared=shared,
    )


def put(service: MasterService, client: str, tenant: str, key: str, size: int) -> int:
    result = service.put_start(client, tenant, key, size, ReplicateConfig())
    if result.code != OK:
        return int(result.code)
    return int(service.put_end(client, tenant, key))


def used_by_segment(service: MasterService) -> dict[str, int]:
    return {info.id: used for info, _, used, _ in service.segment_usage()}


# -- tokens file -----------------------------------------------------------------------------


def test_tokens_file_roles_in_yaml_and_json(tmp_path: Path) -> None:
    yaml_file = tmp_path / "tokens.yaml"
    yaml_file.write_text(
        "plain: tenant-a\n"
        "admin-tok: {tenant: ops, role: admin}\n"
        "explicit:\n  tenant: tenant-b\n  role: tenant\n"
    )
    authority = TokenAuthority.from_file(str(yaml_file))
    assert authority.principal_of("plain") == Principal("tenant-a", False)
    assert authority.principal_of("admin-tok") == Principal("ops", True)
    assert authority.principal_of("explicit") == Principal("tenant-b", False)
    assert authority.tenant_of_header("Bearer admin-tok") == "ops"
    assert authority.principal_of("unknown") is None
    json_file = tmp_path / "tokens.json"
    json_file.write_text(json.dumps({"j": {"tenant": "t", "role": "admin"}, "k": "u"}))
    json_authority = TokenAuthority.from_file(str(json_file))
    assert json_authority.principal_of("j") == Principal("t", True)
    assert json_authority.principal_of("k") == Principal("u", False)


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ({"bad-role": {"tenant": "t", "role": "root"}}, "bad-role"),
        ({"no-tenant": {"role": "admin"}}, "no-tenant"),
        ({"extra": {"tenant": "t", "colour": "red"}}, "extra"),
        ({"bad-tenant": {"tenant": "_reserved"}}, "bad-tenant"),
        ({"number": 5}, "number"),
    ],
)
def test_bad_tokens_file_entries_are_config_errors_naming_the_entry(
    tmp_path: Path, entry: dict[str, Any], named: str
) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(entry))
    with pytest.raises(ConfigError, match=named):
        TokenAuthority.from_file(str(path))


# -- peers and endpoints ---------------------------------------------------------------------


def test_peer_hosts_are_normalized_from_both_transports() -> None:
    assert host_of_peer("ipv4:10.1.2.3:5000") == "10.1.2.3"
    assert host_of_peer("ipv6:[::1]:5000") == "::1"
    assert host_of_peer("ipv6:%5B::ffff:10.0.0.1%5D:7") == "10.0.0.1"
    assert host_of_peer(("127.0.0.1", 4000)) == "127.0.0.1"
    assert host_of_peer(("::1", 4000, 0, 0)) == "::1"
    assert host_of_peer("unix:/tmp/sock") is None
    assert host_of_peer(None) is None


def test_endpoint_attribution_rules() -> None:
    assert endpoint_attributed("10.1.2.3:9000", "10.1.2.3")
    assert not endpoint_attributed("10.1.2.4:9000", "10.1.2.3")
    assert not endpoint_attributed("some-host:9000", "10.1.2.3")
    # A loopback caller may declare any loopback address, and only one.
    assert endpoint_attributed("127.0.0.2:9000", "127.0.0.1")
    assert endpoint_attributed("[::1]:9000", "127.0.0.1")
    assert endpoint_attributed("localhost:9000", "::1")
    assert not endpoint_attributed("192.0.2.1:9000", "127.0.0.1")  # TEST-NET-1: not here
    assert not endpoint_attributed("localhost:9000", "10.1.2.3")
    # A caller on this host may also declare another address of this host.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: picks the outgoing address
            own_address = probe.getsockname()[0]
        except OSError:  # no route at all: this host has only its loopback addresses
            own_address = "127.0.0.1"
    assert endpoint_attributed(f"{own_address}:9000", "127.0.0.1")
    assert not endpoint_attributed(f"{own_address}:9000", "192.0.2.7")


# -- client id bindings ----------------------------------------------------------------------


def test_client_bindings_refuse_other_tenants_and_end_with_the_registration() -> None:
    registry = ClientRegistry(ttl_s=10.0)
    assert registry.bind("c1", "a", now=0.0)
    assert registry.bind("c1", "a", now=1.0) and not registry.bind("c1", "b", now=1.0)
    registry.touch("c1", now=1.0)
    registry.check()
    assert registry.pop_expired(now=5.0) == [] and registry.tenant_of("c1") == "a"
    assert registry.pop_expired(now=11.0) == ["c1"]
    assert registry.tenant_of("c1") is None and registry.bind("c1", "b", now=12.0)
    # Bound by calls that never register it: forgotten one ttl after its binding.
    assert registry.bind("c2", "a", now=12.0)
    assert registry.pop_expired(now=21.0) == [] and registry.tenant_of("c2") == "a"
    registry.touch("c1", now=21.0)  # registering keeps c1's binding past its first ttl
    assert registry.pop_expired(now=22.0) == [] and registry.tenant_of("c2") is None
    registry.check()
    assert registry.bound_count("b") == 1


# -- placement and eviction ------------------------------------------------------------------


def test_tenants_objects_land_only_in_their_own_shared_or_unowned_segments() -> None:
    service, _ = make_service()
    assert service.mount_segment("ca", seg("seg-a"), "tenant-a") == OK
    assert service.mount_segment("cb", seg("seg-b"), "tenant-b") == OK
    for i in range(200):
        assert put(service, "ca", "tenant-a", f"k{i}", 1024) == OK
    used = used_by_segment(service)
    assert used["seg-b"] == 0 and used["seg-a"] >= 200 * 1024
    # Preferences name B's segment: still never used for A.
    pref = ReplicateConfig(preferred_segment="name-seg-b")
    assert service.put_start("ca", "tenant-a", "pref", 1024, pref).code == OK
    assert used_by_segment(service)["seg-b"] == 0
    # A shared segment takes everyone's objects.
    assert service.mount_segment("cs", seg("seg-s", shared=True), "ops") == OK
    for i in range(40):
        assert put(service, "cb", "tenant-b", f"b{i}", 64 * 1024) == OK
    used = used_by_segment(service)
    assert used["seg-s"] > 0 and used["seg-b"] > 0
    service.check()


def test_copy_and_move_targets_are_only_segments_the_tenant_may_use() -> None:
    service, _ = make_service()
    assert service.mount_segment("ca", seg("seg-a"), "tenant-a") == OK
    assert service.mount_segment("ca2", seg("seg-a2"), "tenant-a") == OK
    assert service.mount_segment("cb", seg("seg-b"), "tenant-b") == OK
    assert put(service, "ca", "tenant-a", "k", 1024) == OK
    code, _ = service.tasks.create_copy_task("tenant-a", "k", ["name-seg-b"])
    assert code == ErrorCode.INVALID_PARAMS
    source = "name-seg-a" if used_by_segment(service)["seg-a"] else "name-seg-a2"
    code, _ = service.tasks.create_move_task("tenant-a", "k", source, "name-seg-b")
    assert code == ErrorCode.INVALID_PARAMS
    target = "name-seg-a2" if source == "name-seg-a" else "name-seg-a"
    code, task_id = service.tasks.create_copy_task("tenant-a", "k", [target])
    assert code == OK and task_id
    service.check()


def test_a_writer_evicts_only_its_own_objects_and_never_fails_while_it_has_some() -> None:
    service, _ = make_service()
    assert service.mount_segment("ca", seg("seg-a", size=MIB), "tenant-a") == OK
    assert service.mount_segment("cb", seg("seg-b", size=4 * MIB), "tenant-b") == OK
    # Many of B's objects, all older than A's: they come first in eviction order.
    b_keys = [f"b{i}" for i in range(5000)]
    for key in b_keys:
        assert put(service, "cb", "tenant-b", key, 512) == OK
    b_used = used_by_segment(service)["seg-b"]
    for i in range(400):  # A writes four times what its segment holds
        assert put(service, "ca", "tenant-a", f"a{i}", 10 * 1024) == OK, i
    assert used_by_segment(service)["seg-b"] == b_used
    assert all(service.object_of("tenant-b", key) is not None for key in b_keys)
    assert service.object_of("tenant-a", "a399") is not None
    service.check()


def test_without_tokens_segments_belong_to_nobody() -> None:
    service = MasterService(MasterConfig(enable_multi_tenants=True), rng=random.Random(3))
    assert service.mount_segment("ca", seg("seg-a"), "tenant-a") == OK
    assert service.mount_segment("cb", seg("seg-b"), "tenant-b") == OK
    for i in range(100):
        assert put(service, "ca", "tenant-a", f"k{i}", 1024) == OK
    used = used_by_segment(service)
    assert used["seg-a"] > 0 and used["seg-b"] > 0
    assert service.segment_of("seg-b") is not None
    assert service.segment_of("seg-b").tenant == ""  # type: ignore[union-attr]
    service.check()


def test_unmount_of_another_tenants_segment_is_refused() -> None:
    service, _ = make_service()
    assert service.mount_segment("cb", seg("seg-b"), "tenant-b") == OK
    assert put(service, "cb", "tenant-b", "kept", 100) == OK
    assert service.unmount_segment("cb", "seg-b", "tenant-a") == ErrorCode.INVALID_PARAMS
    assert service.object_of("tenant-b", "kept") is not None
    assert service.unmount_segment("cb", "seg-b", "tenant-b") == OK


# -- scoped views ----------------------------------------------------------------------------


def test_views_are_scoped_to_the_tenant_unless_all_tenants() -> None:
    service, _ = make_service()
    assert service.mount_segment("ca", seg("seg-a"), "tenant-a") == OK
    assert service.mount_segment("cb", seg("seg-b"), "tenant-b") == OK
    assert service.mount_segment("cs", seg("seg-s", shared=True), "ops") == OK
    assert service.bind_client("ca", "tenant-a")
    for i in range(30):
        assert put(service, "ca", "tenant-a", f"a{i}", 8 * 1024) == OK
    for i in range(10):
        assert put(service, "cb", "tenant-b", f"b{i}", 8 * 1024) == OK
    mine = service.segment_usage("tenant-a", all_tenants=False)
    assert sorted(info.id for info, _, _, _ in mine) == ["seg-a", "seg-s"]
    by_id = {info.id: (client, used) for info, client, used, _ in mine}
    assert by_id["seg-a"][0] == "ca" and by_id["seg-s"][0] == ""  # no other tenant's client
    everything = service.segment_usage()
    assert sorted(info.id for info, _, _, _ in everything) == ["seg-a", "seg-b", "seg-s"]
    stats = service.stats("tenant-a", all_tenants=False)
    assert stats["objects"] == 30 and stats["segments"] == 2 and stats["tenant_view"] == 1
    assert stats["capacity_bytes"] == 2 * MIB and stats["clients"] == 1
    assert stats["allocated_bytes"] == sum(used for _, used in by_id.values())
    assert stats["allocated_bytes"] >= 30 * 8 * 1024
    assert service.stats()["objects"] == 40 and "tenant_view" not in service.stats()


# -- the call pipeline -----------------------------------------------------------------------


def _pipeline(**overrides: Any) -> tuple[CallPipeline, MasterService]:
    service, _ = make_service(**overrides)
    return CallPipeline(service, TokenAuthority(TOKENS), RpcCounters()), service


def _call(pipeline: CallPipeline, caller: Caller | None, name: str, *args: Any) -> Any:
    rpc = RPCS[name]
    payload = rpc.args.encode(*args).SerializeToString()
    bound = pipeline.calls[name]
    rejection, answer = pipeline.call(bound, payload, caller)
    if rejection is not None:
        return rejection, answer.decode()
    return rpc.result.decode(rpc.response_type.FromString(answer))


def test_pipeline_binds_client_ids_and_refuses_them_to_other_tenants() -> None:
    pipeline, service = _pipeline()
    a = pipeline.authenticate("token-a", ("127.0.0.1", 1))
    b = pipeline.authenticate("token-b", ("127.0.0.1", 2))
    assert _call(pipeline, b, "MountSegment", "client-b", seg("seg-b"), "") == OK
    assert _call(pipeline, b, "PutStart", "client-b", "", "k", 100, ReplicateConfig()).code == OK
    refused = [
        ("UnmountSegment", "client-b", "seg-b", ""),
        ("ReMountSegment", "client-b", [seg("seg-b")], ""),
        ("MountSegment", "client-b", seg("seg-x"), ""),
        ("Ping", "client-b"),
        ("EndReads", "client-b", [1]),
        ("PutEnd", "client-b", "", "k", 0),
        ("FetchTasks", "client-b", 8),
        ("FinishTask", "client-b", "0-1", True, ""),
    ]
    for name, *args in refused:
        rejection, text = _call(pipeline, a, name, *args)
        assert rejection is Rejection.PERMISSION_DENIED, name
        assert "client-b" in text and "another tenant" in text
    assert service.segment_of("seg-b") is not None and service.segment_of("seg-x") is None
    assert _call(pipeline, b, "PutEnd", "client-b", "", "k", 0) == OK
    assert service.object_of("tenant-b", "k") is not None
    code, _, _ = _call(pipeline, b, "Ping", "client-b")
    assert code == OK
    service.check()


def test_pipeline_shared_mounts_need_an_admin_token() -> None:
    pipeline, service = _pipeline()
    a = pipeline.authenticate("token-a")
    admin = pipeline.authenticate("token-admin")
    rejection, text = _call(pipeline, a, "MountSegment", "ca", seg("s1", shared=True), "")
    assert rejection is Rejection.PERMISSION_DENIED and "admin" in text
    remount = [seg("s2"), seg("s3", shared=True)]
    assert _call(pipeline, a, "ReMountSegment", "ca", remount, "")[0] is Rejection.PERMISSION_DENIED
    assert service.segment_usage() == []
    assert _call(pipeline, admin, "MountSegment", "cadmin", seg("s1", shared=True), "") == OK
    assert [m[0].id for m in service.segment_usage()] == ["s1"]


def test_pipeline_attributes_endpoints_to_the_callers_address() -> None:
    pipeline, service = _pipeline()
    remote = pipeline.authenticate_bearer("Bearer token-a", "ipv4:10.9.8.7:5555")
    foreign = seg("s1")  # declares 127.0.0.1: not where the caller is
    assert _call(pipeline, remote, "MountSegment", "ca", foreign, "") == ErrorCode.INVALID_PARAMS
    assert _call(pipeline, remote, "ReMountSegment", "ca", [foreign], "") == (
        ErrorCode.INVALID_PARAMS
    )
    own = SegmentInfo(
        id="s2", name="n2", base=0x1000, size=MIB, te_endpoint="10.9.8.7:9", host_id="h"
    )
    assert _call(pipeline, remote, "MountSegment", "ca", own, "") == OK
    assert [m[0].id for m in service.segment_usage()] == ["s2"]
    # No peer (in-process): no check.
    assert (
        _call(pipeline, Caller("tenant-a", False, None, True), "MountSegment", "ca", seg("s3"), "")
        == OK
    )
    relaxed, relaxed_service = _pipeline(allow_unattributed_endpoints=True)
    remote = relaxed.authenticate_bearer("Bearer token-a", "ipv4:10.9.8.7:5555")
    assert _call(relaxed, remote, "MountSegment", "ca", foreign, "") == OK
    assert relaxed_service.segment_of("s1") is not None


def test_pipeline_sets_all_tenants_from_the_role() -> None:
    pipeline, service = _pipeline()
    a = pipeline.authenticate("token-a")
    admin = pipeline.authenticate("token-admin")
    assert service.mount_segment("ca", seg("seg-a"), "tenant-a") == OK
    assert service.mount_segment("cb", seg("seg-b"), "tenant-b") == OK
    # A asks for every tenant: the pipeline answers its own view anyway.
    assert [s[0].id for s in _call(pipeline, a, "ListSegments", "", True)] == ["seg-a"]
    assert _call(pipeline, a, "GetStats", "", True)["tenant_view"] == 1
    assert len(_call(pipeline, admin, "ListSegments", "", False)) == 2
    assert "tenant_view" not in _call(pipeline, admin, "GetStats", "", False)
    plain = CallPipeline(MasterService(MasterConfig()), None, RpcCounters())
    anyone = plain.authenticate(None)
    assert anyone is not None and anyone.admin
    assert "tenant_view" not in _call(plain, anyone, "GetStats", "t", False)
