"""Work whose cost grows with the store, run in bounded slices that let other callers in.

A *sliced* operation is a generator function: it does one slice of work with the service lock
held, lets go of the lock and yields ``None``; whoever drives it decides what runs before the
next slice, and the generator's return value is the call's result. It never yields with the
lock held. Two drivers exist:

- :func:`drive` runs every slice back to back (synchronous callers: tools, tests, the plain
  methods of the services);
- the master's transports run each slice as one step of the event loop
  (:func:`mooncake_py.master.transport.pipeline.drive_on_loop`), so calls from other
  connections run between two slices and none waits longer than about one slice.

A slice ends when it has run for :data:`SLICE_SECONDS` (:class:`SliceTimer`), whatever the
size of its items: the pause a sliced call imposes on everyone else does not depend on the
store's size or on how costly each item is. Because other calls run in between, a sliced call
is not one transaction; each documents which consistent result it returns.

Thread-safety: a generator must be driven by one thread at a time (Python's rule); the slices
themselves take the service lock as any call does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from contextlib import AbstractContextManager
from typing import TypeVar

T = TypeVar("T")

Steps = Generator[None, None, T]
"""A sliced operation in progress: yields between slices, returns the result."""

SLICE_SECONDS = 0.001
"""How long one slice may run before it lets other callers in. Small against the 20 ms p99
a concurrent caller may see, large against the cost of one step of the event loop."""


def drive(steps: Steps[T]) -> T:
    """Run every slice of ``steps`` back to back and return its result.

    Between two slices the calling thread gives up the GIL for a moment, so that a thread
    waiting for the service lock takes it before this one takes it again (the lock is not fair).

    Raises:
        Whatever the operation raises.
    """
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: T = done.value
            return result
        time.sleep(0)


class SliceTimer:
    """Says when the current slice has used its time.

    Args:
        seconds: the slice's length.

    Complexity: O(1) per call (one monotonic clock read).
    Thread-safety: one owner.
    """

    __slots__ = ("_seconds", "_deadline")

    def __init__(self, seconds: float = SLICE_SECONDS) -> None:
        self._seconds = seconds
        self._deadline = time.perf_counter() + seconds

    def spent(self) -> bool:
        """True when the slice has run for its time; the caller then ends it and yields."""
        return time.perf_counter() >= self._deadline

    def restart(self) -> None:
        """Start timing the next slice (call after yielding)."""
        self._deadline = time.perf_counter() + self._seconds


R = TypeVar("R")
K = TypeVar("K")

CHECK_EVERY = 64
"""Items handled between two reads of the clock in :func:`map_in_slices`: a read costs about
as much as a cheap item, and 64 items of the costliest kind stay well inside a slice."""


def map_in_slices(
    lock: AbstractContextManager[object],
    items: Sequence[K],
    start_slice: Callable[[], float],
    step: Callable[[int, K, float], R],
    end_slice: Callable[[float], None] | None = None,
    seconds: float = SLICE_SECONDS,
) -> Steps[list[R]]:
    """``[step(index, item, now) for each item]``, in slices.

    Each slice holds ``lock`` once: it starts with ``now = start_slice()`` (read the clock,
    end what expired), runs ``step`` for items until the slice's time is spent (checked every
    :data:`CHECK_EVERY` items), and ends with ``end_slice(now)`` (batched bookkeeping) before
    the lock is let go. A batch that fits in one slice never yields.

    Complexity: O(items) steps plus one clock read per :data:`CHECK_EVERY` items.
    """
    results: list[R] = []
    append = results.append
    position, total = 0, len(items)
    timer = SliceTimer(seconds)
    while True:
        with lock:
            now = start_slice()
            while position < total:
                append(step(position, items[position], now))
                position += 1
                if not position % CHECK_EVERY and timer.spent():
                    break
            if end_slice is not None:
                end_slice(now)
        if position >= total:
            return results
        yield
        timer.restart()


def map_runs_in_slices(
    lock: AbstractContextManager[object],
    total: int,
    start_slice: Callable[[], float],
    run_step: Callable[[int, int, float], list[R]],
    run_length: int = CHECK_EVERY,
    seconds: float = SLICE_SECONDS,
) -> Steps[list[R]]:
    """``run_step(first, stop, now)`` (the results of items ``first`` to ``stop - 1``) over
    consecutive runs of at most ``run_length`` of ``total`` items, concatenated, in slices:
    :func:`map_in_slices` for a step that handles a run of items at once.

    Each slice holds ``lock`` once, starts with ``now = start_slice()`` and runs whole runs
    until its time is spent (checked after each run). A batch that fits in one slice never
    yields.

    Complexity: O(total / run_length) steps plus one clock read per run.
    """
    results: list[R] = []
    position = 0
    timer = SliceTimer(seconds)
    while True:
        with lock:
            now = start_slice()
            while position < total:
                stop = min(position + run_length, total)
                results += run_step(position, stop, now)
                position = stop
                if timer.spent():
                    break
        if position >= total:
            return results
        yield
        timer.restart()
