"""TLS and mutual TLS for every port of the store: gRPC, the stream channel, HTTP, transfers.

One :class:`TlsConfig` describes the PEM files a process uses; the same object builds the
``ssl.SSLContext`` of a plain socket (the master's stream channel and HTTP port, the clients'
TCP transfer service) and the gRPC credentials of the master's gRPC port, so every port of a
deployment trusts the same CA and presents the same certificate.

Roles:

- **Server** (the master; a client's transfer service): presents ``cert_file``/``key_file``
  (both required). With ``require_client_cert`` (mutual TLS) it accepts only peers presenting
  a certificate signed by ``ca_file`` (then required).
- **Client** (a client's gRPC and stream channels to the master; a client's transfer
  connections to peers; the CLI): verifies the server's certificate against ``ca_file`` (or
  the system trust store when no CA file is given) and presents ``cert_file``/``key_file``
  when both are set (needed when the server requires mutual TLS).

Hostname checking: endpoints are written ``host:port`` where ``host`` is usually an IP
address (what a client advertises as its transfer endpoint) and sometimes a DNS name. A
client checks the server's certificate against that ``host`` (a DNS name against the
certificate's DNS SANs, an IP address against its IP SANs), so certificates must name the
addresses peers dial. When they do not (a certificate issued for a service name while peers
dial pod IPs), ``server_name`` replaces the dialed host in the check for every connection of
that process; the chain is always verified against the CA, and hostname checking is never
switched off. Minimum protocol version is TLS 1.2 on both sides, for ``ssl`` and gRPC alike
(gRPC's core default).

Errors: every problem with a file (missing, unreadable, not a PEM certificate or key, a key
that does not match its certificate) raises :class:`~mooncake_py.units.ConfigError` naming
the file and the setting it came from.

Thread-safety: :class:`TlsConfig` is immutable; contexts and credentials are built on each
call (they read the files each time, so a rotated certificate is picked up by the next
server start or connection built from a fresh context) and may be shared between threads
once built, as ``ssl`` and gRPC allow.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from typing import TYPE_CHECKING

from mooncake_py.units import ConfigError

if TYPE_CHECKING:
    import grpc

__all__ = [
    "TlsConfig",
    "check_hostname_target",
    "client_context",
    "grpc_channel_credentials",
    "grpc_channel_options",
    "grpc_server_credentials",
    "server_context",
]


def _check_readable(path: str, setting: str) -> None:
    """Raise ConfigError naming ``path`` and ``setting`` unless ``path`` is a readable file."""
    if not os.path.isfile(path):
        raise ConfigError(f"invalid {setting}={path!r}: no such file")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"invalid {setting}={path!r}: file is not readable")


@dataclasses.dataclass(frozen=True)
class TlsConfig:
    """The PEM files of one process's TLS, and whether its servers require client certificates.

    Attributes:
        cert_file: PEM certificate chain this process presents (leaf first), or ``""``.
        key_file: PEM private key of ``cert_file`` (unencrypted), or ``""``.
        ca_file: PEM bundle of the CA(s) that sign peers' certificates, or ``""`` (clients
            then use the system trust store; a mutual-TLS server cannot do without it).
        require_client_cert: mutual TLS: this process's servers refuse a peer that does not
            present a certificate signed by ``ca_file``. Clients ignore it.
        server_name: the name a client checks the server's certificate against instead of the
            host it dials (module docstring), or ``""`` for the dialed host.
        setting_prefix: how the settings are called where they came from (``"--tls_"`` for
            master flags, ``"tls_"`` for client config keys), so an error names the setting
            a user wrote.

    Raises:
        ConfigError: (at construction) a file that does not exist or is not readable; only
            one of ``cert_file``/``key_file``; ``require_client_cert`` without ``ca_file``.
            Whether the files hold valid PEM is checked when a context is built.
    """

    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    require_client_cert: bool = False
    server_name: str = ""
    setting_prefix: str = "tls_"

    def __post_init__(self) -> None:
        p = self.setting_prefix
        for setting, path in (
            ("cert_file", self.cert_file),
            ("key_file", self.key_file),
            ("ca_file", self.ca_file),
        ):
            if path:
                _check_readable(path, p + setting)
        if bool(self.cert_file) != bool(self.key_file):
            missing = "key_file" if self.cert_file else "cert_file"
            given = "cert_file" if self.cert_file else "key_file"
            raise ConfigError(f"{p}{given} is set but {p}{missing} is not: both are needed")
        if self.require_client_cert and not self.ca_file:
            raise ConfigError(
                f"{p}require_client_cert (mutual TLS) needs {p}ca_file: the CA that signs "
                "client certificates"
            )

    @property
    def has_identity(self) -> bool:
        """Whether this process has a certificate and key to present."""
        return bool(self.cert_file)

    def require_server_identity(self) -> None:
        """Raise ConfigError unless a certificate and key are set (a server needs them)."""
        if not self.has_identity:
            p = self.setting_prefix
            raise ConfigError(f"TLS on a server needs {p}cert_file and {p}key_file")

    def read(self, which: str) -> bytes:
        """The bytes of ``cert_file``, ``key_file`` or ``ca_file`` (``which``), for gRPC.

        Raises:
            ConfigError: the file cannot be read.
        """
        path = str(getattr(self, which))
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise ConfigError(f"invalid {self.setting_prefix}{which}={path!r}: {exc}") from exc


def _load_identity(ctx: ssl.SSLContext, cfg: TlsConfig) -> None:
    """Load ``cfg``'s certificate and key into ``ctx``, naming the file on failure."""
    try:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"invalid {cfg.setting_prefix}cert_file={cfg.cert_file!r} / "
            f"{cfg.setting_prefix}key_file={cfg.key_file!r}: not a PEM certificate chain "
            f"with its matching private key ({exc})"
        ) from exc


def _load_ca(ctx: ssl.SSLContext, cfg: TlsConfig) -> None:
    """Trust ``cfg.ca_file`` in ``ctx``, naming the file on failure."""
    try:
        ctx.load_verify_locations(cafile=cfg.ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"invalid {cfg.setting_prefix}ca_file={cfg.ca_file!r}: not a PEM CA bundle ({exc})"
        ) from exc


def server_context(cfg: TlsConfig) -> ssl.SSLContext:
    """A server-side context: TLS 1.2+, ``cfg``'s identity, client certificates if mutual.

    Returns:
        A new ``ssl.SSLContext`` for ``wrap_socket(..., server_side=True)``; with
        ``require_client_cert`` the handshake fails for a client without a certificate
        signed by ``cfg.ca_file`` (``CERT_REQUIRED``), otherwise none is asked for.

    Raises:
        ConfigError: no certificate/key, or a file that is not valid PEM or does not match.
    """
    cfg.require_server_identity()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_identity(ctx, cfg)
    if cfg.require_client_cert:
        _load_ca(ctx, cfg)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(cfg: TlsConfig) -> ssl.SSLContext:
    """A client-side context: TLS 1.2+, server certificate and hostname verified.

    Returns:
        A new ``ssl.SSLContext`` (``CERT_REQUIRED``, ``check_hostname``) trusting
        ``cfg.ca_file`` (or the system store without one) and presenting ``cfg``'s identity
        when it has one. Wrap sockets with ``server_hostname=check_hostname_target(cfg,
        host)``.

    Raises:
        ConfigError: a file that is not valid PEM, or a key that does not match.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cfg.ca_file:
        _load_ca(ctx, cfg)
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if cfg.has_identity:
        _load_identity(ctx, cfg)
    return ctx


def check_hostname_target(cfg: TlsConfig, host: str) -> str:
    """The name a client checks the server certificate of ``host`` against.

    Args:
        cfg: the client's TLS settings.
        host: the host part of the dialed ``host:port`` (brackets of an IPv6 literal removed).

    Returns:
        ``cfg.server_name`` when set, else ``host``.
    """
    return cfg.server_name or host


def grpc_server_credentials(cfg: TlsConfig) -> grpc.ServerCredentials:
    """gRPC server credentials equivalent to :func:`server_context`.

    Raises:
        ConfigError: no certificate/key, a file that cannot be read, or invalid PEM (checked
            by building :func:`server_context` first, since gRPC only reports bad PEM when the
            server starts, without naming the file).
    """
    import grpc

    server_context(cfg)
    root = cfg.read("ca_file") if cfg.require_client_cert else None
    return grpc.ssl_server_credentials(
        [(cfg.read("key_file"), cfg.read("cert_file"))],
        root_certificates=root,
        require_client_auth=cfg.require_client_cert,
    )


def grpc_channel_credentials(cfg: TlsConfig) -> grpc.ChannelCredentials:
    """gRPC channel credentials equivalent to :func:`client_context`.

    Raises:
        ConfigError: a file that cannot be read, or invalid PEM.
    """
    import grpc

    client_context(cfg)
    return grpc.ssl_channel_credentials(
        root_certificates=cfg.read("ca_file") if cfg.ca_file else None,
        private_key=cfg.read("key_file") if cfg.has_identity else None,
        certificate_chain=cfg.read("cert_file") if cfg.has_identity else None,
    )


def grpc_channel_options(cfg: TlsConfig) -> list[tuple[str, str]]:
    """Channel options that make gRPC check ``cfg.server_name`` instead of the target host.

    Returns:
        ``[("grpc.ssl_target_name_override", server_name)]`` when ``server_name`` is set,
        else ``[]`` (gRPC then checks the target's host, as :func:`client_context` does).
    """
    if cfg.server_name:
        return [("grpc.ssl_target_name_override", cfg.server_name)]
    return []
