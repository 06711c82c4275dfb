"""The demo's outputs: the summary table, a markdown report, a JSON summary and a PNG plot.

The plot uses matplotlib's non-interactive Agg backend, so it works without a display.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from mooncake_py.demo.metrics import PolicyResult, rolling_rate
from mooncake_py.demo.policy import PLAIN, PLAIN_DISK
from mooncake_py.demo.runner import DemoResult

PLOT_NAME = "occupancy-hit-rate.png"
REPORT_NAME = "report.md"
SUMMARY_NAME = "summary.json"
ROLLING_WINDOW_S = 60.0

COLUMNS = (
    "policy",
    "hit rate",
    "live hit rate",
    "pages recomputed",
    "bytes written",
    "evicted (ordinary)",
    "evicted (soft-pinned)",
    "bytes released",
    "back-pressured pages",
)


DISK_COLUMNS = (
    "policy",
    "disk tier",
    "hit rate",
    "live hit rate",
    "pages recomputed",
    "evicted (lost)",
    "spilled to disk",
    "disk hits",
    "promotions",
    "disk peak",
)
"""The side-by-side table of plain LRU without and with the disk tier."""


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB"


def disk_tier_pair(result: DemoResult) -> list[PolicyResult]:
    """Plain LRU without and with the disk tier, when both ran (else empty)."""
    by_name = {p.name: p for p in result.policies}
    if PLAIN in by_name and PLAIN_DISK in by_name:
        return [by_name[PLAIN], by_name[PLAIN_DISK]]
    return []


def disk_table_rows(result: DemoResult) -> list[list[str]]:
    """One row of strings per policy of :func:`disk_tier_pair`, in :data:`DISK_COLUMNS` order."""
    return [
        [
            p.name,
            "yes" if p.disk_tier else "no",
            f"{p.hit_rate:.1%}",
            f"{p.live_hit_rate:.1%}",
            f"{p.pages_recomputed:,}",
            f"{p.evicted_ordinary + p.evicted_soft_pinned:,}",
            f"{p.spilled_objects:,}",
            f"{p.disk_hits:,}",
            f"{p.promoted_objects:,}",
            _mib(p.disk_peak_bytes),
        ]
        for p in disk_tier_pair(result)
    ]


def table_rows(result: DemoResult) -> list[list[str]]:
    """One row of strings per policy, in :data:`COLUMNS` order."""
    return [
        [
            p.name,
            f"{p.hit_rate:.1%}",
            f"{p.live_hit_rate:.1%}",
            f"{p.pages_recomputed:,}",
            _mib(p.bytes_written),
            f"{p.evicted_ordinary:,}",
            f"{p.evicted_soft_pinned:,}",
            _mib(p.bytes_released),
            f"{p.refused_pages + p.skipped_pages:,}",
        ]
        for p in result.policies
    ]


def format_table(result: DemoResult) -> str:
    """The summary table as aligned plain text (first column left, numbers right)."""
    return _aligned(COLUMNS, table_rows(result))


def format_disk_table(result: DemoResult) -> str:
    """The disk-tier table as aligned plain text; "" when the disk-tier replay did not run."""
    rows = disk_table_rows(result)
    return _aligned(DISK_COLUMNS, rows) if rows else ""


def _aligned(columns: tuple[str, ...], body: list[list[str]]) -> str:
    rows = [list(columns), *body]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]

    def line(row: list[str]) -> str:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(rows[0]), rule, *(line(row) for row in rows[1:])])


def markdown_table(result: DemoResult) -> str:
    """The summary table in markdown."""
    return _markdown(COLUMNS, table_rows(result))


def _markdown(columns: tuple[str, ...], rows: list[list[str]]) -> str:
    head = "| " + " | ".join(columns) + " |"
    align = "|" + "|".join([":---"] + ["---:"] * (len(columns) - 1)) + "|"
    body = ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join([head, align, *body])


def plot(result: DemoResult, path: Path) -> None:
    """Store occupancy and rolling live hit rate over virtual time, both policies."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    window = max(int(ROLLING_WINDOW_S / result.config.step_s), 1)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    for number, policy in enumerate(result.policies):
        color = f"C{number}"
        top.plot(policy.times, [100 * o for o in policy.occupancy], color=color, label=policy.name)
        for hits, totals, style, what in (
            (policy.step_live_hits, policy.step_live_reusable, "-", "live conversations"),
            (policy.step_hits, policy.step_reusable, ":", "all turns"),
        ):
            rates = rolling_rate(hits, totals, window)
            bottom.plot(
                policy.times,
                [float("nan") if r is None else 100 * r for r in rates],
                color=color,
                linestyle=style,
                label=f"{policy.name}, {what}",
            )
    top.axhline(90, color="grey", linestyle="--", linewidth=1, label="eviction watermark")
    top.set_ylabel("memory occupancy (% of capacity)")
    top.set_ylim(0, 105)
    top.legend(loc="lower right")
    bottom.set_ylabel(f"prefix hit rate, last {ROLLING_WINDOW_S:.0f} s (%)")
    bottom.set_xlabel("virtual time (s)")
    bottom.set_ylim(0, 105)
    bottom.legend(loc="lower right")
    names = " vs. ".join(p.name for p in result.policies)
    fig.suptitle(f"KV store memory occupancy and hit rate: {names}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _summary(result: DemoResult) -> dict[str, Any]:
    def totals(p: PolicyResult) -> dict[str, Any]:
        skip = {"times", "occupancy", "step_hits", "step_reusable"}
        skip |= {"step_live_hits", "step_live_reusable"}
        fields = {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if f.name not in skip}
        return {
            **fields,
            "hit_rate": p.hit_rate,
            "live_hit_rate": p.live_hit_rate,
            "pages_recomputed": p.pages_recomputed,
        }

    trace = result.trace
    return {
        "master": result.master,
        "embedded_master": result.embedded,
        "wall_s": result.wall_s,
        "trace": dataclasses.asdict(trace.config),
        "turns": len(trace.turns),
        "abandoned": len(trace.abandoned),
        "compacted": sum(1 for t in trace.turns if t.compact),
        "working_set_bytes": trace.unique_pages * result.config.page_bytes,
        "capacity_bytes": result.capacity_bytes,
        "live_peak_bytes": result.live_peak_bytes,
        "page_bytes": result.config.page_bytes,
        "pin_idle_s": result.config.pin_idle_s,
        "master_settings": result.master_settings,
        "abandon_after_s": result.config.abandon_after_s,
        "policies": [totals(p) for p in result.policies],
        "disk_tier": _disk_summary(result),
    }


def _disk_summary(result: DemoResult) -> dict[str, Any]:
    """Plain LRU without and with the disk tier, side by side (or why that replay is missing)."""
    pair = disk_tier_pair(result)
    if not pair:
        reason = result.disk_tier_skipped or "not run (disk_tier off)"
        return {"ran": False, "skipped": reason}
    without, with_tier = pair
    return {
        "ran": True,
        "fsync": result.config.disk_fsync,
        "quota_mib_per_worker": result.config.disk_quota_mib,
        "hit_rate": {"without": without.hit_rate, "with": with_tier.hit_rate},
        "live_hit_rate": {"without": without.live_hit_rate, "with": with_tier.live_hit_rate},
        "pages_recomputed": {
            "without": without.pages_recomputed,
            "with": with_tier.pages_recomputed,
        },
        "disk_hits": with_tier.disk_hits,
        "promotions": with_tier.promoted_objects,
        "spilled_objects": with_tier.spilled_objects,
        "disk_peak_bytes": with_tier.disk_peak_bytes,
    }


def _settings_note(result: DemoResult) -> list[str]:
    if result.embedded:
        shown = ", ".join(f"`{k}={v}`" for k, v in result.master_settings.items())
        return [f"Master settings: {shown} (upstream's defaults unless overridden).", ""]
    return ["Master settings: those of the existing deployment (not known to the demo).", ""]


def _report(result: DemoResult) -> str:
    config, trace = result.config, result.trace
    working = trace.unique_pages * config.page_bytes
    verified = sum(p.verified_pages for p in result.policies)
    lines = [
        "# mooncake-py demo: KV sessions vs. plain LRU",
        "",
        f"Master: `{result.master}` ({'embedded' if result.embedded else 'existing deployment'})"
        f"; {config.trace.workers} engine workers (data-parallel ranks), each hosting "
        f"{_mib(result.capacity_bytes // config.trace.workers)}.",
        "",
        *_settings_note(result),
        "## Workload",
        "",
        f"- {config.trace.conversations} conversations over {config.trace.window_s:.0f} virtual "
        f"seconds, {len(trace.turns)} turns, seed {config.trace.seed}; all share one system "
        f"prompt of {len(trace.system)} pages; each turn goes to a random worker.",
        f"- {len(trace.abandoned)} conversations abandoned, "
        f"{sum(1 for t in trace.turns if t.compact)} compacted; think time median "
        f"{config.trace.think_median_s:.0f} s, at most {config.trace.think_max_s:.0f} s.",
        f"- Pages of {config.page_kib} KiB. Working set {_mib(working)}; store capacity "
        f"{_mib(result.capacity_bytes)} ({result.capacity_bytes / working:.0%} of it); the "
        f"live conversations' contexts peak at {_mib(result.live_peak_bytes)}.",
        "",
        "## Results",
        "",
        markdown_table(result),
        "",
        "- *hit rate*: reusable prompt pages loaded from the store (reusable: computed by an "
        "earlier step, so an unbounded store would have them). *live hit rate*: the same for "
        "the history of conversations that came back (past the system prompt).",
        "- *pages recomputed*: reusable pages that were not in the store. *evicted*: store "
        "counters during the replay; soft-pinned pages go only when the pinned conversations "
        "and the pages under a read lease leave too little below the eviction watermark (90% "
        "of capacity), as at the busiest moments. *bytes released*: freed by releasing "
        "abandoned sessions (what eviction had not taken yet).",
        "- *back-pressured pages*: pages the store refused with NO_AVAILABLE_HANDLE, or that a "
        "save then did not send.",
        f"- Every page loaded ({verified:,} in all) was checked byte for byte against the "
        "content its hash implies; none differed.",
        "",
        *_disk_section(result),
        "## Policies",
        "",
        "- **plain**: untagged writes; the store's LRU decides alone.",
        "- **plain+disk**: plain, on fresh workers with the same memory that each also mount a "
        "disk tier: pages evicted from memory are written to files and stay readable (a read "
        "may copy one back to memory: a promotion).",
        f"- **sessions**: one session per conversation. Each turn attaches its hits, tags its "
        f"writes and pins the session; idle {config.pin_idle_s:.0f} s -> unpin; an ended "
        f"conversation is closed; silent {config.abandon_after_s:.0f} s -> released. "
        f"Session calls: {result.policy('sessions').session_calls}.",
        "",
        f"![occupancy and hit rate]({PLOT_NAME})",
        "",
        "Wall time: "
        + ", ".join(f"{p.name} {p.wall_s:.1f} s" for p in result.policies)
        + f"; whole run {result.wall_s:.1f} s.",
        "",
    ]
    return "\n".join(lines)


def _disk_section(result: DemoResult) -> list[str]:
    """The report's disk-tier section: plain LRU without and with the tier, side by side."""
    rows = disk_table_rows(result)
    if not rows:
        reason = result.disk_tier_skipped or "not asked for (`--no-disk-tier`)"
        return ["## With a disk tier", "", f"The disk-tier replay did not run: {reason}.", ""]
    without, with_tier = disk_tier_pair(result)
    quota = result.config.disk_quota_mib
    size = f"{quota:,.0f} MiB each" if quota is not None else "the client's default size"
    return [
        "## With a disk tier",
        "",
        "The same trace and the same memory under plain LRU, without and with a disk tier "
        f"under each worker's memory ({size}, files synced: "
        f"{'yes' if result.config.disk_fsync else 'no'}):",
        "",
        _markdown(DISK_COLUMNS, rows),
        "",
        f"- Pages recomputed: {without.pages_recomputed:,} without the tier, "
        f"{with_tier.pages_recomputed:,} with it; {with_tier.disk_hits:,} reads were served "
        f"from disk and {with_tier.promoted_objects:,} objects copied back to memory.",
        "- *evicted (lost)*: objects dropped from the store; with the tier, an object evicted "
        "from memory is spilled to disk instead, unless the tier is full or busy.",
        "",
    ]


def write_outputs(result: DemoResult) -> dict[str, Path]:
    """Write the plot, report and JSON summary into ``result.config.out_dir``.

    The plot needs matplotlib (the ``demo`` extra: ``pip install 'mooncake-py[demo]'``); without
    it the plot is skipped with a note on stderr and the rest is written.

    Returns:
        Paths by kind: ``plot`` (when written), ``report``, ``summary``.
    """
    out = Path(result.config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"plot": out / PLOT_NAME, "report": out / REPORT_NAME, "summary": out / SUMMARY_NAME}
    if importlib.util.find_spec("matplotlib") is not None:
        plot(result, files["plot"])
    else:
        del files["plot"]
        print("demo: matplotlib is not installed; skipping the plot", file=sys.stderr)
    files["report"].write_text(_report(result), encoding="utf-8")
    files["summary"].write_text(json.dumps(_summary(result), indent=2) + "\n", encoding="utf-8")
    return files
