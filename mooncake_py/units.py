"""Sizes, durations and booleans as they are written in flags, config files and the CLI.

One grammar for each, shared by the master's flags and config file, the client's config and
the ops CLI, so the same text means the same thing everywhere:

- **Sizes** (:func:`parse_size`): a non-negative int of bytes, or a string such as ``"1024"``,
  ``"512mb"``, ``"4gb"``, ``"1.5GiB"``, ``"16 MiB"``. Units are case-insensitive and all
  binary: ``k``/``kb``/``kib`` = 1024 bytes, ``m``/``mb``/``mib`` = 1024 KiB, then
  ``g``/``gb``/``gib`` and ``t``/``tb``/``tib``; ``b`` or no unit means bytes. Fractions are
  truncated to whole bytes (``"1.5k"`` = 1536, ``"0.1k"`` = 102).
- **Durations** (:func:`parse_duration`, :func:`parse_duration_ms`): a bare non-negative number
  in the caller's default unit (``"45"``, ``"1.5"``, ``"1e3"``, or an int or float), or terms
  of a number and a unit (``d``, ``h``, ``m``, ``s``, ``ms``, case-insensitive) from the
  largest unit to the smallest, each at most once: ``"250ms"``, ``"90s"``, ``"1.5s"``,
  ``"1h30m"``, ``"2s500ms"``, ``"1d 2h"``. Spaces may separate a number from its unit and one
  term from the next; a bare number cannot follow a term (``"1h30"`` is rejected). Negative
  durations and durations above :data:`MAX_DURATION_MS` are rejected.
- **Booleans** (:func:`parse_bool`): ``True``/``False``, the ints 0 and 1, or one of
  ``true``/``false``, ``1``/``0``, ``yes``/``no``, ``on``/``off`` in any case.

Every malformed value raises :class:`ConfigError` with a message of the shape
``invalid KEY=VALUE: must be ...``, where ``KEY`` is the name the caller passes as ``key``.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, DecimalException
from typing import Literal

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
TIB = 1024 * GIB

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    **dict.fromkeys(("k", "kb", "kib"), KIB),
    **dict.fromkeys(("m", "mb", "mib"), MIB),
    **dict.fromkeys(("g", "gb", "gib"), GIB),
    **dict.fromkeys(("t", "tb", "tib"), TIB),
}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")

DurationUnit = Literal["d", "h", "m", "s", "ms"]
"""A unit a duration term may carry, and the default unit of a bare number."""

MAX_DURATION_MS = 2**63 - 1
"""The longest duration accepted (about 292 million years): every duration fits a signed 64-bit
count of milliseconds."""

_UNIT_MS: dict[str, int] = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}
_UNIT_NAMES = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds", "ms": "milliseconds"}
# "ms" comes before "m" so that "5ms" is one term, not five minutes followed by a stray "s".
_DURATION_TERM = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|d|h|m|s)\s*")

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


class ConfigError(ValueError):
    """An invalid configuration value, flag or file, of the master, the client or the CLI."""


def invalid_value(key: str, value: object, expected: str) -> ConfigError:
    """The error for ``key`` holding ``value``: ``invalid KEY=VALUE: must be EXPECTED``."""
    return ConfigError(f"invalid {key}={value!r}: must be {expected}")


def parse_size(value: object, key: str = "size") -> int:
    """Bytes from an int or a size string (grammar in the module docstring).

    Args:
        value: a non-negative int, or text such as ``"512mb"``, ``"1.5GiB"``, ``"16 MiB"``;
            other objects are read through ``str()`` (so the float ``2048.0`` is 2048 bytes).
        key: the name the error message gives the value.

    Returns:
        The number of bytes, fractions truncated.

    Raises:
        ConfigError: a bool, a negative int, or text that is not a size.
    """
    if isinstance(value, bool):
        raise invalid_value(key, value, "a number of bytes, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise invalid_value(key, value, "a non-negative number of bytes")
        return value
    expected = "a size such as 1024, 512mb, 4gb or 1.5GiB"
    match = _SIZE_RE.fullmatch(str(value))
    unit = match[2].lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise invalid_value(key, value, expected)
    try:
        return int(Decimal(match[1]) * _SIZE_UNITS[unit])
    except DecimalException:  # a number too long for Decimal's exponent range
        raise invalid_value(key, value, expected) from None


def _bare_number(text: str) -> Decimal | None:
    """``text`` as a bare number (the syntax ``float()`` reads), or None if it is not one."""
    try:
        return Decimal(text)
    except DecimalException:
        return None


def _terms_in_ms(text: str) -> Decimal | None:
    """The sum of the ``<number><unit>`` terms that make up ``text``, or None if malformed."""
    total, position, previous = Decimal(0), 0, math.inf
    for match in _DURATION_TERM.finditer(text):
        size = _UNIT_MS[match[2]]
        # Terms must be contiguous and run from the largest unit to the smallest.
        if match.start() != position or size >= previous:
            return None
        total += Decimal(match[1]) * size
        position, previous = match.end(), size
    return total if 0 < position == len(text) else None


def _duration_in_ms(value: object, unit: DurationUnit, key: str) -> Decimal:
    """The exact length of a duration in milliseconds, bare numbers counted in ``unit``."""
    expected = f"a duration such as 250ms, 90s or 1h30m, or a number of {_UNIT_NAMES[unit]}"
    text = value.strip().lower() if isinstance(value, str) else ""
    if isinstance(value, int | float) and not isinstance(value, bool):
        amount: Decimal | None = Decimal(value)
    elif isinstance(value, str):
        amount = _bare_number(text)
    else:
        raise invalid_value(key, value, expected)
    too_long = f"at most {MAX_DURATION_MS} milliseconds"
    try:
        if amount is not None:
            if not amount.is_finite():
                raise invalid_value(key, value, "a finite duration")
            negative, total = amount.is_signed(), amount * _UNIT_MS[unit]
        else:
            # A sign is not part of the grammar; it is looked for only to explain the rejection.
            negative, magnitude = text.startswith("-"), _terms_in_ms(text.removeprefix("-"))
            if magnitude is None:
                raise invalid_value(key, value, expected)
            total = magnitude
    except DecimalException:  # beyond even Decimal's exponent range
        raise invalid_value(key, value, too_long) from None
    if negative and total != 0:  # "-0" and "-0s" are zero, not negative
        raise invalid_value(key, value, "a non-negative duration")
    if total > MAX_DURATION_MS:
        raise invalid_value(key, value, too_long)
    return abs(total)  # a zero of either sign is plain 0


def parse_duration(value: object, unit: DurationUnit = "s", key: str = "duration") -> float:
    """Seconds from a duration (grammar in the module docstring).

    Args:
        value: text such as ``"90s"``, ``"1h30m"``, ``"500ms"``, or a bare number (string, int
            or float) counted in ``unit``.
        unit: the unit of a bare number; seconds unless given.
        key: the name the error message gives the value.

    Returns:
        The duration in seconds.

    Raises:
        ConfigError: the value is negative, not finite, longer than :data:`MAX_DURATION_MS`,
            or not a duration.
    """
    return float(_duration_in_ms(value, unit, key) / 1000)


def parse_duration_ms(value: object, unit: DurationUnit = "ms", key: str = "duration") -> int:
    """Whole milliseconds from a duration (grammar in the module docstring).

    Args:
        value: text such as ``"250ms"``, ``"5s"``, ``"1h30m"``, or a bare number (string, int
            or float) counted in ``unit``.
        unit: the unit of a bare number; milliseconds unless given.
        key: the name the error message gives the value.

    Returns:
        The duration in milliseconds.

    Raises:
        ConfigError: the value is negative, not finite, longer than :data:`MAX_DURATION_MS`,
            not a duration, or not a whole number of milliseconds (``"0.5ms"``, the float
            ``1.5``).
    """
    amount = _duration_in_ms(value, unit, key)
    if amount != amount.to_integral_value():
        raise invalid_value(key, value, "a whole number of milliseconds")
    return int(amount)


def parse_bool(value: object, key: str = "boolean") -> bool:
    """A boolean from a bool, the int 0 or 1, or true/false, 1/0, yes/no, on/off (any case).

    Args:
        value: the value to read; surrounding spaces of a string are ignored.
        key: the name the error message gives the value.

    Raises:
        ConfigError: any other value, including the empty string and floats.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise invalid_value(key, value, "one of true/false, 1/0, yes/no, on/off")
