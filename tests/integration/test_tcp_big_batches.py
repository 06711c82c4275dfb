"""Large batches over the TCP transfer path between real client processes, with every transfer
socket's buffers capped at the kernel's defaults (``MOONCAKE_PY_TCP_SOCKET_BUFFER``).

A client that sent every request of a batch before reading any answer deadlocked here once
the two socket buffers filled up (both ends blocked in ``send``); the client's window of
unanswered requests must keep such batches moving however small the buffers are.

The segment owner is one process; the writer and reader is another that contributes nothing
and forces TCP, so every byte goes through the owner's transfer service (checked: the owner's
server counts every op and byte, and the other process maps no shared-memory file).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mooncake_py.client import transfer_framing
from mooncake_py.client.transfer import TransferClient
from mooncake_py.testing import InProcessMaster
from mooncake_py.units import ConfigError, parse_size
from tests.conftest import client_config
from tests.integration.tcp_worker import SMALL, TcpWorkerProcess, batch_digest

KEYS = 100_000  # the master's default --max_batch_keys: the largest batch one call may carry


def _kernel_default(name: str) -> int:
    """``net.core.<name>``, the buffer size a socket gets when nobody asks for one."""
    return int(Path(f"/proc/sys/net/core/{name}").read_text().strip())


BUFFER = min(_kernel_default("wmem_default"), _kernel_default("rmem_default"))


@pytest.fixture
def owner_and_writer() -> Iterator[tuple[TcpWorkerProcess, TcpWorkerProcess]]:
    env = {"MOONCAKE_PY_FORCE_TCP": "1", "MOONCAKE_PY_TCP_SOCKET_BUFFER": str(BUFFER)}
    with InProcessMaster() as master:
        owner = TcpWorkerProcess(env)
        writer = TcpWorkerProcess(env)
        try:
            assert owner.call("setup", config=client_config(master.address, 320 << 20)) == 0
            assert writer.call("setup", config=client_config(master.address, 0)) == 0
            yield owner, writer
        finally:
            owner.stop()
            writer.stop()
        master.service.check()


def _assert_small_buffers(view: dict[str, list[list[int]]], side: str) -> None:
    sockets = view[f"{side}_sockets"]
    assert sockets, f"no {side} transfer socket to inspect"
    for sndbuf, rcvbuf in sockets:
        # Linux reports twice what was set (the doubling covers its bookkeeping): exactly
        # the knob's value, not the 4 MiB asked for by default.
        assert (sndbuf, rcvbuf) == (2 * BUFFER, 2 * BUFFER), side


def _round_trip(
    owner: TcpWorkerProcess,
    writer: TcpWorkerProcess,
    prefix: str,
    count: int,
    sizes: tuple[int, int],
) -> None:
    expected_digest, expected_bytes = batch_digest(prefix, count, sizes)
    served_before = owner.call("transfer_view")["served"]

    put = writer.call("put_generated", prefix=prefix, count=count, sizes=sizes)
    assert put == {"failed": 0, "first_codes": []}
    after_put = owner.call("transfer_view")
    # Every value went to the owner's transfer service as one WRITE.
    assert after_put["served"][0] - served_before[0] == count
    assert after_put["served"][1] - served_before[1] == expected_bytes
    _assert_small_buffers(after_put, "server")

    got = writer.call("get_generated", prefix=prefix, count=count, sizes=sizes)
    assert got["codes"] == [] and got["wrong"] == 0, got
    assert (got["digest"], got["bytes"]) == (expected_digest, expected_bytes)
    after_get = owner.call("transfer_view")
    assert after_get["served"][0] - after_put["served"][0] == count  # one READ per key
    assert after_get["served"][1] - after_put["served"][1] == expected_bytes

    writer_view = writer.call("transfer_view")
    _assert_small_buffers(writer_view, "client")
    assert writer_view["shm_maps"] == []  # nothing of the owner's segment is mapped here


def test_100k_key_batches_over_tcp_with_default_socket_buffers(
    owner_and_writer: tuple[TcpWorkerProcess, TcpWorkerProcess],
) -> None:
    owner, writer = owner_and_writer
    _round_trip(owner, writer, "small", KEYS, SMALL)


def test_large_values_over_tcp_with_default_socket_buffers(
    owner_and_writer: tuple[TcpWorkerProcess, TcpWorkerProcess],
) -> None:
    """~140 MiB in one batch: values of 16-128 KiB fill the client's byte window (32 MiB)
    many times over and take the direct-receive path (64 KiB and more)."""
    owner, writer = owner_and_writer
    _round_trip(owner, writer, "large", 2_000, (16 << 10, 128 << 10))


@pytest.fixture
def fresh_knob() -> Iterator[None]:
    """Let ``MOONCAKE_PY_TCP_SOCKET_BUFFER`` be read again (it is read once per process)."""
    transfer_framing.env_socket_buffers.cache_clear()
    yield
    transfer_framing.env_socket_buffers.cache_clear()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", (transfer_framing.SOCKET_BUFFER_BYTES,) * 2),
        (str(BUFFER), (BUFFER, BUFFER)),
        ("256kb", (parse_size("256kb"),) * 2),
        ("0", None),
    ],
)
def test_the_socket_buffer_knob(
    monkeypatch: pytest.MonkeyPatch, fresh_knob: None, text: str, expected: object
) -> None:
    monkeypatch.setenv("MOONCAKE_PY_TCP_SOCKET_BUFFER", text)
    assert transfer_framing.env_socket_buffers() == expected
    monkeypatch.setenv("MOONCAKE_PY_TCP_SOCKET_BUFFER", "12345")  # read once: no effect now
    assert transfer_framing.env_socket_buffers() == expected


def test_an_invalid_socket_buffer_knob_fails_creation(
    monkeypatch: pytest.MonkeyPatch, fresh_knob: None
) -> None:
    monkeypatch.setenv("MOONCAKE_PY_TCP_SOCKET_BUFFER", "lots")
    with pytest.raises(ConfigError, match="MOONCAKE_PY_TCP_SOCKET_BUFFER"):
        TransferClient()
    TransferClient(socket_buffers=None).close()  # an explicit choice ignores the variable
