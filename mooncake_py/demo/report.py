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


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB"


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
    rows = [list(COLUMNS), *table_rows(result)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]

    def line(row: list[str]) -> str:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(rows[0]), rule, *(line(row) for row in rows[1:])])


def markdown_table(result: DemoResult) -> str:
    """The summary table in markdown."""
    head = "| " + " | ".join(COLUMNS) + " |"
    align = "|" + "|".join([":---"] + ["---:"] * (len(COLUMNS) - 1)) + "|"
    body = ["| " + " | ".join(row) + " |" for row in table_rows(result)]
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
    top.set_ylabel("store occupancy (% of capacity)")
    top.set_ylim(0, 105)
    top.legend(loc="lower right")
    bottom.set_ylabel(f"prefix hit rate, last {ROLLING_WINDOW_S:.0f} s (%)")
    bottom.set_xlabel("virtual time (s)")
    bottom.set_ylim(0, 105)
    bottom.legend(loc="lower right")
    fig.suptitle("KV store occupancy and hit rate: LRU only vs. KV sessions")
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
        "## Policies",
        "",
        "- **plain**: untagged writes; the store's LRU decides alone.",
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
