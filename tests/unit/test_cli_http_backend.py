"""The CLI's HTTP backend on its own: URLs, lookup cursors, and how answers a real master
rarely gives (5xx, a foreign server, no answer) map to the CLI's errors.

The odd answers come from a small standard-library HTTP server in a thread standing in for
whatever sits at the URL; the master's own answers are covered by
``tests/integration/test_cli_http.py``.
"""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_py.cli import main as cli_main
from mooncake_py.cli.http_backend import HttpMemoryBackend, HttpTarget, _cursor_before
from mooncake_py.cli.output import UsageError
from mooncake_py.errors import (
    AuthenticationError,
    ErrorCode,
    InvalidParamsError,
    PermissionDeniedError,
    UnavailableError,
)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:9003", ("http", "127.0.0.1", 9003, "")),
        ("https://master.example", ("https", "master.example", 443, "")),
        ("http://h", ("http", "h", 80, "")),
        ("http://[::1]:9003/", ("http", "::1", 9003, "")),
        ("https://proxy:8443/store/", ("https", "proxy", 8443, "/store")),
    ],
)
def test_urls(url: str, expected: tuple[str, str, int, str]) -> None:
    target = HttpTarget.parse(url)
    assert (target.scheme, target.host, target.port, target.base_path) == expected


@pytest.mark.parametrize(
    "url",
    ["ftp://h:1", "127.0.0.1:9003", "http://", "http://h:99999", "http://h/?a=1", "http://u@h"],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(UsageError, match="--http"):
        HttpTarget.parse(url)


IDS = sorted(
    [
        "a",
        "a0",
        "a/",
        "a-1",
        "a\x01",
        "ab",
        "b",
        "conv-1",
        "conv-10",
        "\ue000",
        "\ud7ff",
        "é",
        "x" * 9,
    ]
)


@pytest.mark.parametrize("session_id", [*IDS, "\x00", "a\x00", "\U0001f600"])
def test_the_lookup_cursor_is_just_below_the_id(session_id: str) -> None:
    cursor = _cursor_before(session_id)
    assert cursor < session_id
    # Whatever lies between the cursor and the id extends the cursor: the listing from it
    # reaches the id after those ids only.
    between = [i for i in IDS if cursor < i < session_id]
    assert all(i.startswith(cursor) and len(i) > len(cursor) for i in between)
    cursor.encode("utf-8")  # sendable in a query string


# -- a stand-in server -------------------------------------------------------------------------


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers every request with the server's ``status`` and ``body``; records requests."""

    def do_GET(self) -> None:
        self._answer(b"")

    def do_POST(self) -> None:
        self._answer(self.rfile.read(int(self.headers.get("Content-Length", "0"))))

    def _answer(self, body: bytes) -> None:
        server: Any = self.server
        server.seen.append((self.command, self.path, dict(self.headers), body))
        self.send_response(server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(server.body)))
        self.end_headers()
        self.wfile.write(server.body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        return  # keep the test output clean


@contextlib.contextmanager
def _server(status: int, body: bytes) -> Iterator[Any]:
    server: Any = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    server.status, server.body, server.seen = status, body, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _backend(server: Any, token: str = "", tenant: str = "") -> HttpMemoryBackend:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    return HttpMemoryBackend(HttpTarget.parse(url), token, tenant, 5.0)


def test_requests_carry_the_token_the_tenant_and_json() -> None:
    answer = {"sessions_released": 2, "pages_freed": 3, "bytes_freed": 4, "pending_bytes": 5}
    with _server(200, json.dumps(answer).encode()) as server:
        result = _backend(server, "secret", "tenant-a").release_all_kv_sessions(confirm=True)
    assert (result.sessions, result.released_objects, result.freed_bytes) == (2, 3, 4)
    assert result.pending_bytes == 5
    method, path, headers, body = server.seen[0]
    assert (method, path) == ("POST", "/v1/memory/release_all_sessions")
    assert headers["Authorization"] == "Bearer secret"
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"confirm": True, "tenant_id": "tenant-a"}


def test_with_a_token_the_default_tenant_is_left_to_the_token() -> None:
    listing = {"sessions": [], "next_cursor": ""}
    with _server(200, json.dumps(listing).encode()) as server:
        _backend(server, "secret", "default").list_kv_sessions(pinned=False, min_idle_ms=90_000)
        _backend(server, "", "default").list_kv_sessions()
    with_token, without = server.seen[0][1], server.seen[1][1]
    assert "tenant_id" not in with_token and "pinned=false" in with_token
    assert "min_idle_minutes=1.49999" in with_token  # half a millisecond under 90 s
    assert "tenant_id=default" in without


@pytest.mark.parametrize(
    ("status", "body", "error", "text"),
    [
        (401, b'{"success":false,"error":"UNAUTHENTICATED"}', AuthenticationError, "UNAUTH"),
        (403, b'{"success":false,"error":"PERMISSION_DENIED"}', PermissionDeniedError, "DENIED"),
        (
            400,
            b'{"success":false,"error_code":-600,"error_message":"bad cursor"}',
            InvalidParamsError,
            "bad cursor",
        ),
        (503, b'{"success":false,"error":"overloaded"}', UnavailableError, "HTTP 503 overloaded"),
        (404, b"<html>nope</html>", UnavailableError, "does not serve the memory API"),
        (200, b"<html>a web page</html>", UnavailableError, "not a JSON object"),
        (200, b"[1, 2]", UnavailableError, "not a JSON object"),
    ],
)
def test_answers_map_to_error_families(
    status: int, body: bytes, error: type[Exception], text: str
) -> None:
    with _server(status, body) as server, pytest.raises(error, match=text):
        _backend(server).list_kv_sessions()


def test_a_bad_request_keeps_the_master_code() -> None:
    body = {"success": False, "error_code": int(ErrorCode.INVALID_PARAMS), "error_message": "x"}
    with (
        _server(400, json.dumps(body).encode()) as server,
        pytest.raises(InvalidParamsError) as raised,
    ):
        _backend(server).release_kv_cache()
    assert raised.value.code == ErrorCode.INVALID_PARAMS


def _cli(*args: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli_main(list(args))
    return code, stdout.getvalue(), stderr.getvalue()


def test_the_cli_reports_a_server_that_is_not_the_memory_api() -> None:
    with _server(404, b"not found") as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        code, out, err = _cli("--http", url, "sessions", "ls")
    assert (code, out) == (3, "")
    assert f"cannot reach the master at {url}" in err and "--metrics_port" in err


def test_a_server_that_never_answers_times_out() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # connections wait in the backlog, never served
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        code, _, err = _cli("--http", url, "--timeout", "0.3", "stats")
    assert code == 3 and "no answer within 0.3s" in err


def test_a_server_that_trickles_its_answer_is_cut_off() -> None:
    # Headers at once, then one byte of a body that never ends every 50 ms: each socket read
    # returns in time, so only a deadline on the whole answer ends the call.
    stop = threading.Event()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def trickle() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n[")
                while not stop.wait(0.05):
                    try:
                        connection.sendall(b" ")
                    except OSError:
                        return

        server = threading.Thread(target=trickle, daemon=True)
        server.start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        try:
            code, _, err = _cli("--http", url, "--timeout", "0.5", "stats")
        finally:
            stop.set()
            server.join(timeout=5)
    assert code == 3 and "no answer within 0.5s" in err


def test_a_closed_backend_refuses_calls() -> None:
    backend = HttpMemoryBackend(HttpTarget.parse("http://127.0.0.1:1"), "", "", 1.0)
    backend.close()
    backend.close()
    with pytest.raises(UnavailableError, match="closed"):
        backend.stats()
