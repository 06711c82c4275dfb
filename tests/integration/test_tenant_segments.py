"""Segments belong to a principal, against a real master process started with a tokens file.

Tenants A and B each run a real client (B in a child process, A in this one) on the master's
two transports (gRPC, and the stream channel that ``master_transport="auto"`` picks); an admin
token sees everything. A can neither withdraw, remount, mount under, ping as nor end the reads
of B's client id, A's writes never land in B's segment, shared segments need the admin, the
views are scoped per tenant (RPC and HTTP), and a segment declaring another host's endpoint is
refused.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mooncake_py import MooncakeDistributedStore
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.errors import ErrorCode, PermissionDeniedError
from mooncake_py.testing import MasterProcess
from mooncake_py.types import SegmentInfo
from tests.conftest import ClientProcess, client_config
from tests.integration.client_worker import digest, value_for

TOKENS = {
    "token-a": "tenant-a",
    "token-b": "tenant-b",
    "token-admin": {"tenant": "ops", "role": "admin"},
}
SEGMENT_BYTES = 8 << 20
VALUE_BYTES = 16 << 10
B_KEYS = [f"b/{i}" for i in range(10)]


def _listening_ports(pid: int) -> set[int]:
    """TCP ports process ``pid`` listens on, from /proc (no port is guessed in advance)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _http(port: int, path: str, token: str | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _metrics_port(master: MasterProcess) -> int:
    rpc_port = int(master.address.rsplit(":", 1)[1])
    for port in sorted(_listening_ports(master.pid) - {rpc_port}):
        with contextlib.suppress(OSError, http.client.HTTPException):
            if _http(port, "/health")[0] == 200:
                return port
    raise AssertionError("the master's HTTP port was not found")


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[MasterProcess, int]]:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    with MasterProcess(["--auth_tokens_file", str(tokens)]) as master:
        yield master, _metrics_port(master)


def _segment(seg_id: str, endpoint: str = "127.0.0.1:9", shared: bool = False) -> SegmentInfo:
    return SegmentInfo(
        id=seg_id,
        name=f"extra-{seg_id}",
        base=0x1000,
        size=1 << 20,
        te_endpoint=endpoint,
        host_id="h",
        shared=shared,
    )


def _by_name(rows: list[tuple[SegmentInfo, str, int, int]]) -> dict[str, tuple[str, str, int]]:
    return {info.name: (info.id, client_id, used) for info, client_id, used, _ in rows}


@pytest.mark.parametrize("transport", ["grpc", "auto"])
def test_segments_belong_to_their_tenant(
    secured: tuple[MasterProcess, int], transport: str
) -> None:
    master, http_port = secured
    use_stream = transport == "auto"
    b_client = ClientProcess()
    a_store = MooncakeDistributedStore()
    admin = MasterClient(master.address, use_stream=use_stream, token="token-admin")
    a_rpc = MasterClient(master.address, use_stream=use_stream, token="token-a")
    b_rpc = MasterClient(master.address, use_stream=use_stream, token="token-b")
    try:
        if use_stream:
            assert admin.connect_stream() and a_rpc.connect_stream() and b_rpc.connect_stream()
        base = {**client_config(master.address, SEGMENT_BYTES), "master_transport": transport}
        assert b_client.call("setup", config={**base, "auth_token": "token-b"}) == 0
        assert a_store.setup({**base, "auth_token": "token-a"}) == 0
        name_a, name_b = a_store.get_hostname(), b_client.call("hostname")

        everything = _by_name(admin.list_segments())
        assert set(everything) == {name_a, name_b}
        b_segment_id, b_client_id, b_used = everything[name_b]
        a_client_id = everything[name_a][1]
        assert b_client_id and b_client_id != a_client_id and b_used == 0

        # A's 200 writes never use B's segment.
        for i in range(200):
            assert a_store.put(f"a/{i}", value_for(f"a/{i}", VALUE_BYTES)) == 0, i
        after = _by_name(admin.list_segments())
        assert after[name_b][2] == 0
        assert after[name_a][2] >= 200 * VALUE_BYTES

        for key in B_KEYS:
            assert b_client.call("put", key=key, size=VALUE_BYTES) == 0
        b_used = _by_name(admin.list_segments())[name_b][2]
        assert b_used >= len(B_KEYS) * VALUE_BYTES

        # Nothing A sends under B's client id runs.
        attempts = [
            lambda: a_rpc.unmount_segment(b_client_id, b_segment_id),
            lambda: a_rpc.remount_segments(b_client_id, [_segment("hijack")]),
            lambda: a_rpc.mount_segment(b_client_id, _segment("under-b")),
            lambda: a_rpc.ping(b_client_id),
            lambda: a_rpc.end_reads(b_client_id, [1, 2, 3]),
        ]
        for attempt in attempts:
            with pytest.raises(PermissionDeniedError):
                attempt()
        everything = _by_name(admin.list_segments())
        assert set(everything) == {name_a, name_b}
        assert everything[name_b] == (b_segment_id, b_client_id, b_used)
        for key in B_KEYS:
            assert b_client.call("get_digest", key=key) == digest(value_for(key, VALUE_BYTES))

        # Shared segments need the admin; placement may then use them for anyone.
        with pytest.raises(PermissionDeniedError):
            a_rpc.mount_segment("a-extra", _segment("s-a", shared=True))
        assert "extra-s-a" not in _by_name(admin.list_segments())
        assert admin.mount_segment("ops-client", _segment("s-ops", shared=True)) == 0

        # Scoped views: each tenant sees what it may use, without the others' client ids.
        mine = _by_name(a_rpc.list_segments())
        assert set(mine) == {name_a, "extra-s-ops"}
        assert mine[name_a][1] == a_client_id and mine["extra-s-ops"][1] == ""
        assert set(_by_name(b_rpc.list_segments())) == {name_b, "extra-s-ops"}
        a_stats, b_stats, all_stats = a_rpc.get_stats(), b_rpc.get_stats(), admin.get_stats()
        assert a_stats["tenant_view"] == 1 and a_stats["objects"] == 200
        assert b_stats["objects"] == len(B_KEYS) and b_stats["allocated_bytes"] == b_used
        assert "tenant_view" not in all_stats and all_stats["objects"] == 200 + len(B_KEYS)
        assert all_stats["segments"] == 3

        # The same on the HTTP admin paths.
        assert _http(http_port, "/get_all_segments")[0] == 401
        status, body = _http(http_port, "/get_all_segments", "token-a")
        assert status == 200 and sorted(body.decode().split()) == sorted([name_a, "extra-s-ops"])
        status, body = _http(http_port, "/get_all_segments", "token-admin")
        assert sorted(body.decode().split()) == sorted([name_a, name_b, "extra-s-ops"])
        assert _http(http_port, f"/query_segment?segment={name_b}", "token-a")[0] == 404
        status, body = _http(http_port, "/get_segments_detail", "token-b")
        detail: dict[str, Any] = json.loads(body)
        client_ids = {d["segment_name"]: d["client_id"] for d in detail["segments"]}
        assert client_ids == {name_b: b_client_id, "extra-s-ops": ""}

        # A declared endpoint must be the caller's own host (loopback here).
        assert a_rpc.mount_segment(a_client_id, _segment("far", "10.20.30.40:5000")) == (
            ErrorCode.INVALID_PARAMS
        )
        assert "extra-far" not in _by_name(admin.list_segments())
        assert a_rpc.mount_segment(a_client_id, _segment("near", "127.0.0.1:5000")) == 0
        assert a_rpc.unmount_segment(a_client_id, "near") == 0

        # B's own calls still work, and its data reads back byte-exact.
        code, _, _ = b_rpc.ping(b_client_id)
        assert code == 0
        for key in B_KEYS:
            assert b_client.call("get_digest", key=key) == digest(value_for(key, VALUE_BYTES))
        assert a_store.get("a/0") == value_for("a/0", VALUE_BYTES)
    finally:
        for rpc in (admin, a_rpc, b_rpc):
            rpc.close()
        a_store.close()
        b_client.stop()
