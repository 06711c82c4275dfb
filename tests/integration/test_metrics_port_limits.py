"""The metrics port serves a bounded number of connections: idle or stalling ones cost at most
``MAX_HTTP_CONNECTIONS`` threads, one beyond is closed without an answer, and the port serves
again once they go (a real master in this process)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from mooncake_py.master import metrics
from mooncake_py.testing import InProcessMaster, wait_until

SLOTS = 6


@pytest.fixture
def master(monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcessMaster]:
    monkeypatch.setattr(metrics, "MAX_HTTP_CONNECTIONS", SLOTS)
    with InProcessMaster() as started:
        yield started


def _health(port: int) -> bytes:
    """The raw answer to GET /health; empty when the connection is closed unanswered."""
    chunks = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        try:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            return b""
    return b"".join(chunks)


def test_idle_connections_cannot_take_more_than_their_slots(master: InProcessMaster) -> None:
    port = master.metrics_port
    assert _health(port).startswith(b"HTTP/1.0 200")
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(SLOTS)]
    try:
        # Every slot is held by a connection that sends nothing: the next one is closed unanswered.
        wait_until(lambda: _health(port) == b"", timeout_s=10, what="a refusal at capacity")
    finally:
        for conn in idle:
            conn.close()
    wait_until(
        lambda: _health(port).startswith(b"HTTP/1.0 200"), timeout_s=10, what="the port serving"
    )
