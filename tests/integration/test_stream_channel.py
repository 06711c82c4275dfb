"""The master's stream channel: same answers as gRPC, clean errors on bad frames, fallback."""

from __future__ import annotations

import socket

import pytest

from mooncake_py import ErrorCode, MooncakeDistributedStore
from mooncake_py._wire.frames import HEADER, STATUS_UNDECODABLE, STATUS_UNKNOWN_METHOD
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.client.stream_client import ChannelClient, ChannelError
from mooncake_py.testing import InProcessMaster


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
    client.exist_key("default", "warm-up")
    for sock in stream._idle:  # noqa: SLF001
        sock.shutdown(socket.SHUT_RDWR)
    with pytest.raises(Exception, match="RPC_FAIL"):
        client.exist_key("default", "k")
    assert not client.stream_connected
    assert client.exist_key("default", "k") == 0  # over gRPC now
    assert client.connect_stream()
    assert client.exist_key("default", "k") == 0
    client.close()
