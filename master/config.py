"""Configuration of the master service.

A :class:`MasterConfig` is assembled from three layers, each overriding the one before it:

1. the defaults declared on :class:`MasterConfig`;
2. an optional YAML or JSON file named by ``--config FILE`` (or upstream's ``--config_path``);
3. flags given on the command line. Only flags actually present override the file: a flag that
   is left out never resets a file value to its default.

Flag and key names follow upstream Mooncake's master flags. Flags accept both the underscore and
the dash spelling (``--client_ttl`` / ``--client-ttl``), and file keys may use either. Boolean
flags take a value like gflags (``--allow_evict_soft_pinned_objects=false``); a bare boolean flag
means true. Every value is validated when the config is built, and any problem raises
:class:`ConfigError` naming the offending key.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import Field, dataclass, field, fields
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

_MIB = 1024 * 1024


class ConfigError(ValueError):
    """An invalid master configuration value, flag or file."""


def _opt(default: object, kind: str, allowed: str, doc: str, *choices: str) -> Any:
    """Declares a field; ``allowed`` is a range such as ``"[0, 65535]"``, ``"> 0"`` or ``""``."""
    meta = {"kind": kind, "allowed": allowed, "help": doc, "choices": choices}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class MasterConfig:
    """Validated, immutable master settings; invalid values raise ConfigError on construction.

    ``client_ttl`` and the ``*_sec`` fields are seconds; the ``*_kv_*_ttl`` fields are ms.
    """

    # Loopback rather than upstream's 0.0.0.0, so a fresh start exposes nothing to the network.
    rpc_address: str = _opt(
        "127.0.0.1", "str", "", "Address the RPC server binds to (use 0.0.0.0 for all interfaces)."
    )
    port: int = _opt(50051, "int", "[0, 65535]", "RPC server port; 0 picks a free port.")
    metrics_port: int = _opt(
        9003, "int", "[-1, 65535]", "HTTP port of /metrics and /health; 0 picks one, -1 disables."
    )
    fast_rpc_port: int = _opt(
        0,
        "int",
        "[-1, 65535]",
        "Stream-channel port (same RPCs, lower per-call cost); 0 picks a free one, -1 disables.",
    )
    client_ttl: float = _opt(
        10.0, "float", "> 0", "Seconds without a heartbeat after which a client is dropped."
    )
    default_kv_lease_ttl: int = _opt(
        10_000, "duration_ms", ">= 0", "Lease an object gets on each read, blocking its eviction."
    )
    default_kv_soft_pin_ttl: int = _opt(
        1_800_000, "duration_ms", ">= 0", "How long a soft pin protects an object from eviction."
    )
    max_kv_soft_pin_ttl: int = _opt(
        86_400_000, "duration_ms", "> 0", "Longest soft pin a client may request."
    )
    allow_evict_soft_pinned_objects: bool = _opt(
        True, "bool", "", "Evict soft-pinned objects when nothing else can be evicted."
    )
    put_start_discard_timeout_sec: float = _opt(
        30.0, "float", ">= 0", "Seconds before an unfinished put may be replaced by a new one."
    )
    put_start_release_timeout_sec: float = _opt(
        600.0, "float", ">= 0", "Seconds before an unfinished put's space is reclaimed."
    )
    allocation_strategy: str = _opt(
        "random", "choice", "", "Replica placement.", "random", "free_ratio_first", "local_first"
    )
    eviction_high_watermark_ratio: float = _opt(
        0.90, "float", "(0, 1]", "Storage usage ratio at which eviction starts."
    )
    eviction_ratio: float = _opt(
        0.05, "float", "[0, 1]", "Fraction of stored data evicted per eviction pass."
    )
    enable_multi_tenants: bool = _opt(False, "bool", "", "Keep a separate key space per tenant.")
    auth_tokens_file: str = _opt(
        "",
        "path",
        "",
        "YAML/JSON file mapping token -> tenant; when set every RPC needs a Bearer token and "
        "tenants are separate key spaces.",
    )
    max_batch_keys: int = _opt(
        100_000, "int", "> 0", "Largest number of keys a single batch RPC accepts."
    )
    max_message_bytes: int = _opt(
        256 * _MIB, "int", f">= {_MIB}", "gRPC max send/receive message size in bytes."
    )
    log_level: str = _opt(
        "INFO", "choice", "", "Log verbosity.", "DEBUG", "INFO", "WARNING", "ERROR"
    )
    kv_session_max_sessions: int = _opt(
        100_000, "int", "> 0", "Active KV sessions per master (env MC_KV_SESSION_MAX_SESSIONS)."
    )
    kv_session_max_members: int = _opt(
        1_000_000,
        "int",
        "> 0",
        "Members per KV session, and the largest update keep set (MC_KV_SESSION_MAX_MEMBERS).",
    )
    kv_session_max_per_object: int = _opt(
        100_000,
        "int",
        "> 0",
        "KV sessions per object or per write tag list (MC_KV_SESSION_MAX_PER_OBJECT).",
    )
    kv_session_max_batch: int = _opt(
        4096, "int", "> 0", "Keys per attach and largest key page (MC_KV_SESSION_MAX_BATCH)."
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _check_field(f, getattr(self, f.name)))
        for low, high in _ORDERED:
            if getattr(self, low) > getattr(self, high):
                raise _invalid(low, getattr(self, low), f"<= {high}={getattr(self, high)!r}")


# Pairs of fields whose values must not decrease from the first to the second.
_ORDERED = (
    ("default_kv_soft_pin_ttl", "max_kv_soft_pin_ttl"),
    ("put_start_discard_timeout_sec", "put_start_release_timeout_sec"),
)


def _invalid(key: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"invalid {key}={value!r}: must be {allowed}")


def _in_range(value: float, allowed: str) -> bool:
    if allowed[:1] in ("[", "("):
        lo, hi = (float(bound) for bound in allowed[1:-1].split(","))
        return (lo < value if allowed[0] == "(" else lo <= value) and value <= hi
    if allowed.startswith(">="):
        return value >= float(allowed[2:])
    return value > float(allowed[1:])


def _check_field(f: Field[Any], value: object) -> object:
    """Checks one field's type and range; returns it canonicalised (float, choice spelling)."""
    name, kind, allowed = f.name, f.metadata["kind"], f.metadata["allowed"]
    if kind == "bool":
        if not isinstance(value, bool):
            raise _invalid(name, value, "a bool")
        return value
    if kind == "path":
        if not isinstance(value, str):
            raise _invalid(name, value, "a file path")
        return value
    if kind in ("str", "choice"):
        if not isinstance(value, str):
            raise _invalid(name, value, "a string")
        if kind == "str" and (not value or any(c.isspace() for c in value)):
            raise _invalid(name, value, "a non-empty host name or IP address")
        matches = [c for c in f.metadata["choices"] if c.lower() == value.lower()]
        if kind == "choice" and not matches:
            raise _invalid(name, value, "one of " + ", ".join(f.metadata["choices"]))
        return matches[0] if matches else value
    if isinstance(value, bool) or not isinstance(value, int | float if kind == "float" else int):
        raise _invalid(name, value, "a number" if kind == "float" else "an integer")
    if kind == "float" and not math.isfinite(value := float(value)):
        raise _invalid(name, value, "a finite number")
    if allowed and not _in_range(value, allowed):
        raise _invalid(name, value, allowed if allowed[0] in "<>" else f"in {allowed}")
    return value


_DURATION_RE = re.compile(r"(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?")
_UNIT_MS = {None: 1, "ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000}
_TRUE, _FALSE = frozenset({"true", "1", "yes", "on"}), frozenset({"false", "0", "no", "off"})


def _to_duration_ms(value: object, key: str) -> int:
    amount: Decimal | None = None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        amount = Decimal(value)
    elif isinstance(value, str) and (match := _DURATION_RE.fullmatch(value.strip().lower())):
        amount = Decimal(match[1]) * _UNIT_MS[match[2]]
    if amount is None:
        raise _invalid(key, value, "milliseconds, or a number with a ms/s/m/h suffix")
    if amount < 0 or amount != amount.to_integral_value():
        raise _invalid(key, value, "a non-negative whole number of milliseconds")
    return int(amount)


def _to_bool(value: object, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _invalid(key, value, "one of true/false, 1/0, yes/no, on/off")


def _coerce(kind: str, value: object, key: str) -> object:
    """Converts a file or flag value towards a field's kind; _check_field validates the result."""
    if kind == "bool":
        return _to_bool(value, key)
    if kind == "duration_ms":
        return _to_duration_ms(value, key)
    if isinstance(value, str):
        value = value.strip()
        with contextlib.suppress(ValueError):
            value = int(value) if kind == "int" else float(value) if kind == "float" else value
    if kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def parse_duration_ms(value: str | int | float) -> int:
    """Parses a duration into whole milliseconds.

    Args:
        value: Milliseconds as an int or float, or a string of digits optionally followed by a
            ``ms``, ``s``, ``m`` or ``h`` suffix (any case, e.g. ``"5s"`` -> 5000).

    Raises:
        ConfigError: If the value is negative, malformed or not a whole number of milliseconds.
    """
    return _to_duration_ms(value, "duration")


def parse_bool(value: object) -> bool:
    """Parses a bool, 0/1, or one of true/false, 1/0, yes/no, on/off (any case).

    Raises:
        ConfigError: If the value is not a recognised boolean.
    """
    return _to_bool(value, "boolean")


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
    kinds = {f.name: f.metadata["kind"] for f in fields(MasterConfig)}
    unknown = [str(key) for key in values if key not in kinds]
    if unknown:
        raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
    kwargs: dict[str, Any] = {k: _coerce(kinds[k], v, k) for k, v in values.items()}
    return MasterConfig(**kwargs)


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
        kind, meta = f.metadata["kind"], f.metadata
        default = str(f.default).lower() if kind == "bool" else f"{f.default}"
        extra: dict[str, Any] = {"nargs": "?", "const": "true"} if kind == "bool" else {}
        metavar = {"str": "ADDRESS", "duration_ms": "DURATION"}.get(kind, kind.upper())
        if kind == "choice":
            metavar = "{" + ",".join(meta["choices"]) + "}"
        if kind == "duration_ms":
            default += " ms; suffixes ms/s/m/h accepted"
        allowed = f" Allowed: {meta['allowed']}." if meta["allowed"] else ""
        doc = f"{meta['help']}{allowed} (default: {default})".replace("%", "%%")
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
