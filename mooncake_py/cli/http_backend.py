"""The CLI's :class:`~mooncake_py.cli.backend.StoreBackend` over the master's HTTP memory API.

The memory API (``/v1/memory/...`` on the master's ``--metrics_port``) answers JSON; this
module calls it with :mod:`http.client` (one connection per call, each socket operation
bounded by the timeout) and turns its answers into the typed results the gRPC
:class:`~mooncake_py.client.api.Client` returns, and its errors into the same
:mod:`mooncake_py.errors` families:

======================================  ==============================================
HTTP answer                             raised
======================================  ==============================================
401                                     :class:`~mooncake_py.errors.AuthenticationError`
403                                     :class:`~mooncake_py.errors.PermissionDeniedError`
400                                     :class:`~mooncake_py.errors.InvalidParamsError`
5xx, refused, timed out, TLS failure    :class:`~mooncake_py.errors.UnavailableError`
404/405/415, a body that is not JSON    :class:`~mooncake_py.errors.UnavailableError`
                                        (not a mooncake-py memory API at that URL)
======================================  ==============================================

The API is coarser than gRPC in places: session times are whole Unix milliseconds (whole
seconds from a master that sends no ``*_ms`` fields), and segments carry no allocation count,
protocol or host id unless the master adds them (those then read as :data:`UNKNOWN_COUNT`
and ``""``).

Thread-safety: an instance is used from one thread (it holds no connection between calls,
so separate instances may run in parallel).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import ssl
import time
from typing import Any
from urllib.parse import urlencode, urlsplit

from mooncake_py import tls
from mooncake_py.cli.output import UsageError
from mooncake_py.client.results import KvSessionListing, SegmentStatus
from mooncake_py.errors import (
    AuthenticationError,
    ErrorCode,
    InvalidParamsError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
)
from mooncake_py.types import KvSessionInfo, ReleaseResult, SegmentInfo

MEMORY_PREFIX = "/v1/memory"
MAX_PAGE = 4096
"""The largest ``limit`` the sessions listing accepts."""

_LOOKUP_PAGE = 64
"""Sessions per page while looking one session up (few precede it from the cursor used)."""

_MAX_SESSION_ID_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class HttpTarget:
    """Where the memory API is served.

    Attributes:
        url: the URL as given (for messages).
        scheme: ``http`` or ``https``.
        host: host name or address (IPv6 without brackets).
        port: TCP port.
        base_path: a path prefix the API sits under (``""`` for the root).
    """

    url: str
    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> HttpTarget:
        """Read ``http://HOST[:PORT][/PREFIX]`` or ``https://...``.

        Raises:
            UsageError: another scheme, no host, a bad port, or a query or fragment.
        """
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise UsageError(f"--http must be a URL such as http://HOST:PORT: {exc}") from exc
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--http must be an http:// or https:// URL with a host, got {url!r}")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise UsageError(f"--http takes no query, fragment or credentials, got {url!r}")
        default_port = 443 if parts.scheme == "https" else 80
        return cls(
            url=url,
            scheme=parts.scheme,
            host=parts.hostname,
            port=port if port is not None else default_port,
            base_path=parts.path.rstrip("/"),
        )


class _TlsConnection(http.client.HTTPConnection):
    """HTTPS with a given context and a given name to check the certificate against (the
    standard :class:`http.client.HTTPSConnection` always checks the dialed host)."""

    default_port = 443

    def __init__(
        self, host: str, port: int, timeout: float, context: ssl.SSLContext, server_name: str
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self._tls_context = context
        self._server_name = server_name

    def connect(self) -> None:
        super().connect()
        self.sock = self._tls_context.wrap_socket(self.sock, server_hostname=self._server_name)


class HttpMemoryBackend:
    """The store calls of the CLI over the HTTP memory API.

    Args:
        target: where the API is served.
        token: bearer token, or ``""``.
        tenant: the tenant to name (``tenant_id``); ``""`` lets the token decide.
        timeout_s: bound of each connect, send and receive.
        tls_config: TLS settings for ``https`` (None: the system's trust store).

    Raises:
        ConfigError: (at construction) a TLS file that is not valid PEM.
    """

    def __init__(
        self,
        target: HttpTarget,
        token: str,
        tenant: str,
        timeout_s: float,
        tls_config: tls.TlsConfig | None = None,
    ) -> None:
        self._target = target
        self._token = token
        # With a token, "default" lets the token decide, as it does over gRPC.
        self._tenant = "" if token and tenant == "default" else tenant
        self._timeout_s = timeout_s
        self._closed = False
        self._tls_context: ssl.SSLContext | None = None
        self._server_name = target.host
        if target.scheme == "https":
            config = tls_config or tls.TlsConfig()
            self._tls_context = tls.client_context(config)
            self._server_name = tls.check_hostname_target(config, target.host)

    # -- sessions ------------------------------------------------------------------------------

    def list_kv_sessions(
        self,
        cursor: str = "",
        limit: int = 1024,
        pinned: bool | None = None,
        min_idle_ms: int = 0,
    ) -> KvSessionListing:
        """``GET /v1/memory/sessions``: one page after ``cursor``.

        Raises:
            InvalidParamsError: a limit outside [1, 4096] or a negative idle bound.
        """
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidParamsError(ErrorCode.INVALID_PARAMS, f"limit must be 1..{MAX_PAGE}")
        if min_idle_ms < 0:
            raise InvalidParamsError(ErrorCode.INVALID_PARAMS, "min_idle_ms must not be negative")
        # No totals: the CLI pages through with cursors, and totals cost a walk of them all.
        query: dict[str, str] = {"limit": str(limit), "totals": "false"}
        if cursor:
            query["cursor"] = cursor
        if pinned is not None:
            query["pinned"] = "true" if pinned else "false"
        if min_idle_ms:
            # The master compares whole idle milliseconds with minutes x 60000: half a
            # millisecond below the bound keeps float rounding from moving the edge.
            query["min_idle_minutes"] = repr((min_idle_ms - 0.5) / 60_000)
        data = self._get("/sessions", query)
        sessions = [_session_info(item) for item in _list(data, "sessions")]
        return KvSessionListing(sessions, str(data.get("next_cursor") or ""))

    def get_kv_session(self, session_id: str) -> KvSessionInfo:
        """The session, found in the listing (the API has no call for one session).

        Starts the listing just before ``session_id`` (ids are listed in code point order),
        so usually one short page answers.

        Raises:
            NotFoundError: SESSION_NOT_FOUND. InvalidParamsError: an id the master would
                refuse (empty, with NUL, over 4096 UTF-8 bytes).

        Complexity: O(sessions between the cursor and ``session_id``).
        """
        _check_session_id(session_id)
        cursor = _cursor_before(session_id)
        while True:
            page = self.list_kv_sessions(cursor, _LOOKUP_PAGE)
            for info in page.sessions:
                if info.session_id == session_id:
                    return info
                if info.session_id > session_id:
                    raise NotFoundError(ErrorCode.SESSION_NOT_FOUND, key=session_id)
            if not page.next_cursor:
                raise NotFoundError(ErrorCode.SESSION_NOT_FOUND, key=session_id)
            cursor = page.next_cursor

    def release_kv_session(self, session_id: str, all_pages: bool = False) -> ReleaseResult:
        """``POST /v1/memory/release_session``: the session's members only it holds go.

        The API answers a ``message`` whenever nothing was removed. A session with members
        always removes or keeps one, so nothing removed and nothing kept means no session
        (``sessions == 0``, with the API's message), as gRPC reports an unknown session; a
        session that kept everything is released with no message, as over gRPC.
        """
        _check_session_id(session_id)
        body: dict[str, Any] = {"session_id": session_id}
        if all_pages:
            body["all_pages"] = True
        data = self._post("/release_session", body)
        result = ReleaseResult(
            sessions=1,
            released_objects=_count(data, "released_pages"),
            freed_bytes=_count(data, "freed_bytes"),
            pending_bytes=_count(data, "pending_bytes"),
            kept_shared=_count(data, "kept_shared"),
            kept_hard_pinned=_count(data, "kept_hard_pinned"),
            kept_writing=_count(data, "kept_writing"),
        )
        touched = result.released_objects + result.kept_shared + result.kept_hard_pinned
        if touched + result.kept_writing:
            return result
        return dataclasses.replace(result, sessions=0, message=str(data.get("message") or ""))

    def release_stale_kv_sessions(
        self, max_idle_ms: int, include_pinned: bool = False
    ) -> ReleaseResult:
        """``POST /v1/memory/release_stale_sessions``: the totals."""
        if max_idle_ms < 0:
            raise InvalidParamsError(ErrorCode.INVALID_PARAMS, "max_idle_ms must not be negative")
        # The master takes whole milliseconds of minutes x 60000: half a millisecond above
        # the bound keeps float rounding from moving it down.
        minutes = (max_idle_ms + 0.5) / 60_000 if max_idle_ms else 0
        body = {"max_idle_minutes": minutes, "include_pinned": include_pinned}
        data = self._post("/release_stale_sessions", body)
        return _sessions_released(data, "total_pages_freed", "total_bytes_freed")

    def release_all_kv_sessions(self, confirm: bool = False) -> ReleaseResult:
        """``POST /v1/memory/release_all_sessions``: the totals.

        Raises:
            InvalidParamsError: unless ``confirm`` (the master refuses, 400).
        """
        data = self._post("/release_all_sessions", {"confirm": confirm})
        return _sessions_released(data, "pages_freed", "bytes_freed")

    def release_kv_cache(self, keep_pinned: bool = True) -> ReleaseResult:
        """``POST /v1/memory/release_kv_cache``."""
        data = self._post("/release_kv_cache", {"keep_pinned": keep_pinned})
        return ReleaseResult(
            released_objects=_count(data, "released_pages"),
            freed_bytes=_count(data, "freed_bytes"),
            pending_bytes=_count(data, "pending_bytes"),
            kept_hard_pinned=_count(data, "kept_hard_pinned"),
            kept_writing=_count(data, "kept_writing"),
            kept_pinned=_count(data, "kept_pinned"),
        )

    # -- the store -----------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """``GET /v1/memory/stats``: its ``counters``, with ``tenant_view`` set to 1 when the
        master answered a tenant's view (as GetStats marks it)."""
        data = self._get("/stats", {})
        counters = data.get("counters")
        if not isinstance(counters, dict):
            raise self._malformed("/stats", "no counters object")
        # GetStats answers integers only; the API's counters are the same figures.
        figures = {
            str(name): value
            for name, value in counters.items()
            if isinstance(value, int) and not isinstance(value, bool)
        }
        if data.get("view") == "tenant":
            figures["tenant_view"] = 1
        return figures

    def segments(self) -> list[SegmentStatus]:
        """``GET /v1/memory/segments``: the segments of the token's view, with their use."""
        data = self._get("/segments", {})
        return [_segment_status(item) for item in _list(data, "segments")]

    def close(self) -> None:
        """Refuse further calls (each call opens and closes its own connection, so none is
        left open); idempotent."""
        self._closed = True

    # -- HTTP ----------------------------------------------------------------------------------

    def _get(self, path: str, query: dict[str, str]) -> dict[str, Any]:
        if self._tenant:
            query = {**query, "tenant_id": self._tenant}
        target = MEMORY_PREFIX + path + ("?" + urlencode(query) if query else "")
        return self._call("GET", path, target, None)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._tenant:
            body = {**body, "tenant_id": self._tenant}
        return self._call("POST", path, MEMORY_PREFIX + path, json.dumps(body).encode("utf-8"))

    def _connection(self) -> http.client.HTTPConnection:
        target = self._target
        if self._tls_context is not None:
            return _TlsConnection(
                target.host, target.port, self._timeout_s, self._tls_context, self._server_name
            )
        return http.client.HTTPConnection(target.host, target.port, timeout=self._timeout_s)

    def _call(self, method: str, path: str, target: str, payload: bytes | None) -> dict[str, Any]:
        if self._closed:
            raise UnavailableError(ErrorCode.RPC_FAIL, "the HTTP backend is closed")
        headers = {"Accept": "application/json", "Connection": "close"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        if payload is not None:
            headers["Content-Type"] = "application/json"
        # The timeout bounds each socket step and the whole answer: a server that trickles
        # its answer byte by byte is cut off too.
        deadline = self._timeout_s
        connection = self._connection()
        try:
            connection.request(
                method, self._target.base_path + target, body=payload, headers=headers
            )
            response = connection.getresponse()
            status, raw = response.status, _read_within(response, time.monotonic() + deadline)
        except TimeoutError as exc:
            raise UnavailableError(
                ErrorCode.RPC_TIMEOUT, f"{method} {path}: no answer within {self._timeout_s:g}s"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise UnavailableError(ErrorCode.RPC_FAIL, f"{method} {path}: {exc}") from exc
        finally:
            connection.close()
        return self._decode(method, path, status, raw)

    def _decode(self, method: str, path: str, status: int, raw: bytes) -> dict[str, Any]:
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = None
        body = data if isinstance(data, dict) else {}
        if status == 200:
            if data is None or not isinstance(data, dict):
                raise self._malformed(path, "the answer is not a JSON object")
            return body
        if status == 401:
            raise AuthenticationError(ErrorCode.RPC_FAIL, "UNAUTHENTICATED")
        if status == 403:
            raise PermissionDeniedError(ErrorCode.RPC_FAIL, "PERMISSION_DENIED")
        if status == 400:
            code = body.get("error_code")
            raise InvalidParamsError(
                code if isinstance(code, int) and code < 0 else ErrorCode.INVALID_PARAMS,
                str(body.get("error_message") or ""),
            )
        if status >= 500:
            detail = body.get("error_message") or body.get("error") or ""
            raise UnavailableError(
                ErrorCode.RPC_FAIL, f"{method} {path}: HTTP {status} {detail}".rstrip()
            )
        raise self._malformed(path, f"HTTP {status} to {method} {MEMORY_PREFIX}{path}")

    def _malformed(self, path: str, why: str) -> UnavailableError:
        return UnavailableError(
            ErrorCode.RPC_FAIL,
            f"{why}: {self._target.url} does not serve the memory API of a mooncake-py master "
            f"(is it the master's --metrics_port?)",
        )


# -- JSON to typed results ---------------------------------------------------------------------


MAX_ANSWER_BYTES = 64 << 20
"""The largest answer read (a listing page of 4096 sessions is about 1.5 MiB)."""


def _read_within(response: http.client.HTTPResponse, deadline: float) -> bytes:
    """The answer's body, read in parts until ``deadline`` (``time.monotonic()``).

    Raises:
        TimeoutError: the deadline passed first.
        http.client.HTTPException: the body is larger than :data:`MAX_ANSWER_BYTES`.
    """
    parts: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError("the answer did not arrive in time")
        part = response.read1(1 << 16)
        if not part:
            return b"".join(parts)
        size += len(part)
        if size > MAX_ANSWER_BYTES:
            raise http.client.HTTPException(f"answer larger than {MAX_ANSWER_BYTES} bytes")
        parts.append(part)


def _list(data: dict[str, Any], name: str) -> list[dict[str, Any]]:
    items = data.get(name)
    if not isinstance(items, list):
        return []
    return [item for item in items if isinstance(item, dict)]


def _count(data: dict[str, Any], name: str) -> int:
    value = data.get(name, 0)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _sessions_released(data: dict[str, Any], pages: str, freed: str) -> ReleaseResult:
    """A many-session release answer (its page and byte totals under ``pages`` / ``freed``)."""
    return ReleaseResult(
        sessions=_count(data, "sessions_released"),
        released_objects=_count(data, pages),
        freed_bytes=_count(data, freed),
        pending_bytes=_count(data, "pending_bytes"),
        kept_shared=_count(data, "kept_shared"),
        kept_hard_pinned=_count(data, "kept_hard_pinned"),
        kept_writing=_count(data, "kept_writing"),
    )


def _unix_time(item: dict[str, Any], name: str) -> float:
    """``name`` (Unix seconds) from ``name_ms`` when the answer has it, else whole seconds."""
    if f"{name}_ms" in item:
        return _count(item, f"{name}_ms") / 1000
    return float(_count(item, name))


def _session_info(item: dict[str, Any]) -> KvSessionInfo:
    return KvSessionInfo(
        session_id=str(item.get("session_id", "")),
        pinned=bool(item.get("pinned", False)),
        member_count=_count(item, "pages_cached"),
        created_at=_unix_time(item, "created_at"),
        last_active_at=_unix_time(item, "last_token_at"),
        bytes=_count(item, "pages_bytes"),
        exclusive_bytes=_count(item, "exclusive_bytes"),
        idle_ms=_count(item, "idle_ms"),
    )


UNKNOWN_COUNT = -1
"""``allocations`` of a segment whose answer did not say (shown as ``-``)."""


def _segment_status(item: dict[str, Any]) -> SegmentStatus:
    # protocol "" and allocations UNKNOWN_COUNT when the answer does not carry them.
    allocations = item.get("allocations")
    segment = SegmentInfo(
        id=str(item.get("segment_id", "")),
        name=str(item.get("name", "")),
        base=0,
        size=_count(item, "capacity_bytes"),
        te_endpoint=str(item.get("te_endpoint", "")),
        protocol=str(item.get("protocol", "")),
        host_id=str(item.get("host_id", "")),
        shared=bool(item.get("shared", False)),
        disk=item.get("tier") == "disk",
    )
    return SegmentStatus(
        segment=segment,
        client_id=str(item.get("client_id", "")),
        used_bytes=_count(item, "used_bytes"),
        allocations=_count(item, "allocations") if allocations is not None else UNKNOWN_COUNT,
    )


def _check_session_id(session_id: str) -> None:
    """Refuse what the master refuses as a session id (as gRPC's INVALID_PARAMS)."""
    valid = bool(session_id) and "\0" not in session_id
    if valid:
        try:
            valid = len(session_id.encode("utf-8")) <= _MAX_SESSION_ID_BYTES
        except UnicodeEncodeError:
            valid = False
    if not valid:
        raise InvalidParamsError(ErrorCode.INVALID_PARAMS, "bad session id", key=session_id)


def _cursor_before(session_id: str) -> str:
    """A listing cursor below ``session_id`` with as few ids as possible between them.

    Any id between ``prefix + chr(c - 1)`` (``c`` the last character) and ``session_id``
    starts with that cursor, so the walk from it reaches ``session_id`` at once unless such
    ids exist. A last character of U+0000 or just above the surrogates falls back to the
    prefix itself (also below ``session_id``).
    """
    prefix, last = session_id[:-1], ord(session_id[-1])
    previous = last - 1
    if previous < 1 or 0xD800 <= previous <= 0xDFFF:
        return prefix
    return prefix + chr(previous)
