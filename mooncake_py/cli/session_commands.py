"""``mooncake-py sessions ...``: list, inspect, pin, close and release KV sessions.

Listings page through the master (``PAGE_LIMIT`` sessions per call); sorting and ``--top``
happen here, so the master never sorts. Release results are shared with the admin commands.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
from collections.abc import Callable
from typing import Any

from mooncake_py.cli.common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    PAGE_LIMIT,
    CliError,
    CommonParents,
    Context,
    about,
    duration_ms,
    positive_int,
)
from mooncake_py.cli.output import (
    Column,
    emit_json,
    emit_listing,
    emit_record,
    format_duration,
    format_size,
    note,
    rows_of,
)
from mooncake_py.types import KvSessionInfo, ReleaseResult

SESSION_COLUMNS = (
    Column("session_id", "SESSION"),
    Column("pinned", "PINNED", "bool"),
    Column("member_count", "MEMBERS", "int"),
    Column("bytes", "SIZE", "bytes"),
    Column("exclusive_bytes", "EXCLUSIVE", "bytes"),
    Column("idle_ms", "IDLE", "ms"),
    Column("age_ms", "AGE", "ms"),
    Column("created_at", "CREATED", "time", in_table=False),
    Column("last_active_at", "LAST ACTIVE", "time", in_table=False),
)

SESSION_FIELDS = (
    Column("session_id", "Session"),
    Column("pinned", "Pinned", "bool"),
    Column("member_count", "Members", "int"),
    Column("bytes", "Size", "bytes"),
    Column("exclusive_bytes", "Exclusive", "bytes"),
    Column("shared_bytes", "Shared", "bytes"),
    Column("created_at", "Created", "time"),
    Column("last_active_at", "Last active", "time"),
    Column("idle_ms", "Idle", "ms"),
    Column("age_ms", "Age", "ms"),
)

RELEASE_FIELDS = tuple(f.name for f in dataclasses.fields(ReleaseResult))

# Why a command cannot run over the HTTP memory API (``--http``).
HTTP_GAP_KEYS = "the memory API has no per-session key listing"
HTTP_GAP_PIN = "the memory API cannot pin or unpin a session"
HTTP_GAP_CLOSE = "the memory API cannot close a session without releasing it"

# Sort orders: the key of the first row shown (ties broken by session id).
SORT_KEYS: dict[str, Callable[[KvSessionInfo], Any]] = {
    "id": lambda i: i.session_id,
    "bytes": lambda i: (-i.bytes, i.session_id),
    "exclusive": lambda i: (-i.exclusive_bytes, i.session_id),
    "idle": lambda i: (-i.idle_ms, i.session_id),
    "members": lambda i: (-i.member_count, i.session_id),
}


def _age_ms(info: KvSessionInfo) -> dict[str, int]:
    # From the master's own figures, so the local clock's skew does not matter.
    age = info.idle_ms + max(0, round((info.last_active_at - info.created_at) * 1000))
    return {"age_ms": age}


def session_rows(infos: list[KvSessionInfo]) -> list[dict[str, Any]]:
    """Session infos as listing rows (with ``age_ms``)."""
    return rows_of(infos, _age_ms)


def fetch_sessions(ctx: Context, pinned: bool | None, min_idle_ms: int) -> list[KvSessionInfo]:
    """Every session of the tenant matching the filters, page by page (weakly consistent).

    Raises:
        CliError: the master refused the listing.
    """
    infos: list[KvSessionInfo] = []
    cursor = ""
    while True:
        with about("the session listing"):
            listing = ctx.client.list_kv_sessions(cursor, PAGE_LIMIT, pinned, min_idle_ms)
        infos.extend(listing.sessions)
        cursor = listing.next_cursor
        if not cursor:
            return infos


def select(infos: list[KvSessionInfo], sort: str, top: int | None) -> list[KvSessionInfo]:
    """Sort ``infos`` by ``sort`` and keep the first ``top`` (all when None)."""
    key = SORT_KEYS[sort]
    if top is not None and top < len(infos):
        return heapq.nsmallest(top, infos, key=key)
    return sorted(infos, key=key)


def get_session(ctx: Context, session_id: str) -> KvSessionInfo:
    """The session's info.

    Raises:
        CliError: EXIT_NOT_FOUND for an unknown session, or another refusal.
    """
    with about(f"session {session_id!r}"):
        return ctx.client.get_kv_session(session_id)


def emit_release(ctx: Context, title: str, result: ReleaseResult) -> None:
    """Print what a release freed and kept (or the result as JSON)."""
    if ctx.out.json:
        emit_json(ctx.out, {name: getattr(result, name) for name in RELEASE_FIELDS})
        return
    text = (
        f"{title}: {result.sessions} session(s), {result.released_objects} object(s) removed, "
        f"{format_size(result.freed_bytes)} freed"
    )
    if result.pending_bytes:
        text += f" (+{format_size(result.pending_bytes)} when read leases end)"
    kept = {
        "shared": result.kept_shared,
        "hard pinned": result.kept_hard_pinned,
        "leased": result.kept_leased,
        "being written": result.kept_writing,
        "in pinned sessions": result.kept_pinned,
    }
    kept_text = ", ".join(f"{count} {why}" for why, count in kept.items() if count)
    if kept_text:
        text += f"; kept {kept_text}"
    if result.message:
        text += f" ({result.message})"
    print(text)


# -- commands ---------------------------------------------------------------------------------


def cmd_ls(ctx: Context) -> int:
    """``sessions ls``."""
    args = ctx.args
    infos = fetch_sessions(ctx, args.pinned, args.idle_over or 0)
    shown = select(infos, args.sort, args.top)
    emit_listing(ctx.out, SESSION_COLUMNS, session_rows(shown), empty_note="no sessions")
    if not ctx.out.json and not ctx.out.file_format and len(shown) < len(infos):
        note(f"showing {len(shown)} of {len(infos)} sessions")
    return EXIT_OK


def cmd_show(ctx: Context) -> int:
    """``sessions show ID``."""
    info = get_session(ctx, ctx.args.session_id)
    row = session_rows([info])[0]
    row["shared_bytes"] = info.bytes - info.exclusive_bytes
    emit_record(ctx.out, SESSION_FIELDS, row)
    return EXIT_OK


def cmd_keys(ctx: Context) -> int:
    """``sessions keys ID``."""
    session_id = ctx.args.session_id
    keys: list[str] = []
    cursor = ""
    while True:
        with about(f"session {session_id!r}"):
            page = ctx.grpc_client.list_kv_session_keys(session_id, cursor, PAGE_LIMIT)
        keys.extend(page.keys)
        cursor = page.next_cursor
        if not cursor:
            break
    rows = [{"key": key} for key in keys]
    emit_listing(ctx.out, (Column("key", "KEY"),), rows, empty_note="no keys")
    return EXIT_OK


def _set_pin(ctx: Context, pinned: bool) -> int:
    session_id = ctx.args.session_id
    with about(f"session {session_id!r}"):
        if pinned:
            ctx.grpc_client.pin_kv_session(session_id)
        else:
            ctx.grpc_client.unpin_kv_session(session_id)
    verb = "pinned" if pinned else "unpinned"
    if ctx.out.json:
        emit_json(ctx.out, {"session_id": session_id, "pinned": pinned})
    else:
        print(f"{verb} session {session_id!r}")
    return EXIT_OK


def cmd_pin(ctx: Context) -> int:
    """``sessions pin ID``."""
    return _set_pin(ctx, True)


def cmd_unpin(ctx: Context) -> int:
    """``sessions unpin ID``."""
    return _set_pin(ctx, False)


def cmd_close(ctx: Context) -> int:
    """``sessions close ID``: drop the memberships and the pin; the data stays cached."""
    session_id = ctx.args.session_id
    info = get_session(ctx, session_id)
    ctx.confirm(
        f"close session {session_id!r} ({info.member_count} members, "
        f"{format_size(info.bytes)}; the data stays cached)?"
    )
    with about(f"session {session_id!r}"):
        ctx.grpc_client.close_kv_session(session_id)
    if ctx.out.json:
        emit_json(ctx.out, {"session_id": session_id, "closed": True})
    else:
        print(f"closed session {session_id!r}; {info.member_count} members detached, data kept")
    return EXIT_OK


def cmd_release(ctx: Context) -> int:
    """``sessions release ID [--all-pages]``: close the session and remove what nothing else
    needs (with ``--all-pages``, what other sessions share too)."""
    session_id = ctx.args.session_id
    all_pages = bool(ctx.args.all_pages)
    info = get_session(ctx, session_id)
    held = (
        f"{format_size(info.bytes)}, shared ones included"
        if all_pages
        else f"{format_size(info.exclusive_bytes)} held by no other session"
    )
    ctx.confirm(
        f"release session {session_id!r}: remove up to {info.member_count} objects ({held})?"
    )
    with about(f"session {session_id!r}"):
        result = ctx.client.release_kv_session(session_id, all_pages)
    if result.sessions == 0:
        raise CliError(EXIT_NOT_FOUND, result.message or f"session {session_id!r} not found")
    emit_release(ctx, f"released session {session_id!r}", result)
    return EXIT_OK


def cmd_release_stale(ctx: Context) -> int:
    """``sessions release-stale --idle-over D [--include-pinned] [--dry-run]``."""
    args = ctx.args
    idle_ms: int = args.idle_over
    which = "session" if args.include_pinned else "unpinned session"
    if args.dry_run:
        pinned = None if args.include_pinned else False
        stale = [i for i in fetch_sessions(ctx, pinned, idle_ms) if i.idle_ms > idle_ms]
        stale = select(stale, "idle", None)
        emit_listing(ctx.out, SESSION_COLUMNS, session_rows(stale))
        total = sum(i.bytes for i in stale)
        exclusive = sum(i.exclusive_bytes for i in stale)
        note(
            f"dry run: would release {len(stale)} {which}(s) idle over "
            f"{format_duration(idle_ms)}, holding {format_size(total)} "
            f"({format_size(exclusive)} exclusive); nothing was changed"
        )
        return EXIT_OK
    ctx.confirm(f"release every {which} idle over {format_duration(idle_ms)} ({ctx.tenant_label})?")
    with about("release of stale sessions"):
        result = ctx.client.release_stale_kv_sessions(idle_ms, args.include_pinned)
    emit_release(ctx, f"released {which}s idle over {format_duration(idle_ms)}", result)
    return EXIT_OK


def cmd_release_all(ctx: Context) -> int:
    """``sessions release-all``."""
    ctx.confirm(
        f"release ALL sessions of {ctx.tenant_label}, removing every object no other session needs?"
    )
    with about("release of all sessions"):
        result = ctx.client.release_all_kv_sessions(confirm=True)
    emit_release(ctx, "released all sessions", result)
    return EXIT_OK


# -- parser -----------------------------------------------------------------------------------


def register(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], parents: CommonParents
) -> None:
    """Add ``sessions`` and its subcommands to the top-level ``commands``."""
    group = commands.add_parser(
        "sessions", help="list, inspect, pin, close and release KV sessions", parents=[parents.base]
    )
    sub = group.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)

    ls = sub.add_parser("ls", help="list sessions", parents=[parents.listing])
    ls.add_argument("--sort", choices=tuple(SORT_KEYS), default="id", help="order (default id)")
    ls.add_argument("--top", type=positive_int, metavar="N", help="only the first N")
    pin_filter = ls.add_mutually_exclusive_group()
    pin_filter.add_argument(
        "--pinned", action="store_const", const=True, dest="pinned", help="only pinned sessions"
    )
    pin_filter.add_argument(
        "--unpinned",
        action="store_const",
        const=False,
        dest="pinned",
        help="only unpinned sessions",
    )
    ls.add_argument(
        "--idle-over", type=duration_ms, metavar="DURATION", help="only sessions idle this long"
    )
    ls.set_defaults(handler=cmd_ls, pinned=None, over_http=True)

    # (name, help, handler, takes --format/--output, why --http cannot run it or "" if it can)
    single: list[tuple[str, str, Callable[[Context], int], bool, str]] = [
        ("show", "a session's accounting", cmd_show, False, ""),
        ("keys", "a session's member keys", cmd_keys, True, HTTP_GAP_KEYS),
        ("pin", "protect a session's objects from eviction", cmd_pin, False, HTTP_GAP_PIN),
        ("unpin", "remove a session's protection", cmd_unpin, False, HTTP_GAP_PIN),
        ("close", "drop a session (its data stays cached)", cmd_close, False, HTTP_GAP_CLOSE),
        ("release", "close a session and remove what nothing else needs", cmd_release, False, ""),
    ]
    for name, text, handler, listing, http_gap in single:
        parser = sub.add_parser(
            name, help=text, parents=[parents.listing if listing else parents.base]
        )
        parser.add_argument("session_id", metavar="ID")
        parser.set_defaults(handler=handler, over_http=not http_gap, http_gap=http_gap)
        if name == "release":
            parser.add_argument(
                "--all-pages",
                action="store_true",
                help="also remove the objects other sessions share (they leave those sessions)",
            )

    stale = sub.add_parser(
        "release-stale", help="release sessions idle too long", parents=[parents.listing]
    )
    stale.add_argument("--idle-over", type=duration_ms, metavar="DURATION", required=True)
    stale.add_argument("--include-pinned", action="store_true", help="also pinned sessions")
    stale.add_argument("--dry-run", action="store_true", help="only list what would go")
    stale.set_defaults(handler=cmd_release_stale, over_http=True)

    every = sub.add_parser("release-all", help="release every session", parents=[parents.base])
    every.set_defaults(handler=cmd_release_all, over_http=True)
