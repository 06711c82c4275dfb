"""What one policy's replay measured: per-turn tallies, per-step series, store counters.

Hit rates are against what an unbounded store would serve (:func:`reusable_prefix`): a turn's
*reusable* pages are the leading prompt pages computed in an earlier step. The *live* hit rate
covers only the history part of follow-up turns (pages past the shared system prompt, of a
conversation that came back): what sessions are meant to protect. Pages recomputed are
reusable pages that were not loaded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from mooncake_py.connector import SaveResult


@dataclasses.dataclass
class PolicyResult:
    """Totals and series of one policy's replay.

    Attributes:
        name: policy name.
        turns: turns served.
        reusable: reusable prompt pages (all turns).
        hits: reusable pages loaded from the store.
        live_reusable: reusable history pages of follow-up turns.
        live_hits: of those, pages loaded.
        verified_pages: pages loaded and checked byte for byte.
        bytes_written: bytes the store accepted from saves.
        pages_written: pages the store accepted.
        refused_pages: pages refused with NO_AVAILABLE_HANDLE (back-pressure).
        skipped_pages: pages not sent after back-pressure.
        backpressure_turns: turns whose save met back-pressure.
        evicted_ordinary: objects evicted that were not soft pinned (store counter delta).
        evicted_soft_pinned: soft-pinned objects evicted (store counter delta).
        bytes_released: bytes freed by session releases (store counter delta).
        disk_tier: the workers mounted a disk tier during this replay.
        disk_hits: reads the store served from a disk tier (store counter delta).
        spilled_objects: objects written to a disk tier on eviction (store counter delta).
        promoted_objects: objects copied back from disk to memory after a read (delta).
        disk_peak_bytes: most bytes the disk tiers held after any step.
        session_calls: session actions the policy asked for.
        sessions_gone: unpins that found the session already empty (all pages evicted).
        wall_s: wall time of the replay.
        capacity_bytes: store capacity during the replay.
        times: virtual time of each step.
        occupancy: store bytes in use / capacity after each step.
        step_hits, step_reusable, step_live_hits, step_live_reusable: per-step sums.
    """

    name: str
    turns: int = 0
    reusable: int = 0
    hits: int = 0
    live_reusable: int = 0
    live_hits: int = 0
    verified_pages: int = 0
    bytes_written: int = 0
    pages_written: int = 0
    refused_pages: int = 0
    skipped_pages: int = 0
    backpressure_turns: int = 0
    evicted_ordinary: int = 0
    evicted_soft_pinned: int = 0
    bytes_released: int = 0
    disk_tier: bool = False
    disk_hits: int = 0
    spilled_objects: int = 0
    promoted_objects: int = 0
    disk_peak_bytes: int = 0
    session_calls: dict[str, int] = dataclasses.field(default_factory=dict)
    sessions_gone: int = 0
    wall_s: float = 0.0
    capacity_bytes: int = 0
    times: list[float] = dataclasses.field(default_factory=list)
    occupancy: list[float] = dataclasses.field(default_factory=list)
    step_hits: list[int] = dataclasses.field(default_factory=list)
    step_reusable: list[int] = dataclasses.field(default_factory=list)
    step_live_hits: list[int] = dataclasses.field(default_factory=list)
    step_live_reusable: list[int] = dataclasses.field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        """Reusable pages loaded / reusable pages (1.0 when nothing was reusable)."""
        return self.hits / self.reusable if self.reusable else 1.0

    @property
    def live_hit_rate(self) -> float:
        """Live conversations' history pages loaded / reusable (1.0 when none)."""
        return self.live_hits / self.live_reusable if self.live_reusable else 1.0

    @property
    def pages_recomputed(self) -> int:
        """Reusable pages that had to be computed again."""
        return self.reusable - self.hits

    def start_step(self, time: float) -> None:
        """Open the series entry of a new step."""
        self.times.append(time)
        for series in (
            self.step_hits,
            self.step_reusable,
            self.step_live_hits,
            self.step_live_reusable,
        ):
            series.append(0)

    def add_turn(
        self, reusable: int, system_pages: int, follow_up: bool, loaded: int, save: SaveResult
    ) -> None:
        """Count one served turn (into the current step).

        Args:
            reusable: the turn's reusable prompt pages.
            system_pages: pages of the shared system prompt at the head of every prompt.
            follow_up: the conversation came back (not its first turn, not a compaction).
            loaded: leading pages loaded (and verified).
            save: what the save did.
        """
        hits = min(loaded, reusable)
        self.turns += 1
        self.reusable += reusable
        self.hits += hits
        self.step_reusable[-1] += reusable
        self.step_hits[-1] += hits
        if follow_up:
            live_reusable = max(reusable - system_pages, 0)
            live_hits = max(hits - system_pages, 0)
            self.live_reusable += live_reusable
            self.live_hits += live_hits
            self.step_live_reusable[-1] += live_reusable
            self.step_live_hits[-1] += live_hits
        self.verified_pages += loaded
        self.bytes_written += save.bytes_written
        self.pages_written += save.written
        self.refused_pages += save.refused
        self.skipped_pages += save.skipped
        self.backpressure_turns += int(save.backpressure)

    def sample_store(self, stats: Mapping[str, int]) -> None:
        """Record the end of a step: memory occupancy and the disk tiers' bytes."""
        self.occupancy.append(stats["allocated_bytes"] / max(stats["capacity_bytes"], 1))
        self.disk_peak_bytes = max(self.disk_peak_bytes, int(stats.get("disk_used_bytes", 0)))

    def add_store_deltas(self, before: Mapping[str, int], after: Mapping[str, int]) -> None:
        """Take the eviction, release and disk-tier counters from two store stats snapshots."""

        def delta(name: str) -> int:
            return int(after.get(name, 0)) - int(before.get(name, 0))

        self.evicted_soft_pinned = delta("evicted_soft_pinned")
        self.evicted_ordinary = delta("evicted_objects") - self.evicted_soft_pinned
        self.bytes_released = delta("released_bytes")
        self.disk_hits = delta("disk_hits")
        self.spilled_objects = delta("spilled_objects")
        self.promoted_objects = delta("promoted_objects")


def rolling_rate(hits: list[int], totals: list[int], window: int) -> list[float | None]:
    """Per step: hits / totals over the last ``window`` steps (None while nothing counted)."""
    rates: list[float | None] = []
    sum_hits = sum_totals = 0
    for i, (hit, total) in enumerate(zip(hits, totals, strict=True)):
        sum_hits += hit
        sum_totals += total
        if i >= window:
            sum_hits -= hits[i - window]
            sum_totals -= totals[i - window]
        rates.append(sum_hits / sum_totals if sum_totals else None)
    return rates
