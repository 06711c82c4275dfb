"""TLS and mutual TLS on every port: a TLS master as a subprocess, client processes whose bytes
cross TLS transfer connections (``force_tcp``), the CLI, ``/metrics`` over HTTPS, and
plaintext refused on the gRPC port, the stream channel, the HTTP port and the transfer service.

The certificates come from a throwaway CA made here (:mod:`tests.tls_certs`).
"""

from __future__ import annotations

import hashlib
import socket
import ssl
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mooncake_py import capability
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.client.transfer import (
    OP_READ,
    OP_WRITE,
    TransferClient,
    TransferOp,
    TransferServer,
)
from mooncake_py.client.transfer_framing import REQUEST, REQUEST_MAGIC
from mooncake_py.errors import MasterUnavailableError, TransferError
from mooncake_py.testing import MasterProcess
from tests.conftest import REPO_ROOT, ClientProcess, client_config
from tests.tls_certs import Pki

pytestmark = pytest.mark.timeout(240)

VALUE_BYTES = 3 << 20  # several TLS records and several transfer parts


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class TlsMaster:
    """A TLS master subprocess with its three ports known."""

    def __init__(self, pki: Pki, mutual: bool) -> None:
        self.metrics_port, self.fast_port = _free_port(), _free_port()
        args = [
            *("--metrics_port", str(self.metrics_port)),
            *("--fast_rpc_port", str(self.fast_port)),
            *("--tls_cert_file", pki.cert_file, "--tls_key_file", pki.key_file),
        ]
        if mutual:
            args += ["--tls_ca_file", pki.ca_file, "--tls_require_client_cert"]
        self.process = MasterProcess(args)

    @property
    def address(self) -> str:
        return self.process.address


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_master(pki: Pki) -> Iterator[TlsMaster]:
    master = TlsMaster(pki, mutual=False)
    with master.process:
        yield master


@pytest.fixture
def mutual_master(pki: Pki) -> Iterator[TlsMaster]:
    master = TlsMaster(pki, mutual=True)
    with master.process:
        yield master


def _tls_keys(pki: Pki, with_cert: bool = True, mutual: bool = False) -> dict[str, Any]:
    keys: dict[str, Any] = {"tls_ca_file": pki.ca_file}
    if with_cert:
        keys |= {"tls_cert_file": pki.client_cert, "tls_key_file": pki.client_key}
    if mutual:
        keys["tls_require_client_cert"] = True
    return keys


def _start_client(
    started: list[ClientProcess], address: str, segment_bytes: int, **extra: Any
) -> tuple[ClientProcess, int]:
    """A client process (force_tcp) set up against ``address``: (process, setup code)."""
    client = ClientProcess(env={"MOONCAKE_PY_FORCE_TCP": "1"})
    started.append(client)
    config = client_config(address, segment_bytes) | {"rpc_timeout_s": 3.0} | extra
    return client, int(client.call("setup", config=config))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mooncake_py.cli", "--timeout", "3", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _https_context(pki: Pki, with_cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki.ca_file)
    if with_cert:
        context.load_cert_chain(pki.client_cert, pki.client_key)
    return context


def _scrape(port: int, context: ssl.SSLContext) -> str:
    url = f"https://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, context=context, timeout=10) as reply:
        return str(reply.read().decode())


def _plaintext_answer(port: int, request: bytes) -> bytes:
    """What a TLS-only port answers a plaintext ``request`` with: the first bytes it sends
    before closing (b"" when it just closes; a reset counts as closing)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except ConnectionResetError:
            pass
        return answer


def _expected_digest(client: ClientProcess, key: str) -> str:
    return str(client.call("expected_digest", key=key, size=VALUE_BYTES))


def test_tls_master_and_tls_transfers_between_processes(
    tls_master: TlsMaster, pki: Pki, client_processes: list[ClientProcess], tmp_path: Path
) -> None:
    writer, code = _start_client(client_processes, tls_master.address, 32 << 20, **_tls_keys(pki))
    assert code == 0
    reader, code = _start_client(client_processes, tls_master.address, 32 << 20, **_tls_keys(pki))
    assert code == 0
    keys = [f"tls-{i}" for i in range(8)]
    assert writer.call("put_from", keys=keys, size=VALUE_BYTES, replica_num=2) == [0] * 8
    expected = [_expected_digest(reader, key) for key in keys]
    # Each key has a replica in the other process's segment: bytes crossed TLS sockets.
    assert reader.call("get_into_digests", keys=keys, size=VALUE_BYTES) == expected
    assert writer.call("get_into_digests", keys=keys, size=VALUE_BYTES) == expected

    # The CLI: plain master calls, and a value read over a TLS transfer connection.
    saved = tmp_path / "value.bin"
    done = _cli(
        "--master", tls_master.address, "--tls-ca", pki.ca_file, "keys", "get", keys[0],
        "-o", str(saved),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == expected[0]
    stats = _cli("--master", tls_master.address, "--tls-ca", pki.ca_file, "--json", "stats")
    assert stats.returncode == 0, stats.stderr
    plain_cli = _cli("--master", tls_master.address, "--json", "stats")
    assert plain_cli.returncode == 3, plain_cli.stderr  # master unreachable

    metrics = _scrape(tls_master.metrics_port, _https_context(pki, with_cert=False))
    assert "master_key_count 8.0" in metrics


def test_plaintext_is_refused_on_every_port(
    tls_master: TlsMaster, pki: Pki, client_processes: list[ClientProcess]
) -> None:
    server, code = _start_client(client_processes, tls_master.address, 16 << 20, **_tls_keys(pki))
    assert code == 0

    # gRPC: the handshake fails, the call finds no master.
    plain = MasterClient(tls_master.address, timeout_s=2.0)
    with pytest.raises(MasterUnavailableError):
        plain.service_ready()
    plain.close()
    # A plaintext client process cannot join.
    _, code = _start_client(client_processes, tls_master.address, 16 << 20)
    assert code != 0

    # Stream channel: the connection is closed without an answer frame.
    frame_request = b"\x00" * 64
    assert _plaintext_answer(tls_master.fast_port, frame_request) == b""
    # HTTP: no plaintext answer at all.
    http_request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    assert not _plaintext_answer(tls_master.metrics_port, http_request).startswith(b"HTTP/")
    # The transfer service: a plaintext READ request gets no answer.
    endpoint = str(server.call("hostname"))
    header = REQUEST.pack(REQUEST_MAGIC, OP_READ, 0, 16, uuid.uuid4().bytes, bytes(41))
    answer = _plaintext_answer(int(endpoint.rsplit(":", 1)[1]), header)
    assert not answer.startswith(b"MCPR")
    # And the TLS client's own refusal: a plaintext transfer client sees a TLS server.
    with pytest.raises(TransferError):
        TransferClient().run(
            endpoint, [TransferOp(OP_READ, str(uuid.uuid4()), 0, memoryview(bytearray(16)))]
        )


def test_a_tls_client_refuses_a_plaintext_master(
    master_process: MasterProcess, pki: Pki, client_processes: list[ClientProcess]
) -> None:
    _, code = _start_client(client_processes, master_process.address, 0, **_tls_keys(pki))
    assert code != 0
    tls_client = MasterClient(master_process.address, timeout_s=2.0, tls=pki.client())
    with pytest.raises(MasterUnavailableError):
        tls_client.service_ready()
    tls_client.close()
    plain = MasterClient(master_process.address, timeout_s=5.0)
    assert plain.service_ready()  # the master itself is fine
    plain.close()


def test_mutual_tls_refuses_clients_without_a_certificate(
    mutual_master: TlsMaster, pki: Pki, client_processes: list[ClientProcess], tmp_path: Path
) -> None:
    mutual = _tls_keys(pki, mutual=True)
    writer, code = _start_client(client_processes, mutual_master.address, 16 << 20, **mutual)
    assert code == 0
    reader, code = _start_client(client_processes, mutual_master.address, 16 << 20, **mutual)
    assert code == 0
    assert writer.call("put_from", keys=["m"], size=VALUE_BYTES, replica_num=2) == [0]
    expected = _expected_digest(reader, "m")
    assert reader.call("get_into_digests", keys=["m"], size=VALUE_BYTES) == [expected]

    # Without a certificate: no process, no CLI, no scrape, no transfer.
    _, code = _start_client(
        client_processes, mutual_master.address, 0, **_tls_keys(pki, with_cert=False)
    )
    assert code != 0
    anonymous = MasterClient(mutual_master.address, timeout_s=2.0, tls=pki.client())
    with pytest.raises(MasterUnavailableError):
        anonymous.service_ready()
    anonymous.close()
    certified = MasterClient(mutual_master.address, timeout_s=5.0, tls=pki.client(True))
    assert certified.service_ready()
    assert certified.connect_stream()  # the stream channel takes the certificate too
    assert certified.service_ready()
    certified.close()

    base = ("--master", mutual_master.address, "--tls-ca", pki.ca_file, "--json", "stats")
    assert _cli(*base).returncode == 3
    with_cert = _cli("--tls-cert", pki.client_cert, "--tls-key", pki.client_key, *base)
    assert with_cert.returncode == 0, with_cert.stderr

    assert "master_key_count 1.0" in _scrape(
        mutual_master.metrics_port, _https_context(pki, with_cert=True)
    )
    with pytest.raises(OSError):
        _scrape(mutual_master.metrics_port, _https_context(pki, with_cert=False))

    endpoint = str(reader.call("hostname"))
    op = TransferOp(OP_READ, str(uuid.uuid4()), 0, memoryview(bytearray(16)))
    with pytest.raises(TransferError):
        TransferClient(tls=pki.client()).run(endpoint, [op])
    # With a certificate the connection is served (the op itself has no capability).
    assert TransferClient(tls=pki.client(True)).run(endpoint, [op]) != [0]


def test_transfer_service_over_tls_full_duplex_and_refusals(pki: Pki) -> None:
    """The transfer service alone, in this process: a pipelined batch both ways over TLS
    (pooled connection reused), and every mismatch of TLS settings refused."""
    segment_id = str(uuid.uuid4())
    segment = memoryview(bytearray(48 << 20))
    key = capability.new_segment_key()
    grant = capability.grant_of(
        capability.mint(
            key,
            segment_id.encode(),
            0,
            len(segment),
            capability.READ | capability.WRITE,
            capability.now_ms() + 600_000,
        )
    )

    def lookup(segment_uuid: bytes) -> tuple[memoryview, bytes] | None:
        return (segment, key) if segment_uuid == uuid.UUID(segment_id).bytes else None

    part = 1 << 20
    source = bytes(range(256)) * (40 * part // 256)
    writes = [
        TransferOp(
            OP_WRITE, segment_id, i * part, memoryview(source)[i * part : (i + 1) * part], grant
        )
        for i in range(40)
    ]
    back = bytearray(len(source))
    reads = [
        TransferOp(
            OP_READ, segment_id, i * part, memoryview(back)[i * part : (i + 1) * part], grant
        )
        for i in range(40)
    ]
    mutual_server = TransferServer("127.0.0.1", lookup, 0, tls=pki.server(mutual=True))
    plain_server = TransferServer("127.0.0.1", lookup, 0)
    client = TransferClient(tls=pki.client(with_cert=True))
    try:
        assert client.run(mutual_server.endpoint, writes) == [0] * 40
        assert client.run(mutual_server.endpoint, reads) == [0] * 40  # the pooled connection
        assert bytes(back) == source
        assert mutual_server.connection_count == 1
        small = [TransferOp(OP_READ, segment_id, 5, memoryview(bytearray(4096)), grant)]
        assert client.run(mutual_server.endpoint, small) == [0]
        assert bytes(small[0].buffer) == source[5 : 5 + 4096]

        refusals = [
            (TransferClient(tls=pki.client()), mutual_server.endpoint),  # no certificate
            (TransferClient(), mutual_server.endpoint),  # plaintext to TLS
            (client, plain_server.endpoint),  # TLS to plaintext
        ]
        for other, endpoint in refusals:
            with pytest.raises(TransferError):
                other.run(endpoint, small)
        served_ops, _ = plain_server.served
        assert served_ops == 0
    finally:
        client.close()
        mutual_server.close()
        plain_server.close()
