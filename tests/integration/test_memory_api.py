"""The memory API (/v1/memory/...) on a real master's HTTP port, with sessions written by real
clients: the request's fields with exact figures, releases that free exactly a session's
exclusive bytes, bad input, tokens and tenants, and the master as a subprocess."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mooncake_py import MooncakeDistributedStore, ObjectDataType, ReplicateConfig
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.transport.auth import Denial
from mooncake_py.testing import InProcessMaster, MasterProcess

# Multiples of the allocator's alignment, so that allocated bytes equal the objects' sizes and
# "frees exactly its exclusive bytes" can be checked against the allocator's own count.
PAGE = 4096
TOKENS = {
    "token-a": "tenant-a",
    "token-b": "tenant-b",
    "token-admin": {"tenant": "ops", "role": "admin"},
}
JSON_TYPE = "application/json"


def call(
    port: int,
    path: str,
    body: Any = None,
    *,
    method: str | None = None,
    token: str | None = None,
    content_type: str | None = JSON_TYPE,
    raw: bytes | None = None,
) -> tuple[int, dict[str, str], Any]:
    """One request; returns (status, lowercased headers, decoded JSON or raw bytes)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        payload = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        if payload is not None and content_type:
            headers["Content-Type"] = content_type
        verb = method or ("GET" if payload is None else "POST")
        connection.request(verb, path, body=payload, headers=headers)
        reply = connection.getresponse()
        data = reply.read()
        answer_headers = {k.lower(): v for k, v in reply.getheaders()}
        if answer_headers.get("content-type", "").startswith(JSON_TYPE):
            return reply.status, answer_headers, json.loads(data)
        return reply.status, answer_headers, data
    finally:
        connection.close()


def ok(port: int, path: str, body: Any = None, **kwargs: Any) -> Any:
    status, _, answer = call(port, path, body, **kwargs)
    assert status == 200, (path, status, answer)
    return answer


def tagged(*sessions: str, keys: int = 1, **extra: Any) -> ReplicateConfig:
    return ReplicateConfig(kv_sessions=[list(sessions)] * keys, **extra)


def http_port(master: InProcessMaster) -> int:
    return master.metrics_port


@pytest.fixture
def checked_master() -> Iterator[InProcessMaster]:
    with InProcessMaster() as running:
        yield running
        running.service.check()


def allocated(port: int) -> int:
    return int(ok(port, "/v1/memory/stats")["allocated_bytes"])


def write_conversations(store: MooncakeDistributedStore) -> None:
    """conv-a: 3 pages of its own plus one shared with conv-b; conv-b: 1 of its own, pinned."""
    assert (
        store.put_batch([f"a{i}" for i in range(3)], [b"a" * PAGE] * 3, tagged("conv-a", keys=3))
        == 0
    )
    assert store.put("shared", b"s" * PAGE, tagged("conv-a", "conv-b")) == 0
    assert store.put("b0", b"b" * (2 * PAGE), tagged("conv-b")) == 0
    store.pin_kv_session("conv-b")


def test_sessions_answer_the_requests_fields_with_exact_figures(
    checked_master: InProcessMaster, make_store
) -> None:  # type: ignore[no-untyped-def]
    port = http_port(checked_master)
    store = make_store(checked_master.address, 8 << 20)
    write_conversations(store)
    listing = ok(port, "/v1/memory/sessions")
    by_id = {s["session_id"]: s for s in listing["sessions"]}
    assert list(by_id) == ["conv-a", "conv-b"]
    a, b = by_id["conv-a"], by_id["conv-b"]
    assert (a["pages_cached"], a["pages_bytes"], a["exclusive_bytes"], a["pinned"]) == (
        4,
        4 * PAGE,
        3 * PAGE,
        False,
    )
    assert (b["pages_cached"], b["pages_bytes"], b["exclusive_bytes"], b["pinned"]) == (
        2,
        3 * PAGE,
        2 * PAGE,
        True,
    )
    typed = store.get_kv_session("conv-a")
    assert a["created_at"] == int(typed.created_at)
    assert a["last_token_at"] == int(typed.last_active_at)
    assert a["created_at_ms"] == int(typed.created_at * 1000)
    assert a["last_token_at_ms"] == int(typed.last_active_at * 1000)
    assert a["idle_minutes"] == 0 and a["idle_ms"] >= 0
    assert {k: listing[k] for k in listing if k.startswith("total_")} == {
        "total_sessions": 2,
        "total_pinned_sessions": 1,
        "total_pages_cached": 6,
        "total_pages_bytes": 7 * PAGE,
        "total_exclusive_bytes": 5 * PAGE,
        "total_bytes_free": (8 << 20) - 6 * PAGE,
    }
    assert listing["next_cursor"] == ""
    # Filters and pages; the totals stay those of every session.
    pinned = ok(port, "/v1/memory/sessions?pinned=true")
    assert [s["session_id"] for s in pinned["sessions"]] == ["conv-b"]
    assert pinned["total_sessions"] == 2
    unpinned = ok(port, "/v1/memory/sessions?pinned=false")
    assert [s["session_id"] for s in unpinned["sessions"]] == ["conv-a"]
    assert ok(port, "/v1/memory/sessions?min_idle_minutes=60")["sessions"] == []
    first = ok(port, "/v1/memory/sessions?limit=1")
    assert [s["session_id"] for s in first["sessions"]] == ["conv-a"]
    assert first["next_cursor"] == "conv-a"
    second = ok(port, "/v1/memory/sessions?limit=1&cursor=conv-a")
    assert [s["session_id"] for s in second["sessions"]] == ["conv-b"]
    assert second["next_cursor"] == ""
    # Without totals: the same pages, and no totals.
    for query, ids, next_cursor in (("", ["conv-a"], "conv-a"), ("&cursor=conv-a", ["conv-b"], "")):
        bare = ok(port, f"/v1/memory/sessions?limit=1&totals=false{query}")
        assert set(bare) == {"sessions", "next_cursor"}
        assert ([s["session_id"] for s in bare["sessions"]], bare["next_cursor"]) == (
            ids,
            next_cursor,
        )


def test_release_session_frees_exactly_its_exclusive_bytes(
    checked_master: InProcessMaster, make_store
) -> None:  # type: ignore[no-untyped-def]
    port = http_port(checked_master)
    store = make_store(checked_master.address, 8 << 20)
    write_conversations(store)
    exclusive = store.get_kv_session("conv-a").exclusive_bytes
    before = allocated(port)
    answer = ok(port, "/v1/memory/release_session", {"session_id": "conv-a"})
    assert answer == {
        "session_id": "conv-a",
        "released_pages": 3,
        "freed_bytes": 3 * PAGE,
        "pending_bytes": 0,
        "freed_disk_bytes": 0,
        "kept_shared": 1,
        "kept_hard_pinned": 0,
        "kept_writing": 0,
    }
    assert before - allocated(port) == answer["freed_bytes"] == exclusive
    assert store.batch_is_exist(["a0", "a1", "a2", "shared", "b0"]) == [0, 0, 0, 1, 1]
    # The shared page now belongs to conv-b alone.
    assert store.get_kv_session("conv-b").exclusive_bytes == 3 * PAGE
    # Unknown session, or a second release: nothing, and the request's message.
    for session_id in ("conv-a", "never-seen"):
        assert ok(port, "/v1/memory/release_session", {"session_id": session_id}) == {
            "session_id": session_id,
            "released_pages": 0,
            "freed_bytes": 0,
            "pending_bytes": 0,
            "freed_disk_bytes": 0,
            "kept_shared": 0,
            "kept_hard_pinned": 0,
            "kept_writing": 0,
            "message": "no cached pages for this session",
        }


def test_all_pages_also_removes_what_other_sessions_share(
    checked_master: InProcessMaster, make_store
) -> None:  # type: ignore[no-untyped-def]
    port = http_port(checked_master)
    store = make_store(checked_master.address, 8 << 20)
    write_conversations(store)
    before = allocated(port)
    answer = ok(port, "/v1/memory/release_session", {"session_id": "conv-a", "all_pages": True})
    assert (answer["released_pages"], answer["freed_bytes"], answer["kept_shared"]) == (
        4,
        4 * PAGE,
        0,
    )
    assert before - allocated(port) == 4 * PAGE
    assert store.batch_is_exist(["shared", "b0"]) == [0, 1]
    assert store.get_kv_session("conv-b").member_count == 1


def test_release_stale_all_and_kv_cache(make_store) -> None:  # type: ignore[no-untyped-def]
    clock = FakeClock()
    with InProcessMaster(clock=clock, background=False) as master:
        port = http_port(master)
        store = make_store(master.address, 8 << 20)
        assert store.put("old", b"o" * PAGE, tagged("old")) == 0
        assert store.put("old-pinned", b"p" * PAGE, tagged("old-pinned")) == 0
        store.pin_kv_session("old-pinned")
        clock.advance(45 * 60)
        assert store.put("fresh", b"f" * PAGE, tagged("fresh")) == 0
        stale = ok(port, "/v1/memory/release_stale_sessions", {"max_idle_minutes": 30})
        assert stale == {
            "sessions_released": 1,
            "total_pages_freed": 1,
            "total_bytes_freed": PAGE,
            "pending_bytes": 0,
            "freed_disk_bytes": 0,
            "kept_shared": 0,
            "kept_hard_pinned": 0,
            "kept_writing": 0,
        }
        assert store.batch_is_exist(["old", "old-pinned", "fresh"]) == [0, 1, 1]
        body = {"max_idle_minutes": 30, "include_pinned": True}
        assert ok(port, "/v1/memory/release_stale_sessions", body)["sessions_released"] == 1
        # release_all_sessions is opt-in: without confirm nothing goes.
        for refused in ({}, {"confirm": False}):
            status, _, answer = call(port, "/v1/memory/release_all_sessions", refused)
            assert status == 400 and answer["error_code"] == -600, answer
            assert answer["error_message"] == 'release_all_sessions needs "confirm": true'
        assert store.is_exist("fresh") == 1
        assert ok(port, "/v1/memory/release_all_sessions", {"confirm": True}) == {
            "sessions_released": 1,
            "pages_freed": 1,
            "bytes_freed": PAGE,
            "pending_bytes": 0,
            "freed_disk_bytes": 0,
            "kept_shared": 0,
            "kept_hard_pinned": 0,
            "kept_writing": 0,
        }
        # release_kv_cache: KV-cache objects go, weights stay; the state says it happened.
        weights = ReplicateConfig(data_type=ObjectDataType.WEIGHT)
        assert store.put("kv", b"k" * PAGE) == 0
        assert store.put("weights", b"w" * PAGE, weights) == 0
        assert ok(port, "/v1/memory/stats")["kv_cache_state"] == "awake"
        assert ok(port, "/v1/memory/release_kv_cache", {}) == {
            "released_pages": 1,
            "freed_bytes": PAGE,
            "pending_bytes": 0,
            "freed_disk_bytes": 0,
            "kept_pinned": 0,
            "kept_hard_pinned": 0,
            "kept_writing": 0,
            "kv_cache_released": True,
        }
        assert store.batch_is_exist(["kv", "weights"]) == [0, 1]
        assert ok(port, "/v1/memory/stats")["kv_cache_state"] == "kv_cache_released"
        assert store.put("kv2", b"k" * PAGE) == 0
        assert ok(port, "/v1/memory/stats")["kv_cache_state"] == "awake"
        master.service.check()


def test_segments_and_stats_match_the_service(checked_master: InProcessMaster, make_store) -> None:  # type: ignore[no-untyped-def]
    port = http_port(checked_master)
    store = make_store(checked_master.address, 8 << 20)
    make_store(checked_master.address, 4 << 20)
    write_conversations(store)
    segments = ok(port, "/v1/memory/segments")
    assert segments["total_segments"] == 2
    assert sorted(s["capacity_bytes"] for s in segments["segments"]) == [4 << 20, 8 << 20]
    assert segments["total_used_bytes"] == 6 * PAGE
    assert segments["total_free_bytes"] == (12 << 20) - 6 * PAGE
    for segment in segments["segments"]:
        assert segment["free_bytes"] == segment["capacity_bytes"] - segment["used_bytes"]
        assert segment["status"] == "OK"
    stats = ok(port, "/v1/memory/stats?history=true")
    service = checked_master.service.stats()
    assert stats["view"] == "global"
    assert (
        (stats["objects"], stats["allocated_bytes"], stats["capacity_bytes"])
        == (
            service["objects"],
            service["allocated_bytes"],
            service["capacity_bytes"],
        )
        == (5, 6 * PAGE, 12 << 20)
    )
    assert (stats["sessions"], stats["pinned_sessions"]) == (2, 1)
    assert stats["counters"]["objects"] == 5
    # The history starts when the master starts serving.
    assert stats["history"] and stats["history"][0]["capacity_bytes"] == 0
    checked_master._server.occupancy.sample()  # noqa: SLF001 - take one now rather than wait
    latest = ok(port, "/v1/memory/stats?history=true")["history"][-1]
    assert (latest["allocated_bytes"], latest["capacity_bytes"], latest["objects"]) == (
        6 * PAGE,
        12 << 20,
        5,
    )
    checked_master._server.occupancy.check()  # noqa: SLF001


def test_bad_input_gets_a_documented_code_and_changes_nothing(
    checked_master: InProcessMaster, make_store
) -> None:  # type: ignore[no-untyped-def]
    port = http_port(checked_master)
    store = make_store(checked_master.address, 8 << 20)
    write_conversations(store)
    release = "/v1/memory/release_session"
    cases: list[tuple[dict[str, Any], int]] = [
        ({"raw": b"not json"}, 400),
        ({"raw": b"[1, 2]"}, 400),
        ({"body": {"session_id": "conv-a", "surprise": 1}}, 400),
        ({"body": {"session_id": 7}}, 400),
        ({"body": {"session_id": "conv-a", "all_pages": "yes"}}, 400),
        ({"body": {}}, 400),
        ({"body": {"session_id": ""}}, 400),
        ({"body": {"session_id": "conv-a"}, "content_type": "text/plain"}, 415),
        ({"body": {"session_id": "conv-a"}, "content_type": None}, 415),
    ]
    for case, expected in cases:
        status, _, answer = call(
            port,
            release,
            case.get("body"),
            raw=case.get("raw"),
            content_type=case.get("content_type", JSON_TYPE),
        )
        assert status == expected, (case, status, answer)
        assert answer["success"] is False and answer["error_code"] == -600, answer
    stale = "/v1/memory/release_stale_sessions"
    for body in ({"max_idle_minutes": -1}, {"max_idle_minutes": "1"}, {"max_idle_minutes": True}):
        assert call(port, stale, body)[0] == 400, body
    # Only an empty body means "no fields"; bytes that str.strip() drops but JSON does not
    # allow are not one (accepted, this would release every object below).
    for raw in (b"\x0c", b" \x0b ", b"\x00"):
        assert call(port, "/v1/memory/release_kv_cache", raw=raw)[0] == 400, raw
    for query in ("pinned=maybe", "limit=0", "limit=4097", "limit=x", "min_idle_minutes=-1"):
        assert call(port, f"/v1/memory/sessions?{query}")[0] == 400, query
    assert call(port, release, method="GET")[0] == 405
    assert call(port, "/v1/memory/sessions", {}, method="POST")[0] == 405
    assert call(port, "/v1/memory/nothing-here")[0] == 404
    assert store.batch_is_exist(["a0", "a1", "a2", "shared", "b0"]) == [1] * 5
    assert ok(port, "/v1/memory/sessions")["total_sessions"] == 2


@pytest.fixture
def token_master(tmp_path: Path) -> Iterator[InProcessMaster]:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(TOKENS))
    with InProcessMaster(auth_tokens_file=str(path)) as running:
        yield running
        running.service.check()


def token_store(address: str, token: str) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    config = {"master_server_address": address, "global_segment_size": 8 << 20}
    assert store.setup({**config, "auth_token": token}) == 0
    return store


def test_tokens_scope_every_path_to_the_tenant(token_master: InProcessMaster) -> None:
    port = http_port(token_master)
    a = token_store(token_master.address, "token-a")
    b = token_store(token_master.address, "token-b")
    try:
        assert a.put("a-page", b"a" * PAGE, tagged("conv-a")) == 0
        assert b.put("b-page", b"b" * PAGE, tagged("conv-b")) == 0
        paths = ["/v1/memory/sessions", "/v1/memory/segments", "/v1/memory/stats"]
        for path in paths:
            status, headers, answer = call(port, path)
            assert (status, headers.get("www-authenticate")) == (401, "Bearer"), path
            assert call(port, path, token="no-such-token")[0] == 401
            assert call(port, path + "?tenant_id=tenant-b", token="token-a")[0] == 403
        assert call(port, "/v1/memory/release_session", {"session_id": "conv-b"})[0] == 401
        refused = {"session_id": "conv-b", "tenant_id": "tenant-b"}
        status, _, answer = call(port, "/v1/memory/release_session", refused, token="token-a")
        assert status == 403 and answer["success"] is False, answer
        assert answer["error"] == Denial.PERMISSION_DENIED.value
        # Tenant A sees and releases only its own; B's session of the same shape is untouched.
        sessions = ok(port, "/v1/memory/sessions", token="token-a")
        assert [s["session_id"] for s in sessions["sessions"]] == ["conv-a"]
        answer = ok(port, "/v1/memory/release_session", {"session_id": "conv-b"}, token="token-a")
        assert answer["released_pages"] == 0
        assert b.is_exist("b-page") == 1
        stats = ok(port, "/v1/memory/stats?history=true", token="token-a")
        assert (stats["view"], stats["objects"], stats["history"]) == ("tenant", 1, [])
        assert a.pin_kv_session("conv-a") == 0
        pinned = ok(port, "/v1/memory/stats", token="token-a")
        assert (pinned["sessions"], pinned["pinned_sessions"]) == (1, 1)
        segments = ok(port, "/v1/memory/segments", token="token-a")
        assert segments["total_segments"] == 1 and segments["total_used_bytes"] == PAGE
        admin = ok(port, "/v1/memory/stats?history=true", token="token-admin")
        assert admin["view"] == "global" and admin["objects"] == 2 and admin["history"]
        assert ok(port, "/v1/memory/segments", token="token-admin")["total_segments"] == 2
        done = ok(port, "/v1/memory/release_all_sessions", {"confirm": True}, token="token-a")
        assert (done["sessions_released"], done["bytes_freed"]) == (1, PAGE)
        assert a.is_exist("a-page") == 0 and b.is_exist("b-page") == 1
        # The open paths stay open: the page and the document carry no data.
        assert call(port, "/openapi.json")[0] == 200
    finally:
        a.close()
        b.close()


def test_master_subprocess_serves_the_api_and_its_document(make_store) -> None:  # type: ignore[no-untyped-def]
    with MasterProcess() as master:
        port = master.metrics_port
        store = make_store(master.address, 8 << 20)
        write_conversations(store)
        document = ok(port, "/openapi.json")
        assert document["openapi"].startswith("3.1")
        assert set(document["paths"]) == {
            "/v1/memory/sessions",
            "/v1/memory/release_session",
            "/v1/memory/release_stale_sessions",
            "/v1/memory/release_all_sessions",
            "/v1/memory/release_kv_cache",
            "/v1/memory/segments",
            "/v1/memory/stats",
        }
        before = allocated(port)
        answer = ok(port, "/v1/memory/release_session", {"session_id": "conv-b"})
        assert answer["freed_bytes"] == before - allocated(port) == 2 * PAGE


def test_sorted_listing_ranks_every_session_in_one_answer(
    checked_master: InProcessMaster, make_store
) -> None:  # type: ignore[no-untyped-def]
    port = http_port(checked_master)
    store = make_store(checked_master.address, 8 << 20)
    sizes = {"s-small": 1, "s-big": 5, "s-mid": 3, "s-mid2": 3}
    for session, pages in sizes.items():
        keys = [f"{session}/{i}" for i in range(pages)]
        assert store.put_batch(keys, [b"x" * PAGE] * pages, tagged(session, keys=pages)) == 0
    store.pin_kv_session("s-mid2")
    top = ok(port, "/v1/memory/sessions?sort=pages_bytes&limit=3")
    # Largest first; equal figures by id.
    assert [s["session_id"] for s in top["sessions"]] == ["s-big", "s-mid", "s-mid2"]
    assert (top["next_cursor"], top["total_sessions"], top["total_pages_cached"]) == ("", 4, 12)
    bottom = ok(port, "/v1/memory/sessions?sort=pages_bytes&order=asc&limit=2")
    assert [s["session_id"] for s in bottom["sessions"]] == ["s-small", "s-mid"]
    pinned = ok(port, "/v1/memory/sessions?sort=exclusive_bytes&pinned=true")
    assert [s["session_id"] for s in pinned["sessions"]] == ["s-mid2"]
    # The pin touched s-mid2 last: it is the least idle.
    idle = ok(port, "/v1/memory/sessions?sort=idle_ms&order=asc&limit=1")
    assert [s["session_id"] for s in idle["sessions"]] == ["s-mid2"]
    assert call(port, "/v1/memory/sessions?sort=colour")[0] == 400
    assert call(port, "/v1/memory/sessions?sort=idle_ms&order=up")[0] == 400


def test_odd_input_never_answers_500(checked_master: InProcessMaster) -> None:
    port = http_port(checked_master)
    release, stale = "/v1/memory/release_session", "/v1/memory/release_stale_sessions"
    cases: list[tuple[str, Any, bytes | None]] = [
        ("/v1/memory/sessions?limit=" + "9" * 5000, None, None),
        ("/v1/memory/sessions?min_idle_minutes=1e999", None, None),
        ("/v1/memory/sessions?min_idle_minutes=" + "1" * 400, None, None),
        (stale, {"max_idle_minutes": 10**400}, None),
        (stale, {"max_idle_minutes": 1e13}, None),
        (release, None, b"[" * 100_000),
        (release, None, b'{"session_id": ' + b"[" * 100_000 + b"}"),
        (release, None, b'{"session_id": "\\ud800"}'),
        (release, None, b"\xff\xfe"),
    ]
    for path, body, raw in cases:
        status, headers, answer = call(port, path, body, raw=raw)
        assert status == 400, (path, status, answer)
        assert headers["x-content-type-options"] == "nosniff"


def test_browsers_are_refused_what_another_site_could_make_them_send(
    checked_master: InProcessMaster, make_store
) -> None:  # type: ignore[no-untyped-def]
    port = http_port(checked_master)
    store = make_store(checked_master.address, 8 << 20)
    write_conversations(store)

    def send(path: str, method: str, headers: dict[str, str], body: bytes = b"") -> int:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.putrequest(method, path, skip_host=True)
            for name, value in headers.items():
                connection.putheader(name, value)
            if body:
                connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body or None)
            return connection.getresponse().status
        finally:
            connection.close()

    here = f"127.0.0.1:{port}"
    json_body = json.dumps({"session_id": "conv-a"}).encode()
    post = {"Content-Type": JSON_TYPE}
    # DNS rebinding: a page whose name points here reads nothing and releases nothing.
    rebound = {"Host": f"evil.example:{port}", "Sec-Fetch-Site": "same-origin"}
    assert send("/v1/memory/sessions", "GET", rebound) == 403
    origin = {"Origin": f"http://evil.example:{port}"}
    assert (
        send("/v1/memory/release_session", "POST", {**rebound, **origin, **post}, json_body) == 403
    )
    # A form on another site posting to the loopback port.
    form = {"Host": here, "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
    form_type = {"Content-Type": "application/x-www-form-urlencoded"}
    assert send("/api/v1/remove_all?force=true", "POST", {**form, **form_type}) == 403
    assert send("/v1/memory/release_session", "POST", {**form, **post}, json_body) == 403
    assert store.batch_is_exist(["a0", "a1", "a2", "shared", "b0"]) == [1] * 5
    # The page itself, on the port's own address, and scripts without browser headers.
    page = {"Host": here, "Origin": f"http://{here}", "Sec-Fetch-Site": "same-origin"}
    assert send("/", "GET", {"Host": here, "Sec-Fetch-Site": "none"}) == 200
    assert (
        send(
            "/v1/memory/sessions",
            "GET",
            {"Host": f"localhost:{port}", "Sec-Fetch-Site": "same-origin"},
        )
        == 200
    )
    assert send("/v1/memory/release_session", "POST", {**page, **post}, json_body) == 200
    assert send("/v1/memory/sessions", "GET", {"Host": f"evil.example:{port}"}) == 200
    assert store.is_exist("a0") == 0


def test_allowed_hosts_let_browsers_use_a_name(make_store) -> None:  # type: ignore[no-untyped-def]
    with InProcessMaster(http_allowed_hosts="dash.example, other.example") as master:
        connection = http.client.HTTPConnection("127.0.0.1", master.metrics_port, timeout=30)
        try:
            connection.putrequest("GET", "/v1/memory/stats", skip_host=True)
            connection.putheader("Host", f"DASH.example:{master.metrics_port}")
            connection.putheader("Sec-Fetch-Site", "same-origin")
            connection.endheaders()
            assert connection.getresponse().status == 200
        finally:
            connection.close()


def test_open_metrics_name_no_tenant_without_an_admin_token(token_master: InProcessMaster) -> None:
    port = http_port(token_master)
    a = token_store(token_master.address, "token-a")
    try:
        assert a.put("a-page", b"a" * PAGE, tagged("conv-a")) == 0
        for token, shown in ((None, False), ("token-a", False), ("token-admin", True)):
            status, _, body = call(port, "/metrics", token=token)
            assert status == 200
            text = body.decode()
            assert ("tenant-a" in text) is shown, token
            assert ("master_tenant_objects" in text) is shown, token
            assert "master_key_count 1.0" in text
    finally:
        a.close()
