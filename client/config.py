"""Client configuration: one frozen object built from ``setup`` arguments, env vars or a file.

Sources, as upstream's client and ``mooncake_config.py`` read them:

- ``setup(local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol,
  rdma_devices, master_server_addr, ..., tenant_id=...)`` (positional form);
- ``setup({...})`` (dict form; values may be strings);
- ``setup()`` with no arguments: the JSON file named by ``MOONCAKE_CONFIG_PATH`` if set, else
  the environment (``MOONCAKE_MASTER``, ``MOONCAKE_LOCAL_HOSTNAME``,
  ``MOONCAKE_GLOBAL_SEGMENT_SIZE``, ``MOONCAKE_LOCAL_BUFFER_SIZE``, ``MOONCAKE_PROTOCOL``,
  ``MOONCAKE_TENANT_ID``, ``MOONCAKE_TE_META_DATA_SERVER``).

``MOONCAKE_TENANT_ID`` and ``MOONCAKE_PY_FORCE_TCP`` apply whichever form is used, unless the
call sets them explicitly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from mooncake_py.errors import ErrorCode, MooncakeError

KIB = 1024
MIB = 1024 * KIB
TIB = 1024 * 1024 * MIB
MIN_SEGMENT_BYTES = KIB
MAX_SEGMENT_BYTES = TIB

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": KIB,
    "kb": KIB,
    "m": MIB,
    "mb": MIB,
    "g": 1024 * MIB,
    "gb": 1024 * MIB,
}
_SIZE_UNITS |= {"t": TIB, "tb": TIB}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: object) -> int:
    """Bytes from an int or a string such as ``"16MB"``, ``"3.125gb"``, ``"1024"``.

    Raises:
        MooncakeError: INVALID_PARAMS for malformed or negative values.
    """
    if isinstance(value, bool):
        raise MooncakeError(ErrorCode.INVALID_PARAMS, f"size must be a number, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise MooncakeError(ErrorCode.INVALID_PARAMS, f"size must not be negative: {value}")
        return value
    match = _SIZE_RE.match(str(value))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise MooncakeError(ErrorCode.INVALID_PARAMS, f"cannot read a size from {value!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_flag(value: object) -> bool:
    """A boolean from ``True``/``"1"``/``"true"``/``"yes"``/``"on"`` (and their negatives)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise MooncakeError(ErrorCode.INVALID_PARAMS, f"cannot read a boolean from {value!r}")


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """Everything a client needs to join the store.

    Attributes:
        local_hostname: this client's address; its host part is where the TCP transfer service
            listens, and (with the service's port) it names the client's segment.
        metadata_server: accepted for compatibility; segments are published through the master.
        global_segment_size: bytes this client contributes (0 = contributes nothing).
        local_buffer_size: accepted for compatibility; transfers need no staging buffer.
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

    def __post_init__(self) -> None:
        for name in ("global_segment_size", "local_buffer_size"):
            size = getattr(self, name)
            if size != 0 and not MIN_SEGMENT_BYTES <= size <= MAX_SEGMENT_BYTES:
                raise MooncakeError(
                    ErrorCode.INVALID_PARAMS, f"{name} must be 0 or within [1 KiB, 1 TiB]: {size}"
                )
        if not self.local_hostname or not self.master_server_addr:
            raise MooncakeError(
                ErrorCode.INVALID_PARAMS, "local_hostname and master_server_addr must be set"
            )
        host, sep, port = self.master_server_addr.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise MooncakeError(
                ErrorCode.INVALID_PARAMS,
                f"master address must be host:port: {self.master_server_addr!r}",
            )
        if self.master_transport not in ("auto", "grpc"):
            raise MooncakeError(
                ErrorCode.INVALID_PARAMS,
                f"master_transport must be 'auto' or 'grpc': {self.master_transport!r}",
            )
        if self.rpc_timeout_s <= 0:
            raise MooncakeError(ErrorCode.INVALID_PARAMS, "rpc_timeout_s must be positive")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ClientConfig:
        """Build from a setup dict or a config file's mapping; unknown keys are ignored.

        Accepts upstream's key spellings (``master_server_address``, ``device_name``).
        """
        aliases = {"master_server_address": "master_server_addr", "device_name": "rdma_devices"}
        normalized = {aliases.get(k, k): v for k, v in values.items()}
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for name, value in normalized.items():
            if name not in fields or value is None:
                continue
            if name in ("global_segment_size", "local_buffer_size"):
                kwargs[name] = parse_size(value)
            elif name == "force_tcp":
                kwargs[name] = parse_flag(value)
            elif name == "rpc_timeout_s":
                kwargs[name] = float(value)
            else:
                kwargs[name] = str(value)
        kwargs.setdefault("force_tcp", env_force_tcp())
        if "auth_token" not in kwargs and os.environ.get("MOONCAKE_AUTH_TOKEN"):
            kwargs["auth_token"] = os.environ["MOONCAKE_AUTH_TOKEN"]
        if "master_transport" not in kwargs and os.environ.get("MOONCAKE_PY_MASTER_TRANSPORT"):
            kwargs["master_transport"] = os.environ["MOONCAKE_PY_MASTER_TRANSPORT"].lower()
        if "tenant_id" not in kwargs and os.environ.get("MOONCAKE_TENANT_ID"):
            kwargs["tenant_id"] = os.environ["MOONCAKE_TENANT_ID"]
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str) -> ClientConfig:
        """Build from a JSON file (upstream's ``MOONCAKE_CONFIG_PATH`` format)."""
        try:
            with open(path, encoding="utf-8") as handle:
                values = json.load(handle)
        except (OSError, ValueError) as exc:
            raise MooncakeError(
                ErrorCode.INVALID_PARAMS, f"cannot read config file {path}: {exc}"
            ) from exc
        if not isinstance(values, dict):
            raise MooncakeError(
                ErrorCode.INVALID_PARAMS, f"config file {path} must hold a JSON object"
            )
        return cls.from_mapping(values)

    @classmethod
    def from_env(cls) -> ClientConfig:
        """Build from ``MOONCAKE_CONFIG_PATH`` if set, else from ``MOONCAKE_*`` variables."""
        path = os.environ.get("MOONCAKE_CONFIG_PATH")
        if path:
            return cls.from_file(path)
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
        return cls.from_mapping({k: v for k, v in values.items() if v})


def env_force_tcp() -> bool:
    """True when ``MOONCAKE_PY_FORCE_TCP`` asks for the TCP path."""
    return parse_flag(os.environ.get("MOONCAKE_PY_FORCE_TCP", ""))
