"""Background timers. Each one only calls a synchronous step of the service with ``now``.

The steps hold all the logic (and are what the tests exercise with a fake clock); a timer here
adds nothing but the cadence and error logging.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Sequence

from .clock import monotonic_clock
from .service.facade import MasterService

log = logging.getLogger(__name__)

# Client TTL checks run every second, as upstream's client monitor does.
REAP_INTERVAL_S = 1.0
# Stuck writes are swept every second; each sweep stops at the first write still in time.
SWEEP_INTERVAL_S = 1.0
# Memory use is checked this often, as upstream's eviction thread does.
EVICTION_INTERVAL_S = 0.01
# Long-lived objects are moved out of the cyclic collector's sight this often. A freeze is
# O(1) (the generations are spliced onto the permanent one), and every full collection scans
# what was allocated since the last freeze: at tens of thousands of writes a second, a second's
# worth of records rather than ten.
GC_FREEZE_INTERVAL_S = 1.0
# Withdrawn segments' objects are dropped in slices; pending drains are looked at this often.
DRAIN_INTERVAL_S = 0.05
# Steps of the event loop between two slices of background work (as for sliced calls).
LOOP_STEPS_BETWEEN_SLICES = 4


def freeze_survivors(now: float) -> None:
    """Move every object alive now to the collector's permanent generation.

    With a million objects of metadata, a full cyclic collection pauses the whole master for
    over a second, and CPython runs one every so often as allocations accumulate. Metadata
    records form no reference cycles (reference counting frees them), so the collector only
    needs to look at recent objects: after a freeze, full collections scan what was allocated
    since. The cost is that cyclic garbage older than the interval is never collected.
    """
    gc.freeze()


async def run_every(
    interval_s: float, step: Callable[[float], object], clock: Callable[[], float]
) -> None:
    """Call ``step(clock())`` every ``interval_s`` seconds until cancelled; log step failures."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            step(clock())
        except Exception:
            log.exception("background step %s failed", getattr(step, "__name__", step))


async def drain_forever(service: MasterService) -> None:
    """Drop the objects of segments whose clients expired, one bounded slice at a time."""
    while True:
        await asyncio.sleep(DRAIN_INTERVAL_S)
        try:
            while service.continue_drains():
                for _ in range(LOOP_STEPS_BETWEEN_SLICES):
                    await asyncio.sleep(0)
        except Exception:
            log.exception("segment drain failed")


async def evict_forever(service: MasterService, clock: Callable[[], float]) -> None:
    """Check memory use every ``EVICTION_INTERVAL_S``; run due passes slice by slice.

    Between slices the event loop serves other requests, so one pass never holds the service
    lock for longer than one slice.
    """
    while True:
        await asyncio.sleep(EVICTION_INTERVAL_S)
        try:
            work = service.start_eviction()
            while work is not None and not service.continue_eviction(work, clock()):
                await asyncio.sleep(0)
        except Exception:
            log.exception("eviction pass failed")


class BackgroundLoops:
    """The master's timers, started and stopped together.

    Args:
        service: the service whose steps to run.
        clock: the same clock the service uses.
        extra_steps: further ``(interval seconds, step(now))`` timers (the occupancy sampler).
    """

    def __init__(
        self,
        service: MasterService,
        clock: Callable[[], float] = monotonic_clock,
        extra_steps: Sequence[tuple[float, Callable[[float], object]]] = (),
    ) -> None:
        self._service = service
        self._clock = clock
        self._extra_steps = list(extra_steps)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start every timer on the running event loop."""
        steps = [
            (REAP_INTERVAL_S, self._reap),
            (SWEEP_INTERVAL_S, self._service.sweep_expired_puts),
            (GC_FREEZE_INTERVAL_S, freeze_survivors),
            *self._extra_steps,
        ]
        self._tasks = [asyncio.create_task(run_every(i, s, self._clock)) for i, s in steps]
        self._tasks.append(asyncio.create_task(evict_forever(self._service, self._clock)))
        self._tasks.append(asyncio.create_task(drain_forever(self._service)))

    def _reap(self, now: float) -> None:
        # Expired clients' objects go in slices (drain_forever), not in this step.
        self._service.reap_expired_clients(now, drain=False)

    async def stop(self) -> None:
        """Cancel every timer and wait for them to finish."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
