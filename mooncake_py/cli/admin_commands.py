"""``mooncake-py segments|keys|stats|release-kv-cache``: the store beyond sessions."""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path
from typing import Any

from mooncake_py.cli.common import (
    EXIT_DENIED,
    EXIT_OK,
    EXIT_STORE_ERROR,
    CliError,
    CommonParents,
    Context,
    about,
    describe_failure,
)
from mooncake_py.cli.output import (
    Column,
    UsageError,
    emit_json,
    emit_listing,
    emit_record,
    format_size,
)
from mooncake_py.cli.session_commands import emit_release
from mooncake_py.errors import BusyError, ErrorCode, MooncakeError

HTTP_GAP_KEY_DATA = "the memory API does not read or remove keys"

OWN_HELP = (
    "show only what the token's tenant may use (the whole store needs an admin token "
    "when the master requires tokens)"
)

SEGMENT_COLUMNS = (
    Column("segment_id", "SEGMENT"),
    Column("name", "NAME"),
    Column("tier", "TIER"),
    Column("client_id", "CLIENT", in_table=False),
    Column("size", "SIZE", "bytes"),
    Column("used_bytes", "USED", "bytes"),
    Column("used_percent", "USE%", "percent"),
    Column("allocations", "ALLOCS", "int"),
    Column("te_endpoint", "ENDPOINT"),
    Column("protocol", "PROTO"),
    Column("host_id", "HOST", in_table=False),
)


TENANT_VIEW_KEY = "tenant_view"
"""The key a master's GetStats answer carries when it answered the token's tenant's view only
(a non-admin token): global views need an admin token."""


def require_global_view(ctx: Context, command: str, stats: dict[str, int] | None = None) -> None:
    """Refuse a global view the master would only answer for the token's tenant.

    Unless ``--own`` was given, asks the master which view the token gets (``stats``, when
    already fetched, tells) and fails when it is a tenant's.

    Raises:
        CliError: EXIT_DENIED, saying that an admin token is needed and how to see the
            tenant's own view instead.
    """
    if ctx.args.own:
        return
    if stats is None:
        stats = ctx.client.stats()
    if stats.get(TENANT_VIEW_KEY):
        raise CliError(
            EXIT_DENIED,
            f"permission denied: `{command}` shows every tenant and needs an admin token "
            f"(the token of {ctx.tenant_label} is not an admin's); add --own to see only "
            "what that tenant may use",
        )


def cmd_segments_ls(ctx: Context) -> int:
    """``segments ls``: every mounted segment with its tier (``memory``, or ``disk`` for a
    client's disk tier, which carries its memory segment's name) and use (``--own``: the
    segments the token's tenant may use, the only view a non-admin token gets)."""
    require_global_view(ctx, "segments ls")
    rows: list[dict[str, Any]] = []
    for status in ctx.client.segments():
        segment, used = status.segment, status.used_bytes
        rows.append(
            {
                "segment_id": segment.id,
                "name": segment.name,
                "tier": DISK_TIER if segment.disk else MEMORY_TIER,
                "client_id": status.client_id,
                "size": segment.size,
                "used_bytes": used,
                "used_percent": 100.0 * used / segment.size if segment.size else 0.0,
                # Negative: the memory API did not say (shown as "-", null in JSON).
                "allocations": status.allocations if status.allocations >= 0 else None,
                "te_endpoint": segment.te_endpoint,
                "protocol": segment.protocol or None,
                "host_id": segment.host_id,
            }
        )
    # A client's disk tier carries its memory segment's name: memory first, then its disk.
    rows.sort(key=lambda r: (r["name"], r["tier"] != MEMORY_TIER, r["segment_id"]))
    emit_listing(ctx.out, SEGMENT_COLUMNS, rows, empty_note="no segments mounted")
    return EXIT_OK


def cmd_stats(ctx: Context) -> int:
    """``stats``: the master's counters (sizes shown in binary units), then a table of bytes
    per tier (memory, disk) in human output; ``--own``: the token's tenant's figures, the
    only view a non-admin token gets."""
    stats = ctx.client.stats()
    require_global_view(ctx, "stats", stats)
    fields = [
        Column(name, name, "bytes" if name.endswith("_bytes") else "int") for name in sorted(stats)
    ]
    emit_record(ctx.out, fields, stats)
    if not (ctx.out.json or ctx.out.file_format):
        # JSON and files carry the raw figures above; a person also gets them per tier.
        sys.stdout.write("\n")
        emit_listing(ctx.out, TIER_COLUMNS, tier_rows(stats))
    return EXIT_OK


MEMORY_TIER = "memory"
DISK_TIER = "disk"

TIER_COLUMNS = (
    Column("tier", "TIER"),
    Column("segments", "SEGMENTS", "int"),
    Column("used_bytes", "USED", "bytes"),
    Column("capacity_bytes", "CAPACITY", "bytes"),
    Column("free_bytes", "FREE", "bytes"),
    Column("used_percent", "USE%", "percent"),
)

# tier -> the stats keys of its (segments, used bytes, capacity bytes)
_TIER_KEYS = {
    MEMORY_TIER: ("segments", "allocated_bytes", "capacity_bytes"),
    DISK_TIER: ("disk_segments", "disk_used_bytes", "disk_capacity_bytes"),
}


def tier_rows(stats: dict[str, int]) -> list[dict[str, Any]]:
    """Bytes per tier from a GetStats answer: one row per tier whose figures it carries
    (a tenant's view carries memory figures only)."""
    rows = []
    for tier, (segments, used_key, capacity_key) in _TIER_KEYS.items():
        if capacity_key not in stats:
            continue
        used, capacity = stats.get(used_key, 0), stats[capacity_key]
        rows.append(
            {
                "tier": tier,
                "segments": stats.get(segments, 0),
                "used_bytes": used,
                "capacity_bytes": capacity,
                "free_bytes": max(0, capacity - used),
                "used_percent": 100.0 * used / capacity if capacity else 0.0,
            }
        )
    return rows


def cmd_release_kv_cache(ctx: Context) -> int:
    """``release-kv-cache [--include-pinned]``: remove KV-cache objects, keep other data."""
    include_pinned: bool = ctx.args.include_pinned
    scope = "including" if include_pinned else "except"
    ctx.confirm(
        f"remove every KV-cache object of {ctx.tenant_label} ({scope} pinned "
        "sessions' objects; other data types stay)?"
    )
    with about("release of the KV cache"):
        result = ctx.client.release_kv_cache(keep_pinned=not include_pinned)
    emit_release(ctx, "released the KV cache", result)
    return EXIT_OK


def cmd_keys_get(ctx: Context) -> int:
    """``keys get KEY [--output FILE]``: print the value to stdout or save it."""
    key: str = ctx.args.key
    output: str | None = ctx.args.value_file
    if ctx.out.file_format:
        raise UsageError("keys get writes the value itself: use --output FILE without --format")
    with about(f"key {key!r}"):
        value = ctx.grpc_client.get(key)
    size = len(value)
    if output and output != "-":
        Path(output).write_bytes(value)
        if ctx.out.json:
            emit_json(ctx.out, {"key": key, "size": size, "output": output})
        else:
            print(f"saved key {key!r} ({format_size(size)}) to {output}", file=sys.stderr)
    elif ctx.out.json:
        encoded = base64.b64encode(value).decode("ascii")
        emit_json(ctx.out, {"key": key, "size": size, "value_base64": encoded})
    else:
        sys.stdout.flush()
        sys.stdout.buffer.write(value)
        sys.stdout.buffer.flush()
    return EXIT_OK


def cmd_keys_rm(ctx: Context) -> int:
    """``keys rm KEY [--force]``."""
    key: str = ctx.args.key
    force: bool = ctx.args.force
    ctx.confirm(f"remove key {key!r}{' (forced, even while read)' if force else ''}?")
    try:
        ctx.grpc_client.remove(key, force)
    except BusyError as exc:
        if exc.code == ErrorCode.OBJECT_HAS_LEASE:
            message = f"key {key!r} is being read (leased); retry or --force"
        else:
            message = f"key {key!r} is being written; retry later"
        raise CliError(EXIT_STORE_ERROR, message) from exc
    except MooncakeError as exc:
        raise describe_failure(exc, f"key {key!r}") from exc
    if ctx.out.json:
        emit_json(ctx.out, {"key": key, "removed": True})
    else:
        print(f"removed key {key!r}")
    return EXIT_OK


def cmd_keys_demote(ctx: Context) -> int:
    """``keys demote KEY...``: move the keys from memory to their owners' disk tiers now."""
    keys: list[str] = ctx.args.keys
    with about("demoting keys"):
        result = ctx.grpc_client.batch_demote(keys)
    outcomes = {key: _code_name(code) for key, code in zip(keys, result.codes, strict=True)}
    if ctx.out.json:
        emit_json(ctx.out, {"demoted": outcomes})
    else:
        for key, outcome in outcomes.items():
            print(f"{key}\t{outcome}")
    return EXIT_OK if all(code == 0 for code in result.codes) else EXIT_STORE_ERROR


def _code_name(code: int) -> str:
    """``OK``, an ErrorCode's name, or the number of a code this CLI does not know."""
    if code == 0:
        return "OK"
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


def register(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], parents: CommonParents
) -> None:
    """Add ``segments``, ``keys``, ``stats`` and ``release-kv-cache`` to ``commands``."""
    segments = commands.add_parser(
        "segments", help="memory segments and disk tiers", parents=[parents.base]
    )
    segments_sub = segments.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    ls = segments_sub.add_parser(
        "ls", help="list mounted segments (memory and disk tiers)", parents=[parents.listing]
    )
    ls.add_argument("--own", action="store_true", help=OWN_HELP)
    ls.set_defaults(handler=cmd_segments_ls, over_http=True)

    keys = commands.add_parser("keys", help="read or remove one key", parents=[parents.base])
    keys_sub = keys.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    get = keys_sub.add_parser("get", help="print a value or save it", parents=[parents.base])
    get.add_argument("key", metavar="KEY")
    get.add_argument(
        "--output", "-o", dest="value_file", metavar="FILE", help="save the value to FILE"
    )
    get.set_defaults(handler=cmd_keys_get, http_gap=HTTP_GAP_KEY_DATA)
    rm = keys_sub.add_parser("rm", help="remove a key", parents=[parents.base])
    rm.add_argument("key", metavar="KEY")
    rm.add_argument("--force", action="store_true", help="remove even while it is being read")
    rm.set_defaults(handler=cmd_keys_rm, http_gap=HTTP_GAP_KEY_DATA)
    demote = keys_sub.add_parser(
        "demote", help="move keys from memory to their disk tiers", parents=[parents.base]
    )
    demote.add_argument("keys", metavar="KEY", nargs="+")
    demote.set_defaults(handler=cmd_keys_demote, http_gap=HTTP_GAP_KEY_DATA)

    stats = commands.add_parser(
        "stats", help="the master's counters, and bytes per tier", parents=[parents.listing]
    )
    stats.add_argument("--own", action="store_true", help=OWN_HELP)
    stats.set_defaults(handler=cmd_stats, over_http=True)

    release = commands.add_parser(
        "release-kv-cache",
        help="remove every KV-cache object (other data types stay)",
        parents=[parents.base],
    )
    release.add_argument(
        "--include-pinned", action="store_true", help="also pinned sessions' objects"
    )
    release.set_defaults(handler=cmd_release_kv_cache, over_http=True)
