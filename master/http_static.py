"""The dashboard's files and the OpenAPI document on the metrics port.

``/`` is the dashboard's page, ``/dashboard/app.js`` and ``/dashboard/app.css`` its script and
style (package data of ``mooncake_py.master.dashboard``); ``/openapi.json`` the memory API's
document (:mod:`.openapi`). None of them carries data, so none needs a token: the page itself
calls the memory API with the token its user gives.

Every answer carries a Content-Security-Policy that allows only this origin's script, style
and connections (no inline code, no other site), and forbids framing: a page elsewhere can
neither run code in the dashboard's origin nor overlay its release buttons.

Thread-safety: the files are read once, on first use, under a lock; afterwards read-only.
"""

from __future__ import annotations

import importlib.resources
import json
import threading
from collections.abc import Callable

from .http_common import JSON, Reply, Request, Route
from .openapi import openapi_document

SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    (
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'",
    ),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-cache"),
)

DASHBOARD_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/dashboard/app.css": ("app.css", "text/css; charset=utf-8"),
}
"""Path -> (file in the dashboard package, content type)."""

_PACKAGE = "mooncake_py.master.dashboard"


class StaticFiles:
    """The routes of the dashboard's files and of ``/openapi.json``.

    Attributes:
        routes: path -> :class:`~.http_common.Route` (GET, no token).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, bytes] = {}
        self._openapi = json.dumps(openapi_document(), indent=1).encode()
        self.routes: dict[str, Route] = {
            path: Route("GET", self._file_handler(name, kind), False)
            for path, (name, kind) in DASHBOARD_FILES.items()
        }
        self.routes["/openapi.json"] = Route(
            "GET", lambda _: Reply(200, JSON, self._openapi, SECURITY_HEADERS), False
        )

    def _file_handler(self, name: str, content_type: str) -> Callable[[Request], Reply]:
        def serve(_: Request) -> Reply:
            return Reply(200, content_type, self._read(name), SECURITY_HEADERS)

        return serve

    def _read(self, name: str) -> bytes:
        """One dashboard file's bytes, read from the package on first use.

        Raises:
            FileNotFoundError: the package lacks the file (a broken install; the port answers
                500 and logs it).
        """
        with self._lock:
            data = self._cache.get(name)
            if data is None:
                data = importlib.resources.files(_PACKAGE).joinpath(name).read_bytes()
                self._cache[name] = data
            return data
