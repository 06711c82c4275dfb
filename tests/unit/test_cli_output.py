"""Formatting and parsing of the ops CLI: sizes, durations, tables, output options, usage."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa
import pytest

from mooncake_py.cli import main
from mooncake_py.cli.common import EXIT_NOT_FOUND, EXIT_STORE_ERROR, duration_ms, exit_code_of
from mooncake_py.cli.output import (
    Column,
    OutputOptions,
    UsageError,
    arrow_table,
    emit_listing,
    emit_record,
    format_duration,
    format_size,
    parse_duration,
    render_table,
)
from mooncake_py.errors import ErrorCode

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


@pytest.mark.parametrize(
    ("num_bytes", "text"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (1000 * KIB, "1000.0 KiB"),
        (MIB - 1, "1.0 MiB"),  # rounds up into the next unit, never "1024.0 KiB"
        (12 * MIB + 300 * KIB, "12.3 MiB"),
        (3 * GIB, "3.0 GiB"),
        (5 << 40, "5.0 TiB"),
        (-2048, "-2.0 KiB"),
    ],
)
def test_format_size(num_bytes: int, text: str) -> None:
    assert format_size(num_bytes) == text


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (-5, "0s"),
        (1, "1ms"),
        (850, "850ms"),
        (1000, "1s"),
        (45_999, "45s"),
        (192_000, "3m12s"),
        (300_000, "5m"),
        (3_600_000, "1h"),
        (5_400_000, "1h30m"),
        (5_432_000, "1h30m"),  # two most significant units
        (2 * 86_400_000 + 3 * 3_600_000, "2d3h"),
        (86_400_000 + 60_000, "1d"),
    ],
)
def test_format_duration(ms: int, text: str) -> None:
    assert format_duration(ms) == text


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("30m", 1800.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("1d2h", 93_600.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("2s500ms", 2.5),
        ("1.5h", 5400.0),
        ("45", 45.0),
        ("1.5", 1.5),
        ("0", 0.0),
        (" 2H ", 7200.0),
        ("1h 30m", 5400.0),  # spaces may separate terms, as in the master's flags
        ("3 ms", 0.003),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", " ", "abc", "-5", "-5m", "1x", "m", "30m1h", "1h1h", "1h 30", "1h30", "h30m"]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize("ms", [1000, 59_000, 192_000, 5_400_000, 7_200_000, 97_200_000])
def test_formatted_durations_parse_back(ms: int) -> None:
    assert parse_duration(format_duration(ms)) * 1000 == ms


def test_duration_argument_type() -> None:
    assert duration_ms("30m") == 1_800_000
    assert duration_ms("1.5") == 1500
    with pytest.raises(argparse.ArgumentTypeError):
        duration_ms("soon")


def test_exit_codes_of_store_codes() -> None:
    assert exit_code_of(ErrorCode.SESSION_NOT_FOUND) == EXIT_NOT_FOUND
    assert exit_code_of(ErrorCode.OBJECT_NOT_FOUND) == EXIT_NOT_FOUND
    assert exit_code_of(ErrorCode.RPC_FAIL) == 3
    assert exit_code_of(ErrorCode.INVALID_PARAMS) == 2
    assert exit_code_of(ErrorCode.OBJECT_HAS_LEASE) == EXIT_STORE_ERROR


COLUMNS = (
    Column("name", "NAME"),
    Column("size", "SIZE", "bytes"),
    Column("idle", "IDLE", "ms"),
    Column("on", "ON", "bool"),
    Column("hidden", "HIDDEN", in_table=False),
    Column("at", "AT", "time"),
)
ROWS = [
    {"name": "a", "size": 1536, "idle": 192_000, "on": True, "hidden": "x", "at": 1.5e9},
    {"name": "longer", "size": 10, "idle": 0, "on": False, "hidden": "y", "at": 0.0},
]


def test_render_table_aligns_and_hides() -> None:
    lines = render_table(COLUMNS, ROWS).splitlines()
    assert lines[0].startswith("NAME    ") and "HIDDEN" not in lines[0]
    assert lines[1].split()[:5] == ["a", "1.5", "KiB", "3m12s", "yes"]
    assert lines[2].split() == ["longer", "10", "B", "0s", "no", "-"]
    # Numbers are right-aligned: the size column ends at the same offset on every line.
    end = lines[0].index("SIZE") + len("SIZE")
    assert lines[1][:end].endswith(" 1.5 KiB") and lines[2][:end].endswith("    10 B")


def test_arrow_table_types() -> None:
    table = arrow_table(COLUMNS, ROWS)
    assert table.column_names == ["name", "size", "idle", "on", "hidden", "at"]
    assert table.schema.field("size").type == pa.int64()
    assert table.schema.field("on").type == pa.bool_()
    assert table.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert table.column("at").to_pylist()[1] is None  # unset time
    assert table.column("at").cast(pa.int64()).to_pylist()[0] == 1_500_000_000_000_000


def test_output_options() -> None:
    assert OutputOptions.resolve(False, None, "x.csv").file_format == "csv"
    assert OutputOptions.resolve(False, None, "x.parquet").file_format == "parquet"
    assert OutputOptions.resolve(False, None, "x.json").json
    assert OutputOptions.resolve(False, "csv", None).output is None  # CSV to stdout
    for flags in ((False, None, "x.txt"), (False, "parquet", None), (True, "csv", "x.csv")):
        with pytest.raises(UsageError):
            OutputOptions.resolve(*flags)


def test_emitters(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    emit_listing(OutputOptions(json=True), COLUMNS, ROWS)
    assert [row["hidden"] for row in json.loads(capsys.readouterr().out)] == ["x", "y"]
    emit_record(OutputOptions(json=True), COLUMNS, ROWS[0])
    assert json.loads(capsys.readouterr().out)["size"] == 1536
    emit_record(OutputOptions(), COLUMNS, ROWS[0])
    assert "SIZE:  1.5 KiB" in capsys.readouterr().out
    emit_listing(OutputOptions(), COLUMNS, [], empty_note="nothing here")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "nothing here\n"
    emit_listing(OutputOptions(file_format="csv"), COLUMNS, ROWS)
    assert capsys.readouterr().out.splitlines()[0] == '"name","size","idle","on","hidden","at"'


@pytest.mark.parametrize(
    "argv",
    [
        ["sessions", "ls", "--top", "0"],
        ["sessions", "ls", "--idle-over", "soon"],
        ["sessions", "ls", "--pinned", "--unpinned"],
        ["sessions", "release-stale"],  # --idle-over is required
        ["sessions"],
        ["--master", "no-port", "stats"],
        ["--format", "parquet", "sessions", "ls"],
        ["--format", "csv", "keys", "get", "k"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.strip()


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for command in ("sessions", "segments", "keys", "stats", "release-kv-cache", "exit codes"):
        assert command in text
