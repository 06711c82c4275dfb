"""Client configuration: one frozen object built from ``setup`` arguments, env vars or a file.

Sources, as upstream's client and ``mooncake_config.py`` read them:

- ``setup(local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol,
  rdma_devices, master_server_addr, ..., tenant_id=...)`` (positional form);
- ``setup({...})`` (dict form; values may be strings);
- ``setup()`` with no arguments: the JSON file named by ``MOONCAKE_CONFIG_PATH`` if set, else
  the environment (``MOONCAKE_MASTER``, ``MOONCAKE_LOCAL_HOSTNAME``,
  ``MOONCAKE_GLOBAL_SEGMENT_SIZE``, ``MOONCAKE_LOCAL_BUFFER_SIZE``, ``MOONCAKE_PROTOCOL``,
  ``MOONCAKE_TENANT_ID``, ``MOONCAKE_TE_META_DATA_SERVER``).

``MOONCAKE_TENANT_ID``, ``MOONCAKE_PY_FORCE_TCP``, ``MOONCAKE_PY_PREFAULT_SEGMENT`` and the
TLS variables (:data:`TLS_ENV`: ``MOONCAKE_PY_TLS_CA``, ``MOONCAKE_PY_TLS_CERT``,
``MOONCAKE_PY_TLS_KEY``, ``MOONCAKE_PY_TLS_SERVER_NAME``,
``MOONCAKE_PY_TLS_REQUIRE_CLIENT_CERT``) apply whichever form is used, unless the call sets
them explicitly. ``enable_standalone`` (a setup argument or key) and
``MOONCAKE_ENABLE_STANDALONE`` are setup switches, not configuration: see
:mod:`mooncake_py.client.compat_setup`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from mooncake_py.errors import ErrorCode, InvalidParamsError
from mooncake_py.ha_names import is_etcd_address, parse_etcd_endpoints
from mooncake_py.tls import TlsConfig
from mooncake_py.units import KIB, MIB, TIB, ConfigError, parse_bool, parse_size

from .prefault import PREFAULT_ENV

MIN_SEGMENT_BYTES = KIB
MAX_SEGMENT_BYTES = TIB

__all__ = [
    "KIB",
    "MAX_SEGMENT_BYTES",
    "MIB",
    "MIN_SEGMENT_BYTES",
    "TIB",
    "TLS_ENV",
    "ClientConfig",
    "ClientConfigError",
    "env_enable_standalone",
    "env_force_tcp",
    "lenient_flag",
    "setup_values_from_env",
]

_T = TypeVar("_T")


class ClientConfigError(ConfigError, InvalidParamsError):
    """An invalid client configuration value or file.

    Both a :class:`~mooncake_py.units.ConfigError`, like every bad configuration, and the store's
    INVALID_PARAMS error, so ``MooncakeDistributedStore.setup`` returns that code for it and
    callers catching :class:`~mooncake_py.errors.MooncakeError` keep working.
    """

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_PARAMS, message)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.detail,))


def _read(parse: Callable[[object, str], _T], value: object, key: str) -> _T:
    """``parse(value, key)``, its ConfigError raised again as a ClientConfigError."""
    try:
        return parse(value, key)
    except ConfigError as exc:
        raise ClientConfigError(str(exc)) from exc


def _read_default_on_flag(value: object, key: str) -> bool:
    # An empty value keeps the default (on), as an unset environment variable does.
    if isinstance(value, str) and not value.strip():
        return True
    return _read(parse_bool, value, key)


def _read_flag(value: object, key: str) -> bool:
    # An empty value means the flag is off, as an unset environment variable does.
    if isinstance(value, str) and not value.strip():
        return False
    return _read(parse_bool, value, key)


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """Everything a client needs to join the store.

    Attributes:
        local_hostname: this client's address; its host part is where the TCP transfer service
            listens, and (with the service's port) it names the client's segment.
        metadata_server: accepted for compatibility; segments are published through the master.
        global_segment_size: bytes this client contributes (0 = contributes nothing).
        local_buffer_size: transfers need no staging buffer, but 0 means none, as upstream: the
            drop-in store's copying calls (``put``, ``get``, ...) then fail with INVALID_PARAMS
            and only the zero-copy ones work.
        protocol: accepted for compatibility (``tcp``, ``rdma``); the data path is chosen per
            replica (shared memory on one host, TCP across hosts).
        rdma_devices: accepted for compatibility.
        master_server_addr: ``host:port`` of the master.
        tenant_id: key namespace.
        force_tcp: use the TCP path even for same-host replicas.
        rpc_timeout_s: deadline of each master call.
        master_transport: ``auto`` (the master's stream channel when offered, else gRPC) or
            ``grpc`` (gRPC only); env ``MOONCAKE_PY_MASTER_TRANSPORT``.
        auth_token: bearer token for a master started with ``--auth_tokens_file`` (env
            ``MOONCAKE_AUTH_TOKEN``); the token decides the tenant unless ``tenant_id`` is set.
        shared_segment: offer this client's segment to every tenant (env
            ``MOONCAKE_PY_SHARED_SEGMENT``): a segment-host setting for an operator, whose
            mount then needs an admin token. Otherwise only this client's tenant's objects are
            placed in its segment.
        tls_ca_file: PEM CA bundle that signs the master's and the peers' certificates (env
            ``MOONCAKE_PY_TLS_CA``). Setting it or ``tls_cert_file`` turns TLS on for every
            connection of the client: to the master (gRPC and stream channel), to peers'
            transfer services, and its own transfer service; plaintext is then refused.
        tls_cert_file: PEM certificate chain this client presents to the master (when it
            requires client certificates) and that its transfer service presents to peers
            (env ``MOONCAKE_PY_TLS_CERT``); needed when the client contributes a segment.
        tls_key_file: PEM private key of ``tls_cert_file`` (env ``MOONCAKE_PY_TLS_KEY``).
        tls_server_name: name checked against the master's and peers' certificates instead of
            the host dialed (env ``MOONCAKE_PY_TLS_SERVER_NAME``; see :mod:`mooncake_py.tls`).
        tls_require_client_cert: this client's transfer service accepts only peers presenting
            a certificate signed by ``tls_ca_file`` (env
            ``MOONCAKE_PY_TLS_REQUIRE_CLIENT_CERT``).
        prefault_segment: allocate and map every page of the segment at setup (env
            ``MOONCAKE_PY_PREFAULT_SEGMENT``; default on), so no write into it takes a page
            fault; setup then fails with INTERNAL_ERROR when the memory is not available
            (:mod:`mooncake_py.client.prefault`). Off: pages are allocated on first write.
        enable_ssd_offload: keep a disk tier under this client's segment (env
            ``MOONCAKE_OFFLOAD_ENABLED``): objects the master evicts from the segment are
            written to files under ``ssd_offload_path`` and stay readable from there
            (:mod:`mooncake_py.client.disk_tier_host`). Needs a segment.
        ssd_offload_path: the disk tier's root directory (env
            ``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH``); upstream's default,
            :data:`DEFAULT_OFFLOAD_PATH`, when the tier is on and neither names one.
        ssd_offload_quota: the tier's size in bytes (env
            ``MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES``); 0: 90 % of the free space of its
            filesystem at setup.
        ssd_offload_fsync: sync every file before the master may serve it (env
            ``MOONCAKE_PY_OFFLOAD_FSYNC``, default on). Off: a host crash may lose recent
            files (a process crash never does; a torn file is never served either way).

    Raises:
        ClientConfigError: on construction, for a segment or buffer size outside
            [1 KiB, 1 TiB] (0 aside), a missing hostname or master address, a master address
            that is not ``host:port``, an unknown ``master_transport`` or a non-positive
            ``rpc_timeout_s``; a TLS file that is missing, a certificate without its key, or
            a client contributing a segment under TLS without a certificate; a negative
            ``ssd_offload_quota``.
    """

    local_hostname: str = "127.0.0.1"
    metadata_server: str = "P2PHANDSHAKE"
    global_segment_size: int = 16 * MIB
    local_buffer_size: int = 16 * MIB
    protocol: str = "tcp"
    rdma_devices: str = ""
    master_server_addr: str = "127.0.0.1:50051"
    tenant_id: str = "default"
    force_tcp: bool = False
    rpc_timeout_s: float = 10.0
    master_transport: str = "auto"
    auth_token: str = ""
    shared_segment: bool = False
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_server_name: str = ""
    tls_require_client_cert: bool = False
    prefault_segment: bool = True
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    ssd_offload_quota: int = 0
    ssd_offload_fsync: bool = True

    def __post_init__(self) -> None:
        for name in ("global_segment_size", "local_buffer_size"):
            size = getattr(self, name)
            if size != 0 and not MIN_SEGMENT_BYTES <= size <= MAX_SEGMENT_BYTES:
                raise ClientConfigError(f"{name} must be 0 or within [1 KiB, 1 TiB]: {size}")
        if not self.local_hostname or not self.master_server_addr:
            raise ClientConfigError("local_hostname and master_server_addr must be set")
        if is_etcd_address(self.master_server_addr):
            # An HA cluster: the leader's address is read from these etcd endpoints.
            try:
                parse_etcd_endpoints(self.master_server_addr)
            except ValueError as exc:
                raise ClientConfigError(f"master address: {exc}") from None
        else:
            host, sep, port = self.master_server_addr.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ClientConfigError(
                    "master address must be host:port or etcd://HOST:PORT[;HOST:PORT]: "
                    f"{self.master_server_addr!r}",
                )
        if self.master_transport not in ("auto", "grpc"):
            raise ClientConfigError(
                f"master_transport must be 'auto' or 'grpc': {self.master_transport!r}",
            )
        if self.rpc_timeout_s <= 0:
            raise ClientConfigError("rpc_timeout_s must be positive")
        if self.enable_ssd_offload and not self.ssd_offload_path:
            # As upstream's file storage: its default directory when none is named.
            object.__setattr__(self, "ssd_offload_path", DEFAULT_OFFLOAD_PATH)
        if self.ssd_offload_quota < 0:
            raise ClientConfigError("ssd_offload_quota must be 0 or positive")
        tls = self.tls_config()
        if tls is not None and self.global_segment_size > 0 and not tls.has_identity:
            raise ClientConfigError(
                "with TLS a client contributing a segment needs tls_cert_file and tls_key_file "
                "(its transfer service presents them to peers)"
            )

    def tls_config(self) -> TlsConfig | None:
        """The TLS settings of every connection of this client; None for plaintext.

        TLS is on when ``tls_ca_file``, ``tls_cert_file`` or ``tls_key_file`` is set.

        Raises:
            ClientConfigError: a TLS file is missing or unreadable, only one of
                ``tls_cert_file``/``tls_key_file`` is set, or ``tls_require_client_cert``
                without ``tls_ca_file``.
        """
        if not (self.tls_ca_file or self.tls_cert_file or self.tls_key_file):
            if self.tls_require_client_cert:
                raise ClientConfigError("tls_require_client_cert needs tls_ca_file")
            return None
        try:
            return TlsConfig(
                cert_file=self.tls_cert_file,
                key_file=self.tls_key_file,
                ca_file=self.tls_ca_file,
                require_client_cert=self.tls_require_client_cert,
                server_name=self.tls_server_name,
                setting_prefix="tls_",
            )
        except ConfigError as exc:
            raise ClientConfigError(str(exc)) from exc

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ClientConfig:
        """Build from a setup dict or a config file's mapping; unknown keys are ignored.

        Accepts upstream's key spellings (``master_server_address``, ``device_name``). Sizes
        and ``force_tcp`` are read with :func:`mooncake_py.units.parse_size` and
        :func:`~mooncake_py.units.parse_bool` (an empty ``force_tcp`` is False).

        Raises:
            ClientConfigError: a value cannot be read or fails validation.
        """
        aliases = {"master_server_address": "master_server_addr", "device_name": "rdma_devices"}
        normalized = {aliases.get(k, k): v for k, v in values.items()}
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for name, value in normalized.items():
            if name not in fields or value is None:
                continue
            if name in ("global_segment_size", "local_buffer_size", "ssd_offload_quota"):
                kwargs[name] = _read(parse_size, value, name)
            elif name in (
                "force_tcp",
                "shared_segment",
                "tls_require_client_cert",
                "enable_ssd_offload",
            ):
                kwargs[name] = _read_flag(value, name)
            elif name in ("prefault_segment", "ssd_offload_fsync"):
                kwargs[name] = _read_default_on_flag(value, name)
            elif name == "rpc_timeout_s":
                kwargs[name] = float(value)
            else:
                kwargs[name] = str(value)
        kwargs.setdefault("force_tcp", env_force_tcp())
        if "shared_segment" not in kwargs:
            kwargs["shared_segment"] = _read_flag(
                os.environ.get("MOONCAKE_PY_SHARED_SEGMENT", ""), "MOONCAKE_PY_SHARED_SEGMENT"
            )
        if "prefault_segment" not in kwargs:
            kwargs["prefault_segment"] = _read_default_on_flag(
                os.environ.get(PREFAULT_ENV, ""), PREFAULT_ENV
            )
        for variable, name in OFFLOAD_ENV.items():
            if name not in kwargs and os.environ.get(variable):
                text = os.environ[variable]
                if name == "ssd_offload_quota":
                    kwargs[name] = _read(parse_size, text, variable)
                elif name == "enable_ssd_offload":
                    kwargs[name] = _read_flag(text, variable)
                elif name == "ssd_offload_fsync":
                    kwargs[name] = _read_default_on_flag(text, variable)
                else:
                    kwargs[name] = text
        if "auth_token" not in kwargs and os.environ.get("MOONCAKE_AUTH_TOKEN"):
            kwargs["auth_token"] = os.environ["MOONCAKE_AUTH_TOKEN"]
        if "master_transport" not in kwargs and os.environ.get("MOONCAKE_PY_MASTER_TRANSPORT"):
            kwargs["master_transport"] = os.environ["MOONCAKE_PY_MASTER_TRANSPORT"].lower()
        if "tenant_id" not in kwargs and os.environ.get("MOONCAKE_TENANT_ID"):
            kwargs["tenant_id"] = os.environ["MOONCAKE_TENANT_ID"]
        for variable, name in TLS_ENV.items():
            if name not in kwargs and os.environ.get(variable):
                text = os.environ[variable]
                is_flag = name == "tls_require_client_cert"
                kwargs[name] = _read_flag(text, variable) if is_flag else text
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str) -> ClientConfig:
        """Build from a JSON file (upstream's ``MOONCAKE_CONFIG_PATH`` format).

        Raises:
            ClientConfigError: the file cannot be read, is not a JSON object, or holds an
                invalid value.
        """
        values = _read_json_object(path)
        return cls.from_mapping(values)

    @classmethod
    def from_env(cls) -> ClientConfig:
        """Build from ``MOONCAKE_CONFIG_PATH`` if set, else from ``MOONCAKE_*`` variables.

        Raises:
            ClientConfigError: as :meth:`from_file` and :meth:`from_mapping`.
        """
        return cls.from_mapping(setup_values_from_env())


TLS_ENV = {
    "MOONCAKE_PY_TLS_CA": "tls_ca_file",
    "MOONCAKE_PY_TLS_CERT": "tls_cert_file",
    "MOONCAKE_PY_TLS_KEY": "tls_key_file",
    "MOONCAKE_PY_TLS_SERVER_NAME": "tls_server_name",
    "MOONCAKE_PY_TLS_REQUIRE_CLIENT_CERT": "tls_require_client_cert",
}
"""Environment variables of the TLS settings (below setup arguments and file keys)."""

DEFAULT_OFFLOAD_PATH = "/data/file_storage"
"""Where a disk tier lives when it is on and no ``ssd_offload_path`` is given (upstream's)."""

OFFLOAD_ENV = {
    "MOONCAKE_OFFLOAD_ENABLED": "enable_ssd_offload",
    "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": "ssd_offload_path",
    "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": "ssd_offload_quota",
    "MOONCAKE_PY_OFFLOAD_FSYNC": "ssd_offload_fsync",
}
"""Environment variables of the disk tier's settings (below setup arguments and file keys)."""


def setup_values_from_env() -> dict[str, Any]:
    """The setup keys ``setup()`` without arguments reads: the JSON object in the file named by
    ``MOONCAKE_CONFIG_PATH`` if set, else the set ``MOONCAKE_*`` variables.

    Raises:
        ClientConfigError: the file cannot be read or does not hold a JSON object.
    """
    path = os.environ.get("MOONCAKE_CONFIG_PATH")
    if path:
        return _read_json_object(path)
    env = os.environ
    values = {
        "master_server_addr": env.get("MOONCAKE_MASTER"),
        "local_hostname": env.get("MOONCAKE_LOCAL_HOSTNAME"),
        "metadata_server": env.get("MOONCAKE_TE_META_DATA_SERVER"),
        "global_segment_size": env.get("MOONCAKE_GLOBAL_SEGMENT_SIZE"),
        "local_buffer_size": env.get("MOONCAKE_LOCAL_BUFFER_SIZE"),
        "protocol": env.get("MOONCAKE_PROTOCOL"),
        "tenant_id": env.get("MOONCAKE_TENANT_ID"),
    }
    return {k: v for k, v in values.items() if v}


def _read_json_object(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            values = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ClientConfigError(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(values, dict):
        raise ClientConfigError(f"config file {path} must hold a JSON object")
    return values


def lenient_flag(value: object) -> bool:
    """A setup flag as upstream reads it: a boolean spelling (``true``/``1``/``yes``/``on``,
    any case) is honoured; anything else, like a missing value, means False (upstream logs a
    warning and keeps the default instead of failing the setup)."""
    try:
        return _read_flag(value, "flag")
    except ClientConfigError:
        return False


def env_enable_standalone() -> bool:
    """True when ``MOONCAKE_ENABLE_STANDALONE`` asks for the embedded master (upstream's
    switch for callers whose ``setup`` has no ``enable_standalone`` argument)."""
    return lenient_flag(os.environ.get("MOONCAKE_ENABLE_STANDALONE", ""))


def env_force_tcp() -> bool:
    """True when ``MOONCAKE_PY_FORCE_TCP`` asks for the TCP path (unset or empty: False).

    Raises:
        ClientConfigError: the variable is set to something other than a boolean.
    """
    return _read_flag(os.environ.get("MOONCAKE_PY_FORCE_TCP", ""), "MOONCAKE_PY_FORCE_TCP")
