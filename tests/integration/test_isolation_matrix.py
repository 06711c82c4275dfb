"""The isolation matrix: every master RPC on both transports, the data plane and the HTTP port,
tenant A against tenant B and a token-less process against both.

Tenant B is a real client process (:mod:`tests.integration.tenant_worker`) holding a segment,
values and a pinned session. The attacks come from this process: raw requests built from each
RPC's protobuf descriptor, filled with B's identifiers (its tenant, client id, segment, keys and
session), sent over gRPC and over the stream channel; raw transfer-service requests and local
shared-memory handovers for B's segment; and every HTTP path. Everything must be refused (or
act on the attacker's own, empty namespace), no answer may carry B's identifiers, and afterwards
B's values read back byte-exact, its session is still pinned with every member, its segment is
still mounted and its client healthy.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from mooncake_py import MooncakeDistributedStore, capability
from mooncake_py._proto import master_pb2 as pb
from mooncake_py._wire.rpcs import RPCS
from mooncake_py.client.local_share import request_segment
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.client.stream_client import ChannelClient, ChannelError
from mooncake_py.client.transfer import OP_READ, OP_WRITE, TransferClient, TransferOp
from mooncake_py.testing import MasterProcess, wait_until
from tests.integration.client_worker import digest, value_for
from tests.line_worker import call_worker

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKENS = {
    "token-a": "tenant-a",
    "token-b": "tenant-b",
    "token-ops": {"tenant": "ops", "role": "admin"},
}
B_KEYS = [f"b-secret-{i}" for i in range(8)]
B_TAGGED = [f"b-conv-{i}" for i in range(4)]
B_SESSION = "b-conversation"
SIZE = 64 * 1024


class TenantProcess:
    """Tenant B's client process."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.tenant_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=os.environ.copy(),
        )

    def call(self, op: str, **kwargs: Any) -> Any:
        return call_worker(self.process, op, **kwargs)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tokens = tmp_path_factory.mktemp("tokens") / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    metrics_port = _free_port()
    args = ["--auth_tokens_file", str(tokens), "--metrics_port", str(metrics_port)]
    with MasterProcess(args) as master:
        b = TenantProcess()
        try:
            config = {
                "master_server_address": master.address,
                "global_segment_size": 32 << 20,
                "auth_token": "token-b",
            }
            assert b.call("setup", config=config) == 0
            for key in B_KEYS:
                assert b.call("put", key=key, size=SIZE) == 0
            assert b.call("put_tagged", keys=B_TAGGED, size=SIZE, session=B_SESSION) == 0
            b.call("pin", session=B_SESSION)
            identity = b.call("identity")
            yield {"master": master, "b": b, "identity": identity, "metrics_port": metrics_port}
        finally:
            b.stop()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _b_strings(identity: dict[str, Any]) -> list[bytes]:
    """What no answer to anyone but B (or an admin) may contain: B's client id, segment id and
    endpoint, the names of B's keys the attacks never name (an answer may echo a name it was
    asked about), and the first bytes of every B value."""
    unnamed = B_KEYS[2:] + B_TAGGED
    return [
        identity["client_id"].encode(),
        identity["segment_id"].encode(),
        identity["endpoint"].encode(),
        *(k.encode() for k in unnamed),
        *(value_for(k, SIZE)[:32] for k in B_KEYS + B_TAGGED),
    ]


def _fill(message: Message, identity: dict[str, Any], tenant: str, client_id: str) -> None:
    """Fill a request with B's identifiers (``tenant`` and ``client_id`` as given)."""
    segment = pb.Segment(
        id=identity["segment_id"],
        name=identity["name"],
        base=4096,
        size=32 << 20,
        te_endpoint=identity["endpoint"],
        host_id=identity["host_id"],
        capability_key=b"k" * capability.KEY_BYTES,
    )
    values: dict[str, Any] = {
        "tenant_id": tenant,
        "client_id": client_id,
        "key": B_KEYS[0],
        "keys": B_KEYS[:2],
        "session_id": B_SESSION,
        "segment_id": identity["segment_id"],
        "segment_name": identity["name"],
        "source": identity["name"],
        "target": identity["name"],
        "targets": [identity["name"]],
        "pattern": ".*",
        "force": True,
        "confirm": True,
        "include_pinned": True,
        "value_length": SIZE,
        "value_lengths": [SIZE, SIZE],
        "write_id": 1,
        "write_ids": [1, 2],
        "read_ids": [1, 2, 3],
        "task_id": str(uuid.uuid4()),
        "limit": 100,
        "all_tenants": True,
    }
    for field in message.DESCRIPTOR.fields:
        if field.name == "segment":
            message.segment.CopyFrom(segment)
        elif field.name == "segments":
            message.segments.append(segment)
        elif field.name == "put":
            _fill(message.put, identity, tenant, client_id)
        elif field.name in values:
            value = values[field.name]
            if isinstance(value, list):
                getattr(message, field.name).extend(value)
            else:
                setattr(message, field.name, value)


def _calls(master: MasterProcess, token: str) -> dict[str, Any]:
    """Raw callers for one token on both transports: name -> (payload -> bytes | error)."""
    metadata = [("authorization", f"Bearer {token}")] if token else []
    channel = grpc.insecure_channel(master.address)
    ready = RPCS["ServiceReady"]
    answer = channel.unary_unary(
        ready.path, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )(b"", metadata=[("authorization", "Bearer token-ops")], timeout=10)
    _, stream_port = ready.result.decode(ready.response_type.FromString(answer))
    host = master.address.rsplit(":", 1)[0]
    stream = ChannelClient(host, stream_port, 5.0, token=token)

    def via_grpc(name: str, payload: bytes) -> tuple[str, bytes]:
        call = channel.unary_unary(
            RPCS[name].path, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        try:
            return "answer", call(payload, metadata=metadata, timeout=10)
        except grpc.RpcError as error:
            return error.code().name, b""

    def via_stream(name: str, payload: bytes) -> tuple[str, bytes]:
        try:
            return "answer", stream.call(name.encode(), payload)
        except ChannelError as error:
            return f"status-{error.status}", b""

    return {"grpc": via_grpc, "stream": via_stream, "close": (channel.close, stream.close)}


def _field_names(descriptor: Any) -> set[str]:
    """A request's field names, those of its nested ``put`` request included."""
    names = {f.name for f in descriptor.fields}
    if "put" in names:
        names |= {f.name for f in descriptor.fields_by_name["put"].message_type.fields}
    return names


def _answer_code(name: str, body: bytes) -> int | None:
    """The answer's top-level code, or None when it has none."""
    answer = RPCS[name].response_type.FromString(body)
    return getattr(answer, "code", None)


def test_a_token_less_process_gets_nothing_from_any_rpc(world: dict[str, Any]) -> None:
    calls = _calls(world["master"], "")
    try:
        for name, rpc in RPCS.items():
            request = rpc.request_type()
            _fill(request, world["identity"], "tenant-b", world["identity"]["client_id"])
            payload = request.SerializeToString()
            assert calls["grpc"](name, payload) == ("UNAUTHENTICATED", b""), name
            assert calls["stream"](name, payload)[0] == "status-3", name
    finally:
        for close in calls["close"]:
            close()
    _assert_b_intact(world)


@pytest.mark.parametrize("transport", ["grpc", "stream"])
def test_tenant_a_cannot_reach_b_through_any_rpc(world: dict[str, Any], transport: str) -> None:
    identity = world["identity"]
    forbidden = _b_strings(identity)
    calls = _calls(world["master"], "token-a")
    own_client = f"attacker-{transport}"
    refused = {"PERMISSION_DENIED", "status-4"}
    try:
        for name, rpc in RPCS.items():
            fields = _field_names(rpc.request_type.DESCRIPTOR)
            names_tenant = "tenant_id" in fields
            names_client = "client_id" in fields
            # 1. Naming B's tenant is refused outright.
            if names_tenant:
                request = rpc.request_type()
                _fill(request, identity, "tenant-b", own_client)
                outcome, _ = calls[transport](name, request.SerializeToString())
                assert outcome in refused, (name, outcome)
            # 2. Acting under B's client id is refused.
            if names_client:
                request = rpc.request_type()
                _fill(request, identity, "", identity["client_id"])
                outcome, body = calls[transport](name, request.SerializeToString())
                if outcome == "answer":
                    code = _answer_code(name, body)
                    assert code not in (None, 0), (name, code)
                else:
                    assert outcome in refused, (name, outcome)
            # 3. In A's own namespace, with B's identifiers elsewhere: nothing of B comes back.
            request = rpc.request_type()
            _fill(request, identity, "", own_client)
            outcome, body = calls[transport](name, request.SerializeToString())
            for secret in forbidden:
                assert secret not in body, (name, secret)
    finally:
        for close in calls["close"]:
            close()
    _assert_b_intact(world)


def test_the_data_plane_serves_b_only_to_capability_holders(
    world: dict[str, Any], tmp_path: Path
) -> None:
    identity = world["identity"]
    master = world["master"]
    a = MooncakeDistributedStore()
    config = {
        "master_server_address": master.address,
        "global_segment_size": 8 << 20,
        "auth_token": "token-a",
    }
    assert a.setup(config) == 0
    try:
        assert a.put("a-own", b"A" * 4096) == 0
        # A's real capability, for A's own segment.
        rpc = MasterClient(master.address, token="token-a")
        own = rpc.get_replica_list("", "a-own", "attacker-data").replicas[0]
        rpc.close()
        grants = [b"", b"\0" * capability.GRANT_BYTES, capability.grant_of(own.capability)]
        scratch = memoryview(bytearray(SIZE))
        tcp = TransferClient()
        try:
            for grant in grants:
                for op in (OP_READ, OP_WRITE):
                    ops = [TransferOp(op, identity["segment_id"], 0, scratch, grant)]
                    try:
                        codes = tcp.run(identity["endpoint"], ops)
                    except Exception:  # the server closed on us: refused too
                        continue
                    assert codes[0] != 0, (op, grant[:4])
        finally:
            tcp.close()
        assert bytes(scratch) == bytes(SIZE), "a refused READ delivered bytes"
        for grant in grants:
            assert request_segment(identity["segment_id"], grant) is None
    finally:
        a.close()
    _assert_b_intact(world)


def test_the_http_port_shows_b_to_nobody_else(world: dict[str, Any]) -> None:
    identity = world["identity"]
    forbidden = _b_strings(identity)
    port = world["metrics_port"]
    paths = [
        "/metrics",
        "/metrics/summary",
        "/health",
        "/get_all_keys",
        f"/query_key?key={B_KEYS[0]}",
        f"/batch_query_keys?keys={B_KEYS[0]},{B_KEYS[1]}",
        "/get_all_segments",
        "/get_segments_detail",
        f"/query_segment?segment={identity['name']}",
        f"/api/v1/segments/status?segment={identity['name']}",
    ]
    for token in ("", "token-a"):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        for path in paths:
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=10) as reply:
                    body = reply.read()
            except urllib.error.HTTPError as error:
                body = error.read()
                assert error.code in (401, 403, 404), (path, error.code)
            for secret in forbidden:
                assert secret not in body, (token, path, secret)
        removal = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/v1/remove_all?force=true&tenant_id=tenant-b",
            method="POST",
            headers=headers,
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(removal, timeout=10)
        assert refused.value.code in (401, 403)
    _assert_b_intact(world)


def _assert_b_intact(world: dict[str, Any]) -> None:
    b = world["b"]
    keys = B_KEYS + B_TAGGED
    assert b.call("digests", keys=keys) == [digest(value_for(k, SIZE)) for k in keys]
    session = b.call("session", session=B_SESSION)
    assert session == {"pinned": True, "members": len(B_TAGGED), "keys": sorted(B_TAGGED)}
    wait_until(lambda: b.call("healthy"), timeout_s=5)
    admin = MasterClient(world["master"].address, token="token-ops")
    try:
        mounted = {info.id: client for info, client, _, _ in admin.list_segments()}
    finally:
        admin.close()
    assert mounted.get(world["identity"]["segment_id"]) == world["identity"]["client_id"]


def test_a_forged_mount_gets_none_of_bs_bytes_and_opens_no_file(
    world: dict[str, Any], tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    segment = pb.Segment(
        id=str(uuid.uuid4()),
        name="forged:1",
        base=4096,
        size=64 << 20,
        te_endpoint=f"127.0.0.1:{listener.getsockname()[1]}",
        host_id=world["identity"]["host_id"],
        capability_key=b"f" * capability.KEY_BYTES,
    )
    # The removed shm_path field (number 8), naming a file outside any segment.
    path = f"/dev/shm/x/../../..{victim}".encode()
    forged = segment.SerializeToString() + b"\x42" + bytes([len(path)]) + path
    request = pb.MountSegmentRequest(client_id="attacker-mount")
    request.segment.MergeFromString(forged)
    calls = _calls(world["master"], "token-a")
    try:
        outcome, body = calls["grpc"]("MountSegment", request.SerializeToString())
        assert outcome == "answer" and _answer_code("MountSegment", body) == 0
        b = world["b"]
        keys = [f"b-after-forgery-{i}" for i in range(30)]
        for key in keys:
            assert b.call("put", key=key, size=SIZE) == 0
        assert b.call("digests", keys=keys) == [digest(value_for(k, SIZE)) for k in keys]
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody ever connected to the forged segment's endpoint
        assert victim.read_bytes() == b"untouched"
    finally:
        for close in calls["close"]:
            close()
        listener.close()
    _assert_b_intact(world)
