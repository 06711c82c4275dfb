"""One grammar for sizes, durations and booleans: units, master flags, client config and CLI."""

from __future__ import annotations

import pickle
import re

import pytest

from mooncake_py import MooncakeDistributedStore
from mooncake_py.cli.output import parse_duration as cli_parse_duration
from mooncake_py.client.config import ClientConfig, ClientConfigError, env_force_tcp
from mooncake_py.errors import ErrorCode, MooncakeError
from mooncake_py.master import config as master_config
from mooncake_py.master.config import parse_args
from mooncake_py.units import (
    GIB,
    KIB,
    MAX_DURATION_MS,
    MIB,
    TIB,
    ConfigError,
    parse_bool,
    parse_duration,
    parse_duration_ms,
    parse_size,
)


def invalid(key: str, value: object) -> str:
    """A pattern for the start of the error about ``key`` holding ``value``."""
    return "^" + re.escape(f"invalid {key}={value!r}: must be ")


@pytest.fixture(autouse=True)
def _no_client_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # ClientConfig.from_mapping reads these; the tests below must not depend on the caller's.
    for name in (
        "MOONCAKE_PY_FORCE_TCP",
        "MOONCAKE_AUTH_TOKEN",
        "MOONCAKE_TENANT_ID",
        "MOONCAKE_PY_MASTER_TRANSPORT",
    ):
        monkeypatch.delenv(name, raising=False)


# --- sizes -------------------------------------------------------------------------------------

SIZES = [
    (0, 0),
    (4096, 4096),
    ("1024", 1024),
    ("  2048 ", 2048),
    ("1 b", 1),
    ("2k", 2 * KIB),
    ("2KB", 2 * KIB),
    ("2kib", 2 * KIB),
    ("512mb", 512 * MIB),
    ("16 MiB", 16 * MIB),
    ("16MB", 16 * MIB),
    ("4gb", 4 * GIB),
    ("1.5GiB", 3 * GIB // 2),
    ("3.125gb", 3 * GIB + GIB // 8),
    ("1t", TIB),
    ("1 TiB", TIB),
    ("0.1k", 102),  # fractions of a byte are truncated
    (2048.0, 2048),  # other objects are read through str()
]


@pytest.mark.parametrize(("value", "expected"), SIZES)
def test_parse_size(value: object, expected: int) -> None:
    assert parse_size(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"), [(v, n) for v, n in SIZES if KIB <= n <= TIB and isinstance(v, str)]
)
def test_client_sizes_read_like_units(value: str, expected: int) -> None:
    config = ClientConfig.from_mapping({"global_segment_size": value, "local_buffer_size": value})
    assert config.global_segment_size == config.local_buffer_size == expected


@pytest.mark.parametrize(
    "value", ["", "lots", "1x", "1 kbit", "-1", "-1kb", "1e3", "1.5.5mb", "kb", -1, True, None]
)
def test_parse_size_rejects(value: object) -> None:
    with pytest.raises(ConfigError, match=invalid("global_segment_size", value)):
        parse_size(value, "global_segment_size")


# --- durations ---------------------------------------------------------------------------------

# Text with units, and its length in milliseconds.
DURATIONS = [
    ("0s", 0),
    ("250ms", 250),
    ("3 MS", 3),
    ("1.5s", 1_500),
    ("90s", 90_000),
    ("  10S ", 10_000),
    ("2s500ms", 2_500),
    ("2m", 120_000),
    ("1m30s", 90_000),
    ("1h", 3_600_000),
    ("1.5h", 5_400_000),
    ("1h30m", 5_400_000),
    ("1h 30m", 5_400_000),
    ("1d", 86_400_000),
    ("1d2h", 93_600_000),
    (".5s", 500),
    ("-0s", 0),
]


@pytest.mark.parametrize(("text", "ms"), DURATIONS)
def test_durations_read_the_same_everywhere(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms
    assert parse_duration(text) == ms / 1000
    assert cli_parse_duration(text) == ms / 1000
    if ms > 0:  # the lease TTL and client_ttl must be positive
        assert parse_args([f"--default_kv_lease_ttl={text}"]).default_kv_lease_ttl == ms
        assert master_config.config_from_mapping({"default_kv_lease_ttl": text}) == (
            master_config.MasterConfig(default_kv_lease_ttl=ms)
        )
        assert parse_args([f"--client-ttl={text}"]).client_ttl == ms / 1000
    else:
        with pytest.raises(ConfigError, match="default_kv_lease_ttl=0: must be > 0"):
            parse_args([f"--default_kv_lease_ttl={text}"])


def test_compound_lease_ttl_flag_equals_the_cli_duration() -> None:
    lease = parse_args(["--default_kv_lease_ttl=1h30m"]).default_kv_lease_ttl
    assert lease == round(cli_parse_duration("1h30m") * 1000) == 5_400_000


# A bare number counts in each reader's default unit, which has not changed.
BARE = [
    ("45", 45, 45.0),
    ("1.5", None, 1.5),  # 1.5 ms is not a whole number of milliseconds
    ("1500.0", 1500, 1500.0),
    ("1e3", 1000, 1000.0),
    ("0", 0, 0.0),
]


@pytest.mark.parametrize(("text", "as_ms", "as_seconds"), BARE)
def test_bare_numbers_use_the_default_unit(text: str, as_ms: int | None, as_seconds: float) -> None:
    assert parse_duration(text) == as_seconds
    assert cli_parse_duration(text) == as_seconds
    assert parse_duration(text, unit="ms") == as_seconds / 1000
    if as_ms is None:
        with pytest.raises(ConfigError, match="whole number of milliseconds"):
            parse_duration_ms(text)
        with pytest.raises(ConfigError, match="default_kv_lease_ttl"):
            parse_args([f"--default_kv_lease_ttl={text}"])
    else:
        assert parse_duration_ms(text) == as_ms
        if as_ms:
            assert parse_args([f"--default_kv_lease_ttl={text}"]).default_kv_lease_ttl == as_ms
    # Both timeouts, as the discard timeout may not exceed the release timeout.
    cfg = parse_args(
        [f"--put_start_discard_timeout_sec={text}", f"--put_start_release_timeout_sec={text}"]
    )
    assert cfg.put_start_discard_timeout_sec == cfg.put_start_release_timeout_sec == as_seconds


def test_bare_number_unit_is_a_parameter() -> None:
    assert parse_duration_ms(2, unit="s") == 2_000
    assert parse_duration_ms("1.5", unit="m") == 90_000
    assert parse_duration("3", unit="h") == 10_800.0
    assert parse_duration_ms(1500.0) == 1500
    assert parse_duration("2m", unit="ms") == 120.0  # a unit in the text wins


DURATION_REJECTS = [
    "",
    " ",
    "abc",
    "-5",
    "-5m",
    "1x",
    "m",
    "s",
    "ms5",
    "30m1h",  # units out of order
    "1h1h",  # a unit twice
    "1h30",  # a bare number after a term
    "h30m",
    "1.2.3s",
    "5 m s",
    "nan",
    "inf",
    "1e30",  # above MAX_DURATION_MS
]


@pytest.mark.parametrize("text", DURATION_REJECTS)
def test_bad_durations_are_rejected_everywhere(text: str) -> None:
    with pytest.raises(ConfigError, match=invalid("default_kv_lease_ttl", text)):
        parse_duration_ms(text, key="default_kv_lease_ttl")
    with pytest.raises(ConfigError, match=invalid("default_kv_lease_ttl", text)):
        parse_args([f"--default_kv_lease_ttl={text}"])
    with pytest.raises(ConfigError, match="client_ttl"):
        parse_args([f"--client_ttl={text}"])
    with pytest.raises(ConfigError, match="not a duration"):
        cli_parse_duration(text)


@pytest.mark.parametrize("value", [True, None, b"5s", [5], -1, -0.5, float("nan"), float("inf")])
def test_non_text_durations_are_rejected(value: object) -> None:
    with pytest.raises(ConfigError, match=invalid("duration", value)):
        parse_duration(value)
    with pytest.raises(ConfigError):
        parse_duration_ms(value)


def test_negative_durations_say_so() -> None:
    with pytest.raises(ConfigError, match="non-negative"):
        parse_duration("-5m")
    with pytest.raises(ConfigError, match="non-negative"):
        parse_duration_ms(-1)


def test_longest_duration() -> None:
    assert parse_duration_ms(str(MAX_DURATION_MS)) == MAX_DURATION_MS
    with pytest.raises(ConfigError, match=str(MAX_DURATION_MS)):
        parse_duration_ms(MAX_DURATION_MS + 1)
    with pytest.raises(ConfigError, match=str(MAX_DURATION_MS)):
        parse_duration("1e999999")


def test_fractional_milliseconds() -> None:
    assert parse_duration("0.5ms") == 0.0005
    with pytest.raises(ConfigError, match="whole number of milliseconds"):
        parse_duration_ms("0.5ms")


# --- booleans ----------------------------------------------------------------------------------

BOOLS = [
    (True, True),
    (False, False),
    (1, True),
    (0, False),
    ("true", True),
    ("FALSE", False),
    ("1", True),
    ("0", False),
    (" Yes ", True),
    ("no", False),
    ("on", True),
    ("Off", False),
]


@pytest.mark.parametrize(("value", "expected"), BOOLS)
def test_booleans_read_the_same_everywhere(value: object, expected: bool) -> None:
    assert parse_bool(value) is expected
    assert ClientConfig.from_mapping({"force_tcp": value}).force_tcp is expected
    assert master_config.config_from_mapping({"enable_multi_tenants": value}) == (
        master_config.MasterConfig(enable_multi_tenants=expected)
    )
    if isinstance(value, str):
        assert parse_args([f"--enable_multi_tenants={value}"]).enable_multi_tenants is expected


@pytest.mark.parametrize("value", ["maybe", "y", "2", "tru", 2, -1, 1.0, b"1"])
def test_bad_booleans_are_rejected_everywhere(value: object) -> None:
    with pytest.raises(ConfigError, match=invalid("force_tcp", value) + "one of"):
        parse_bool(value, "force_tcp")
    with pytest.raises(ClientConfigError, match=re.escape(f"force_tcp={value!r}")):
        ClientConfig.from_mapping({"force_tcp": value})
    with pytest.raises(ConfigError, match="enable_multi_tenants"):
        master_config.config_from_mapping({"enable_multi_tenants": value})


def test_empty_boolean() -> None:
    for value in ("", None):
        with pytest.raises(ConfigError):
            parse_bool(value)
        with pytest.raises(ConfigError, match="enable_multi_tenants"):
            master_config.config_from_mapping({"enable_multi_tenants": value})
    with pytest.raises(ConfigError):
        parse_args(["--enable_multi_tenants="])
    # For the client an empty or None value is an unset one, which means off.
    assert ClientConfig.from_mapping({"force_tcp": " "}).force_tcp is False
    assert ClientConfig.from_mapping({"force_tcp": None}).force_tcp is False


def test_force_tcp_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_force_tcp() is False
    monkeypatch.setenv("MOONCAKE_PY_FORCE_TCP", "On")
    assert env_force_tcp() is True
    monkeypatch.setenv("MOONCAKE_PY_FORCE_TCP", "sometimes")
    with pytest.raises(ClientConfigError, match="MOONCAKE_PY_FORCE_TCP='sometimes'"):
        env_force_tcp()


# --- the error type ----------------------------------------------------------------------------


def test_master_config_error_is_the_units_error() -> None:
    from mooncake_py.master.transport import auth

    assert master_config.ConfigError is ConfigError
    assert auth.ConfigError is ConfigError
    assert issubclass(ConfigError, ValueError)


def test_client_config_error_is_both_a_config_error_and_invalid_params() -> None:
    with pytest.raises(ClientConfigError) as info:
        ClientConfig.from_mapping({"global_segment_size": "lots"})
    error = info.value
    assert isinstance(error, ConfigError) and isinstance(error, MooncakeError)
    assert error.code == ErrorCode.INVALID_PARAMS
    assert str(error) == (
        "INVALID_PARAMS: invalid global_segment_size='lots': "
        "must be a size such as 1024, 512mb, 4gb or 1.5GiB"
    )
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is ClientConfigError and str(copy) == str(error) and copy.code == error.code


def test_client_validation_errors_are_config_errors() -> None:
    with pytest.raises(ClientConfigError, match="within"):
        ClientConfig(global_segment_size=KIB - 1)
    with pytest.raises(ClientConfigError, match="host:port"):
        ClientConfig(master_server_addr="no-port")


@pytest.mark.parametrize(
    "values",
    [
        {"global_segment_size": "lots"},
        {"local_buffer_size": "-1kb"},
        {"global_segment_size": "2TiB"},
        {"force_tcp": "maybe"},
        {"master_server_addr": "no-port"},
    ],
)
def test_setup_returns_invalid_params_for_a_bad_config(values: dict[str, object]) -> None:
    store = MooncakeDistributedStore()
    assert store.setup({"master_server_addr": "127.0.0.1:1", **values}) == (
        ErrorCode.INVALID_PARAMS
    )
