"""Command line of the demo: ``python -m mooncake_py.demo`` and ``mooncake-py demo``.

The ops CLI registers the subcommand with two lines in ``mooncake_py/cli/__init__.py``::

    from mooncake_py.demo.cli import add_demo_subcommand
    GROUPS = (sessions.register, admin.register, add_demo_subcommand)

:func:`add_demo_subcommand` has the ``register(commands, parents)`` shape and sets the
subcommand's ``handler`` to :func:`run_from_args`, which takes the parsed arguments (or the ops
CLI's context, whose ``args`` it reads) and returns the exit code: 0 done, 1 the demo failed (a
worker error, or a page read back with wrong bytes), 2 bad arguments, 3 the master given with
``--master`` cannot be reached. The demo's ``--master`` (after ``demo``) has its own
destination, ``demo_master``, so the ops CLI's global ``--master`` (which always has a value)
never turns the embedded master off.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mooncake_py.demo.runner import DemoConfig, DemoError, MasterUnreachableError, run
from mooncake_py.demo.trace import TraceConfig

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

DESCRIPTION = (
    "Replay a synthetic multi-turn chat workload against the store through the KV connector, "
    "on the same trace: plain LRU, then with KV sessions, then plain LRU with a disk tier "
    "under the same memory (unless --no-disk-tier). Starts an embedded master and "
    "two engine-worker processes unless --master is given. Prints summary tables and writes "
    "a report, a plot and a JSON summary to --out."
)

# --quick: a smaller trace that keeps the story (about 15 s on two cores, three replays).
QUICK = {"conversations": 150, "window_s": 360.0}

_TRACE_FLAGS: dict[str, tuple[str, type, str]] = {
    "seed": ("--seed", int, "random seed of the trace"),
    "conversations": ("--conversations", int, "conversations in the trace"),
    "window_s": ("--window", float, "virtual seconds over which conversations arrive"),
    "min_turns": ("--min-turns", int, "fewest turns per conversation"),
    "max_turns": ("--max-turns", int, "most turns per conversation"),
    "think_median_s": ("--think-median", float, "median think time (virtual s)"),
    "think_max_s": ("--think-max", float, "longest think time (virtual s)"),
    "system_pages": ("--system-pages", int, "pages of the shared system prompt"),
    "abandon_fraction": ("--abandon-fraction", float, "share of conversations abandoned"),
    "compact_fraction": ("--compact-fraction", float, "share of conversations compacted"),
    "workers": ("--workers", int, "engine-worker processes (data-parallel ranks)"),
}
_DEMO_FLAGS: dict[str, tuple[str, type, str]] = {
    "page_kib": ("--page-kib", int, "KiB per page"),
    "capacity_ratio": (
        "--capacity-ratio",
        float,
        "store capacity / peak bytes of the live conversations' contexts",
    ),
    "capacity_mib": ("--capacity-mib", float, "store capacity in MiB (overrides the ratio)"),
    "pin_idle_s": ("--pin-idle", float, "sessions: unpin after this idle time (virtual s)"),
    "abandon_after_s": ("--abandon-after", float, "sessions: release after this silence"),
    "lease_ms": ("--lease-ms", int, "read-lease TTL of the embedded master (ms; default 10 s)"),
    "disk_quota_mib": ("--disk-quota-mib", float, "disk tier size per worker in MiB"),
}


def configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the demo's options to ``parser``; returns it."""
    trace_defaults, demo_defaults = TraceConfig(), DemoConfig()
    parser.add_argument("--quick", action="store_true", help="a small trace (about 15 s)")
    parser.add_argument(
        "--master",
        dest="demo_master",
        metavar="HOST:PORT",
        help="use this master instead of an embedded one",
    )
    parser.add_argument(
        "--out", type=Path, default=demo_defaults.out_dir, help="output folder (%(default)s)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress line")
    parser.add_argument(
        "--no-disk-tier",
        action="store_true",
        help="skip the replay with a disk tier under the workers' memory",
    )
    parser.add_argument(
        "--disk-fsync",
        action="store_true",
        help="disk tier: sync each file before it is served (slower; off: the tier is temporary)",
    )
    for flags, defaults in ((_TRACE_FLAGS, trace_defaults), (_DEMO_FLAGS, demo_defaults)):
        for name, (flag, kind, text) in flags.items():
            default = getattr(defaults, name)
            shown = "" if default is None else f" (default {default})"
            parser.add_argument(
                flag,
                dest=name,
                type=kind,
                default=None,
                metavar=flag[2:].upper(),
                help=text + shown,
            )
    return parser


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    """The :class:`DemoConfig` of parsed arguments (``--quick`` first, explicit flags win).

    Raises:
        ValueError: a value is out of range.
    """
    trace: dict[str, Any] = dict(QUICK) if args.quick else {}
    trace |= {k: getattr(args, k) for k in _TRACE_FLAGS if getattr(args, k) is not None}
    demo = {k: getattr(args, k) for k in _DEMO_FLAGS if getattr(args, k) is not None}
    return DemoConfig(
        trace=dataclasses.replace(TraceConfig(), **trace),
        master=args.demo_master,
        out_dir=args.out,
        progress=not args.no_progress,
        disk_tier=not args.no_disk_tier,
        disk_fsync=args.disk_fsync,
        **demo,
    )


def run_from_args(args: argparse.Namespace | Any) -> int:
    """Run the demo for parsed arguments: print the summary, return the exit code.

    Args:
        args: the parsed arguments, or an object holding them as ``args`` (the ops CLI's
            context).
    """
    namespace = args if isinstance(args, argparse.Namespace) else args.args
    try:
        config = config_from_args(namespace)
    except ValueError as exc:
        sys.stderr.write(f"mooncake-py demo: {exc}\n")
        return EXIT_USAGE
    try:
        result = run(config)
    except MasterUnreachableError as exc:
        sys.stderr.write(f"mooncake-py demo: {exc}\n")
        return EXIT_UNREACHABLE
    except DemoError as exc:
        sys.stderr.write(f"\nmooncake-py demo: FAILED: {exc}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        sys.stderr.write("\nmooncake-py demo: interrupted\n")
        return 130
    sys.stdout.write(_summary_text(result) + "\n")
    return EXIT_OK


def _summary_text(result: Any) -> str:
    from mooncake_py.demo.report import format_disk_table, format_table

    files = ", ".join(str(path) for path in result.files.values())
    text = f"\n{format_table(result)}\n"
    disk = format_disk_table(result)
    if disk:
        text += f"\nsame memory, without and with a disk tier:\n{disk}\n"
    elif result.disk_tier_skipped:
        text += f"\ndisk-tier replay skipped: {result.disk_tier_skipped}\n"
    return text + f"\nwrote {files} ({result.wall_s:.0f} s)"


def add_demo_subcommand(subparsers: Any, parents: Any = None) -> None:
    """Register ``demo`` on an ``add_subparsers()`` object, with ``handler=run_from_args``.

    Args:
        subparsers: the ``add_subparsers()`` result of the ops CLI's parser.
        parents: accepted for the ops CLI's ``register(commands, parents)`` shape and unused:
            the demo takes no global option (its ``--master`` is its own).
    """
    parser = subparsers.add_parser("demo", help="run the KV-sessions demo", description=DESCRIPTION)
    configure_parser(parser)
    parser.set_defaults(handler=run_from_args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m mooncake_py.demo``; returns the exit code."""
    parser = configure_parser(argparse.ArgumentParser(prog="mooncake-py demo"))
    parser.description = DESCRIPTION
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    return run_from_args(args)
