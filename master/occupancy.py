"""Store occupancy over time: a bounded ring of samples the dashboard draws.

:class:`OccupancyHistory` keeps the last ``capacity`` samples of the store-wide figures
(allocated and capacity bytes, objects); a background timer calls :meth:`OccupancyHistory.sample`
every ``--occupancy_sample_sec``. ``GET /v1/memory/stats?history=true`` returns them to admin
callers (:mod:`.http_memory`). Samples are store-wide, so a tenant's token never sees them.

Thread-safety: :meth:`~OccupancyHistory.record` runs on the event loop, :meth:`~OccupancyHistory.
samples` on HTTP threads; a lock makes each see whole samples.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping

DEFAULT_SAMPLES = 720
"""Samples kept: an hour at the default 5 s interval."""


@dataclasses.dataclass(frozen=True, slots=True)
class OccupancySample:
    """The store-wide figures at one moment.

    Attributes:
        t: Unix time of the sample (seconds).
        allocated_bytes: bytes allocated to replicas.
        capacity_bytes: bytes of every mounted segment.
        objects: objects stored.
    """

    t: float
    allocated_bytes: int
    capacity_bytes: int
    objects: int


class OccupancyHistory:
    """The last ``capacity`` occupancy samples, oldest first.

    Args:
        stats: reads the store-wide figures (``MasterService.stats``: ``allocated_bytes``,
            ``capacity_bytes``, ``objects``).
        capacity: samples kept (at least 1).
        wall_clock: Unix time for each sample (the service's own clock is monotonic).

    Raises:
        ValueError: ``capacity`` < 1.
    """

    def __init__(
        self,
        stats: Callable[[], Mapping[str, int]],
        capacity: int = DEFAULT_SAMPLES,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self._stats = stats
        self._wall_clock = wall_clock
        self._samples: collections.deque[OccupancySample] = collections.deque(maxlen=capacity)
        self._lock = threading.Lock()

    def sample(self, now: float = 0.0) -> OccupancySample:
        """Read the figures and keep them as the newest sample (the oldest goes when full).

        Args:
            now: the service clock's time (unused: samples carry wall time; the argument lets
                a background timer call this like its other steps).

        Returns:
            The sample recorded. O(what ``stats`` costs).
        """
        figures = self._stats()
        taken = OccupancySample(
            self._wall_clock(),
            int(figures.get("allocated_bytes", 0)),
            int(figures.get("capacity_bytes", 0)),
            int(figures.get("objects", 0)),
        )
        with self._lock:
            self._samples.append(taken)
        return taken

    def samples(self) -> list[OccupancySample]:
        """Every kept sample, oldest first. O(capacity)."""
        with self._lock:
            return list(self._samples)

    def check(self) -> None:
        """Assert the ring's invariants: bounded, no negative figure, no more allocated than
        mounted. (Times may go back: they are wall time.)"""
        with self._lock:
            kept = list(self._samples)
            assert self._samples.maxlen is not None and len(kept) <= self._samples.maxlen
        for sample in kept:
            assert 0 <= sample.allocated_bytes <= sample.capacity_bytes, sample
            assert sample.objects >= 0, sample
