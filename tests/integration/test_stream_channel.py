"""The master's stream channel: same answers as gRPC, clean errors on bad frames, fallback."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from mooncake_py import ErrorCode, MooncakeDistributedStore
from mooncake_py._wire.frames import (
    HEADER,
    ONE_WAY_CALL_ID,
    STATUS_UNDECODABLE,
    STATUS_UNKNOWN_METHOD,
    one_way_frame,
    read_response,
    request_frame,
)
from mooncake_py._wire.rpcs import RPCS
from mooncake_py.client import stream_client
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.client.stream_client import ChannelClient, ChannelError
from mooncake_py.master.transport.stream import PRE_AUTH_MAX_FRAME
from mooncake_py.testing import InProcessMaster, wait_until


def _fast_port(master: InProcessMaster) -> int:
    return master._server.fast_port  # noqa: SLF001 - the test needs the bound port


@pytest.mark.parametrize("transport", ["auto", "grpc"])
def test_both_transports_give_the_same_answers(master: InProcessMaster, transport: str) -> None:
    store = MooncakeDistributedStore()
    config = {"master_server_address": master.address, "global_segment_size": 8 << 20}
    assert store.setup({**config, "master_transport": transport}) == 0
    try:
        assert store.client._core.master.stream_connected == (transport == "auto")  # noqa: SLF001
        assert store.put("k", b"value") == 0
        assert store.get("k") == b"value"
        assert store.batch_is_exist(["k", "missing"]) == [1, 0]
        assert store.remove("k") == ErrorCode.OBJECT_HAS_LEASE
        assert store.put("", b"x") == ErrorCode.INVALID_PARAMS
        keys = [f"many-{i}" for i in range(5000)]
        assert store.put_batch(keys, [b"v" * 10] * 5000) == 0
        assert store.batch_is_exist(keys) == [1] * 5000
    finally:
        store.close()


def test_bad_frames_get_clean_errors_and_the_master_keeps_serving(master: InProcessMaster) -> None:
    channel = ChannelClient("127.0.0.1", _fast_port(master), 5.0)
    with pytest.raises(ChannelError, match="unknown method") as caught:
        channel.call(b"NoSuchMethod", b"")
    assert caught.value.status == STATUS_UNKNOWN_METHOD
    with pytest.raises(ChannelError, match="undecodable request: ") as caught:
        channel.call(b"ExistKey", b"\x12\x03\xff\xfe\xfd")  # key with invalid UTF-8
    assert caught.value.status == STATUS_UNDECODABLE
    assert channel.call(b"ExistKey", b"") != b""  # the connection still serves
    channel.close()

    raw = socket.create_connection(("127.0.0.1", _fast_port(master)))
    raw.sendall(HEADER.pack(2**31, 1, 3) + b"abc")  # longer than any frame may be
    raw.settimeout(5)
    assert raw.recv(100) == b""  # the master closed this connection...
    raw.close()
    client = MasterClient(master.address)
    assert client.connect_stream()
    assert client.service_ready().startswith("mooncake-py")  # ...and serves everyone else
    client.close()


def test_calls_fall_back_to_grpc_when_the_stream_breaks(master: InProcessMaster) -> None:
    client = MasterClient(master.address)
    assert client.connect_stream() and client.stream_connected
    # Break every pooled connection under the client's feet.
    stream = client._stream  # noqa: SLF001
    assert stream is not None
    client.probe_key("default", "warm-up")
    for sock in stream._idle:  # noqa: SLF001
        sock.shutdown(socket.SHUT_RDWR)
    with pytest.raises(Exception, match="RPC_FAIL"):
        client.probe_key("default", "k")
    assert not client.stream_connected
    assert client.probe_key("default", "k") == 0  # over gRPC now
    assert client.connect_stream()
    assert client.probe_key("default", "k") == 0
    client.close()


def test_one_way_frames_run_in_order_and_get_no_response(master: InProcessMaster) -> None:
    store = MooncakeDistributedStore()
    config = {"master_server_address": master.address, "global_segment_size": 8 << 20}
    assert store.setup(config) == 0
    assert store.put("k", b"v") == 0
    client = store.client
    assert client is not None
    core = client._core  # noqa: SLF001 - the test drives a read's lease by hand
    assert core is not None
    (located,) = core.locate(["k"])
    assert located.code == 0 and located.read_id > 0
    assert master.service.is_leased("default", "k")

    raw = socket.create_connection(("127.0.0.1", _fast_port(master)))
    raw.settimeout(5)
    end = RPCS["EndReads"].args.encode(core.client_id, [located.read_id]).SerializeToString()
    remove = RPCS["Remove"].args.encode("default", "k", False).SerializeToString()
    # Refused and unknown one-way frames get no answer either; the connection keeps serving.
    raw.sendall(
        one_way_frame(b"NoSuchMethod", b"")
        + one_way_frame(b"ExistKey", b"\x12\x03\xff\xfe\xfd")
        + one_way_frame(b"EndReads", end)
        + request_frame(7, b"Remove", remove)
    )
    call_id, status, body = read_response(raw)
    assert (call_id, status) == (7, 0)  # the only answer: the remove's, after the end ran
    assert RPCS["Remove"].result.decode(RPCS["Remove"].response_type.FromString(body)) == 0
    raw.close()
    assert master.service.stats()["read_holds"] == 0
    store.close()


def test_a_threads_next_call_follows_its_one_way_send(master: InProcessMaster) -> None:
    channel = ChannelClient("127.0.0.1", _fast_port(master), 5.0)
    stats = RPCS["GetStats"]
    payload = stats.args.encode().SerializeToString()
    channel.call(stats.wire_name, payload)  # one pooled connection
    end = RPCS["EndReads"].args.encode("nobody", [1]).SerializeToString()
    channel.send_one_way(b"EndReads", end)
    used = channel._local.follow  # noqa: SLF001
    borrowed: list[socket.socket] = []
    taken = threading.Event()

    def borrow_it_for_a_while() -> None:  # as the heartbeat thread might
        channel._local.follow = used  # noqa: SLF001  (take exactly that connection)
        borrowed.append(channel._take())  # noqa: SLF001
        taken.set()
        time.sleep(0.2)
        channel._give_back(borrowed[0])  # noqa: SLF001

    other = threading.Thread(target=borrow_it_for_a_while)
    other.start()
    taken.wait(5)
    started = time.monotonic()
    channel.call(stats.wire_name, payload)  # waits for the connection its send used
    assert time.monotonic() - started >= 0.15
    other.join()
    assert borrowed == [used] and channel._idle == [used]  # noqa: SLF001
    channel.call(stats.wire_name, payload)  # no one-way before it: any connection, no wait
    channel.close()
    assert ONE_WAY_CALL_ID == 0xFFFFFFFF


def _closed_by_peer(sock: socket.socket) -> bool:
    """True when the master closed ``sock`` (EOF or reset) within a few seconds."""
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_an_unauthenticated_connection_may_not_send_a_large_frame(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"token-a": "tenant-a"}))
    with InProcessMaster(auth_tokens_file=str(path)) as master:
        port = _fast_port(master)
        flood = socket.create_connection(("127.0.0.1", port))
        # A header announcing 255 MiB: refused before a byte of its body is kept.
        flood.sendall(struct.pack("<IIB", 255 << 20, 1, 8) + b"GetStats" + b"\0" * 1024)
        assert _closed_by_peer(flood)
        flood.close()
        # Authenticated, the same connection kind may send frames up to max_message_bytes.
        channel = ChannelClient("127.0.0.1", port, 5.0, token="token-a")
        big = RPCS["BatchExistKey"].args.encode("", ["k" * 100] * 2000, "c").SerializeToString()
        assert len(big) > PRE_AUTH_MAX_FRAME
        answer = channel.call(b"BatchExistKey", big)
        assert list(RPCS["BatchExistKey"].response_type.FromString(answer).results) == [0] * 2000
        channel.close()


def test_connections_beyond_the_limit_are_closed_and_the_others_keep_serving() -> None:
    with InProcessMaster(stream_max_connections=3) as master:
        port = _fast_port(master)
        stats = RPCS["GetStats"]
        payload = stats.args.encode().SerializeToString()
        held = [ChannelClient("127.0.0.1", port, 5.0) for _ in range(3)]
        for channel in held:
            channel.call(stats.wire_name, payload)  # each holds one open connection
        extra = socket.create_connection(("127.0.0.1", port))
        assert _closed_by_peer(extra)
        extra.close()
        for channel in held:
            channel.call(stats.wire_name, payload)
        held[0].close()
        again = ChannelClient("127.0.0.1", port, 5.0)
        wait_until(lambda: _serves(again, stats.wire_name, payload), 5.0, what="a free place")
        for channel in (*held[1:], again):
            channel.close()


def _serves(channel: ChannelClient, name: bytes, payload: bytes) -> bool:
    try:
        channel.call(name, payload)
    except OSError:
        return False
    return True


def test_a_healthy_idle_connection_is_reused_whatever_its_descriptor_number(
    master: InProcessMaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stale check of an idle pooled connection works for descriptors of 1024 and above
    (which select() refuses): a healthy one is reused, not reconnected."""
    monkeypatch.setattr(stream_client, "STALE_CHECK_AFTER_S", 0.0)
    fillers = [socket.socket() for _ in range(1100)]  # push new descriptors past 1023
    try:
        channel = ChannelClient("127.0.0.1", _fast_port(master), 5.0)
        stats = RPCS["GetStats"]
        payload = stats.args.encode().SerializeToString()
        channel.call(stats.wire_name, payload)
        (pooled,) = channel._idle  # noqa: SLF001
        assert pooled.fileno() >= 1024
        time.sleep(0.01)
        channel.call(stats.wire_name, payload)
        assert channel._idle == [pooled]  # noqa: SLF001 - the same connection, checked and kept
        channel.close()
    finally:
        for filler in fillers:
            filler.close()
