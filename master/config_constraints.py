"""The typed constraints a master setting's value must meet (:mod:`.config` declares which).

Each :class:`Constraint` says whether a value is admitted, what it expects (for the error
message ``invalid KEY=VALUE: must be ...``) and how to spell an admitted value canonically.

Thread-safety: constraints are immutable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


class Constraint(ABC):
    """A rule a field's (type-checked) value must follow, declared next to the field."""

    @abstractmethod
    def admits(self, value: Any) -> bool:
        """Whether ``value`` follows the rule."""

    @property
    @abstractmethod
    def expected(self) -> str:
        """What a rejected value must be instead, as the error message puts it."""

    def canonical(self, value: Any) -> Any:
        """The stored form of an admitted value; the value itself unless overridden."""
        return value


@dataclass(frozen=True)
class InRange(Constraint):
    """``low <= value <= high``, or ``low < value <= high`` when ``low_open``."""

    low: int | float
    high: int | float
    low_open: bool = False

    def admits(self, value: Any) -> bool:
        above_low = self.low < value if self.low_open else self.low <= value
        return bool(above_low and value <= self.high)

    @property
    def expected(self) -> str:
        return f"in {self}"

    def __str__(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low}, {self.high}]"


@dataclass(frozen=True)
class AtLeast(Constraint):
    """``value >= bound``."""

    bound: int | float

    def admits(self, value: Any) -> bool:
        return bool(value >= self.bound)

    @property
    def expected(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return f">= {self.bound}"


@dataclass(frozen=True)
class Positive(Constraint):
    """``value > 0``."""

    def admits(self, value: Any) -> bool:
        return bool(value > 0)

    @property
    def expected(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return "> 0"


@dataclass(frozen=True, init=False)
class OneOf(Constraint):
    """One of ``choices`` in any case; the value is stored as the choice is spelled."""

    choices: tuple[str, ...]

    def __init__(self, *choices: str) -> None:
        object.__setattr__(self, "choices", choices)

    def admits(self, value: Any) -> bool:
        return self._match(value) is not None

    def canonical(self, value: Any) -> Any:
        return self._match(value)

    @property
    def expected(self) -> str:
        return "one of " + ", ".join(self.choices)

    def _match(self, value: Any) -> str | None:
        lowered = value.lower() if isinstance(value, str) else None
        return next((c for c in self.choices if c.lower() == lowered), None)


@dataclass(frozen=True)
class OnlyTrue(Constraint):
    """``True`` only: a flag of upstream's whose other setting names a mode this master does
    not have (``why`` says what it does instead)."""

    why: str

    def admits(self, value: Any) -> bool:
        return value is True

    @property
    def expected(self) -> str:
        return f"true ({self.why})"
