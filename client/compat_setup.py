"""How ``MooncakeDistributedStore.setup`` turns its arguments into a joined client.

Upstream's forms, read by :func:`setup_values`: ``setup(local_hostname, metadata_server,
global_segment_size, local_buffer_size, protocol, rdma_devices, master_server_addr, engine=None,
enable_ssd_offload=False, ssd_offload_path="", tenant_id="default",
enable_client_http_server=False, client_http_port=9300, enable_standalone=False)``, the
``setup({...})`` dict form, and mooncake-py's ``setup()``, which reads ``MOONCAKE_CONFIG_PATH`` or
the ``MOONCAKE_*`` variables.

Two upstream behaviours live here rather than in the typed client:

- ``enable_standalone`` (argument or dict key) or ``MOONCAKE_ENABLE_STANDALONE=true`` starts an
  :class:`~mooncake_py.client.embedded_master.EmbeddedMaster` in this process and joins it
  (:func:`join`); the store stops it in ``close()``.
- ``local_buffer_size=0`` leaves upstream's client without its staging buffer, so every call
  that copies through it fails with INVALID_PARAMS (-600) while the zero-copy calls
  (``put_from``, ``get_into``, ...) work: :class:`UnbufferedClient`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from mooncake_py.errors import ErrorCode, InvalidParamsError
from mooncake_py.types import ReplicateConfig

from .api import Client
from .buffer_handle import BufferHandle
from .buffers import parts_views
from .config import ClientConfig, env_enable_standalone, lenient_flag, setup_values_from_env
from .embedded_master import EmbeddedMaster, requested_port
from .results import BatchResult

SETUP_PARAMETERS = (
    "local_hostname",
    "metadata_server",
    "global_segment_size",
    "local_buffer_size",
    "protocol",
    "rdma_devices",
    "master_server_addr",
    "engine",
    "enable_ssd_offload",
    "ssd_offload_path",
    "tenant_id",
    "enable_client_http_server",
    "client_http_port",
    "enable_standalone",
)
"""Upstream's ``setup`` parameters, in positional order."""

REQUIRED_PARAMETERS = SETUP_PARAMETERS[:7]
"""The ones without a default (upstream's pybind signature)."""

_MASTER_KEYS = ("master_server_addr", "master_server_address")
# Any valid address: it only stands in for the embedded master's until that one is bound.
_PLACEHOLDER_MASTER = "127.0.0.1:0"


def setup_values(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The setup keys of one ``setup`` call, in any of its forms (see the module docstring).

    Raises:
        TypeError: too many positional arguments, or a required one missing (as pybind
            raises for upstream's signature).
        ClientConfigError: ``setup()`` could not read ``MOONCAKE_CONFIG_PATH``.
    """
    if not args and not kwargs:
        return setup_values_from_env()
    if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
        return dict(args[0])
    if len(args) > len(SETUP_PARAMETERS):
        raise TypeError(f"setup() takes at most {len(SETUP_PARAMETERS)} positional arguments")
    values: dict[str, Any] = dict(zip(SETUP_PARAMETERS, args, strict=False))
    values.update(kwargs)  # mooncake-py's own keys (auth_token, force_tcp, ...) ride along
    missing = [name for name in REQUIRED_PARAMETERS if name not in values]
    if missing:
        raise TypeError(f"setup() missing arguments: {', '.join(missing)}")
    return values


def wants_standalone(values: Mapping[str, Any]) -> bool:
    """True when the call or ``MOONCAKE_ENABLE_STANDALONE`` asks for the embedded master.

    The variable turns it on even for calls that do not say so (upstream's way for engines
    whose ``setup`` call has no such argument); a value that is not a boolean means False.
    """
    return lenient_flag(values.get("enable_standalone")) or env_enable_standalone()


def join(values: Mapping[str, Any]) -> tuple[Client, EmbeddedMaster | None]:
    """Join the store ``values`` describe; returns the client and the embedded master it
    started, if any (its owner stops it after closing the client).

    With standalone on, the master address in ``values`` only lends its port (none, or an
    empty address: a free port) and the client joins ``127.0.0.1:<port>``; the other values
    are checked before the master starts, so a bad size starts nothing.

    Raises:
        MooncakeError: the configuration is invalid (INVALID_PARAMS), the embedded master
            cannot start (INTERNAL_ERROR), or joining fails (its code).
    """
    if not wants_standalone(values):
        return open_client(ClientConfig.from_mapping(values)), None
    requested = next((str(values[k]) for k in _MASTER_KEYS if values.get(k)), "")
    others = {k: v for k, v in values.items() if k not in _MASTER_KEYS}
    config = ClientConfig.from_mapping({**others, "master_server_addr": _PLACEHOLDER_MASTER})
    master = EmbeddedMaster()
    # With a token the embedded master requires it, for this store's tenant.
    tokens = {config.auth_token: config.tenant_id} if config.auth_token else None
    address = master.start(requested_port(requested), tokens)
    try:
        client = open_client(dataclasses.replace(config, master_server_addr=address))
    except BaseException:
        master.stop()
        raise
    return client, master


def open_client(config: ClientConfig) -> Client:
    """A joined client for the drop-in store: an :class:`UnbufferedClient` when
    ``config.local_buffer_size`` is 0, else a plain :class:`Client`."""
    return UnbufferedClient(config) if config.local_buffer_size == 0 else Client(config)


def _no_local_buffer(key: str | None = None) -> InvalidParamsError:
    return InvalidParamsError(
        ErrorCode.INVALID_PARAMS,
        "local_buffer_size is 0: only the zero-copy calls can move bytes",
        key=key,
    )


class UnbufferedClient(Client):
    """A :class:`Client` that, like upstream's client set up with ``local_buffer_size=0``,
    refuses every call that would copy through its local buffer.

    Refused with INVALID_PARAMS: ``put``, ``put_batch``, ``put_parts``, ``upsert``,
    ``upsert_batch``, ``upsert_parts`` and the reads returning new bytes (``get``,
    ``get_batch``, ``get_buffer``, ``batch_get_buffer`` and their handle variants). Calls with
    nothing to copy (an empty batch; parts adding up to 0 bytes) and every zero-copy call
    behave as on a plain :class:`Client`.
    """

    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> None:
        """Refused: see the class docstring."""
        raise _no_local_buffer(key)

    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> None:
        """Refused: see the class docstring."""
        raise _no_local_buffer(key)

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> None:
        """Refused unless the parts hold no byte: see the class docstring."""
        if _total_bytes(parts):
            raise _no_local_buffer(key)
        super().put_parts(key, *parts, config=config)

    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> None:
        """Refused unless the parts hold no byte: see the class docstring."""
        if _total_bytes(parts):
            raise _no_local_buffer(key)
        super().upsert_parts(key, *parts, config=config)

    def put_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> BatchResult[None]:
        """Refused unless ``keys`` is empty: see the class docstring."""
        if keys:
            raise _no_local_buffer()
        return super().put_batch(keys, values, config)

    def upsert_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> BatchResult[None]:
        """Refused unless ``keys`` is empty: see the class docstring."""
        if keys:
            raise _no_local_buffer()
        return super().upsert_batch(keys, values, config)

    def get_batch(self, keys: Sequence[str]) -> BatchResult[bytes]:
        """Refused unless ``keys`` is empty: see the class docstring."""
        if keys:
            raise _no_local_buffer()
        return super().get_batch(keys)

    def batch_get_buffer(self, keys: Sequence[str]) -> BatchResult[pa.Buffer]:
        """Refused unless ``keys`` is empty: see the class docstring."""
        if keys:
            raise _no_local_buffer()
        return super().batch_get_buffer(keys)

    def batch_get_buffer_handle(self, keys: Sequence[str]) -> BatchResult[BufferHandle]:
        """Refused unless ``keys`` is empty: see the class docstring."""
        if keys:
            raise _no_local_buffer()
        return super().batch_get_buffer_handle(keys)


def _total_bytes(parts: Sequence[Any]) -> int:
    # parts_views raises for a part that is not one-dimensional, before anything is refused.
    return sum(view.nbytes for view in parts_views(parts))
