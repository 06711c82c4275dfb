"""mooncake_py.tls: validation, contexts that really handshake, and the config wiring."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest

from mooncake_py.client.config import ClientConfig, ClientConfigError
from mooncake_py.master.config import MasterConfig, parse_args
from mooncake_py.tls import (
    TlsConfig,
    check_hostname_target,
    client_context,
    grpc_channel_credentials,
    grpc_channel_options,
    grpc_server_credentials,
    server_context,
)
from mooncake_py.units import ConfigError
from tests.tls_certs import Pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> str:
    """Handshake over a loopback connection; returns "ok" or both sides' error texts.

    Both sides run: the server on a thread, the client here; one byte is echoed so that a
    server-side refusal (TLS 1.3 reports it after the client's handshake) reaches the client.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    errors: list[str] = []

    def serve() -> None:
        conn, _ = listener.accept()
        conn.settimeout(5)
        try:
            with server.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(tls.recv(1))
        except (ssl.SSLError, OSError) as exc:
            errors.append(f"server: {exc}")

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            client.wrap_socket(raw, server_hostname=name) as tls,
        ):
            tls.sendall(b"x")
            if tls.recv(1) != b"x":
                errors.append("client: connection closed")
    except (ssl.SSLError, OSError) as exc:
        errors.append(f"client: {exc}")
    finally:
        thread.join(5)
        listener.close()
    return "; ".join(sorted(errors)) if errors else "ok"  # client's first, whichever came first


def test_tls_and_hostname_checks(pki: Pki) -> None:
    server = server_context(pki.server())
    client = client_context(pki.client())
    assert client.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert server.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert client.check_hostname and client.verify_mode == ssl.CERT_REQUIRED
    assert _handshake(server, client, "127.0.0.1") == "ok"  # an IP SAN
    assert _handshake(server, client, "localhost") == "ok"
    assert "certificate" in _handshake(server, client, "10.9.8.7").lower()


def test_server_name_replaces_the_dialed_host(pki: Pki) -> None:
    cfg = pki.client(server_name="master.example")
    assert check_hostname_target(cfg, "10.9.8.7") == "master.example"
    assert check_hostname_target(pki.client(), "10.9.8.7") == "10.9.8.7"
    assert grpc_channel_options(cfg) == [("grpc.ssl_target_name_override", "master.example")]
    assert grpc_channel_options(pki.client()) == []
    server = server_context(pki.server())
    assert _handshake(server, client_context(cfg), check_hostname_target(cfg, "10.9.8.7")) == "ok"


def test_another_ca_is_not_trusted(pki: Pki, tmp_path: Path) -> None:
    other = Pki(tmp_path / "other")
    outcome = _handshake(server_context(pki.server()), client_context(other.client()), "127.0.0.1")
    assert "certificate verify failed" in outcome


def test_mutual_tls_needs_a_client_certificate(pki: Pki) -> None:
    server = server_context(pki.server(mutual=True))
    assert server.verify_mode == ssl.CERT_REQUIRED
    assert _handshake(server, client_context(pki.client(with_cert=True)), "127.0.0.1") == "ok"
    assert _handshake(server, client_context(pki.client()), "127.0.0.1") != "ok"
    # Without mutual TLS the server asks for no certificate at all.
    assert server_context(pki.server()).verify_mode == ssl.CERT_NONE


def test_validation_names_the_file(pki: Pki, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ConfigError, match=r"tls_ca_file=.*nope\.pem.*no such file"):
        TlsConfig(ca_file=missing)
    with pytest.raises(ConfigError, match="--tls_cert_file=.*nope"):
        TlsConfig(cert_file=missing, key_file=pki.key_file, setting_prefix="--tls_")
    with pytest.raises(ConfigError, match="tls_key_file is not"):
        TlsConfig(cert_file=pki.cert_file)
    with pytest.raises(ConfigError, match="needs tls_ca_file"):
        TlsConfig(pki.cert_file, pki.key_file, require_client_cert=True)
    with pytest.raises(ConfigError, match="needs tls_cert_file and tls_key_file"):
        server_context(TlsConfig(ca_file=pki.ca_file))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="garbage.pem"):
        client_context(TlsConfig(ca_file=str(garbage)))
    with pytest.raises(ConfigError, match="garbage.pem"):
        server_context(TlsConfig(cert_file=str(garbage), key_file=pki.key_file))
    # A key that is not the certificate's.
    with pytest.raises(ConfigError, match="matching private key"):
        server_context(TlsConfig(cert_file=pki.cert_file, key_file=pki.client_key))
    with pytest.raises(ConfigError, match="garbage.pem"):
        grpc_server_credentials(TlsConfig(cert_file=str(garbage), key_file=pki.key_file))


def test_grpc_credentials_build(pki: Pki) -> None:
    assert grpc_server_credentials(pki.server(mutual=True)) is not None
    assert grpc_channel_credentials(pki.client(with_cert=True)) is not None


def test_master_flags_and_file_keys(pki: Pki, tmp_path: Path) -> None:
    assert MasterConfig().tls() is None
    config = parse_args(
        [
            "--tls_cert_file",
            pki.cert_file,
            "--tls-key-file",
            pki.key_file,
            "--tls_ca_file",
            pki.ca_file,
            "--tls_require_client_cert",
        ]
    )
    tls = config.tls()
    assert tls is not None and tls.require_client_cert and tls.cert_file == pki.cert_file
    conf = tmp_path / "master.yaml"
    conf.write_text(f"tls_cert_file: {pki.cert_file}\ntls_key_file: {pki.key_file}\n")
    from_file = parse_args(["--config", str(conf)]).tls()
    assert from_file is not None and not from_file.require_client_cert
    with pytest.raises(ConfigError, match="--tls_cert_file and --tls_key_file"):
        parse_args(["--tls_ca_file", pki.ca_file])
    with pytest.raises(ConfigError, match="--tls_key_file=.*missing"):
        parse_args(["--tls_cert_file", pki.cert_file, "--tls_key_file", "missing.key"])


def test_client_keys_and_environment(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = ClientConfig.from_mapping({"global_segment_size": 0})
    assert plain.tls_config() is None
    keyed = ClientConfig.from_mapping(
        {
            "tls_ca_file": pki.ca_file,
            "tls_cert_file": pki.client_cert,
            "tls_key_file": pki.client_key,
            "tls_require_client_cert": "true",
        }
    )
    tls = keyed.tls_config()
    assert tls is not None and tls.require_client_cert and tls.ca_file == pki.ca_file
    monkeypatch.setenv("MOONCAKE_PY_TLS_CA", pki.ca_file)
    monkeypatch.setenv("MOONCAKE_PY_TLS_SERVER_NAME", "master.example")
    from_env = ClientConfig.from_mapping({"global_segment_size": 0}).tls_config()
    assert from_env is not None and from_env.server_name == "master.example"
    assert not from_env.has_identity
    # A client contributing memory serves its transfer service with a certificate.
    with pytest.raises(ClientConfigError, match="needs tls_cert_file and tls_key_file"):
        ClientConfig.from_mapping({"global_segment_size": "16mb"})
    with pytest.raises(ClientConfigError, match="tls_ca_file=.*no such file"):
        ClientConfig.from_mapping({"global_segment_size": 0, "tls_ca_file": "/nonexistent.pem"})
