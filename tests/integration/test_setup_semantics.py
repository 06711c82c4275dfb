"""Upstream's setup semantics on the drop-in store, against real masters and real clients.

- ``enable_standalone`` (keyword, dict key, ``MOONCAKE_ENABLE_STANDALONE``): the store starts a
  master in its own process on 127.0.0.1 (the port of ``master_server_addr``, else a free
  one), joins it, and stops it in ``close()``.
- A set-up store, or one whose setup failed, refuses another setup until ``close()``
  (upstream's ``test_store_setup_lifecycle.py``).
- ``local_buffer_size=0``: the copying calls fail with INVALID_PARAMS, the zero-copy ones work
  (upstream's ``TestZeroLocalBufferSize``).
- ``mooncake_py.mooncake_config.MooncakeConfig``: upstream's ``load_from_env`` / ``from_file``.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mooncake_py import ErrorCode, MooncakeDistributedStore
from mooncake_py.mooncake_config import DEFAULT_LOCAL_BUFFER_SIZE, MooncakeConfig
from mooncake_py.testing import InProcessMaster

MIB = 1 << 20
INVALID = int(ErrorCode.INVALID_PARAMS)
INTERNAL = int(ErrorCode.INTERNAL_ERROR)
SHIM = Path(__file__).resolve().parents[1] / "engines" / "shim"


@pytest.fixture(autouse=True)
def _no_standalone_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOONCAKE_ENABLE_STANDALONE", raising=False)


@pytest.fixture
def stores() -> Iterator[list[MooncakeDistributedStore]]:
    """Stores a test creates; each is closed at the end, whatever happened."""
    made: list[MooncakeDistributedStore] = []
    yield made
    for store in made:
        store.close()


def _new(stores: list[MooncakeDistributedStore]) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    stores.append(store)
    return store


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _joiner_config(address: str, **extra: Any) -> dict[str, Any]:
    # A short RPC deadline, so joining a master that is gone fails promptly.
    return {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": 16 * MIB,
        "master_server_address": address,
        "rpc_timeout_s": 2.0,
        **extra,
    }


def _positional(master_server_addr: str, local_buffer_size: int = 16 * MIB) -> tuple[Any, ...]:
    return ("127.0.0.1", "P2PHANDSHAKE", 16 * MIB, local_buffer_size, "tcp", "", master_server_addr)


# ----------------------------------------------------------------------------------------------
# Embedded master


def test_standalone_keyword_embeds_a_master_that_other_clients_can_join(
    stores: list[MooncakeDistributedStore],
) -> None:
    port = _free_port()
    owner = _new(stores)
    assert owner.setup(*_positional(f"10.9.8.7:{port}"), enable_standalone=True) == 0
    host, _, segment_port = owner.get_hostname().rpartition(":")
    assert host == "127.0.0.1" and segment_port.isdigit()
    assert owner.put("shared", b"from the embedded master") == 0
    assert owner.get("shared") == b"from the embedded master"
    assert owner.health_check() == 0

    # The host part of the address is ignored: the master listens on 127.0.0.1:<port>.
    other = _new(stores)
    assert other.setup(_joiner_config(f"127.0.0.1:{port}")) == 0
    assert other.get("shared") == b"from the embedded master"
    assert other.put("back", b"seen by both") == 0
    assert owner.get("back") == b"seen by both"
    assert other.close() == 0

    assert owner.close() == 0
    assert owner.health_check() == 1
    late = _new(stores)
    assert late.setup(_joiner_config(f"127.0.0.1:{port}")) < 0  # close() stopped the master


def test_a_standalone_store_with_a_token_starts_a_master_that_requires_it(
    stores: list[MooncakeDistributedStore],
) -> None:
    port = _free_port()
    owner = _new(stores)
    config = {
        **_joiner_config(f"127.0.0.1:{port}"),
        "enable_standalone": True,
        "auth_token": "owner-token",
    }
    assert owner.setup(config) == 0
    assert owner.put("private", b"only with the token") == 0
    # A local process without the token gets nothing from the embedded master.
    anonymous = _new(stores)
    assert anonymous.setup(_joiner_config(f"127.0.0.1:{port}")) == ErrorCode.RPC_FAIL
    joiner = _new(stores)
    assert joiner.setup(_joiner_config(f"127.0.0.1:{port}", auth_token="owner-token")) == 0
    assert joiner.get("private") == b"only with the token"
    assert not list(Path(tempfile.gettempdir()).glob("mooncake_py-tokens-*"))


def test_standalone_dict_form_without_master_address_takes_a_free_port(
    stores: list[MooncakeDistributedStore],
) -> None:
    first, second = _new(stores), _new(stores)
    for store in (first, second):  # two embedded masters at once: each took its own free port
        assert store.setup({"local_hostname": "127.0.0.1", "enable_standalone": True}) == 0
    assert first.put("k", b"first") == 0 and second.put("k", b"second") == 0
    assert first.get("k") == b"first" and second.get("k") == b"second"


def test_standalone_dict_flag_is_read_like_upstream(stores: list[MooncakeDistributedStore]) -> None:
    # A string spelling counts; a value that is no boolean means "off", so the (missing)
    # master at the given address is joined instead and the setup fails.
    assert _new(stores).setup({"enable_standalone": "TRUE"}) == 0
    off = _new(stores)
    assert off.setup(_joiner_config("127.0.0.1:1", enable_standalone="maybe")) < 0


def test_standalone_env_var_embeds_for_calls_that_do_not_ask(
    stores: list[MooncakeDistributedStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _free_port()
    monkeypatch.setenv("MOONCAKE_ENABLE_STANDALONE", "true")
    owner = _new(stores)
    assert owner.setup(*_positional(f"127.0.0.1:{port}")) == 0
    assert owner.put("env", b"embedded") == 0
    monkeypatch.delenv("MOONCAKE_ENABLE_STANDALONE")
    other = _new(stores)
    assert other.setup(_joiner_config(f"127.0.0.1:{port}")) == 0
    assert other.get("env") == b"embedded"


def test_standalone_on_a_taken_port_fails_with_internal_error(
    stores: list[MooncakeDistributedStore],
) -> None:
    with InProcessMaster() as master:
        store = _new(stores)
        assert store.setup(*_positional(master.address), enable_standalone=True) == INTERNAL
        assert store.setup(*_positional(master.address)) == INVALID  # failed: close first
        assert store.close() == 0
        assert store.setup(*_positional(master.address)) == 0  # the running master, joined
        assert store.put("k", b"v") == 0


def test_standalone_checks_sizes_before_starting_a_master(
    stores: list[MooncakeDistributedStore],
) -> None:
    port = _free_port()
    store = _new(stores)
    config = {"enable_standalone": True, "master_server_addr": f"127.0.0.1:{port}"}
    assert store.setup({**config, "global_segment_size": "50%"}) == INVALID
    assert store.close() == 0
    assert store.setup(config) == 0  # the port was never taken by the failed setup


# ----------------------------------------------------------------------------------------------
# Setup lifecycle (upstream's test_store_setup_lifecycle.py)


def _lifecycle_config(address: str, global_segment_size: str = "16MB") -> dict[str, Any]:
    return {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "master_server_addr": address,
        "protocol": "tcp",
        "rdma_devices": "",
        "global_segment_size": global_segment_size,
        "local_buffer_size": "16MB",
    }


def test_repeated_setup_requires_close(
    master: InProcessMaster, stores: list[MooncakeDistributedStore]
) -> None:
    store = _new(stores)
    assert store.setup(_lifecycle_config(master.address)) == 0
    assert store.setup(_lifecycle_config(master.address)) == INVALID
    assert store.health_check() == 0  # the refused setup left the first one alone
    assert store.put("still", b"working") == 0
    assert store.close() == 0
    assert store.setup(_lifecycle_config(master.address)) == 0


def test_failed_setup_must_be_closed_before_retry(
    master: InProcessMaster, stores: list[MooncakeDistributedStore]
) -> None:
    store = _new(stores)
    assert store.setup(_lifecycle_config(master.address, "50%")) == INVALID
    assert store.health_check() == 1
    assert store.setup(_lifecycle_config(master.address)) == INVALID
    assert store.close() == 0
    assert store.setup(_lifecycle_config(master.address)) == 0
    assert store.put("k", b"v") == 0


def test_failed_join_must_be_closed_before_retry(
    master: InProcessMaster, stores: list[MooncakeDistributedStore]
) -> None:
    store = _new(stores)
    assert store.setup(_joiner_config("127.0.0.1:1")) == int(ErrorCode.RPC_FAIL)
    assert store.setup(_joiner_config(master.address)) == INVALID
    assert store.close() == 0
    assert store.setup(_joiner_config(master.address)) == 0


def test_a_type_error_is_not_a_failed_setup(
    master: InProcessMaster, stores: list[MooncakeDistributedStore]
) -> None:
    store = _new(stores)
    with pytest.raises(TypeError):
        store.setup("127.0.0.1", "P2PHANDSHAKE")
    assert store.setup(*_positional(master.address)) == 0


# ----------------------------------------------------------------------------------------------
# local_buffer_size=0 (upstream's TestZeroLocalBufferSize)


class Arena:
    """A registered ctypes buffer of the store."""

    def __init__(self, store: MooncakeDistributedStore, size: int) -> None:
        self.memory = (ctypes.c_ubyte * size)()
        self.ptr = ctypes.addressof(self.memory)
        assert store.register_buffer(self.ptr, size) == 0

    def write(self, offset: int, data: bytes) -> None:
        ctypes.memmove(self.ptr + offset, data, len(data))

    def read(self, offset: int, size: int) -> bytes:
        return bytes(self.memory[offset : offset + size])


@pytest.mark.parametrize("form", ["positional", "dict", "dict string"])
def test_zero_local_buffer_refuses_copying_calls(
    master: InProcessMaster, stores: list[MooncakeDistributedStore], form: str
) -> None:
    writer = _new(stores)
    assert writer.setup(_joiner_config(master.address)) == 0
    assert writer.put("stored", b"written elsewhere") == 0
    store = _new(stores)
    if form == "positional":
        assert store.setup(*_positional(master.address, local_buffer_size=0)) == 0
    else:
        zero = 0 if form == "dict" else "0"
        assert store.setup(_joiner_config(master.address, local_buffer_size=zero)) == 0

    assert store.put("k", b"test_zero_buffer_value") == INVALID
    assert store.put("empty", b"") == INVALID
    assert store.put_batch(["k1", "k2"], [b"a", b"b"]) == INVALID
    assert store.put_parts("k3", b"a", b"b") == INVALID
    assert store.upsert("k4", b"abc") == INVALID
    assert store.upsert_batch(["k5"], [b"a"]) == INVALID
    assert store.upsert_parts("k6", b"a") == INVALID
    assert store.batch_is_exist(["k", "k1", "k2", "k3", "k4", "k5", "k6"]) == [0] * 7
    assert store.get("stored") == b""
    assert store.get_batch(["stored", "missing"]) == [b"", b""]
    assert store.get_buffer("stored") is None
    assert store.batch_get_buffer(["stored"]) == [None]
    assert store.is_exist("stored") == 1 and store.get_size("stored") == len(b"written elsewhere")

    # Nothing to copy: as a buffered store.
    assert store.put_batch([], []) == 0 and store.upsert_batch([], []) == 0
    assert store.batch_get_buffer([]) == []
    assert store.put_parts("nothing", b"") == writer.put_parts("nothing too", b"")

    # The zero-copy calls move bytes without a local buffer.
    arena = Arena(store, 4096)
    arena.write(0, b"zero-copy")
    assert store.put_from("zc", arena.ptr, len(b"zero-copy")) == 0
    assert store.batch_put_from(["zc2"], [arena.ptr], [4]) == [0]
    assert store.get_into("stored", arena.ptr + 1024, 1024) == len(b"written elsewhere")
    assert arena.read(1024, len(b"written elsewhere")) == b"written elsewhere"
    assert store.batch_get_into(
        ["zc", "zc2"], [arena.ptr + 2048, arena.ptr + 3072], [512, 512]
    ) == [
        len(b"zero-copy"),
        4,
    ]
    assert writer.get("zc") == b"zero-copy" and writer.get("zc2") == b"zero"


def test_a_default_local_buffer_keeps_copying_calls(
    master: InProcessMaster, stores: list[MooncakeDistributedStore]
) -> None:
    store = _new(stores)
    assert store.setup(_joiner_config(master.address, local_buffer_size=MIB)) == 0
    assert store.put("k", b"v") == 0 and store.get("k") == b"v"


# ----------------------------------------------------------------------------------------------
# MooncakeConfig


def test_mooncake_config_load_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH", raising=False)
    monkeypatch.delenv("MOONCAKE_MASTER", raising=False)
    with pytest.raises(ValueError, match="MOONCAKE_MASTER"):
        MooncakeConfig.load_from_env()
    monkeypatch.setenv("MOONCAKE_MASTER", "10.0.0.1:50051")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "1.5gb")
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "RDMA")
    monkeypatch.setenv("MOONCAKE_OFFLOAD_ENABLED", "yes")
    for name in ("MOONCAKE_LOCAL_HOSTNAME", "MOONCAKE_LOCAL_BUFFER_SIZE", "MOONCAKE_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    config = MooncakeConfig.load_from_env()
    assert config.master_server_address == "10.0.0.1:50051"
    assert config.local_hostname == "localhost" and config.metadata_server == "P2PHANDSHAKE"
    assert config.global_segment_size == 3 * (1 << 29)
    assert config.local_buffer_size == DEFAULT_LOCAL_BUFFER_SIZE
    assert config.protocol == "rdma" and config.device_name == "" and config.enable_ssd_offload
    assert config.tenant_id == "default" and config.client_http_port == 9300
    monkeypatch.setenv("MOONCAKE_OFFLOAD_ENABLED", "sometimes")
    with pytest.raises(ValueError, match="boolean"):
        MooncakeConfig.load_from_env()


def test_mooncake_config_from_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mooncake.json"
    fields = {
        "local_hostname": "node1",
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": "master:50051",
        "global_segment_size": "512 MB",
        "local_buffer_size": 0,
        "device_name": "mlx5_0",
        "tenant_id": 7,
    }
    path.write_text(json.dumps(fields))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    config = MooncakeConfig.load_from_env()
    assert config == MooncakeConfig.from_file(str(path))
    assert (config.global_segment_size, config.local_buffer_size) == (512 * MIB, 0)
    assert config.protocol == "tcp" and config.device_name == "mlx5_0" and config.tenant_id == "7"
    path.write_text(json.dumps({k: v for k, v in fields.items() if k != "metadata_server"}))
    with pytest.raises(ValueError, match="metadata_server"):
        MooncakeConfig.from_file(str(path))
    path.write_text(json.dumps({**fields, "global_segment_size": "mb"}))
    with pytest.raises(ValueError, match="missing number"):
        MooncakeConfig.from_file(str(path))
    with pytest.raises(ValueError, match="non-negative"):
        MooncakeConfig("h", "P2PHANDSHAKE", -1, 0, "tcp", "", "m:1")
    with pytest.raises(ValueError, match="non-empty"):
        MooncakeConfig("", "P2PHANDSHAKE", 0, 0, "tcp", "", "m:1")


def test_mooncake_config_resolves_under_upstreams_module_path(
    master: InProcessMaster, tmp_path: Path
) -> None:
    # An upstream-style script, run as its own process with the shim on its path.
    script = tmp_path / "script.py"
    script.write_text(
        "from mooncake.mooncake_config import MooncakeConfig\n"
        "from mooncake.store import MooncakeDistributedStore\n"
        "c = MooncakeConfig.load_from_env()\n"
        "s = MooncakeDistributedStore()\n"
        "assert s.setup(c.local_hostname, c.metadata_server, c.global_segment_size,\n"
        "               c.local_buffer_size, c.protocol, c.device_name,\n"
        "               c.master_server_address) == 0\n"
        "assert s.put('script', b'ok') == 0 and s.get('script') == b'ok'\n"
        "s.close()\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SHIM), os.environ.get("PYTHONPATH", "")]),
        "MOONCAKE_MASTER": master.address,
        "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
        "MOONCAKE_GLOBAL_SEGMENT_SIZE": "16mb",
        "MOONCAKE_LOCAL_BUFFER_SIZE": "16mb",
    }
    env.pop("MOONCAKE_CONFIG_PATH", None)
    env.pop("MOONCAKE_ENABLE_STANDALONE", None)
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
