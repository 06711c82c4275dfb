"""The OpenAPI 3.1 document of the memory API, served at ``/openapi.json``.

Request bodies come from :data:`~.http_memory.BODIES`, the same field tables the handlers
validate with; the answers' schemas are written out here and held to the handlers by the
property-based test (tests/integration/test_memory_api_schema.py), which checks every answer
against them.

Thread-safety: :func:`openapi_document` builds a new dict on each call (callers cache it).
"""

from __future__ import annotations

from typing import Any

from mooncake_py import __version__

from .http_memory import BODIES, DEFAULT_LIST_LIMIT, MAX_IDLE_MINUTES, Field
from .http_memory_views import DISK_ACTIVITY
from .service.admin_queries import TIERS
from .service.session_overview import RANKINGS

INT = {"type": "integer", "minimum": 0}
NUM = {"type": "number"}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
TIER = {"enum": list(TIERS)}


def _object(properties: dict[str, Any], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": [name for name in properties if name not in optional],
        "additionalProperties": False,
    }


ERROR = {
    "type": "object",
    "properties": {
        "success": {"const": False},
        "error_code": {"type": "integer"},
        "error_message": STR,
        "error": STR,
    },
    "required": ["success"],
    "additionalProperties": False,
}

SESSION = _object(
    {
        "session_id": STR,
        "created_at": INT,
        "last_token_at": INT,
        "created_at_ms": INT,
        "last_token_at_ms": INT,
        "idle_minutes": INT,
        "idle_ms": INT,
        "pages_cached": INT,
        "pages_bytes": INT,
        "exclusive_bytes": INT,
        "pinned": BOOL,
    }
)

SESSIONS = _object(
    {
        "sessions": {"type": "array", "items": {"$ref": "#/components/schemas/Session"}},
        "next_cursor": STR,
        "total_sessions": INT,
        "total_pinned_sessions": INT,
        "total_pages_cached": INT,
        "total_pages_bytes": INT,
        "total_exclusive_bytes": INT,
        "total_bytes_free": INT,
    },
    optional=(
        "total_sessions",
        "total_pinned_sessions",
        "total_pages_cached",
        "total_pages_bytes",
        "total_exclusive_bytes",
        "total_bytes_free",
    ),
)

RELEASED_SESSION = _object(
    {
        "session_id": STR,
        "released_pages": INT,
        "freed_bytes": INT,
        "pending_bytes": INT,
        "kept_shared": INT,
        "kept_hard_pinned": INT,
        "kept_writing": INT,
        "freed_disk_bytes": INT,
        "message": STR,
    },
    optional=("message",),
)

RELEASED_STALE = _object(
    {
        "sessions_released": INT,
        "total_pages_freed": INT,
        "total_bytes_freed": INT,
        "freed_disk_bytes": INT,
        "pending_bytes": INT,
        "kept_shared": INT,
        "kept_hard_pinned": INT,
        "kept_writing": INT,
    }
)

RELEASED_ALL = _object(
    {
        "sessions_released": INT,
        "pages_freed": INT,
        "bytes_freed": INT,
        "freed_disk_bytes": INT,
        "pending_bytes": INT,
        "kept_shared": INT,
        "kept_hard_pinned": INT,
        "kept_writing": INT,
    }
)

RELEASED_KV_CACHE = _object(
    {
        "released_pages": INT,
        "freed_bytes": INT,
        "freed_disk_bytes": INT,
        "pending_bytes": INT,
        "kept_pinned": INT,
        "kept_hard_pinned": INT,
        "kept_writing": INT,
        "kv_cache_released": BOOL,
    }
)

SEGMENT = _object(
    {
        "name": STR,
        "segment_id": STR,
        "client_id": STR,
        "te_endpoint": STR,
        "status": STR,
        "tier": TIER,
        "used_bytes": INT,
        "capacity_bytes": INT,
        "free_bytes": INT,
        "usage_percent": NUM,
    }
)

SEGMENTS = _object(
    {
        "segments": {"type": "array", "items": {"$ref": "#/components/schemas/Segment"}},
        "total_segments": INT,
        "total_used_bytes": INT,
        "total_capacity_bytes": INT,
        "total_free_bytes": INT,
        "tiers": _object(
            {
                "memory": {"$ref": "#/components/schemas/TierOccupancy"},
                "disk": {"$ref": "#/components/schemas/TierOccupancy"},
            }
        ),
    }
)

TIER_OCCUPANCY = _object(
    {
        "segments": INT,
        "used_bytes": INT,
        "capacity_bytes": INT,
        "free_bytes": INT,
        "usage_percent": NUM,
    }
)

# The global view's disk object adds the tier's store-wide activity; a tenant's has bytes only.
DISK_STATS = _object(
    {
        **TIER_OCCUPANCY["properties"],
        **dict.fromkeys(DISK_ACTIVITY, INT),
    },
    optional=tuple(DISK_ACTIVITY),
)

SAMPLE = _object({"t": NUM, "allocated_bytes": INT, "capacity_bytes": INT, "objects": INT})

STATS = _object(
    {
        "view": {"enum": ["global", "tenant"]},
        "timestamp": NUM,
        "objects": INT,
        "allocated_bytes": INT,
        "capacity_bytes": INT,
        "free_bytes": INT,
        "usage_percent": NUM,
        "segments": INT,
        "sessions": INT,
        "pinned_sessions": INT,
        "kv_cache_state": {"enum": ["awake", "kv_cache_released"]},
        "memory": {"$ref": "#/components/schemas/TierOccupancy"},
        "disk": {"$ref": "#/components/schemas/DiskStats"},
        "counters": {"type": "object", "additionalProperties": {"type": "integer"}},
        "history": {"type": "array", "items": {"$ref": "#/components/schemas/OccupancySample"}},
    }
)


def _param(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


TENANT_PARAM = _param(
    "tenant_id",
    STR,
    "The tenant to act for: the token's own when tokens are required (403 otherwise).",
)


def _body_schema(fields: dict[str, Field]) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for name, field in fields.items():
        schema: dict[str, Any] = {"type": field.kind, "description": field.description}
        if field.minimum is not None:
            schema["minimum"] = field.minimum
        if field.maximum is not None:
            schema["maximum"] = field.maximum
        if field.max_length is not None:
            schema["maxLength"] = field.max_length
        if field.const is not None:
            schema["const"] = field.const
        if field.non_empty:
            # JSON Schema counts characters, the store UTF-8 bytes: an id of many multi-byte
            # characters may fit maxLength and still be refused (400), as the description says.
            schema["minLength"] = 1
            schema["pattern"] = "^[^\\u0000]+$"
        properties[name] = schema
    return {
        "type": "object",
        "properties": properties,
        "required": [name for name, field in fields.items() if field.required],
        "additionalProperties": False,
    }


def _answers(ok: str, description: str, *, has_body: bool) -> dict[str, Any]:
    def error(text: str) -> dict[str, Any]:
        content = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
        return {"description": text, "content": content}

    answers = {
        "200": {
            "description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ok}"}}},
        },
        "400": error("Bad input (INVALID_PARAMS)."),
        "401": error("No known bearer token (tokens are required)."),
        "403": error("The call names another tenant than the token's."),
    }
    if has_body:
        answers["415"] = error("The body is not sent as application/json.")
    return answers


def _get(summary: str, ok: str, parameters: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "parameters": [*parameters, TENANT_PARAM],
            "responses": _answers(ok, summary, has_body=False),
        }
    }


def _post(path: str, summary: str, ok: str) -> dict[str, Any]:
    body = {
        # A JSON body (``{}`` at least) with Content-Type application/json: without that
        # header a POST is refused (415), so that browsers cannot send one cross-site.
        "required": True,
        "content": {"application/json": {"schema": _body_schema(BODIES[path])}},
    }
    return {
        "post": {
            "summary": summary,
            "requestBody": body,
            "responses": _answers(ok, summary, has_body=True),
        }
    }


def openapi_document() -> dict[str, Any]:
    """The memory API's OpenAPI 3.1 document (a fresh dict)."""
    sessions_params = [
        _param("pinned", BOOL, "Only pinned (true) or unpinned (false) sessions."),
        _param(
            "min_idle_minutes",
            {"type": "number", "minimum": 0, "maximum": MAX_IDLE_MINUTES},
            "Only sessions idle so long.",
        ),
        _param(
            "limit",
            {"type": "integer", "minimum": 1, "maximum": 4096, "default": DEFAULT_LIST_LIMIT},
            "Sessions in this page.",
        ),
        _param("cursor", STR, "Continue after this session id (a page's next_cursor)."),
        _param(
            "totals",
            {"type": "boolean"},
            "Add the totals over every session (a walk of all of them); by default only a "
            "listing's first page (no cursor) has them.",
        ),
        _param(
            "sort",
            {"enum": list(RANKINGS)},
            "Answer the top `limit` sessions by this figure (one walk; no pages: cursor is "
            "ignored), with the totals.",
        ),
        _param("order", {"enum": ["desc", "asc"]}, "With sort: largest first (default) or not."),
    ]
    history = _param("history", BOOL, "Add the occupancy history (store-wide views only).")
    paths = {
        "/v1/memory/sessions": _get(
            "The tenant's KV sessions, in id order, with totals over all of them.",
            "Sessions",
            sessions_params,
        ),
        "/v1/memory/release_session": _post(
            "/v1/memory/release_session",
            "Release one session: remove its objects no other session holds, then end it.",
            "ReleasedSession",
        ),
        "/v1/memory/release_stale_sessions": _post(
            "/v1/memory/release_stale_sessions",
            "Release every session idle for longer than max_idle_minutes.",
            "ReleasedStale",
        ),
        "/v1/memory/release_all_sessions": _post(
            "/v1/memory/release_all_sessions",
            "Release every session of the tenant (needs confirm: true).",
            "ReleasedAll",
        ),
        "/v1/memory/release_kv_cache": _post(
            "/v1/memory/release_kv_cache",
            "Remove every KV-cache object of the tenant; other data stays.",
            "ReleasedKvCache",
        ),
        "/v1/memory/segments": _get(
            "Mounted segments the caller may see, memory and disk tiers, with bytes per tier.",
            "Segments",
            [],
        ),
        "/v1/memory/stats": _get(
            "The caller's view of the store's figures, with bytes per tier (memory, disk).",
            "Stats",
            [history],
        ),
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "mooncake-py memory API",
            "version": __version__,
            "description": (
                "KV sessions and the memory they hold, on the master's HTTP port. Objects are "
                "pages; bytes are sizes times replicas."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": {
                "Error": ERROR,
                "Session": SESSION,
                "Sessions": SESSIONS,
                "ReleasedSession": RELEASED_SESSION,
                "ReleasedStale": RELEASED_STALE,
                "ReleasedAll": RELEASED_ALL,
                "ReleasedKvCache": RELEASED_KV_CACHE,
                "Segment": SEGMENT,
                "Segments": SEGMENTS,
                "TierOccupancy": TIER_OCCUPANCY,
                "DiskStats": DISK_STATS,
                "OccupancySample": SAMPLE,
                "Stats": STATS,
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
    }
