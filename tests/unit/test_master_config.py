"""Tests for the master configuration: defaults, flags, files, precedence and validation."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from mooncake_py.master.config import (
    AtLeast,
    ConfigError,
    Constraint,
    InRange,
    MasterConfig,
    OneOf,
    Positive,
    build_arg_parser,
    config_from_mapping,
    load_config_file,
    parse_args,
    parse_bool,
    parse_duration_ms,
)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# --- defaults ----------------------------------------------------------------------------------


def test_defaults() -> None:
    cfg = MasterConfig()
    assert cfg.rpc_address == "127.0.0.1"
    assert cfg.port == 50051
    assert cfg.client_ttl == 10.0
    assert cfg.default_kv_lease_ttl == 10_000
    assert cfg.default_kv_soft_pin_ttl == 1_800_000
    assert cfg.max_kv_soft_pin_ttl == 86_400_000
    assert cfg.allow_evict_soft_pinned_objects is True
    assert cfg.put_start_discard_timeout_sec == 30.0
    assert cfg.put_start_release_timeout_sec == 600.0
    assert cfg.allocation_strategy == "random"
    assert cfg.eviction_high_watermark_ratio == 0.90
    assert cfg.eviction_ratio == 0.05
    assert cfg.enable_multi_tenants is False
    assert cfg.max_batch_keys == 100_000
    assert cfg.max_message_bytes == 256 * 1024 * 1024
    assert cfg.log_level == "INFO"


def test_no_arguments_gives_defaults() -> None:
    assert parse_args([]) == MasterConfig()
    assert config_from_mapping({}) == MasterConfig()


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        MasterConfig().port = 1  # type: ignore[misc]


def test_float_fields_store_floats() -> None:
    cfg = MasterConfig(client_ttl=5, put_start_discard_timeout_sec=1)
    assert isinstance(cfg.client_ttl, float)
    assert isinstance(cfg.put_start_discard_timeout_sec, float)


def test_choice_fields_are_canonicalised() -> None:
    cfg = MasterConfig(log_level="debug", allocation_strategy="Local_First")
    assert cfg.log_level == "DEBUG"
    assert cfg.allocation_strategy == "local_first"


# --- command-line flags ------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--client_ttl", "--client-ttl"])
def test_flag_spellings(flag: str) -> None:
    assert parse_args([flag, "2.5"]).client_ttl == 2.5
    assert parse_args([f"{flag}=3"]).client_ttl == 3.0


def test_flags_of_every_kind() -> None:
    cfg = parse_args(
        [
            "--rpc-address=0.0.0.0",
            "--port",
            "0",
            "--default_kv_lease_ttl=5s",
            "--default-kv-soft-pin-ttl",
            "2m",
            "--max_kv_soft_pin_ttl=1h",
            "--put_start_discard_timeout_sec=1.5",
            "--put-start-release-timeout-sec=2",
            "--allocation-strategy=free_ratio_first",
            "--eviction_high_watermark_ratio=1",
            "--eviction-ratio=0",
            "--max-batch-keys=10",
            "--max_message_bytes=1048576",
            "--log-level=warning",
        ]
    )
    assert cfg == MasterConfig(
        rpc_address="0.0.0.0",
        port=0,
        default_kv_lease_ttl=5_000,
        default_kv_soft_pin_ttl=120_000,
        max_kv_soft_pin_ttl=3_600_000,
        put_start_discard_timeout_sec=1.5,
        put_start_release_timeout_sec=2.0,
        allocation_strategy="free_ratio_first",
        eviction_high_watermark_ratio=1.0,
        eviction_ratio=0.0,
        max_batch_keys=10,
        max_message_bytes=1024 * 1024,
        log_level="WARNING",
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--enable_multi_tenants"], True),
        (["--enable-multi-tenants"], True),
        (["--enable_multi_tenants=true"], True),
        (["--enable_multi_tenants", "yes"], True),
        (["--enable-multi-tenants=off"], False),
        (["--enable_multi_tenants=0"], False),
    ],
)
def test_bool_flag_values(argv: list[str], expected: bool) -> None:
    assert parse_args(argv).enable_multi_tenants is expected


@pytest.mark.parametrize(
    "argv",
    [["--allow_evict_soft_pinned_objects=false"], ["--allow-evict-soft-pinned-objects", "no"]],
)
def test_bool_flag_can_turn_default_off(argv: list[str]) -> None:
    assert parse_args(argv).allow_evict_soft_pinned_objects is False


def test_help_lists_both_spellings_and_defaults() -> None:
    text = build_arg_parser().format_help()
    for option in ("--client_ttl", "--client-ttl", "--config", "--config_path", "--log-level"):
        assert option in text
    assert "50051" in text


def test_invalid_flag_value_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="max_batch_keys"):
        parse_args(["--max_batch_keys=lots"])
    with pytest.raises(ConfigError, match="enable_multi_tenants"):
        parse_args(["--enable_multi_tenants=maybe"])


def test_unknown_or_incomplete_flag_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="--no_such_flag"):
        parse_args(["--no_such_flag=1"])
    with pytest.raises(ConfigError, match="--port"):
        parse_args(["--port"])


def test_flag_prefixes_are_not_expanded() -> None:
    with pytest.raises(ConfigError):
        parse_args(["--eviction_high=0.5"])


# --- config files ------------------------------------------------------------------------------


def test_yaml_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "master.yaml",
        "# master settings\n"
        "rpc_address: 0.0.0.0\n"
        "port: 6000\n"
        "client-ttl: 4.5\n"
        "default_kv_lease_ttl: 2s\n"
        "allow_evict_soft_pinned_objects: false\n"
        "allocation_strategy: local_first\n"
        "log-level: debug\n",
    )
    cfg = parse_args(["--config", path])
    assert cfg == MasterConfig(
        rpc_address="0.0.0.0",
        port=6000,
        client_ttl=4.5,
        default_kv_lease_ttl=2_000,
        allow_evict_soft_pinned_objects=False,
        allocation_strategy="local_first",
        log_level="DEBUG",
    )


def test_json_file(tmp_path: Path) -> None:
    values = {
        "port": 7000,
        "eviction_ratio": 0.1,
        "enable_multi_tenants": True,
        "max_kv_soft_pin_ttl": "2h",
        "max-message-bytes": 8 * 1024 * 1024,
    }
    path = write(tmp_path, "master.json", json.dumps(values))
    cfg = parse_args(["--config", path])
    assert cfg.port == 7000
    assert cfg.eviction_ratio == 0.1
    assert cfg.enable_multi_tenants is True
    assert cfg.max_kv_soft_pin_ttl == 7_200_000
    assert cfg.max_message_bytes == 8 * 1024 * 1024


def test_load_config_file_normalises_keys(tmp_path: Path) -> None:
    path = write(tmp_path, "m.yml", "client-ttl: 3\nmax-batch-keys: '50'\n")
    assert load_config_file(path) == {"client_ttl": 3, "max_batch_keys": "50"}


@pytest.mark.parametrize("text", ['{"port": 6001}', "port: 6001\n"])
def test_file_without_known_suffix_tries_json_then_yaml(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, "master.conf", text)
    assert load_config_file(path) == {"port": 6001}


def test_empty_yaml_file_is_an_empty_config(tmp_path: Path) -> None:
    path = write(tmp_path, "master.yaml", "# nothing set\n")
    assert load_config_file(path) == {}
    assert parse_args(["--config", path]) == MasterConfig()


@pytest.mark.parametrize("flag", ["--config", "--config_path", "--config-path"])
def test_config_flag_spellings(tmp_path: Path, flag: str) -> None:
    path = write(tmp_path, "master.yaml", "port: 6100\n")
    assert parse_args([flag, path]).port == 6100


# --- precedence --------------------------------------------------------------------------------


def test_flags_override_file_and_file_overrides_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "master.yaml",
        "port: 6000\nclient_ttl: 4\nallow_evict_soft_pinned_objects: false\n",
    )
    cfg = parse_args(["--port=7000", "--config", path])
    assert cfg.port == 7000  # flag beats file, whatever the order on the command line
    assert cfg.client_ttl == 4.0  # file beats default
    assert cfg.allow_evict_soft_pinned_objects is False  # an absent flag keeps the file value
    assert cfg.eviction_ratio == 0.05  # default when neither sets it


def test_flag_equal_to_default_still_overrides_file(tmp_path: Path) -> None:
    path = write(tmp_path, "master.yaml", "port: 6000\nenable_multi_tenants: true\n")
    cfg = parse_args(["--config", path, "--port", "50051", "--enable_multi_tenants=false"])
    assert cfg.port == 50051
    assert cfg.enable_multi_tenants is False


def test_flags_fix_an_invalid_combination_in_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "master.yaml", "put_start_release_timeout_sec: 10\n")
    with pytest.raises(ConfigError, match="put_start_release_timeout_sec"):
        parse_args(["--config", path])
    cfg = parse_args(["--config", path, "--put_start_discard_timeout_sec=5"])
    assert cfg.put_start_release_timeout_sec == 10.0


# --- upstream aliases --------------------------------------------------------------------------


def test_client_live_ttl_sec_alias(tmp_path: Path) -> None:
    path = write(tmp_path, "master.yaml", "client_live_ttl_sec: 7\n")
    assert load_config_file(path) == {"client_ttl": 7}
    assert parse_args(["--config", path]).client_ttl == 7.0


def test_rpc_port_alias(tmp_path: Path) -> None:
    path = write(tmp_path, "master.json", '{"rpc_port": 6200}')
    assert load_config_file(path) == {"port": 6200}
    assert parse_args(["--config", path]).port == 6200


def test_rpc_port_zero_is_ignored(tmp_path: Path) -> None:
    path = write(tmp_path, "master.yaml", "rpc_port: 0\nport: 6300\n")
    assert load_config_file(path) == {"port": 6300}


def test_alias_and_canonical_key_together_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "master.yaml", "rpc_port: 6200\nport: 6300\n")
    with pytest.raises(ConfigError, match="port"):
        load_config_file(path)
    path = write(tmp_path, "dup.yaml", "client_ttl: 1\nclient-ttl: 2\n")
    with pytest.raises(ConfigError, match="client_ttl"):
        load_config_file(path)


def test_invalid_rpc_port_names_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, "master.yaml", "rpc_port: high\n")
    with pytest.raises(ConfigError, match="rpc_port"):
        load_config_file(path)


# --- durations and booleans --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1500, 1500),
        (1500.0, 1500),
        (0, 0),
        ("1500", 1500),
        ("250ms", 250),
        ("5s", 5_000),
        ("1.5s", 1_500),
        ("2m", 120_000),
        ("1h", 3_600_000),
        ("  10S ", 10_000),
        ("3 MS", 3),
        ("0s", 0),
    ],
)
def test_parse_duration_ms(value: str | int | float, expected: int) -> None:
    assert parse_duration_ms(value) == expected


@pytest.mark.parametrize(
    "value", ["-5s", "-1", -1, "5x", "", "s", "ms5", "1.2.3s", "0.0001s", 1.5, float("nan")]
)
def test_parse_duration_ms_rejects(value: str | int | float) -> None:
    with pytest.raises(ConfigError):
        parse_duration_ms(value)


def test_parse_duration_ms_rejects_non_numbers() -> None:
    with pytest.raises(ConfigError):
        parse_duration_ms(True)
    with pytest.raises(ConfigError):
        parse_duration_ms(None)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        (False, False),
        ("true", True),
        ("FALSE", False),
        ("1", True),
        ("0", False),
        (" Yes ", True),
        ("no", False),
        ("on", True),
        ("Off", False),
    ],
)
def test_parse_bool(value: object, expected: bool) -> None:
    assert parse_bool(value) is expected


@pytest.mark.parametrize("value", ["maybe", "", "2", 2, None, 1.0])
def test_parse_bool_rejects(value: object) -> None:
    with pytest.raises(ConfigError):
        parse_bool(value)


def test_compound_durations() -> None:
    cfg = parse_args(["--default_kv_lease_ttl=1h30m", "--max-kv-soft-pin-ttl", "1d 2h"])
    assert cfg.default_kv_lease_ttl == 5_400_000
    assert cfg.max_kv_soft_pin_ttl == 93_600_000


def test_seconds_fields_take_durations(tmp_path: Path) -> None:
    path = write(tmp_path, "master.yaml", "client_ttl: 1m30s\nput_start_release_timeout_sec: 10m\n")
    cfg = parse_args(["--config", path, "--put-start-discard-timeout-sec=45s"])
    assert cfg.client_ttl == 90.0
    assert cfg.put_start_release_timeout_sec == 600.0
    assert cfg.put_start_discard_timeout_sec == 45.0
    assert parse_args(["--client_ttl=250ms"]).client_ttl == 0.25
    assert parse_args(["--client_ttl=2.5"]).client_ttl == 2.5  # bare numbers stay seconds


def test_duration_error_names_the_key() -> None:
    with pytest.raises(ConfigError, match="default_kv_lease_ttl"):
        config_from_mapping({"default_kv_lease_ttl": "-5s"})
    with pytest.raises(ConfigError, match="max_kv_soft_pin_ttl"):
        parse_args(["--max_kv_soft_pin_ttl=soon"])


# --- config_from_mapping -----------------------------------------------------------------------


def test_config_from_mapping_coerces_strings() -> None:
    cfg = config_from_mapping(
        {
            "port": " 6000 ",
            "client_ttl": "2.5",
            "default_kv_soft_pin_ttl": "30m",
            "allow_evict_soft_pinned_objects": "off",
            "eviction_high_watermark_ratio": "0.8",
            "max_batch_keys": 1000.0,
            "allocation_strategy": "FREE_RATIO_FIRST",
        }
    )
    assert cfg.port == 6000
    assert cfg.client_ttl == 2.5
    assert cfg.default_kv_soft_pin_ttl == 1_800_000
    assert cfg.allow_evict_soft_pinned_objects is False
    assert cfg.eviction_high_watermark_ratio == 0.8
    assert cfg.max_batch_keys == 1000
    assert cfg.allocation_strategy == "free_ratio_first"


def test_config_from_mapping_rejects_unknown_keys() -> None:
    with pytest.raises(ConfigError, match="bogus"):
        config_from_mapping({"port": 1, "bogus": 2})


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("port", 70000),
        ("port", -1),
        ("port", "http"),
        ("port", 1.5),
        ("port", True),
        ("rpc_address", ""),
        ("rpc_address", "127.0.0.1 extra"),
        ("client_ttl", 0),
        ("client_ttl", -1),
        ("client_ttl", "inf"),
        ("client_ttl", "nan"),
        ("default_kv_lease_ttl", -1),
        ("max_kv_soft_pin_ttl", 0),
        ("put_start_discard_timeout_sec", -0.5),
        ("allocation_strategy", "round_robin"),
        ("eviction_high_watermark_ratio", 0),
        ("eviction_high_watermark_ratio", 1.01),
        ("eviction_ratio", -0.1),
        ("eviction_ratio", 1.5),
        ("max_batch_keys", 0),
        ("max_message_bytes", 1024 * 1024 - 1),
        ("log_level", "TRACE"),
        ("enable_multi_tenants", "sometimes"),
    ],
)
def test_invalid_values_name_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key) as info:
        config_from_mapping({key: value})
    assert "must be" in str(info.value)


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ConfigError, match="eviction_ratio"):
        MasterConfig(eviction_ratio=2.0)
    with pytest.raises(ConfigError, match="port"):
        MasterConfig(port="50051")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="enable_multi_tenants"):
        MasterConfig(enable_multi_tenants=1)  # type: ignore[arg-type]


def test_error_message_names_value_and_range() -> None:
    with pytest.raises(ConfigError) as info:
        MasterConfig(port=70000)
    message = str(info.value)
    assert "port" in message and "70000" in message and "65535" in message
    with pytest.raises(ConfigError) as info:
        MasterConfig(allocation_strategy="round_robin")
    assert "free_ratio_first" in str(info.value)


@pytest.mark.parametrize(
    ("constraint", "admitted", "rejected", "text", "expected"),
    [
        (InRange(0, 65535), [0, 65535], [-1, 65536], "[0, 65535]", "in [0, 65535]"),
        (InRange(0, 1, low_open=True), [1e-9, 1], [0, 1.01], "(0, 1]", "in (0, 1]"),
        (AtLeast(5), [5, 6.5], [4.99], ">= 5", ">= 5"),
        (Positive(), [1e-9, 1], [0, -1], "> 0", "> 0"),
    ],
)
def test_range_constraints(
    constraint: Constraint, admitted: list[float], rejected: list[float], text: str, expected: str
) -> None:
    assert all(constraint.admits(value) for value in admitted)
    assert not any(constraint.admits(value) for value in rejected)
    assert str(constraint) == text
    assert constraint.expected == expected
    assert constraint.canonical(admitted[0]) == admitted[0]


def test_one_of_constraint() -> None:
    levels = OneOf("DEBUG", "INFO")
    assert levels.admits("debug") and levels.canonical("debug") == "DEBUG"
    assert not levels.admits("TRACE") and not levels.admits(1)
    assert levels.expected == "one of DEBUG, INFO"
    assert levels == OneOf("DEBUG", "INFO")  # constraints are plain values


def test_help_shows_each_constraint() -> None:
    text = " ".join(build_arg_parser().format_help().split())
    assert "RPC server port; 0 picks a free port. Allowed: [0, 65535]." in text
    assert "Allowed: (0, 1]." in text
    assert "Allowed: >= 1048576." in text
    assert "Allowed: > 0." in text
    assert "--allocation_strategy {random,free_ratio_first,local_first}" in text


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_release_timeout_below_discard_timeout() -> None:
    with pytest.raises(ConfigError, match="put_start_release_timeout_sec"):
        MasterConfig(put_start_discard_timeout_sec=30, put_start_release_timeout_sec=10)
    cfg = MasterConfig(put_start_discard_timeout_sec=10, put_start_release_timeout_sec=10)
    assert cfg.put_start_release_timeout_sec == cfg.put_start_discard_timeout_sec


def test_soft_pin_default_above_max() -> None:
    with pytest.raises(ConfigError, match="default_kv_soft_pin_ttl"):
        MasterConfig(default_kv_soft_pin_ttl=2_000, max_kv_soft_pin_ttl=1_000)
    with pytest.raises(ConfigError, match="max_kv_soft_pin_ttl"):
        parse_args(["--max_kv_soft_pin_ttl=10m"])  # below the 30 minute default soft pin
    assert parse_args(["--max_kv_soft_pin_ttl=10m", "--default_kv_soft_pin_ttl=10m"])


def test_unknown_key_in_file(tmp_path: Path) -> None:
    path = write(tmp_path, "master.yaml", "port: 6000\nenable_gc: true\nmetrics_port: 9003\n")
    with pytest.raises(ConfigError, match="enable_gc") as info:
        load_config_file(path)
    assert "metrics_port" not in str(info.value)  # a known key is not reported
    with pytest.raises(ConfigError, match="enable_gc"):
        parse_args(["--config", path])


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("master.yaml", "port: [6000\n"),
        ("master.yml", "port: 1\n  bad indent: 2\n"),
        ("master.json", '{"port": 6000,}'),
        ("master.json", ""),
        ("master.conf", "{port: [}"),
    ],
)
def test_malformed_file(tmp_path: Path, name: str, text: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError, match=name):
        load_config_file(path)


@pytest.mark.parametrize("text", ["- port\n- 6000\n", "6000\n", '"port"\n'])
def test_file_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, "master.yaml", text)
    with pytest.raises(ConfigError, match="mapping"):
        load_config_file(path)


def test_missing_or_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing.yaml"):
        load_config_file(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="missing.yaml"):
        parse_args(["--config", str(tmp_path / "missing.yaml")])
    with pytest.raises(ConfigError):
        load_config_file(str(tmp_path))  # a directory
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00port")
    with pytest.raises(ConfigError, match="binary.yaml"):
        load_config_file(str(binary))


def test_invalid_value_in_file_names_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, "master.yaml", "eviction_high_watermark_ratio: 1.5\n")
    with pytest.raises(ConfigError, match="eviction_high_watermark_ratio"):
        parse_args(["--config", path])
