"""Configuration of the master service.

A :class:`MasterConfig` is assembled from three layers, each overriding the one before it:

1. the defaults declared on :class:`MasterConfig`;
2. an optional YAML or JSON file named by ``--config FILE`` (or upstream's ``--config_path``);
3. flags given on the command line. Only flags actually present override the file: a flag that
   is left out never resets a file value to its default.

Flag and key names follow upstream Mooncake's master flags. Flags accept both the underscore and
the dash spelling (``--client_ttl`` / ``--client-ttl``), and file keys may use either. Boolean
flags take a value like gflags (``--allow_evict_soft_pinned_objects=false``); a bare boolean flag
means true. Booleans and durations are read as :mod:`mooncake_py.units` reads them everywhere:
the ``*_kv_*_ttl`` fields take ``250ms``, ``90s``, ``1h30m`` or a bare number of milliseconds,
``client_ttl`` and the ``*_sec`` fields the same forms with bare numbers in seconds.

Each field declares its kind and a typed :class:`Constraint` (:class:`InRange`,
:class:`AtLeast`, :class:`Positive`, :class:`OneOf`). Every value is validated when the config
is built, and any problem raises :class:`ConfigError` naming the offending key, as
``invalid KEY=VALUE: must be ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml

from mooncake_py.tls import TlsConfig
from mooncake_py.units import (
    MIB,
    ConfigError,
    invalid_value,
    parse_bool,
    parse_duration,
    parse_duration_ms,
)

from .config_constraints import AtLeast, Constraint, InRange, OneOf, OnlyTrue, Positive

__all__ = [
    "AtLeast",
    "ConfigError",
    "Constraint",
    "InRange",
    "Kind",
    "MasterConfig",
    "OneOf",
    "OnlyTrue",
    "Positive",
    "SESSION_LIMIT_ENV",
    "build_arg_parser",
    "config_from_mapping",
    "load_config_file",
    "parse_args",
    "parse_bool",
    "parse_duration_ms",
    "session_limits_from_env",
]

Kind = Literal["address", "path", "str", "bool", "int", "float", "seconds", "milliseconds"]
"""What a field holds: a host to bind, a file path, a string, a bool, an int, a float, a
duration in seconds (float) or in milliseconds (int)."""


@dataclass(frozen=True)
class _Spec:
    kind: Kind
    help: str
    constraint: Constraint | None = None


def _opt(default: object, kind: Kind, doc: str, constraint: Constraint | None = None) -> Any:
    """Declares a field holding ``kind``, described by ``doc`` and checked by ``constraint``."""
    return field(default=default, metadata={"spec": _Spec(kind, doc, constraint)})


def _spec(f: Field[Any]) -> _Spec:
    spec: _Spec = f.metadata["spec"]
    return spec


@dataclass(frozen=True)
class MasterConfig:
    """Validated, immutable master settings; invalid values raise ConfigError on construction.

    ``client_ttl`` and the ``*_sec`` fields are seconds; the ``*_kv_*_ttl`` fields are ms.
    """

    # Loopback rather than upstream's 0.0.0.0, so a fresh start exposes nothing to the network.
    rpc_address: str = _opt(
        "127.0.0.1", "address", "Address the RPC server binds to (use 0.0.0.0 for all interfaces)."
    )
    port: int = _opt(50051, "int", "RPC server port; 0 picks a free port.", InRange(0, 65535))
    metrics_port: int = _opt(
        9003,
        "int",
        "HTTP port of /metrics, /health, upstream's admin paths, the memory API (/v1/memory/...) "
        "and the dashboard (/); 0 picks one, -1 disables.",
        InRange(-1, 65535),
    )
    http_allowed_hosts: str = _opt(
        "",
        "str",
        "Comma-separated host names browsers may use to reach the HTTP port (the dashboard), "
        "besides IP addresses, localhost and this machine's own names; a browser request "
        "naming another host is refused, against DNS rebinding.",
    )
    occupancy_sample_sec: float = _opt(
        5.0,
        "seconds",
        "How often the store's occupancy is sampled for the dashboard's history "
        "(the last 720 samples are kept).",
        Positive(),
    )
    fast_rpc_port: int = _opt(
        0,
        "int",
        "Stream-channel port (same RPCs, lower per-call cost); 0 picks a free one, -1 disables.",
        InRange(-1, 65535),
    )
    client_ttl: float = _opt(
        10.0, "seconds", "Seconds without a heartbeat after which a client is dropped.", Positive()
    )
    default_kv_lease_ttl: int = _opt(
        10_000,
        "milliseconds",
        "Longest a read lease lasts when its reader does not end it (a reader that died or "
        "hung); while it lasts the object's bytes stay put. Must be positive.",
        Positive(),
    )
    default_kv_soft_pin_ttl: int = _opt(
        1_800_000,
        "milliseconds",
        "How long a soft pin protects an object from eviction.",
        AtLeast(0),
    )
    max_kv_soft_pin_ttl: int = _opt(
        86_400_000, "milliseconds", "Longest soft pin a client may request.", Positive()
    )
    allow_evict_soft_pinned_objects: bool = _opt(
        True, "bool", "Evict soft-pinned objects when nothing else can be evicted."
    )
    enable_offload: bool = _opt(
        True,
        "bool",
        "Accept the disk tiers clients mount (setup with enable_ssd_offload): an object "
        "evicted from memory is written to its segment owner's disk tier and stays readable "
        "from there. False: disk tier mounts are refused and eviction drops objects.",
    )
    offload_on_evict: bool = _opt(
        True,
        "bool",
        "Write objects to disk tiers when memory evicts them (or an operator demotes them). "
        "Only true: upstream's other mode, copying every object to disk when its write ends, "
        "is not offered.",
        OnlyTrue("objects go to disk tiers when evicted; write-behind at PutEnd is not offered"),
    )
    promotion_on_hit: bool = _opt(
        True,
        "bool",
        "Copy an object read from a disk tier back into its owner's memory segment when that "
        "has room below the eviction watermark.",
    )
    capability_ttl_sec: float = _opt(
        60.0,
        "seconds",
        "How long a data-plane capability the master hands out with a replica stays valid "
        "(at least as long as the read lease or write reservation it serves); hosts' clocks "
        "must agree well within it.",
        Positive(),
    )
    put_start_discard_timeout_sec: float = _opt(
        30.0,
        "seconds",
        "Seconds before an unfinished put may be replaced by a new one.",
        AtLeast(0),
    )
    put_start_release_timeout_sec: float = _opt(
        600.0, "seconds", "Seconds before an unfinished put's space is reclaimed.", AtLeast(0)
    )
    allocation_strategy: str = _opt(
        "random",
        "str",
        "Replica placement.",
        OneOf("random", "free_ratio_first", "local_first"),
    )
    eviction_high_watermark_ratio: float = _opt(
        0.90,
        "float",
        "Storage usage ratio at which eviction starts.",
        InRange(0, 1, low_open=True),
    )
    eviction_ratio: float = _opt(
        0.05, "float", "Fraction of stored data evicted per eviction pass.", InRange(0, 1)
    )
    enable_multi_tenants: bool = _opt(False, "bool", "Keep a separate key space per tenant.")
    auth_tokens_file: str = _opt(
        "",
        "path",
        "YAML/JSON file mapping token -> tenant; when set every RPC needs a Bearer token and "
        "tenants are separate key spaces.",
    )
    allow_unattributed_endpoints: bool = _opt(
        False,
        "bool",
        "Accept a mounted segment's te_endpoint host even when it is not the address the "
        "client connects from (NAT or proxy setups).",
    )
    # Upstream has no TLS flags; these follow the common --tls_* spelling.
    tls_cert_file: str = _opt(
        "",
        "path",
        "PEM certificate chain the master presents; when set with --tls_key_file every port "
        "(gRPC, stream channel, HTTP) speaks TLS only.",
    )
    tls_key_file: str = _opt("", "path", "PEM private key of --tls_cert_file.")
    tls_ca_file: str = _opt(
        "", "path", "PEM CA bundle that signs client certificates (for --tls_require_client_cert)."
    )
    tls_require_client_cert: bool = _opt(
        False,
        "bool",
        "Mutual TLS: refuse clients without a certificate signed by --tls_ca_file.",
    )
    max_batch_keys: int = _opt(
        100_000, "int", "Largest number of keys a single batch RPC accepts.", Positive()
    )
    max_message_bytes: int = _opt(
        256 * MIB, "int", "gRPC max send/receive message size in bytes.", AtLeast(MIB)
    )
    stream_max_connections: int = _opt(
        4096,
        "int",
        "Stream-channel connections held at once; one beyond is closed at once.",
        Positive(),
    )
    rpc_conn_timeout_seconds: float = _opt(
        300.0,
        "float",
        "Idle RPC connections (stream channel and gRPC) are closed after this many seconds; "
        "0 keeps them open (upstream's default). Clients reconnect transparently.",
        AtLeast(0),
    )
    rpc_max_concurrent_calls: int = _opt(
        4096,
        "int",
        "gRPC calls in progress at once; one beyond is refused with RESOURCE_EXHAUSTED.",
        Positive(),
    )
    log_level: str = _opt(
        "INFO", "str", "Log verbosity.", OneOf("DEBUG", "INFO", "WARNING", "ERROR")
    )
    kv_session_max_sessions: int = _opt(
        100_000,
        "int",
        "Active KV sessions per master (env MC_KV_SESSION_MAX_SESSIONS).",
        Positive(),
    )
    kv_session_max_members: int = _opt(
        1_000_000,
        "int",
        "Members per KV session, and the largest update keep set (MC_KV_SESSION_MAX_MEMBERS).",
        Positive(),
    )
    kv_session_max_per_object: int = _opt(
        100_000,
        "int",
        "KV sessions per object or per write tag list (MC_KV_SESSION_MAX_PER_OBJECT).",
        Positive(),
    )
    kv_session_max_batch: int = _opt(
        4096,
        "int",
        "Keys per attach and largest key page (MC_KV_SESSION_MAX_BATCH).",
        Positive(),
    )
    enable_ha: bool = _opt(
        False,
        "bool",
        "Elect a leader among the masters of --cluster_id on etcd (--etcd_endpoints); the "
        "others stand by, following the replicated metadata log, and take over when it dies.",
    )
    etcd_endpoints: str = _opt(
        "", "str", "etcd endpoints, HOST:PORT separated by ';' or ',' (with --enable_ha)."
    )
    cluster_id: str = _opt(
        "mooncake_cluster", "str", "Names the HA cluster: its leader key and log in etcd."
    )
    ha_lease_ttl_sec: float = _opt(
        5.0,
        "seconds",
        "TTL of the leader's etcd lease: a dead leader is replaced within about this long.",
        InRange(1.0, 3600.0),
    )
    ha_advertise_address: str = _opt(
        "",
        "str",
        "HOST:PORT clients reach this master at, published when it leads (default: "
        "--rpc_address and the bound port).",
    )
    enable_snapshot: bool = _opt(
        False,
        "bool",
        "Without HA: log every metadata change to --snapshot_dir before answering, with "
        "periodic snapshots, so a restart recovers the objects (--enable_snapshot_restore).",
    )
    enable_snapshot_restore: bool = _opt(
        False,
        "bool",
        "At start, recover the metadata from --snapshot_dir (with --enable_snapshot).",
    )
    snapshot_dir: str = _opt(
        "",
        "path",
        "Directory of the metadata log and snapshots (default: $MOONCAKE_SNAPSHOT_LOCAL_PATH).",
    )
    snapshot_interval_seconds: float = _opt(
        600.0,
        "seconds",
        "Seconds between metadata snapshots (0: by record count only).",
        AtLeast(0.0),
    )
    snapshot_log_records: int = _opt(
        100_000, "int", "Log records between metadata snapshots (0: by time only).", AtLeast(0)
    )
    snapshot_retention_count: int = _opt(2, "int", "Metadata snapshots kept.", Positive())

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _check_field(f, getattr(self, f.name)))
        for low, high in _ORDERED:
            if getattr(self, low) > getattr(self, high):
                raise invalid_value(low, getattr(self, low), f"<= {high}={getattr(self, high)!r}")
        self.tls()  # raises ConfigError naming a missing file or an incomplete TLS setting
        if self.enable_ha and not self.etcd_endpoints.strip():
            raise invalid_value("etcd_endpoints", self.etcd_endpoints, "set with --enable_ha")
        if self.enable_ha:
            from mooncake_py.ha_names import parse_etcd_endpoints

            try:
                parse_etcd_endpoints(self.etcd_endpoints)
            except ValueError as exc:
                raise invalid_value("etcd_endpoints", self.etcd_endpoints, str(exc)) from None
        if (
            self.enable_ha
            and self.rpc_address.strip("[]") in ("0.0.0.0", "::", "")
            and not self.ha_advertise_address
        ):
            # The leader publishes where clients reach it: a wildcard names no host.
            raise invalid_value(
                "ha_advertise_address", "", "set when --rpc_address binds every interface"
            )
        if self.enable_snapshot_restore and not (self.enable_snapshot or self.enable_ha):
            raise invalid_value(
                "enable_snapshot_restore", True, "used with --enable_snapshot (or --enable_ha)"
            )
        if self.enable_snapshot and not self.enable_ha and not self.snapshot_directory():
            raise invalid_value(
                "snapshot_dir", self.snapshot_dir, "set (or $MOONCAKE_SNAPSHOT_LOCAL_PATH)"
            )

    def snapshot_directory(self) -> str:
        """Where the metadata log and snapshots live without HA: ``snapshot_dir``, else
        upstream's ``$MOONCAKE_SNAPSHOT_LOCAL_PATH``; "" when neither is set."""
        return self.snapshot_dir or os.environ.get("MOONCAKE_SNAPSHOT_LOCAL_PATH", "")

    def tls(self) -> TlsConfig | None:
        """The TLS settings of every port, or None when the master serves plaintext.

        Raises:
            ConfigError: a TLS file is missing or unreadable, a certificate without its key
                (or the reverse), a CA or mutual TLS without a certificate, or mutual TLS
                without a CA.
        """
        given = self.tls_cert_file or self.tls_key_file or self.tls_ca_file
        if not given and not self.tls_require_client_cert:
            return None
        cfg = TlsConfig(
            cert_file=self.tls_cert_file,
            key_file=self.tls_key_file,
            ca_file=self.tls_ca_file,
            require_client_cert=self.tls_require_client_cert,
            setting_prefix="--tls_",
        )
        cfg.require_server_identity()
        return cfg


# Pairs of fields whose values must not decrease from the first to the second.
_ORDERED = (
    ("default_kv_soft_pin_ttl", "max_kv_soft_pin_ttl"),
    ("put_start_discard_timeout_sec", "put_start_release_timeout_sec"),
)
_FLOAT_KINDS = ("float", "seconds")


def _check_type(name: str, kind: Kind, value: object) -> object:
    """Checks that ``value`` is of ``kind``; returns it canonicalised (ints as floats)."""
    if kind == "bool":
        if not isinstance(value, bool):
            raise invalid_value(name, value, "a bool")
        return value
    if kind == "path":
        if not isinstance(value, str):
            raise invalid_value(name, value, "a file path")
        return value
    if kind in ("address", "str"):
        if not isinstance(value, str):
            raise invalid_value(name, value, "a string")
        if kind == "address" and (not value or any(c.isspace() for c in value)):
            raise invalid_value(name, value, "a non-empty host name or IP address")
        return value
    floating = kind in _FLOAT_KINDS
    if isinstance(value, bool) or not isinstance(value, int | float if floating else int):
        raise invalid_value(name, value, "a number" if floating else "an integer")
    if floating and not math.isfinite(value := float(value)):
        raise invalid_value(name, value, "a finite number")
    return value


def _check_field(f: Field[Any], value: object) -> object:
    """Checks one field's type and constraint; returns the value in its stored form."""
    spec = _spec(f)
    value = _check_type(f.name, spec.kind, value)
    if spec.constraint is not None:
        if not spec.constraint.admits(value):
            raise invalid_value(f.name, value, spec.constraint.expected)
        value = spec.constraint.canonical(value)
    return value


def _coerce(kind: Kind, value: object, key: str) -> object:
    """Converts a file or flag value towards a field's kind; _check_field validates the result."""
    if kind == "bool":
        return parse_bool(value, key=key)
    if kind == "milliseconds":
        return parse_duration_ms(value, key=key)
    if kind == "seconds" and isinstance(value, str):
        # Numbers are left to _check_field, which reports a bad one against the field's range.
        return parse_duration(value, key=key)
    if isinstance(value, str):
        value = value.strip()
        with contextlib.suppress(ValueError):
            value = int(value) if kind == "int" else float(value) if kind == "float" else value
    if kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _decode(text: str, suffix: str) -> object:
    if suffix == ".json":
        return json.loads(text)
    if suffix not in (".yaml", ".yml"):
        with contextlib.suppress(json.JSONDecodeError):
            return json.loads(text)
    data = yaml.safe_load(text)
    return {} if data is None else data  # an empty or comment-only YAML document


def load_config_file(path: str) -> dict[str, object]:
    """Reads a YAML (``.yaml``/``.yml``) or JSON (``.json``; otherwise JSON, then YAML) file.

    Keys are normalised to underscores; ``client_live_ttl_sec`` is read as ``client_ttl`` and a
    non-zero ``rpc_port`` as ``port``. Values are returned uncoerced (see config_from_mapping).

    Raises:
        ConfigError: If the file cannot be read or parsed, its top level is not a mapping, or it
            has unknown or repeated keys.
    """
    try:
        data = _decode(Path(path).read_text(encoding="utf-8"), Path(path).suffix.lower())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path!r}: {exc}") from exc
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {path!r} is not valid JSON or YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path!r}: top level must be a mapping, not {type(data).__name__}"
        )
    known = {f.name for f in fields(MasterConfig)}
    result: dict[str, object] = {}
    spelled: dict[str, str] = {}
    unknown: list[str] = []
    for raw_key, value in data.items():
        key = str(raw_key).strip().replace("-", "_")
        key = "client_ttl" if key == "client_live_ttl_sec" else key
        if key == "rpc_port":
            port = _coerce("int", value, "rpc_port")
            if isinstance(port, bool) or not isinstance(port, int):
                raise ConfigError(f"config file {path!r}: invalid rpc_port={value!r}")
            if port == 0:
                continue
            key = "port"
        if key not in known or not isinstance(raw_key, str):
            unknown.append(str(raw_key))
        elif key in result:
            raise ConfigError(
                f"config file {path!r}: {key} given twice ({spelled[key]}, {raw_key})"
            )
        else:
            result[key], spelled[key] = value, raw_key
    if unknown:
        raise ConfigError(f"config file {path!r}: unknown keys: {', '.join(unknown)}")
    return result


def config_from_mapping(values: Mapping[str, object]) -> MasterConfig:
    """Builds a config from field names to values, coercing strings to each field's type.

    Raises:
        ConfigError: On unknown keys, values that cannot be coerced, or failed validation.
    """
    kinds = {f.name: _spec(f).kind for f in fields(MasterConfig)}
    unknown = [str(key) for key in values if key not in kinds]
    if unknown:
        raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
    kwargs: dict[str, Any] = {k: _coerce(kinds[k], v, k) for k, v in values.items()}
    return MasterConfig(**kwargs)


_METAVARS = {"address": "ADDRESS", "seconds": "DURATION", "milliseconds": "DURATION"}
# The unit of a bare number in each duration kind, as the help text names it.
_DURATION_UNITS = {"seconds": "s", "milliseconds": "ms"}


def build_arg_parser() -> argparse.ArgumentParser:
    """Returns the master's argument parser: one flag per config field plus ``--config``.

    Values stay strings and flags left out are absent from the namespace, so parse_args can
    layer them over the config file and validate everything together.
    """
    parser = argparse.ArgumentParser(
        "mooncake-py-master", argument_default=argparse.SUPPRESS, allow_abbrev=False
    )
    parser.add_argument(
        *("--config", "--config_path", "--config-path"),
        dest="config",
        metavar="FILE",
        help="YAML or JSON config file; flags given on the command line override it.",
    )
    for f in fields(MasterConfig):
        names = dict.fromkeys([f"--{f.name}", f"--{f.name.replace('_', '-')}"])
        spec = _spec(f)
        kind, constraint = spec.kind, spec.constraint
        default = str(f.default).lower() if kind == "bool" else f"{f.default}"
        extra: dict[str, Any] = {"nargs": "?", "const": "true"} if kind == "bool" else {}
        metavar = _METAVARS.get(kind, kind.upper())
        allowed = f" Allowed: {constraint}." if constraint is not None else ""
        if isinstance(constraint, OneOf):  # the choices are in the metavar already
            metavar, allowed = "{" + ",".join(constraint.choices) + "}", ""
        if kind in _DURATION_UNITS:
            default += f" {_DURATION_UNITS[kind]}; or a duration such as 250ms, 90s, 1h30m"
        doc = f"{spec.help}{allowed} (default: {default})".replace("%", "%%")
        parser.add_argument(*names, dest=f.name, metavar=metavar, help=doc, **extra)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> MasterConfig:
    """Builds the config from defaults, then ``MC_KV_SESSION_*`` variables, then
    ``--config FILE``, then the flags given.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Raises:
        ConfigError: If the config file, a flag or any value is invalid (``--help`` still prints
            the help and exits).
    """
    parser = build_arg_parser()
    parser.exit_on_error = False  # report bad flags as ConfigError, like bad values
    try:
        namespace, unrecognized = parser.parse_known_args(argv)
    except argparse.ArgumentError as exc:
        raise ConfigError(str(exc)) from exc
    if unrecognized:
        raise ConfigError(f"unrecognized arguments: {' '.join(unrecognized)}")
    given: dict[str, object] = dict(vars(namespace))
    config_path = given.pop("config", None)
    values = session_limits_from_env()
    if config_path is not None:
        values.update(load_config_file(str(config_path)))
    values.update(given)
    return config_from_mapping(values)


SESSION_LIMIT_ENV = {
    "MC_KV_SESSION_MAX_SESSIONS": "kv_session_max_sessions",
    "MC_KV_SESSION_MAX_MEMBERS": "kv_session_max_members",
    "MC_KV_SESSION_MAX_PER_OBJECT": "kv_session_max_per_object",
    "MC_KV_SESSION_MAX_BATCH": "kv_session_max_batch",
}


def session_limits_from_env() -> dict[str, object]:
    """KV session limits set by upstream's ``MC_KV_SESSION_*`` variables (below file and flags).

    Raises:
        ConfigError: a variable is not a positive integer.
    """
    values: dict[str, object] = {}
    for variable, key in SESSION_LIMIT_ENV.items():
        text = os.environ.get(variable)
        if text is None:
            continue
        if not text.strip().isdigit() or int(text) <= 0:
            raise ConfigError(f"invalid {variable}={text!r}: must be a positive integer")
        values[key] = int(text)
    return values
