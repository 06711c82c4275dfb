"""A throwaway certificate authority for the TLS tests (trustme), written to PEM files."""

from __future__ import annotations

from pathlib import Path

import trustme

from mooncake_py.tls import TlsConfig


class Pki:
    """A CA, a server certificate and client certificates, as files under ``root``.

    The server certificate names 127.0.0.1, localhost and ``master.example``; every client
    certificate names 127.0.0.1 too, since a client's transfer service presents it to peers
    dialing 127.0.0.1.

    Attributes:
        ca_file: the CA certificate (PEM).
        cert_file, key_file: the server's certificate chain and key.
        client_cert, client_key: a client's certificate chain and key.
    """

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.ca = trustme.CA()
        self.ca_file = str(root / "ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_file)
        self.cert_file, self.key_file = self.issue(
            "server", "127.0.0.1", "localhost", "master.example"
        )
        self.client_cert, self.client_key = self.issue("client", "127.0.0.1", "client.example")

    def issue(self, name: str, *identities: str) -> tuple[str, str]:
        """Issue a certificate for ``identities``; returns (chain file, key file)."""
        issued = self.ca.issue_cert(*identities)
        cert, key = str(self.root / f"{name}.pem"), str(self.root / f"{name}.key")
        issued.cert_chain_pems[0].write_to_path(cert)
        for pem in issued.cert_chain_pems[1:]:
            pem.write_to_path(cert, append=True)
        issued.private_key_pem.write_to_path(key)
        return cert, key

    def server(self, mutual: bool = False) -> TlsConfig:
        """The server's settings (with ``mutual``: client certificates required)."""
        return TlsConfig(self.cert_file, self.key_file, self.ca_file, require_client_cert=mutual)

    def client(self, with_cert: bool = False, server_name: str = "") -> TlsConfig:
        """A client's settings: the CA, and the client certificate when ``with_cert``."""
        cert, key = (self.client_cert, self.client_key) if with_cert else ("", "")
        return TlsConfig(cert, key, self.ca_file, server_name=server_name)
