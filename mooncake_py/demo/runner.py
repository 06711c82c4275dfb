"""The demo's coordinator: a master, two engine workers, and the trace replayed per policy.

:func:`run` starts an embedded master (or uses ``DemoConfig.master``), spawns one worker
process per data-parallel rank (each hosting half the store's capacity), then replays the same
trace twice, plain LRU first, then with sessions. Virtual time advances in steps of
``step_s``: at each step the policy's due session jobs and the step's turns go to the workers,
which serve their lists concurrently; the coordinator waits for both, samples the master's
stats (occupancy) and moves on. Between policies every key of the run is removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from mooncake_py.client.api import Client
from mooncake_py.demo.metrics import PolicyResult
from mooncake_py.demo.policy import PLAIN_DISK, PlainPolicy, Policy, SessionPolicy
from mooncake_py.demo.pool import DemoError, WorkerPool
from mooncake_py.demo.trace import Trace, TraceConfig, generate, in_progress_pages, reusable_prefix
from mooncake_py.demo.worker import (
    CleanupJob,
    Job,
    SessionOutcome,
    TurnOutcome,
    WorkerSpec,
)
from mooncake_py.errors import MooncakeError

if TYPE_CHECKING:
    from mooncake_py.testing import InProcessMaster

KIB = 1024
MIB = 1024 * KIB


class MasterUnreachableError(DemoError):
    """The master to run against does not answer."""


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """Everything a demo run needs.

    Attributes:
        trace: the workload.
        page_kib: bytes per page, in KiB.
        capacity_ratio: store capacity relative to the live conversations' contexts at the
            busiest moment of the trace (see :func:`in_progress_pages`); 1.0 means the store
            can just hold every live conversation then, and only a small share of the
            trace's working set. Ignored when ``capacity_mib`` is set.
        capacity_mib: store capacity in MiB (split between the workers' segments).
        pin_idle_s: the sessions policy unpins a conversation idle this long (virtual s).
        abandon_after_s: it releases a conversation silent this long (virtual s).
        step_s: virtual seconds per step.
        lease_ms: read-lease TTL of the embedded master in ms; None runs upstream's default
            (10 s). Readers end their leases when their copies are done, so the TTL only
            bounds readers that die; it no longer decides what eviction may take.
        disk_tier: also replay plain LRU with a disk tier under each worker's memory.
        disk_quota_mib: each tier's size in MiB (None: the client's default, a share of the
            filesystem's free space).
        disk_fsync: the tiers sync each file before it may be served. Off by default: the
            tiers live in a temporary directory removed at the end of the run, so durability
            buys nothing here, and syncing every spill slows the replay down.
        master: ``host:port`` of an existing master to use instead of an embedded one (its
            ``enable_offload`` must be on for the disk-tier replay, or that replay is skipped).
        out_dir: where the report, plot and JSON summary go.
        model: model name in the keys.
        progress: draw a progress line on stderr.
    """

    trace: TraceConfig = TraceConfig()
    page_kib: int = 32
    capacity_ratio: float = 1.0
    capacity_mib: float | None = None
    pin_idle_s: float = 90.0
    abandon_after_s: float = 160.0
    step_s: float = 1.0
    lease_ms: int | None = None
    disk_tier: bool = True
    disk_quota_mib: float | None = None
    disk_fsync: bool = False
    master: str | None = None
    out_dir: Path = Path("demo-output")
    model: str = "demo-org/chat-model-8b"
    progress: bool = True

    def __post_init__(self) -> None:
        if (
            self.page_kib < 1
            or self.step_s <= 0
            or (self.lease_ms is not None and self.lease_ms < 1)
        ):
            raise ValueError("page_kib, step_s and lease_ms must be positive")
        if self.capacity_ratio <= 0:
            raise ValueError("capacity_ratio must be positive")
        if self.capacity_mib is not None and self.capacity_mib <= 0:
            raise ValueError("capacity_mib must be positive")
        if self.disk_quota_mib is not None and self.disk_quota_mib <= 0:
            raise ValueError("disk_quota_mib must be positive")
        if not 0 < self.pin_idle_s <= self.abandon_after_s:
            raise ValueError("need 0 < pin_idle_s <= abandon_after_s")
        if self.trace.think_min_s <= self.step_s:
            raise ValueError("think_min_s must exceed step_s")

    @property
    def page_bytes(self) -> int:
        """Bytes per page."""
        return self.page_kib * KIB

    def capacity_bytes(self, trace: Trace) -> int:
        """Store capacity the workers contribute (a multiple of the worker count)."""
        wanted = (
            self.capacity_mib * MIB
            if self.capacity_mib is not None
            else self.capacity_ratio * max(in_progress_pages(trace, self.step_s)) * self.page_bytes
        )
        per_worker = max(int(wanted) // self.trace.workers // 64 * 64, 64 * KIB)
        return per_worker * self.trace.workers


@dataclasses.dataclass
class DemoResult:
    """A finished demo: the workload's size and each policy's result.

    Attributes:
        config: what was run.
        trace: the replayed trace.
        capacity_bytes: capacity the workers contributed.
        live_peak_bytes: bytes of live conversations' contexts at the busiest step (see
            :func:`in_progress_pages`).
        policies: results, plain first (then sessions, then plain+disk when it ran).
        master: address of the master used.
        embedded: whether the demo started that master.
        master_settings: the embedded master's settings that shape the outcome (lease TTL,
            eviction watermarks and ratio, soft-pin rules); empty for an existing master.
        disk_tier_skipped: why the disk-tier replay did not run ("" when it ran or was not
            asked for).
        files: paths written (report, plot, summary).
        wall_s: wall time of the whole run.
    """

    config: DemoConfig
    trace: Trace
    capacity_bytes: int
    live_peak_bytes: int
    policies: list[PolicyResult]
    master: str
    embedded: bool
    master_settings: dict[str, object] = dataclasses.field(default_factory=dict)
    disk_tier_skipped: str = ""
    files: dict[str, Path] = dataclasses.field(default_factory=dict)
    wall_s: float = 0.0

    def policy(self, name: str) -> PolicyResult:
        """The result of the policy called ``name``."""
        return next(p for p in self.policies if p.name == name)


class Progress:
    """One ``\\r``-redrawn status line on stderr, at most ten times a second."""

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self._label, self._total, self._enabled = label, max(total, 1), enabled
        self._last = 0.0

    def update(self, done: int, result: PolicyResult, force: bool = False) -> None:
        """Redraw for ``done`` steps of ``total``."""
        now = time.monotonic()
        if not self._enabled or (not force and now - self._last < 0.1):
            return
        self._last = now
        share = min(done / self._total, 1.0)
        bar = "#" * int(share * 30)
        sys.stderr.write(
            f"\r  {self._label:<9}[{bar:<30}] {share:4.0%}  turns {result.turns:>5}  "
            f"hit {result.hit_rate:4.0%}  live hit {result.live_hit_rate:4.0%} "
        )
        sys.stderr.flush()

    def finish(self, result: PolicyResult) -> None:
        """Draw the final state and end the line."""
        if self._enabled:
            self.update(self._total, result, force=True)
            sys.stderr.write("\n")
            sys.stderr.flush()


def _stats(master: Client) -> dict[str, int]:
    return {name: int(value) for name, value in master.stats().items()}


def _wait_drained(master: Client, baseline: Mapping[str, int], timeout_s: float) -> None:
    """Wait until the store holds no more than before the run (leases delay frees)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _stats(master)["allocated_bytes"] <= baseline.get("allocated_bytes", 0):
            return
        time.sleep(0.1)


def replay(
    pool: WorkerPool,
    master: Client,
    trace: Trace,
    policy: Policy,
    config: DemoConfig,
    capacity_bytes: int,
) -> PolicyResult:
    """Replay ``trace`` under ``policy``; returns what it measured.

    Raises:
        DemoError: a worker failed or read a wrong page.
    """
    reusable = reusable_prefix(trace, config.step_s)
    system_pages = len(trace.system)
    workers = trace.config.workers
    steps = int((trace.end_time + config.abandon_after_s) // config.step_s) + 2
    result = PolicyResult(name=policy.name, capacity_bytes=capacity_bytes)
    progress = Progress(policy.name, steps, config.progress)
    before = _stats(master)
    started = time.monotonic()
    next_turn = 0
    for step in range(steps):
        now = step * config.step_s
        result.start_step(now)
        jobs: list[list[Job]] = [[] for _ in range(workers)]
        served: list[list[int | None]] = [[] for _ in range(workers)]
        for worker, job in policy.due(now):
            jobs[worker].append(job)
            served[worker].append(None)
        while next_turn < len(trace.turns) and trace.turns[next_turn].time < now + config.step_s:
            turn = trace.turns[next_turn]
            jobs[turn.worker].append(policy.job_for(turn))
            served[turn.worker].append(next_turn)
            next_turn += 1
        for rank, outcomes in enumerate(pool.dispatch(jobs)):
            for index, outcome in zip(served[rank], outcomes, strict=True):
                if index is None:
                    assert isinstance(outcome, SessionOutcome)
                    result.sessions_gone += int(not outcome.applied)
                    continue
                assert isinstance(outcome, TurnOutcome)
                turn = trace.turns[index]
                follow_up = turn.index > 0 and not turn.compact
                result.add_turn(
                    reusable[index], system_pages, follow_up, outcome.loaded, outcome.save
                )
        result.sample_store(_stats(master))
        progress.update(step + 1, result)
    result.wall_s = time.monotonic() - started
    result.add_store_deltas(before, _stats(master))
    result.session_calls = policy.counts()
    result.disk_tier = pool.disk_tier
    progress.finish(result)
    return result


def _start_master(config: DemoConfig) -> tuple[InProcessMaster | None, str]:
    if config.master is not None:
        return None, config.master
    # Imported here: the ops CLI loads this module for its `demo` command and must not load
    # the master (and its server dependencies) for every other command.
    from mooncake_py.testing import InProcessMaster

    if config.lease_ms is None:
        master = InProcessMaster().start()
    else:
        master = InProcessMaster(default_kv_lease_ttl=config.lease_ms).start()
    return master, master.address


SHOWN_MASTER_SETTINGS = (
    "default_kv_lease_ttl",
    "eviction_high_watermark_ratio",
    "eviction_ratio",
    "default_kv_soft_pin_ttl",
    "allow_evict_soft_pinned_objects",
    "enable_offload",
    "promotion_on_hit",
)
"""The master settings the report states (those that change what the policies achieve)."""


def _specs(
    config: DemoConfig, trace: Trace, capacity: int, address: str, run_id: str, disk_root: str
) -> list[WorkerSpec]:
    """One spec per rank; with ``disk_root`` each mounts a disk tier under its own subdirectory."""
    quota = int(config.disk_quota_mib * MIB) if config.disk_quota_mib is not None else 0
    return [
        WorkerSpec(
            rank=rank,
            master=address,
            segment_bytes=capacity // config.trace.workers,
            page_bytes=config.page_bytes,
            max_pages=trace.max_pages,
            model=config.model,
            key_prefix=run_id,
            disk_dir=os.path.join(disk_root, f"rank-{rank}") if disk_root else None,
            disk_quota_bytes=quota,
            disk_fsync=config.disk_fsync,
        )
        for rank in range(config.trace.workers)
    ]


def _replay_and_clean(
    pool: WorkerPool,
    stats_client: Client,
    baseline: Mapping[str, int],
    trace: Trace,
    policy: Policy,
    config: DemoConfig,
    capacity: int,
    run_id: str,
) -> PolicyResult:
    result = replay(pool, stats_client, trace, policy, config, capacity)
    pool.dispatch([[CleanupJob(run_id)]])
    # Removed keys free their memory once their read leases end (the embedded master's are
    # short; a deployment's may last seconds).
    _wait_drained(stats_client, baseline, timeout_s=15.0)
    return result


def _replay_policies(
    config: DemoConfig, trace: Trace, capacity: int, address: str, run_id: str
) -> tuple[list[PolicyResult], str]:
    """Start the workers on ``address`` and replay ``trace`` under each policy.

    Returns:
        The results, and why the disk-tier replay was skipped ("" when it ran or was not
        asked for).
    """
    with contextlib.ExitStack() as cleanup:
        try:
            # Contributes no memory; the token, if any, comes from MOONCAKE_AUTH_TOKEN.
            stats_client = Client.connect(master_server_addr=address, global_segment_size=0)
            cleanup.callback(stats_client.close)
            baseline = _stats(stats_client)
        except MooncakeError as exc:
            raise MasterUnreachableError(f"cannot reach the master at {address}: {exc}") from exc
        pool = WorkerPool(_specs(config, trace, capacity, address, run_id, ""))
        cleanup.callback(pool.stop)
        results = [
            _replay_and_clean(pool, stats_client, baseline, trace, policy, config, capacity, run_id)
            for policy in (
                PlainPolicy(),
                SessionPolicy(run_id, config.pin_idle_s, config.abandon_after_s),
            )
        ]
        pool.stop()
        if not config.disk_tier:
            return results, ""
        disk_root = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="demo-disk-tier-"))
        try:
            disk_pool = WorkerPool(_specs(config, trace, capacity, address, run_id, disk_root))
        except DemoError as exc:
            if config.master is None:
                raise  # the embedded master accepts disk tiers: this is a real failure
            # An existing deployment may refuse disk tiers (enable_offload off).
            return results, f"the workers could not mount a disk tier: {_last_line(exc)}"
        cleanup.callback(disk_pool.stop)
        # A master with enable_offload off refuses the mounts and the workers go on without a
        # tier: replaying then would only repeat plain LRU under another name.
        mounted = _stats(stats_client).get("disk_segments", 0) - baseline.get("disk_segments", 0)
        if mounted < config.trace.workers:
            disk_pool.stop()
            reason = f"the master mounted {max(mounted, 0)} of {config.trace.workers} disk tiers"
            if config.master is None:
                raise DemoError(reason)
            return results, f"{reason} (is its enable_offload off?)"
        results.append(
            _replay_and_clean(
                disk_pool,
                stats_client,
                baseline,
                trace,
                PlainPolicy(PLAIN_DISK),
                config,
                capacity,
                run_id,
            )
        )
        return results, ""


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


def run(config: DemoConfig) -> DemoResult:
    """Run the demo: every policy on one trace; writes the report, plot and summary.

    Workers are spawned processes: a script calling this must do so under
    ``if __name__ == "__main__":``.

    Returns:
        The result, with ``files`` naming what was written in ``config.out_dir``.

    Raises:
        DemoError: the master or a worker failed, or a page read back held wrong bytes.
    """
    from mooncake_py.demo.report import write_outputs  # matplotlib is loaded only here

    started = time.monotonic()
    trace = generate(config.trace)
    capacity = config.capacity_bytes(trace)
    run_id = f"demo-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    embedded, address = _start_master(config)
    settings = (
        {}
        if embedded is None
        else {name: getattr(embedded.config, name) for name in SHOWN_MASTER_SETTINGS}
    )
    try:
        results, disk_tier_skipped = _replay_policies(config, trace, capacity, address, run_id)
    finally:
        if embedded is not None:
            embedded.stop()
    result = DemoResult(
        config=config,
        trace=trace,
        capacity_bytes=capacity,
        live_peak_bytes=max(in_progress_pages(trace, config.step_s)) * config.page_bytes,
        policies=results,
        master=address,
        embedded=embedded is not None,
        master_settings=settings,
        disk_tier_skipped=disk_tier_skipped,
    )
    result.wall_s = time.monotonic() - started
    result.files = write_outputs(result)
    return result


__all__ = ["DemoConfig", "DemoError", "DemoResult", "MasterUnreachableError", "run"]
