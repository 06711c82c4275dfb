"""The many-clients benchmark's arithmetic: round figures, medians, CPU shares, py-spy summaries.

Pure functions over the workers' answers (:mod:`tests.bench.many_clients_worker`), the text of
``/proc/<pid>/stat`` and py-spy's raw output, so that they are tested without a store
(``tests/unit/test_many_clients_bench.py``). Nothing here starts a process or reads a file.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tests.bench.common import median

CALL_TYPES: tuple[tuple[str, str], ...] = (
    ("put_big", "put_batch 16 x 64KiB"),
    ("put_small", "put_batch 64 x 4KiB"),
    ("get_into_big", "batch_get_into 16 x 64KiB"),
    ("get_small", "get_batch 64 x 4KiB"),
    ("exist", "batch_is_exist 128 (64 present, 64 absent)"),
    ("remove", "batch_remove 80 (16 x 64KiB + 64 x 4KiB)"),
)
"""The call types of the mixed loop: id (as the workers name them) and label."""


def round_figures(answers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One side's figures for one round, from every client's ``run`` answer.

    Args:
        answers: per client, ``elapsed_s`` (its timed phase, first call's start to last call's
            end) and per call type id ``calls``, ``keys``, ``failures`` (counts) and ``times``
            (seconds per call).

    Returns:
        ``ops_per_s`` and ``keys_per_s`` (the sum over clients of each client's calls or keys
        over its own ``elapsed_s``), ``failures`` (all call types), ``calls`` (all call types),
        and ``types``: per call type id, ``calls``, ``calls_per_s``, ``failures``, ``p50_us``
        and ``p99_us`` over every client's calls of that type pooled (None without calls).

    Complexity: O(calls log calls) for the percentiles.
    """
    ops_per_s = keys_per_s = 0.0
    pooled: dict[str, list[float]] = collections.defaultdict(list)
    calls: collections.Counter[str] = collections.Counter()
    failures: collections.Counter[str] = collections.Counter()
    rates: collections.Counter[str] = collections.Counter()
    for answer in answers:
        elapsed = float(answer["elapsed_s"])
        for type_id, record in answer["types"].items():
            calls[type_id] += int(record["calls"])
            failures[type_id] += int(record["failures"])
            pooled[type_id] += record["times"]
            if elapsed > 0:
                rates[type_id] += record["calls"] / elapsed
                ops_per_s += record["calls"] / elapsed
                keys_per_s += record["keys"] / elapsed
    types: dict[str, dict[str, float | None]] = {}
    for type_id in sorted(set(calls) | set(pooled)):
        p50, p99 = percentiles_us(pooled[type_id])
        types[type_id] = {
            "calls": float(calls[type_id]),
            "calls_per_s": float(rates[type_id]),
            "failures": float(failures[type_id]),
            "p50_us": p50,
            "p99_us": p99,
        }
    return {
        "ops_per_s": ops_per_s,
        "keys_per_s": keys_per_s,
        "calls": sum(calls.values()),
        "failures": sum(failures.values()),
        "types": types,
    }


def percentiles_us(times_s: Sequence[float]) -> tuple[float | None, float | None]:
    """The 50th and 99th percentiles of ``times_s`` in microseconds; (None, None) if empty."""
    if not len(times_s):
        return None, None
    p50, p99 = np.percentile(np.asarray(times_s, dtype=np.float64) * 1e6, [50, 99])
    return float(p50), float(p99)


def flatten(figures: Mapping[str, Any], prefix: str = "") -> dict[str, float | None]:
    """A nested dict of figures as one level, names joined by ``.`` (``types.put_big.p50_us``);
    anything that is not a number or None (e.g. a list) is left out."""
    flat: dict[str, float | None] = {}
    for name, value in figures.items():
        if isinstance(value, Mapping):
            flat |= flatten(value, f"{prefix}{name}.")
        elif value is None or isinstance(value, int | float):
            flat[f"{prefix}{name}"] = None if value is None else float(value)
    return flat


def medians(rounds: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Per flattened figure (:func:`flatten`), the median over the rounds that have it (None
    when none has it). Complexity: O(rounds x figures)."""
    values: dict[str, list[float]] = collections.defaultdict(list)
    names: dict[str, None] = {}
    for figures in rounds:
        for name, value in flatten(figures).items():
            names[name] = None
            if value is not None:
                values[name].append(value)
    return {name: median(values[name]) if values[name] else None for name in names}


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """``ours / theirs``; None when either is missing or ``theirs`` is 0."""
    if ours is None or theirs is None or theirs == 0:
        return None
    return ours / theirs


def proc_stat_cpu_ticks(stat_text: str) -> tuple[int, int]:
    """``(utime, stime)`` in clock ticks from the text of ``/proc/<pid>/stat``.

    The process name (field 2) is in parentheses and may itself hold spaces and parentheses,
    so the fields are counted from the last ``)``: utime and stime are fields 14 and 15.

    Raises:
        ValueError: the text is not in that format.
    """
    closing = stat_text.rfind(")")
    if closing < 0:
        raise ValueError("no process name in /proc/<pid>/stat text")
    fields = stat_text[closing + 1 :].split()
    if len(fields) < 13:
        raise ValueError("too few fields in /proc/<pid>/stat text")
    # fields[0] is field 3 (state): utime (14) is fields[11], stime (15) fields[12].
    return int(fields[11]), int(fields[12])


def cpu_share(
    before: tuple[int, int], after: tuple[int, int], wall_s: float, ticks_per_s: float
) -> dict[str, float | None]:
    """A process's CPU use over ``wall_s`` seconds as fractions of one core.

    Args:
        before, after: ``(utime, stime)`` ticks (:func:`proc_stat_cpu_ticks`) at the start and
            end of the interval.

    Returns:
        ``user``, ``system`` and ``total`` (1.0: one core busy all along; a multi-threaded
        process may exceed 1); all None when ``wall_s`` is not positive.
    """
    if wall_s <= 0:
        return {"user": None, "system": None, "total": None}
    user = (after[0] - before[0]) / ticks_per_s / wall_s
    system = (after[1] - before[1]) / ticks_per_s / wall_s
    return {"user": user, "system": system, "total": user + system}


def cpu_us_per_call(cpu_cores: float | None, calls_per_s: float | None) -> float | None:
    """CPU microseconds spent per call: ``cpu_cores`` (a :func:`cpu_share` total, in cores)
    over ``calls_per_s``; None when either is missing or no call was made.

    A figure that does not depend on how fast the clients drove the store: on a machine whose
    cores are all busy, throughput tells who got the cores, this tells what each call cost.
    """
    if cpu_cores is None or not calls_per_s:
        return None
    return cpu_cores / calls_per_s * 1e6


_LINE_NUMBER = re.compile(r":\d+\)$")


def frame_name(frame: str) -> str:
    """A py-spy frame without its line number: ``f (pkg/mod.py:12)`` -> ``f (pkg/mod.py)``."""
    return _LINE_NUMBER.sub(")", frame.strip())


def pyspy_summary(raw_text: str, top: int = 15) -> dict[str, Any]:
    """The heaviest frames of a py-spy ``record -f raw`` output.

    Each line is ``frame;frame;...;frame COUNT``, root first and leaf last. Frames are grouped
    by function and file (line numbers dropped, :func:`frame_name`).

    Args:
        top: how many frames each list keeps.

    Returns:
        ``samples`` (all counted samples), ``self`` (frames by the samples they were the leaf
        of) and ``inclusive`` (frames by the samples whose stack holds them, counted once per
        sample even when recursive, leaving out the frames found in every sample: the event
        loop and the entry point, which say nothing): lists of ``{"frame", "samples",
        "share"}`` (share of ``samples``), heaviest first, ties by name; and
        ``in_every_sample``: the frames left out, by name.

    Complexity: O(total stack depth over the lines + frames log frames).
    """
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw_text.splitlines():
        stack, _, count_text = line.strip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [frame_name(f) for f in stack.split(";") if f.strip()]
        if not frames:
            continue
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count

    def heaviest(counter: collections.Counter[str]) -> list[dict[str, Any]]:
        ranked = sorted(counter.items(), key=lambda item: (-item[1], item[0]))[:top]
        return [
            {"frame": frame, "samples": n, "share": n / samples if samples else 0.0}
            for frame, n in ranked
        ]

    everywhere = sorted(frame for frame, n in inclusive.items() if n == samples)
    for frame in everywhere:
        del inclusive[frame]
    return {
        "samples": samples,
        "self": heaviest(own),
        "inclusive": heaviest(inclusive),
        "in_every_sample": everywhere,
    }
