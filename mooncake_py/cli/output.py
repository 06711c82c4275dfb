"""Formatting and output of the ops CLI: human tables, JSON, CSV and Parquet.

Humans get aligned tables with sizes in KiB/MiB/GiB and durations such as ``3m12s``; scripts
get ``--json`` (raw numbers: bytes, milliseconds, Unix seconds); large listings can be written
with ``--format csv|parquet --output FILE`` (through pyarrow, typed columns).
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from mooncake_py import units
from mooncake_py.units import ConfigError

Kind = Literal["text", "int", "bytes", "ms", "bool", "time", "percent"]
"""How a column's raw values are shown: text, counts, sizes, durations in milliseconds,
flags, Unix times (seconds) or percentages."""

_SIZE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
_DURATION_UNITS_MS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}


class UsageError(ValueError):
    """A command line that cannot be carried out (exit code 2)."""


# -- sizes and durations ----------------------------------------------------------------------


def format_size(num_bytes: int) -> str:
    """Bytes as a short human string in binary units.

    Args:
        num_bytes: a byte count (negative counts keep their sign).

    Returns:
        ``"512 B"``, ``"1.5 KiB"``, ``"12.0 MiB"``, ``"3.2 GiB"``, ...
    """
    if num_bytes < 0:
        return "-" + format_size(-num_bytes)
    if num_bytes < 1024:
        return f"{num_bytes} B"
    value = float(num_bytes)
    for unit in _SIZE_UNITS:
        value /= 1024
        if round(value, 1) < 1024 or unit == _SIZE_UNITS[-1]:
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def format_duration(ms: float) -> str:
    """A duration in milliseconds as its two most significant units.

    Args:
        ms: milliseconds (negative values are shown as ``0s``).

    Returns:
        ``"850ms"``, ``"45s"``, ``"3m12s"``, ``"1h30m"``, ``"2d3h"``; a unit that is zero in
        the second place is left out (``"2h"``, ``"5m"``).
    """
    total = int(ms) if ms > 0 else 0
    if total < 1000:
        return f"{total}ms" if total else "0s"
    parts: list[str] = []
    rest = total // 1000 * 1000
    for unit in ("d", "h", "m", "s"):
        size = _DURATION_UNITS_MS[unit]
        count, rest = divmod(rest, size)
        if count or parts:
            parts.append(f"{count}{unit}" if count else "")
        if len(parts) == 2:
            break
    return "".join(parts)


def parse_duration(text: str) -> float:
    """Seconds from ``"90s"``, ``"30m"``, ``"2h"``, ``"1h30m"``, ``"1d"``, ``"500ms"`` or a plain
    number of seconds (``"45"``, ``"1.5"``), as :func:`mooncake_py.units.parse_duration` reads
    durations for the master and the client too.

    Units must appear from largest to smallest, each at most once.

    Raises:
        ConfigError: (a ValueError) empty, negative or malformed text; the message starts with
            ``not a duration``.
    """
    try:
        return units.parse_duration(text, unit="s")
    except ConfigError as exc:
        raise ConfigError(
            f"not a duration: {text!r} (use e.g. 90s, 30m, 2h, 1h30m or seconds)"
        ) from exc


def format_time(unix_seconds: float) -> str:
    """A Unix time as local ``YYYY-MM-DD HH:MM:SS``, or ``-`` when unset."""
    if unix_seconds <= 0:
        return "-"
    return datetime.datetime.fromtimestamp(unix_seconds).strftime("%Y-%m-%d %H:%M:%S")


def format_value(value: Any, kind: Kind) -> str:
    """One raw value as a table cell."""
    if value is None:
        return "-"
    if kind == "bytes":
        return format_size(int(value))
    if kind == "ms":
        return format_duration(float(value))
    if kind == "bool":
        return "yes" if value else "no"
    if kind == "time":
        return format_time(float(value))
    if kind == "percent":
        return f"{float(value):.1f}%"
    return str(value)


# -- tables -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a listing.

    Attributes:
        field: the raw name (JSON key, CSV/Parquet column).
        header: the table heading.
        kind: how values are shown and typed.
        in_table: False to leave the column out of human tables (JSON and files keep it).
    """

    field: str
    header: str
    kind: Kind = "text"
    in_table: bool = True


_ARROW_TYPES: dict[str, pa.DataType] = {
    "text": pa.string(),
    "int": pa.int64(),
    "bytes": pa.int64(),
    "ms": pa.int64(),
    "bool": pa.bool_(),
    "time": pa.timestamp("us", tz="UTC"),
    "percent": pa.float64(),
}


def render_table(columns: Sequence[Column], rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows as an aligned text table with a header line (numbers right-aligned)."""
    shown = [c for c in columns if c.in_table]
    cells = [[format_value(row.get(c.field), c.kind) for c in shown] for row in rows]
    widths = [len(c.header) for c in shown]
    for line in cells:
        widths = [max(w, len(cell)) for w, cell in zip(widths, line, strict=True)]
    right = [c.kind not in ("text", "bool", "time") for c in shown]

    def fmt(line: Sequence[str]) -> str:
        padded = (
            cell.rjust(w) if r else cell.ljust(w)
            for cell, w, r in zip(line, widths, right, strict=True)
        )
        return "  ".join(padded).rstrip()

    return "\n".join([fmt([c.header for c in shown]), *(fmt(line) for line in cells)])


def arrow_table(columns: Sequence[Column], rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows as a typed pyarrow table (times as UTC timestamps)."""
    arrays = []
    for column in columns:
        values = [row.get(column.field) for row in rows]
        if column.kind == "time":
            micros = [None if v is None or v <= 0 else round(v * 1e6) for v in values]
            arrays.append(pa.array(micros, pa.int64()).cast(_ARROW_TYPES["time"]))
        else:
            arrays.append(pa.array(values, _ARROW_TYPES[column.kind]))
    return pa.Table.from_arrays(arrays, names=[c.field for c in columns])


# -- emitting ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OutputOptions:
    """Where and how results are written.

    Attributes:
        json: print JSON instead of tables.
        file_format: ``csv`` or ``parquet`` for listings, or None.
        output: the file for ``file_format`` (``-`` or None: stdout, CSV only).
    """

    json: bool = False
    file_format: str | None = None
    output: str | None = None

    @classmethod
    def resolve(cls, json_flag: bool, file_format: str | None, output: str | None) -> OutputOptions:
        """Check the combination; an ``--output`` without ``--format`` uses its suffix.

        Raises:
            UsageError: parquet to stdout, an unknown suffix, or ``--json`` with ``--format``.
        """
        if output and not file_format:
            suffix = Path(output).suffix.lower()
            file_format = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}.get(suffix)
            if suffix == ".json":
                return cls(True, None, output)
            if file_format is None:
                raise UsageError(f"cannot tell the format of {output!r}: pass --format csv|parquet")
        if file_format and json_flag:
            raise UsageError("--json and --format exclude each other")
        if file_format == "parquet" and (not output or output == "-"):
            raise UsageError("--format parquet needs --output FILE")
        return cls(json_flag, file_format, output)


def _stdout() -> TextIO:
    return sys.stdout


def emit_json(options: OutputOptions, data: Any) -> None:
    """Print (or write to ``options.output``) ``data`` as JSON."""
    text = json.dumps(data, indent=2, sort_keys=False)
    if options.output and options.output != "-":
        Path(options.output).write_text(text + "\n", encoding="utf-8")
    else:
        _stdout().write(text + "\n")


def emit_listing(
    options: OutputOptions,
    columns: Sequence[Column],
    rows: Sequence[Mapping[str, Any]],
    empty_note: str = "",
) -> None:
    """Write a listing as a table, JSON (a list of objects), CSV or Parquet.

    Args:
        options: the output options.
        columns: all columns (tables show those with ``in_table``).
        rows: raw values by ``Column.field``.
        empty_note: printed to stderr instead of an empty table.
    """
    if options.file_format:
        table = arrow_table(columns, rows)
        if options.file_format == "parquet":
            assert options.output is not None
            pq.write_table(table, options.output)
        elif options.output and options.output != "-":
            pa_csv.write_csv(table, options.output)
        else:
            buffer = io.BytesIO()
            pa_csv.write_csv(table, buffer)
            _stdout().write(buffer.getvalue().decode("utf-8"))
        return
    if options.json:
        emit_json(options, [{c.field: row.get(c.field) for c in columns} for row in rows])
        return
    if not rows and empty_note:
        note(empty_note)
        return
    _stdout().write(render_table(columns, rows) + "\n")


def emit_record(
    options: OutputOptions, fields: Sequence[Column], record: Mapping[str, Any]
) -> None:
    """Write one record: ``label  value`` lines, a JSON object, or a one-row CSV/Parquet."""
    if options.file_format:
        emit_listing(options, fields, [record])
        return
    if options.json:
        emit_json(options, {f.field: record.get(f.field) for f in fields})
        return
    width = max((len(f.header) for f in fields if f.in_table), default=0)
    lines = (
        f"{f.header + ':':<{width + 1}}  {format_value(record.get(f.field), f.kind)}"
        for f in fields
        if f.in_table
    )
    _stdout().write("\n".join(lines) + "\n")


def emit_message(options: OutputOptions, text: str, data: Mapping[str, Any]) -> None:
    """A one-line outcome for humans, or ``data`` as JSON."""
    if options.json:
        emit_json(options, dict(data))
    else:
        _stdout().write(text + "\n")


def note(text: str) -> None:
    """A line for the operator on stderr (kept out of machine-readable stdout)."""
    sys.stderr.write(text + "\n")


def rows_of(
    items: Sequence[Any], extra: Callable[[Any], Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Dataclass instances (all of one type) as row dicts, optionally with computed fields.

    Cheaper than ``dataclasses.asdict`` per item, which matters for 100,000 sessions.
    """
    if not items:
        return []
    names = [f.name for f in dataclasses.fields(items[0])]
    rows = []
    for item in items:
        row = {name: getattr(item, name) for name in names}
        if extra is not None:
            row.update(extra(item))
        rows.append(row)
    return rows
