"""Every workload row a benchmark plan can produce, and the selection of rows to run.

A row is one figure of the report: an id (``shm.b.batch_get_into.4MiB``), a label
(``shm B batch_get_into 32 x 4MiB``), its group (``local``, ``shm``, ``tcp``, ``meta``), unit and
limit. :func:`catalogue` lists them for a :class:`~tests.bench.plan.Plan` in report order, so that
the phases define their rows from one place and ``--rows`` can be checked before anything runs.

Some rows are *opt-in*: measured only when a ``--rows`` pattern selects them (the cross-process
small-value reads), so that a default run keeps its set of rows.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from typing import Any

from tests.bench.common import KIB, MIB, size_label
from tests.bench.plan import Plan

PATHS = ("shm", "tcp")
# Cross-process small values B reads one call at a time (opt-in rows, see the module docstring).
SMALL_SIZES = (4 * KIB,)
SMALL_CALLS = {"full": 400, "quick": 150, "tiny": 10}


def memcpy_limit(plan: Plan, size: int, batch: int = 1) -> str:
    """The memcpy limit for a call moving ``batch`` values of ``size`` bytes: the smallest
    measured size that holds them; past the smallest, a batch of the pieces measured (the
    largest cross-process value) compares with that size copied in such pieces."""
    sizes = sorted(plan.memcpy_sizes)
    nbytes = size * batch
    if batch > 1 and nbytes > sizes[0] and size == max(plan.sizes):
        return f"memcpy_{size_label(sizes[-1])}_{size_label(size)}"
    return f"memcpy_{size_label(next((s for s in sizes if s >= nbytes), sizes[-1]))}"


def small_calls(plan: Plan) -> int:
    """Calls per round of each opt-in cross-process small-value row."""
    return SMALL_CALLS.get(plan.mode, SMALL_CALLS["full"])


def _local(plan: Plan) -> list[dict[str, Any]]:
    rows = []
    for size in plan.local_sizes:
        label = size_label(size)
        small = size < MIB
        unit = "ops/s" if small else "MB/s"
        limit_id = "pingpong" if small else memcpy_limit(plan, size)
        for op in ("put", "get", "put_from", "get_into"):
            rows.append(
                {
                    "id": f"local.{op}.{label}",
                    "group": "local",
                    "label": f"{op} {label}",
                    "op": op,
                    "size": size,
                    "batch": 1,
                    "unit": unit,
                    "limit_id": limit_id,
                }
            )
    for count, size, _ in plan.local_batches:
        for op in ("put_batch", "get_batch", "batch_put_from", "batch_get_into"):
            rows.append(
                {
                    "id": f"local.{op}.{count}x{size_label(size)}",
                    "group": "local",
                    "label": f"{op} {count} x {size_label(size)}",
                    "op": op,
                    "size": size,
                    "batch": count,
                    "unit": "MB/s",
                    "limit_id": memcpy_limit(plan, size, count),
                }
            )
    return rows


def _cross(plan: Plan, path: str) -> list[dict[str, Any]]:
    title = "shm" if path == "shm" else "TCP"
    rows = []
    for size in SMALL_SIZES:
        label = size_label(size)
        for op in ("get", "get_into"):
            rows.append(
                {
                    "id": f"{path}.b.{op}.{label}",
                    "group": path,
                    "path": path,
                    "label": f"{title} B {op} {label}",
                    "op": op,
                    "size": size,
                    "batch": 1,
                    "unit": "ops/s",
                    "limit_id": "pingpong",
                    "opt_in": True,
                }
            )
    for size in plan.sizes:
        label, batch = size_label(size), plan.batches[size]
        stream = f"stream_{label}"
        limits = (
            (memcpy_limit(plan, size, batch), memcpy_limit(plan, size))
            if path == "shm"
            else (stream, stream)
        )
        common: dict[str, Any] = {"group": path, "path": path, "size": size, "unit": "MB/s"}
        for side, op, many, text in (
            ("a", "batch_put_from", True, f"A batch_put_from {batch} x {label}"),
            ("b", "get_into", False, f"B get_into {label}"),
            ("b", "batch_get_into", True, f"B batch_get_into {batch} x {label}"),
            ("b", "put_from", False, f"B put_from {label} (into A)"),
        ):
            rows.append(
                {
                    "id": f"{path}.{side}.{op}.{label}",
                    **common,
                    "op": op,
                    "batch": batch if many else 1,
                    "label": f"{title} {text}",
                    "limit_id": limits[0] if many else limits[1],
                }
            )
    return rows


# batch_is_exist probes: (probe, id part, label part). "warm": the same present keys every call,
# just written and read back by their writer; "cold": keys another client has just written,
# each probed once (the first probe after the write); "miss": every key absent.
PROBES = (("warm", "", ""), ("cold", "cold.", ", cold"), ("miss", "miss.", ", absent"))
# get -> remove -> put rounds (one row per size), single process
ROUND_TRIP_SIZES = (4 * KIB,)


def _round_trips(plan: Plan) -> list[dict[str, Any]]:
    del plan  # the same rows in every mode; the round counts are the plan's local_calls
    rows = []
    for size in ROUND_TRIP_SIZES:
        label = size_label(size)
        rows.append(
            {
                "id": f"local.read_remove_write.{label}",
                "group": "local",
                "label": f"get, remove, put {label} (rounds/s)",
                "op": "read_remove_write",
                "size": size,
                "batch": 1,
                "unit": "ops/s",
                "limit_id": "pingpong",
            }
        )
    return rows


def _meta(plan: Plan) -> list[dict[str, Any]]:
    rows = []
    for variant in ("", ".grpc"):
        grpc = variant == ".grpc"
        how = " (gRPC)" if grpc else " (stream)"
        small_limit = "grpc_echo_ExistKey" if grpc else "pingpong"
        common: dict[str, Any] = {"group": "meta", "unit": "ops/s", "batch": 1, "variant": variant}
        for state in ("present", "absent"):
            rows.append(
                {
                    "id": f"meta.is_exist.{state}{variant}",
                    **common,
                    "op": "is_exist",
                    "label": f"B is_exist, {state} key{how}",
                    "limit_id": small_limit,
                }
            )
        for size in plan.batch_exist_sizes:
            for probe, id_part, text in PROBES:
                rows.append(
                    {
                        "id": f"meta.batch_is_exist.{id_part}{size}{variant}",
                        **common,
                        "op": "batch_is_exist",
                        "probe": probe,
                        "unit": "keys/s",
                        "batch": size,
                        "label": f"B batch_is_exist {size} keys{text}{how}",
                        "limit_id": f"grpc_echo_BatchExistKey{size}",
                        "limit_scale": size,
                    }
                )
        rows.append(
            {
                "id": f"meta.remove{variant}",
                **common,
                "op": "remove",
                "label": f"B remove{how}",
                "limit_id": small_limit,
            }
        )
    return rows


def catalogue(plan: Plan) -> dict[str, dict[str, Any]]:
    """Every row ``plan`` can produce, by id, in report order (local, shm, tcp, meta).

    Complexity: O(rows); the plan is not changed.
    """
    rows = _local(plan) + _round_trips(plan) + _cross(plan, "shm") + _cross(plan, "tcp")
    rows += _meta(plan)
    return {row["id"]: row for row in rows}


class NoSuchRows(ValueError):
    """A ``--rows`` pattern matches no row; the message lists the row labels."""


def _matches(pattern: str, row: dict[str, Any]) -> bool:
    wanted = pattern.strip().lower()
    names = (row["id"].lower(), row["label"].lower())
    if any(mark in wanted for mark in "*?["):
        return any(fnmatch.fnmatchcase(name, wanted) for name in names)
    return any(wanted in name for name in names)


def parse_patterns(text: str | Sequence[str] | None) -> list[str] | None:
    """``--rows`` values (comma-separated, the option repeatable) as a list; None: no
    restriction. Empty entries are dropped; all-empty input raises :class:`NoSuchRows`."""
    if text is None:
        return None
    parts = [text] if isinstance(text, str) else list(text)
    patterns = [p.strip() for part in parts for p in part.split(",") if p.strip()]
    if not patterns:
        raise NoSuchRows("--rows needs at least one pattern")
    return patterns


def select(rows: dict[str, dict[str, Any]], patterns: Iterable[str] | None) -> set[str]:
    """The ids of the rows to measure.

    Args:
        rows: :func:`catalogue`'s answer.
        patterns: case-insensitive patterns over row labels and ids: a glob when it has
            ``*``, ``?`` or ``[`` (matched against the whole label or id), else a substring.
            None: every row that is not opt-in.

    Raises:
        NoSuchRows: a pattern matches no row (each pattern must select something, so that a
            typo is not a silently empty comparison).
    """
    if patterns is None:
        return {row_id for row_id, row in rows.items() if not row.get("opt_in")}
    chosen: set[str] = set()
    for pattern in patterns:
        hits = {row_id for row_id, row in rows.items() if _matches(pattern, row)}
        if not hits:
            known = "\n  ".join(f"{row['label']}  [{row_id}]" for row_id, row in rows.items())
            raise NoSuchRows(f"--rows {pattern!r} matches no row; the rows are:\n  {known}")
        chosen |= hits
    return chosen


def upstream_peer(row_id: str) -> str | None:
    """The upstream row a mooncake-py row is compared with: upstream has one cross-process path
    (TCP) and one master transport, measured under the shm / default-transport ids."""
    if row_id.startswith("tcp.a."):
        return None  # upstream's segment owner writes its own segment locally, never over TCP
    if row_id.startswith("tcp."):
        row_id = "shm." + row_id[4:]
    return row_id.removesuffix(".grpc")
