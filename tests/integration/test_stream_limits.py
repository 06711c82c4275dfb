"""Stream-channel limits over time: idle and unauthenticated connections are closed, clients
reconnect without failing a call, and a sliced call keeps its connection's order."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from mooncake_py import ErrorCode
from mooncake_py._wire.frames import HEADER, request_frame
from mooncake_py._wire.rpcs import RPCS
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.client.stream_client import ChannelClient
from mooncake_py.master.transport import stream
from mooncake_py.testing import InProcessMaster, wait_until
from mooncake_py.types import ReplicateConfig, SegmentInfo


def _channel_of(master: InProcessMaster) -> stream.StreamChannel:
    channel = master._server._channel  # noqa: SLF001 - the test counts its connections
    assert channel is not None
    return channel


def _closed_by_peer(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _responses(sock: socket.socket, count: int) -> list[tuple[int, int, bytes]]:
    """Read ``count`` response frames that may arrive in one segment."""
    data = bytearray()
    frames: list[tuple[int, int, bytes]] = []
    while len(frames) < count:
        chunk = sock.recv(65536)
        assert chunk, "closed"
        data += chunk
        while len(data) >= HEADER.size:
            length, call_id, status = HEADER.unpack_from(data)
            if len(data) < HEADER.size + length:
                break
            frames.append((call_id, status, bytes(data[HEADER.size : HEADER.size + length])))
            del data[: HEADER.size + length]
    return frames


def test_idle_connections_are_closed_and_the_client_reconnects() -> None:
    with InProcessMaster(rpc_conn_timeout_seconds=0.5) as master:
        client = MasterClient(master.address)
        assert client.connect_stream()
        assert client.exist_key("", "k", "c") == 0
        assert _channel_of(master).connections == 1
        wait_until(lambda: _channel_of(master).connections == 0, 5.0, what="the idle close")
        # The pooled connection is dead; the call takes a new one and does not fail.
        assert client.exist_key("", "k", "c") == 0
        assert client.stream_connected
        assert _channel_of(master).connections == 1
        client.close()


def test_a_busy_connection_stays_open() -> None:
    with InProcessMaster(rpc_conn_timeout_seconds=0.5) as master:
        channel = ChannelClient("127.0.0.1", master._server.fast_port, 5.0)  # noqa: SLF001
        stats = RPCS["GetStats"]
        payload = stats.args.encode().SerializeToString()
        for _ in range(15):  # 1.5 s of calls every 0.1 s: never idle for 0.5 s
            channel.call(stats.wire_name, payload)
            time.sleep(0.1)
        assert _channel_of(master).connections == 1
        channel.close()


def test_no_idle_timeout_when_disabled() -> None:
    with InProcessMaster(rpc_conn_timeout_seconds=0) as master:
        sock = socket.create_connection(("127.0.0.1", master._server.fast_port))  # noqa: SLF001
        assert not _closed_by_peer(sock, 1.0)
        sock.close()


def test_an_unauthenticated_connection_is_closed_after_its_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream, "PRE_AUTH_TIMEOUT_S", 0.4)
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"token-a": "tenant-a"}))
    with InProcessMaster(auth_tokens_file=str(path), rpc_conn_timeout_seconds=0) as master:
        port = master._server.fast_port  # noqa: SLF001
        silent = socket.create_connection(("127.0.0.1", port))
        authed = ChannelClient("127.0.0.1", port, 5.0, token="token-a")
        stats = RPCS["GetStats"]
        payload = stats.args.encode().SerializeToString()
        authed.call(stats.wire_name, payload)
        assert _closed_by_peer(silent, 5.0)
        silent.close()
        time.sleep(0.6)
        authed.call(stats.wire_name, payload)  # authenticated: kept although silent
        assert _channel_of(master).connections == 1
        authed.close()


def test_a_sliced_call_keeps_the_order_of_its_connection() -> None:
    with InProcessMaster(background=False) as master:
        service = master.service
        segment = SegmentInfo(
            id="seg",
            name="s",
            base=0x1000,
            size=64 << 20,
            te_endpoint="127.0.0.1:1",
            host_id="h",
        )
        assert service.mount_segment("filler", segment) == ErrorCode.OK
        keys = [f"k{i}" for i in range(3000)]
        results = service.batch_put_start("filler", "", keys, [64] * len(keys), ReplicateConfig())
        assert all(r.code == ErrorCode.OK for r in results)
        assert service.batch_put_end("filler", "", keys) == [ErrorCode.OK] * len(keys)
        service._removals.slice_seconds = 0.0  # noqa: SLF001 - one object per slice
        remove_all, exist = RPCS["RemoveAll"], RPCS["ExistKey"]
        sock = socket.create_connection(("127.0.0.1", master._server.fast_port))  # noqa: SLF001
        sock.settimeout(30)
        # Both frames in one write: the second waits for the first's answer, so it sees
        # the removal done.
        sock.sendall(
            request_frame(
                1, remove_all.wire_name, remove_all.args.encode("", False).SerializeToString()
            )
            + request_frame(
                2, exist.wire_name, exist.args.encode("", "k2999", "c").SerializeToString()
            )
        )
        first, second = _responses(sock, 2)
        assert (first[0], first[1]) == (1, 0)
        assert remove_all.response_type.FromString(first[2]).count == 3000
        assert (second[0], second[1]) == (2, 0)
        assert exist.response_type.FromString(second[2]).code == 0  # gone: "does not exist"
        sock.close()
        service.check()
