"""Injected time for the master: the real monotonic clock, and a manual one for tests."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Anything that returns the current time in seconds (monotonic, arbitrary origin)."""

    def __call__(self) -> float: ...


def monotonic_clock() -> float:
    """The production clock: ``time.monotonic()``."""
    return time.monotonic()


class FakeClock:
    """A clock that moves only when told to; thread-safe.

    Args:
        start: initial reading in seconds.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds`` (must be >= 0); returns the new reading."""
        if seconds < 0:
            raise ValueError("a clock never goes back")
        with self._lock:
            self._now += seconds
            return self._now
