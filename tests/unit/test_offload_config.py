"""The disk tier's client settings: upstream's setup keywords, config keys and variables."""

from __future__ import annotations

import pytest

from mooncake_py.client.config import DEFAULT_OFFLOAD_PATH, ClientConfig, ClientConfigError

BASE = {"master_server_address": "127.0.0.1:50051"}


def test_setup_keys_turn_the_tier_on(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("MOONCAKE_OFFLOAD_ENABLED", "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"):
        monkeypatch.delenv(variable, raising=False)
    config = ClientConfig.from_mapping(
        {**BASE, "enable_ssd_offload": True, "ssd_offload_path": "/ssd", "ssd_offload_quota": "2gb"}
    )
    assert config.enable_ssd_offload and config.ssd_offload_path == "/ssd"
    assert config.ssd_offload_quota == 2 << 30
    assert config.ssd_offload_fsync
    assert not ClientConfig.from_mapping(BASE).enable_ssd_offload


def test_variables_are_read_below_setup_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOONCAKE_OFFLOAD_ENABLED", "true")
    monkeypatch.setenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "/env-ssd")
    monkeypatch.setenv("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "1048576")
    monkeypatch.setenv("MOONCAKE_PY_OFFLOAD_FSYNC", "false")
    config = ClientConfig.from_mapping(BASE)
    assert config.enable_ssd_offload and config.ssd_offload_path == "/env-ssd"
    assert config.ssd_offload_quota == 1 << 20 and not config.ssd_offload_fsync
    assert ClientConfig.from_mapping({**BASE, "ssd_offload_path": "/mine"}).ssd_offload_path == (
        "/mine"
    )


def test_a_tier_without_a_path_takes_upstreams_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", raising=False)
    config = ClientConfig.from_mapping({**BASE, "enable_ssd_offload": True})
    assert config.ssd_offload_path == DEFAULT_OFFLOAD_PATH


def test_bad_values_are_refused() -> None:
    with pytest.raises(ClientConfigError):
        ClientConfig.from_mapping({**BASE, "enable_ssd_offload": "maybe"})
    with pytest.raises(ClientConfigError):
        ClientConfig.from_mapping({**BASE, "ssd_offload_quota": "lots"})
    with pytest.raises(ClientConfigError):
        ClientConfig(ssd_offload_quota=-1)


def test_the_master_takes_upstreams_offload_flags() -> None:
    from mooncake_py.master.config import ConfigError, MasterConfig, config_from_mapping

    config = config_from_mapping(
        {"enable_offload": "true", "offload_on_evict": "true", "promotion_on_hit": "false"}
    )
    assert config.enable_offload and config.offload_on_evict and not config.promotion_on_hit
    with pytest.raises(ConfigError, match="write-behind"):
        MasterConfig(offload_on_evict=False)
