"""What the metrics port's paths share: the reply, the parsed request, routes and JSON errors.

:mod:`.http_admin` (upstream's admin paths) and :mod:`.http_memory` (the memory API) both build
:class:`Route` tables whose handlers take a :class:`Request` and return a :class:`Reply`;
:class:`~mooncake_py.master.http_admin.AdminApi` dispatches over their union.

Thread-safety: every type here is immutable; the helpers are pure functions.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import unquote_plus, urlsplit

from mooncake_py.errors import ErrorCode

JSON = "application/json; charset=utf-8"
TEXT = "text/plain; version=0.0.4; charset=utf-8"
PLAIN = "text/plain; charset=utf-8"


@dataclasses.dataclass(frozen=True, slots=True)
class Reply:
    """One HTTP answer.

    Attributes:
        status: the HTTP status code.
        content_type: the ``Content-Type`` header.
        body: the whole body, or an iterator of its parts (streamed: no ``Content-Length``).
        headers: extra headers.
    """

    status: int
    content_type: str
    body: bytes | Iterator[bytes]
    headers: tuple[tuple[str, str], ...] = ()


class BadRequest(Exception):
    """Raised by a handler's parsing helpers: answer ``reply`` instead."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


def json_reply(status: int, payload: Any, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    """``payload`` as compact JSON."""
    return Reply(status, JSON, json.dumps(payload, separators=(",", ":")).encode(), headers)


def error_reply(status: int, code: ErrorCode, message: str = "") -> Reply:
    """Upstream's ``{"success":false,"error_code":N,"error_message":...}`` (the code's name
    when no message is given)."""
    body = {"success": False, "error_code": int(code), "error_message": message or code.name}
    return json_reply(status, body)


def simple_error(status: int, message: str) -> Reply:
    """Upstream's ``{"success":false,"error":...}``."""
    return json_reply(status, {"success": False, "error": message})


def text_reply(status: int, text: str, content_type: str = TEXT) -> Reply:
    """``text`` as UTF-8 (undecodable characters escaped)."""
    return Reply(status, content_type, text.encode("utf-8", "backslashreplace"))


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """One request as a handler sees it.

    Attributes:
        query: ``(decoded name, raw value)`` pairs of the query string, in order.
        tenant: the effective tenant of key and session calls (the token's, else the default).
        token_tenant: the token's tenant when the master requires tokens, else None.
        segment_scope: whose segments it sees: None for every segment (an admin token, or no
            tokens required), else the token's tenant.
        admin: the caller may see and act for every tenant (an admin token on a guarded
            path, or a master that requires no tokens).
        body: the request body (empty for none).
        content_type: the ``Content-Type`` header, or None.
    """

    query: tuple[tuple[str, str], ...]
    tenant: str
    token_tenant: str | None
    segment_scope: str | None
    admin: bool = True
    body: bytes = b""
    content_type: str | None = None

    def raw(self, name: str) -> str | None:
        """The first raw (still percent-encoded) value of ``name``, or None."""
        for key, value in self.query:
            if key == name:
                return value
        return None

    def param(self, name: str) -> str | None:
        """The first value of ``name``, percent-decoded as UTF-8, or None when absent.

        Raises:
            BadRequest: the decoded bytes are not UTF-8 (400).
        """
        value = self.raw(name)
        return None if value is None else decode_query_value(name, value)


def decode_query_value(name: str, raw: str) -> str:
    """Percent-decode one query value as UTF-8.

    Raises:
        BadRequest: the decoded bytes are not UTF-8 (400, INVALID_PARAMS).
    """
    try:
        return unquote_plus(raw, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        message = f"query parameter {name!r} is not valid UTF-8"
        raise BadRequest(error_reply(400, ErrorCode.INVALID_PARAMS, message)) from None


def parse_query(query: str) -> tuple[tuple[str, str], ...]:
    """The ``(decoded name, raw value)`` pairs of a query string.

    Raises:
        BadRequest: a name is not UTF-8 once decoded.
    """
    pairs: list[tuple[str, str]] = []
    for part in query.split("&"):
        if part:
            name, _, value = part.partition("=")
            pairs.append((decode_query_value("name", name), value))
    return tuple(pairs)


@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    """One path.

    Attributes:
        method: the one method it answers (another gets 405 with ``Allow``).
        handler: answers a request.
        guarded: needs a token when the master requires tokens.
    """

    method: str
    handler: Callable[[Request], Reply]
    guarded: bool


@dataclasses.dataclass(frozen=True, slots=True)
class BrowserHeaders:
    """The headers that tell a browser's request from a script's.

    Attributes:
        host: ``Host``.
        origin: ``Origin`` (browsers send it on cross-origin requests and on every POST).
        fetch_site: ``Sec-Fetch-Site`` (browsers send it on every request).
    """

    host: str | None = None
    origin: str | None = None
    fetch_site: str | None = None


class BrowserGuard:
    """Refuses what a web page elsewhere could make a browser send to this port.

    Scripts, scrapers and engines send neither ``Origin`` nor ``Sec-Fetch-Site`` and are never
    refused. A browser's request is refused when:

    - its ``Host`` is a name this port does not answer browsers on (DNS rebinding: a page whose
      name an attacker points at this address would otherwise be same-origin with the port):
      allowed are IP literals, ``localhost`` (and ``*.localhost``), this machine's host names
      and ``allowed_hosts``;
    - it would change something (any method but GET and HEAD) and comes from another site:
      ``Sec-Fetch-Site`` other than ``same-origin`` / ``none``, or an ``Origin`` whose
      host and port differ from ``Host`` (cross-site form posts included).

    Args:
        allowed_hosts: further host names (case-insensitive, without port).

    Thread-safety: immutable after construction.
    """

    def __init__(self, allowed_hosts: Sequence[str] = ()) -> None:
        names = {"localhost", socket.gethostname(), socket.getfqdn(), *allowed_hosts}
        self._names = frozenset(name.lower().rstrip(".") for name in names if name)

    def refusal(self, method: str, headers: BrowserHeaders) -> str | None:
        """Why the request must be refused (a sentence), or None when it may go on."""
        if headers.origin is None and headers.fetch_site is None:
            return None
        host = _host_name(headers.host or "")
        if not host or not self._answers(host):
            return (
                f"this port does not answer browsers that reach it as {host!r}; "
                "name the host in --http_allowed_hosts"
            )
        if method in ("GET", "HEAD"):
            return None
        if headers.fetch_site not in (None, "same-origin", "none"):
            return "cross-site requests may not change anything"
        if headers.origin is not None:
            origin = urlsplit(headers.origin).netloc.lower()
            if origin != (headers.host or "").lower():
                return "cross-origin requests may not change anything"
        return None

    def _answers(self, host: str) -> bool:
        if host in self._names or host.endswith(".localhost"):
            return True
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return False
        return True


def _host_name(host: str) -> str:
    """``Host`` without its port or IPv6 brackets, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0].rstrip(".") if host.count(":") == 1 else host.rstrip(".")
