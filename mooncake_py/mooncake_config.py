"""``MooncakeConfig``: upstream's ``mooncake.mooncake_config`` under mooncake-py.

Scripts written for upstream read their settings with ``MooncakeConfig.load_from_env()`` or
``MooncakeConfig.from_file(path)`` and pass the fields to ``MooncakeDistributedStore.setup``; a
shim mapping ``mooncake.mooncake_config`` to this module runs them unchanged. Same fields,
defaults, environment variables, parsing and errors (``ValueError``) as upstream's class
(release 0.3.13):

- sizes take an int or a string with an optional binary suffix (``kb``/``k``, ``mb``/``m``,
  ``gb``/``g``, ``tb``/``t``, ``b``; any case, decimals allowed: ``"1.5gb"``);
- flags take a bool, a number, or ``true``/``1``/``yes``/``on``/``enable`` and
  ``false``/``0``/``no``/``off``/``disable`` (empty: False);
- the protocol is lowercased (an unknown one is passed on with a warning), sizes must not be
  negative, and ``local_hostname``, ``metadata_server`` and ``master_server_address`` must be
  non-empty strings.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_GLOBAL_SEGMENT_SIZE", "DEFAULT_LOCAL_BUFFER_SIZE", "MooncakeConfig"]

log = logging.getLogger(__name__)

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200
"""Upstream's default contribution: 3.125 GiB."""
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824
"""Upstream's default local buffer: 1 GiB."""
DEFAULT_CLIENT_HTTP_PORT = 9300

# Longest suffixes first, so "mb" is not read as "b".
_SUFFIXES = (
    ("kb", 1 << 10),
    ("mb", 1 << 20),
    ("gb", 1 << 30),
    ("tb", 1 << 40),
    ("k", 1 << 10),
    ("m", 1 << 20),
    ("g", 1 << 30),
    ("t", 1 << 40),
    ("b", 1),
)
_TRUE = frozenset({"true", "1", "yes", "on", "enable"})
_FALSE = frozenset({"false", "0", "no", "off", "disable"})
# Only a hint (upstream warns, never rejects): the transfer engine decides what it supports.
_KNOWN_PROTOCOLS = frozenset(
    {
        "tcp", "rdma", "efa", "nvmeof", "nvlink", "musa", "nvlink_intra", "hip", "barex",
        "cxl", "ascend", "ub", "ubshmem", "maca", "sunrise_link", "rpc_only",
    }
)  # fmt: skip
_REQUIRED = ("local_hostname", "metadata_server", "master_server_address")


def _parse_size(value: Any) -> int:
    """Bytes from an int or a size string.

    Raises:
        ValueError: an empty string, a suffix without a number, or no number at all.
    """
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return int(value)
    text = value.strip().lower()
    if not text:
        raise ValueError("Invalid segment size: empty string")
    for suffix, multiplier in _SUFFIXES:
        if text.endswith(suffix):
            number = text[: -len(suffix)].strip()
            if not number:
                raise ValueError(f"Invalid segment size: missing number before '{suffix}'")
            return int(float(number) * multiplier)
    return int(float(text))


def _parse_bool(value: Any) -> bool:
    """A flag from a bool, a number, None (False) or a boolean spelling.

    Raises:
        ValueError: a string that spells no boolean.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return bool(value)
    if value is None:
        return False
    text = str(value).strip().lower()
    if not text or text in _FALSE:
        return False
    if text in _TRUE:
        return True
    raise ValueError(f"Invalid boolean value: {value!r}")


@dataclass
class MooncakeConfig:
    """A store client's settings, as upstream's ``mooncake_config.MooncakeConfig``.

    Attributes:
        local_hostname: this client's address.
        metadata_server: transfer-engine metadata (``P2PHANDSHAKE``, an HTTP URL, ...).
        global_segment_size: bytes contributed.
        local_buffer_size: bytes of the local buffer.
        protocol: ``tcp`` (default), ``rdma``, ...
        device_name: RDMA device(s), or ``auto-discovery``.
        master_server_address: ``host:port`` of the master.
        enable_ssd_offload: offload to SSD.
        ssd_offload_path: directory of the SSD offload.
        tenant_id: key namespace.
        enable_client_http_server: serve the client's HTTP endpoints.
        client_http_port: their port.

    Raises:
        ValueError: on construction, for an empty or non-string protocol, a negative size,
            or an empty required field.
    """

    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: str | None
    master_server_address: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = DEFAULT_CLIENT_HTTP_PORT

    def __post_init__(self) -> None:
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError(
                f"Invalid protocol: {self.protocol!r}. Protocol must be a non-empty string, "
                "e.g. 'tcp' or 'rdma'."
            )
        self.protocol = self.protocol.strip().lower()
        if self.protocol not in _KNOWN_PROTOCOLS:
            log.warning("Unrecognised protocol %r; passing it through unchanged.", self.protocol)
        for name in ("global_segment_size", "local_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"Invalid {name}: {getattr(self, name)}. Size must be non-negative."
                )
        for name in _REQUIRED:
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(
                    f"Config field {name!r} must be a non-empty string, got {value!r}."
                )

    @staticmethod
    def from_file(file_path: str) -> MooncakeConfig:
        """Read a JSON object with the field names (``device_name``, ``master_server_address``).

        Raises:
            OSError: the file cannot be read. ValueError: it is not JSON, misses
                ``local_hostname``, ``metadata_server`` or ``master_server_address``, or holds
                an invalid value.
        """
        with open(file_path, encoding="utf-8") as handle:
            config = json.load(handle)
        for name in _REQUIRED:
            if name not in config:
                raise ValueError(f"Missing required config field: {name}")
        ssd_offload_path = config.get("ssd_offload_path")
        tenant_id = config.get("tenant_id")
        return MooncakeConfig(
            local_hostname=config.get("local_hostname"),
            metadata_server=config.get("metadata_server"),
            global_segment_size=_parse_size(
                config.get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE)
            ),
            local_buffer_size=_parse_size(
                config.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE)
            ),
            protocol=config.get("protocol", "tcp"),
            device_name=config.get("device_name", ""),
            master_server_address=config.get("master_server_address"),
            enable_ssd_offload=_parse_bool(config.get("enable_ssd_offload", False)),
            ssd_offload_path="" if ssd_offload_path is None else str(ssd_offload_path),
            tenant_id="default" if tenant_id is None else str(tenant_id),
            enable_client_http_server=_parse_bool(config.get("enable_client_http_server", False)),
            client_http_port=int(config.get("client_http_port", DEFAULT_CLIENT_HTTP_PORT)),
        )

    @staticmethod
    def load_from_env() -> MooncakeConfig:
        """:meth:`from_file` of ``MOONCAKE_CONFIG_PATH`` when set; else the ``MOONCAKE_*``
        variables: ``MOONCAKE_MASTER`` (required), ``MOONCAKE_LOCAL_HOSTNAME`` (``localhost``),
        ``MOONCAKE_TE_META_DATA_SERVER`` (``P2PHANDSHAKE``), ``MOONCAKE_GLOBAL_SEGMENT_SIZE``,
        ``MOONCAKE_LOCAL_BUFFER_SIZE``, ``MOONCAKE_PROTOCOL`` (``tcp``), ``MOONCAKE_DEVICE``,
        ``MOONCAKE_OFFLOAD_ENABLED``, ``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH``,
        ``MOONCAKE_TENANT_ID``, ``MOONCAKE_ENABLE_CLIENT_HTTP_SERVER`` and
        ``MOONCAKE_CLIENT_HTTP_PORT``.

        Raises:
            ValueError: neither ``MOONCAKE_CONFIG_PATH`` nor ``MOONCAKE_MASTER`` is set, or a
                value is invalid; as :meth:`from_file`.
        """
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if path is not None:
            return MooncakeConfig.from_file(path)
        master = os.getenv("MOONCAKE_MASTER")
        if not master:
            raise ValueError(
                "Neither the environment variable 'MOONCAKE_CONFIG_PATH' nor 'MOONCAKE_MASTER' "
                "is set."
            )
        env = os.environ
        return MooncakeConfig(
            local_hostname=env.get("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            metadata_server=env.get("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=_parse_size(
                env.get("MOONCAKE_GLOBAL_SEGMENT_SIZE", DEFAULT_GLOBAL_SEGMENT_SIZE)
            ),
            local_buffer_size=_parse_size(
                env.get("MOONCAKE_LOCAL_BUFFER_SIZE", DEFAULT_LOCAL_BUFFER_SIZE)
            ),
            protocol=env.get("MOONCAKE_PROTOCOL", "tcp"),
            device_name=env.get("MOONCAKE_DEVICE", ""),
            master_server_address=master,
            enable_ssd_offload=_parse_bool(env.get("MOONCAKE_OFFLOAD_ENABLED", "false")),
            ssd_offload_path=env.get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=env.get("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=_parse_bool(
                env.get("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false")
            ),
            client_http_port=int(env.get("MOONCAKE_CLIENT_HTTP_PORT", DEFAULT_CLIENT_HTTP_PORT)),
        )
