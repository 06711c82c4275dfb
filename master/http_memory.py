"""The memory API on the metrics port: list KV sessions and release their memory over HTTP.

The paths, field names and shapes follow the session-release request the project started from
(``GET /v1/memory/sessions``, ``POST /v1/memory/release_session``,
``/v1/memory/release_stale_sessions``, ``/v1/memory/release_all_sessions``), extended with
``POST /v1/memory/release_kv_cache``, ``GET /v1/memory/segments`` and ``GET /v1/memory/stats``.
The OpenAPI document at ``/openapi.json`` (:mod:`.openapi`) is built from the same field
tables this module validates with, so the two cannot drift apart.

**Who may do what.** With ``--auth_tokens_file`` every path needs ``Authorization: Bearer``
(401 without a known token) and acts for the token's tenant; a ``tenant_id`` naming another
tenant is refused (403), an admin token included, as on gRPC. An admin token (or a master that
requires no tokens) sees store-wide segments, stats and occupancy history; a tenant's token sees
its own view (:mod:`~mooncake_py.master.service.tenant_views`). Without tokens ``tenant_id``
picks the tenant on a multi-tenant master.

**Bodies.** POST bodies are JSON objects: an unknown field, a wrong type or a missing required
field is 400 (INVALID_PARAMS), a body that is not JSON 400, a POST whose ``Content-Type`` is
not ``application/json`` 415. That last rule keeps a web page from another origin from
releasing memory through a browser: a cross-site request with that content type needs a CORS
preflight, which this port never grants.

**Figures.** ``pages`` are objects (the store's unit of KV cache), ``bytes`` their sizes times
their replicas. A release's ``freed_bytes`` is the memory the allocators got back at once,
``freed_disk_bytes`` the disk tier bytes it freed (the tiers' owners delete their files);
``pending_bytes`` what comes back when reads still copying from removed objects end. Segments
and stats give bytes per tier, memory and disk (:mod:`.http_memory_views`). Releases
and listings run in slices (:mod:`~mooncake_py.master.service.slices`): other callers are
served between them.

Thread-safety: a :class:`MemoryApi` is immutable after construction; its handlers run on many
HTTP threads at once (every state access takes the service lock).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from mooncake_py.errors import ErrorCode
from mooncake_py.types import KvSessionInfo, ReleaseResult, valid_tenant_id

from .http_common import BadRequest, Reply, Request, Route, error_reply, json_reply, simple_error
from .http_memory_views import percent, segments_json, tier_stats
from .occupancy import OccupancyHistory
from .service.admin_queries import AdminQueries
from .service.context import DEFAULT_TENANT
from .service.facade import MasterService
from .service.session_overview import RANKINGS, SessionTotals, overview_sliced
from .service.slices import drive
from .state.session_registry import MAX_SESSION_ID_BYTES
from .transport.auth import Denial

NOTHING_CACHED = "no cached pages for this session"
"""The ``message`` of a session release that released nothing (the request's own words)."""

CONFIRM_NEEDED = 'release_all_sessions needs "confirm": true'

MAX_IDLE_MINUTES = 1e12
"""The largest idle bound in minutes (about two million years)."""

DEFAULT_LIST_LIMIT = 1000
"""Sessions one ``GET /v1/memory/sessions`` page holds unless ``limit`` says otherwise."""


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    """One field of a JSON request body.

    Attributes:
        kind: ``"string"``, ``"boolean"`` or ``"number"`` (JSON Schema's names).
        required: the body must carry it.
        description: what it means (into the OpenAPI document).
        minimum: the least value of a number.
        maximum: the greatest value of a number.
        max_length: the most characters of a string (None: no bound).
        non_empty: a string must not be empty.
        const: the one value accepted (None: any of its kind).
        refusal: the message when the field is missing or not ``const`` (None: a generic one).
    """

    kind: str
    required: bool
    description: str
    minimum: float | None = None
    maximum: float | None = None
    max_length: int | None = None
    non_empty: bool = False
    const: Any = None
    refusal: str | None = None


TENANT_FIELD = Field(
    "string",
    False,
    "The tenant to act for: must be the token's own when tokens are required; picks the "
    "tenant on a multi-tenant master without tokens.",
)

RELEASE_SESSION_BODY: dict[str, Field] = {
    "session_id": Field(
        "string",
        True,
        "The session to release: 1 to 4096 UTF-8 bytes, no NUL.",
        max_length=MAX_SESSION_ID_BYTES,
        non_empty=True,
    ),
    "all_pages": Field(
        "boolean",
        False,
        "Also remove the session's objects that other sessions share (by default they stay "
        "cached and only leave this session). Hard-pinned objects and writes in flight stay.",
    ),
    "tenant_id": TENANT_FIELD,
}
RELEASE_STALE_BODY: dict[str, Field] = {
    "max_idle_minutes": Field(
        "number",
        True,
        "Release sessions idle for longer than this.",
        minimum=0,
        maximum=MAX_IDLE_MINUTES,
    ),
    "include_pinned": Field("boolean", False, "Release pinned sessions too (default false)."),
    "tenant_id": TENANT_FIELD,
}
RELEASE_ALL_BODY: dict[str, Field] = {
    "confirm": Field(
        "boolean",
        True,
        "Must be true: releasing every session is opt-in (400 without it).",
        const=True,
        refusal=CONFIRM_NEEDED,
    ),
    "tenant_id": TENANT_FIELD,
}
RELEASE_KV_CACHE_BODY: dict[str, Field] = {
    "keep_pinned": Field(
        "boolean", False, "Keep objects of pinned sessions and TTL pins (default true)."
    ),
    "tenant_id": TENANT_FIELD,
}

BODIES: dict[str, dict[str, Field]] = {
    "/v1/memory/release_session": RELEASE_SESSION_BODY,
    "/v1/memory/release_stale_sessions": RELEASE_STALE_BODY,
    "/v1/memory/release_all_sessions": RELEASE_ALL_BODY,
    "/v1/memory/release_kv_cache": RELEASE_KV_CACHE_BODY,
}
"""Each POST path's body fields (the OpenAPI document is built from these)."""


def _invalid(message: str) -> BadRequest:
    return BadRequest(error_reply(400, ErrorCode.INVALID_PARAMS, message))


def parse_body(request: Request, fields: Mapping[str, Field]) -> dict[str, Any]:
    """The request's JSON body, checked against ``fields``.

    Returns:
        The body's fields (absent optional ones are absent).

    Raises:
        BadRequest: 415 for a content type other than JSON; 400 for a body that is not a JSON
            object, an unknown field, a wrong type, a number below its minimum or not finite,
            or a missing required field.
    """
    media = (request.content_type or "").split(";")[0].strip().lower()
    if media != "application/json":
        message = "POST bodies must be JSON (Content-Type: application/json)"
        raise BadRequest(error_reply(415, ErrorCode.INVALID_PARAMS, message))
    try:
        # Only an empty body means "no fields": anything else must be JSON, and JSON's
        # whitespace is narrower than bytes.strip()'s (a lone form feed is not JSON).
        body = json.loads(request.body) if request.body else {}
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser
        raise _invalid("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise _invalid("the body must be a JSON object")
    for name, value in body.items():
        field = fields.get(name)
        if field is None:
            raise _invalid(f"unknown field {name!r}")
        _check_type(name, value, field)
    for name, field in fields.items():
        missing = field.required and name not in body
        if missing or (field.const is not None and body.get(name, field.const) != field.const):
            raise _invalid(field.refusal or f"missing field {name!r}")
    return body


def _check_type(name: str, value: Any, field: Field) -> None:
    if field.kind == "boolean":
        ok = isinstance(value, bool)
    elif field.kind == "string":
        ok = isinstance(value, str)
        if ok and not _encodable(value):
            raise _invalid(f"field {name!r} is not valid Unicode (a lone surrogate)")
        if ok and field.non_empty and not value:
            raise _invalid(f"field {name!r} must not be empty")
        if ok and field.max_length is not None and len(value) > field.max_length:
            raise _invalid(f"field {name!r} is longer than {field.max_length} characters")
    else:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok and not _finite(value):
            raise _invalid(f"field {name!r} must be a finite number")
        if ok and field.minimum is not None and value < field.minimum:
            raise _invalid(f"field {name!r} must be at least {field.minimum:g}")
        if ok and field.maximum is not None and value > field.maximum:
            raise _invalid(f"field {name!r} must be at most {field.maximum:g}")
    if not ok:
        raise _invalid(f"field {name!r} must be a {field.kind}")


def _encodable(text: str) -> bool:
    """Whether ``text`` is valid Unicode (JSON's ``\\ud800`` escapes can make lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _finite(value: float) -> bool:
    """Whether a JSON number is finite as a float (a 400-digit integer is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


# Bounded lengths: no query value turns into an unbounded int() or float() conversion.
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]{0,30})(?:\.[0-9]{1,30})?(?:[eE][-+]?[0-9]{1,4})?")
_JSON_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")


def _bool_param(request: Request, name: str) -> bool | None:
    """A query flag: ``true`` or ``false`` exactly (None when absent; anything else 400)."""
    value = request.param(name)
    if value is None:
        return None
    if value in ("true", "false"):
        return value == "true"
    raise _invalid(f"query parameter {name!r} must be true or false")


def _number_param(request: Request, name: str, least: float, most: float) -> float | None:
    """A query number in JSON's syntax in [least, most] (None when absent)."""
    value = request.param(name)
    if value is None:
        return None
    number = float(value) if _JSON_NUMBER.fullmatch(value) else math.nan  # 1e9999 -> inf
    if not least <= number <= most:  # NaN (not a number) fails both
        raise _invalid(f"query parameter {name!r} must be a number in [{least:g}, {most:g}]")
    return number


def _integer_param(request: Request, name: str, low: int, high: int, default: int) -> int:
    """A query integer in [low, high] (``default`` when absent)."""
    value = request.param(name)
    if value is None:
        return default
    if _JSON_INTEGER.fullmatch(value) and low <= int(value) <= high:
        return int(value)
    raise _invalid(f"query parameter {name!r} must be an integer in [{low}, {high}]")


class MemoryApi:
    """The ``/v1/memory`` paths of one master (see the module docstring).

    Args:
        service: the master's service.
        occupancy: the sampled occupancy history (None: ``history`` is always empty).
        wall_clock: Unix time, for ``timestamp``.

    Attributes:
        routes: path -> :class:`~.http_common.Route`, merged into the metrics port's table.
    """

    def __init__(
        self,
        service: MasterService,
        occupancy: OccupancyHistory | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._service = service
        self._occupancy = occupancy
        self._wall_clock = wall_clock
        self._multi_tenant = service.context.tenants.multi_tenant
        self._page = service.context.state.sessions.limits.max_batch
        self._queries = AdminQueries(service.context)
        get, post = "GET", "POST"
        self.routes: dict[str, Route] = {
            "/v1/memory/sessions": Route(get, self._sessions, True),
            "/v1/memory/release_session": Route(post, self._release_session, True),
            "/v1/memory/release_stale_sessions": Route(post, self._release_stale, True),
            "/v1/memory/release_all_sessions": Route(post, self._release_all, True),
            "/v1/memory/release_kv_cache": Route(post, self._release_kv_cache, True),
            "/v1/memory/segments": Route(get, self._segments, True),
            "/v1/memory/stats": Route(get, self._stats, True),
        }

    # -- who the call acts for ---------------------------------------------------------------

    def _acting_tenant(self, request: Request, named: str | None) -> str:
        """The tenant a call acts for, from the token and the ``tenant_id`` it names.

        Raises:
            BadRequest: 403 when it names another tenant than its token's; 400 for an invalid
                tenant id on a multi-tenant master.
        """
        named = named or ""
        if request.token_tenant is not None:
            if named and named != request.token_tenant:
                raise BadRequest(simple_error(403, Denial.PERMISSION_DENIED.value))
            return request.token_tenant
        if named and self._multi_tenant and not valid_tenant_id(named):
            raise _invalid(f"invalid tenant_id {named!r}")
        return named or DEFAULT_TENANT

    # -- sessions ----------------------------------------------------------------------------

    def _sessions(self, request: Request) -> Reply:
        tenant = self._acting_tenant(request, request.param("tenant_id"))
        pinned = _bool_param(request, "pinned")
        min_idle = _number_param(request, "min_idle_minutes", 0.0, MAX_IDLE_MINUTES)
        limit = _integer_param(request, "limit", 1, self._page, DEFAULT_LIST_LIMIT)
        cursor = request.param("cursor") or ""
        ranking = request.param("sort")
        if ranking is not None and ranking not in RANKINGS:
            raise _invalid(f"query parameter 'sort' must be one of {', '.join(RANKINGS)}")
        order = request.param("order")
        if order not in (None, "asc", "desc"):
            raise _invalid("query parameter 'order' must be asc or desc")
        if ranking is not None:
            cursor = ""  # a ranking is one answer: it has no pages to continue
        # Totals cost a walk of every session: by default only a listing's first page has them.
        with_totals = _bool_param(request, "totals")
        if with_totals is None:
            with_totals = not cursor
        min_idle_ms = 0.0 if min_idle is None else min_idle * 60_000
        context = self._service.context
        next_cursor = ""
        if ranking is not None:
            # One walk: the totals and the top ``limit`` sessions by the figure.
            code, totals, infos = drive(
                overview_sliced(
                    context, tenant, ranking, order != "asc", limit, pinned, min_idle_ms
                )
            )
        else:
            code, totals, _ = (
                drive(overview_sliced(context, tenant))
                if with_totals
                else (ErrorCode.OK, SessionTotals(), [])
            )
            if code == ErrorCode.OK:
                listing = self._service.sessions.list_kv_sessions_sliced(
                    tenant, cursor, limit, pinned, math.ceil(min_idle_ms)
                )
                code, infos, next_cursor = drive(listing)
        if code != ErrorCode.OK:
            raise BadRequest(error_reply(400, code))
        answer: dict[str, Any] = {
            "sessions": [session_json(info) for info in infos],
            "next_cursor": next_cursor,
        }
        if with_totals or ranking is not None:
            answer.update(
                {
                    "total_sessions": totals.sessions,
                    "total_pinned_sessions": totals.pinned,
                    "total_pages_cached": totals.pages,
                    "total_pages_bytes": totals.bytes,
                    "total_exclusive_bytes": totals.exclusive_bytes,
                    "total_bytes_free": self._free_bytes(request),
                }
            )
        return json_reply(200, answer)

    def _free_bytes(self, request: Request) -> int:
        # Free memory: what a release makes room in (disk tiers are where memory spills to).
        details = self._queries.segments(request.segment_scope)
        return sum(max(0, d.capacity_bytes - d.used_bytes) for d in details if not d.disk)

    # -- releases ----------------------------------------------------------------------------

    def _release_session(self, request: Request) -> Reply:
        body = parse_body(request, RELEASE_SESSION_BODY)
        tenant = self._acting_tenant(request, body.get("tenant_id"))
        session_id = body["session_id"]
        steps = self._service.releases.release_kv_session_sliced(
            tenant, session_id, all_pages=bool(body.get("all_pages", False))
        )
        code, result = drive(steps)
        if code != ErrorCode.OK:
            return error_reply(400, code, f"invalid session id {session_id!r}")
        answer: dict[str, Any] = {
            "session_id": session_id,
            "released_pages": result.released_objects,
            "freed_bytes": result.freed_bytes,
            **_kept(result),
        }
        if not result.released_objects:
            answer["message"] = NOTHING_CACHED
        return json_reply(200, answer)

    def _release_stale(self, request: Request) -> Reply:
        body = parse_body(request, RELEASE_STALE_BODY)
        tenant = self._acting_tenant(request, body.get("tenant_id"))
        # Minutes to whole milliseconds (at most MAX_IDLE_MINUTES: no overflow).
        max_idle_ms = int(float(body["max_idle_minutes"]) * 60_000)
        include_pinned = bool(body.get("include_pinned", False))
        steps = self._service.releases.release_stale_kv_sessions_sliced(
            tenant, max_idle_ms, include_pinned
        )
        code, result = drive(steps)
        if code != ErrorCode.OK:
            return error_reply(400, code)
        return json_reply(
            200,
            {
                "sessions_released": result.sessions,
                "total_pages_freed": result.released_objects,
                "total_bytes_freed": result.freed_bytes,
                **_kept(result),
            },
        )

    def _release_all(self, request: Request) -> Reply:
        body = parse_body(request, RELEASE_ALL_BODY)
        tenant = self._acting_tenant(request, body.get("tenant_id"))
        code, result = drive(self._service.releases.release_all_kv_sessions_sliced(tenant, True))
        if code != ErrorCode.OK:
            return error_reply(400, code, result.message)
        return json_reply(
            200,
            {
                "sessions_released": result.sessions,
                "pages_freed": result.released_objects,
                "bytes_freed": result.freed_bytes,
                **_kept(result),
            },
        )

    def _release_kv_cache(self, request: Request) -> Reply:
        body = parse_body(request, RELEASE_KV_CACHE_BODY)
        tenant = self._acting_tenant(request, body.get("tenant_id"))
        keep_pinned = bool(body.get("keep_pinned", True))
        code, result = drive(self._service.releases.release_kv_cache_sliced(tenant, keep_pinned))
        if code != ErrorCode.OK:
            return error_reply(400, code)
        return json_reply(200, release_kv_cache_json(result))

    # -- segments and stats ------------------------------------------------------------------

    def _segments(self, request: Request) -> Reply:
        self._acting_tenant(request, request.param("tenant_id"))
        return json_reply(200, segments_json(self._queries.segments(request.segment_scope)))

    def _stats(self, request: Request) -> Reply:
        tenant = self._acting_tenant(request, request.param("tenant_id"))
        want_history = bool(_bool_param(request, "history"))
        figures = self._service.stats(tenant, all_tenants=request.admin)
        # A tenant's figures carry no disk bytes: they come from the disk tiers it may use.
        visible = [] if request.admin else self._queries.segments(request.segment_scope)
        allocated = int(figures.get("allocated_bytes", 0))
        capacity = int(figures.get("capacity_bytes", 0))
        history: list[dict[str, Any]] = []
        if want_history and request.admin and self._occupancy is not None:
            history = [dataclasses.asdict(s) for s in self._occupancy.samples()]
        answer = {
            "view": "global" if request.admin else "tenant",
            "timestamp": self._wall_clock(),
            "objects": int(figures.get("objects", 0)),
            "allocated_bytes": allocated,
            "capacity_bytes": capacity,
            "free_bytes": max(0, capacity - allocated),
            "usage_percent": percent(allocated, capacity),
            "segments": int(figures.get("segments", 0)),
            "sessions": int(figures.get("sessions", 0)),
            "pinned_sessions": int(figures.get("pinned_sessions", 0)),
            "kv_cache_state": self._service.kv_cache_state(tenant),
            **tier_stats(figures, visible, request.admin),
            "counters": {k: int(v) for k, v in sorted(figures.items())},
            "history": history,
        }
        return json_reply(200, answer)


def session_json(info: KvSessionInfo) -> dict[str, Any]:
    """One session as ``GET /v1/memory/sessions`` lists it (the request's field names)."""
    return {
        "session_id": info.session_id,
        "created_at": int(info.created_at),
        "last_token_at": int(info.last_active_at),
        "created_at_ms": int(info.created_at * 1000),
        "last_token_at_ms": int(info.last_active_at * 1000),
        "idle_minutes": info.idle_ms // 60_000,
        "idle_ms": info.idle_ms,
        "pages_cached": info.member_count,
        "pages_bytes": info.bytes,
        "exclusive_bytes": info.exclusive_bytes,
        "pinned": info.pinned,
    }


def release_kv_cache_json(result: ReleaseResult) -> dict[str, Any]:
    """A ``release_kv_cache`` answer."""
    return {
        "released_pages": result.released_objects,
        "freed_bytes": result.freed_bytes,
        "freed_disk_bytes": result.freed_disk_bytes,
        "pending_bytes": result.pending_bytes,
        "kept_pinned": result.kept_pinned,
        "kept_hard_pinned": result.kept_hard_pinned,
        "kept_writing": result.kept_writing,
        "kv_cache_released": result.released_objects > 0,
    }


def _kept(result: ReleaseResult) -> dict[str, int]:
    """What a session release left and why (with ``pending_bytes``), and the disk tier bytes
    it freed, as every answer has it."""
    return {
        "freed_disk_bytes": result.freed_disk_bytes,
        "pending_bytes": result.pending_bytes,
        "kept_shared": result.kept_shared,
        "kept_hard_pinned": result.kept_hard_pinned,
        "kept_writing": result.kept_writing,
    }
