"""What the CLI's shared commands need of the master, whichever way they reach it.

:class:`StoreBackend` is the subset of :class:`~mooncake_py.client.api.Client` the commands
that also run over the HTTP memory API call (session listings and releases, segments, stats).
Two implementations satisfy it: the gRPC :class:`~mooncake_py.client.api.Client` itself, and
:class:`~mooncake_py.cli.http_backend.HttpMemoryBackend`. Both return the same typed results
and raise the same :mod:`mooncake_py.errors` families, so the output code is shared.
"""

from __future__ import annotations

from typing import Protocol

from mooncake_py.client.results import KvSessionListing, SegmentStatus
from mooncake_py.types import KvSessionInfo, ReleaseResult


class StoreBackend(Protocol):
    """The master calls of the commands that run over gRPC and over HTTP alike.

    Every method may raise :class:`~mooncake_py.errors.UnavailableError` (master unreachable),
    :class:`~mooncake_py.errors.AuthenticationError` (no or unknown token) and
    :class:`~mooncake_py.errors.PermissionDeniedError` (the token may not act for the tenant).
    Implementations are used from one thread.
    """

    def list_kv_sessions(
        self,
        cursor: str = "",
        limit: int = 1024,
        pinned: bool | None = None,
        min_idle_ms: int = 0,
    ) -> KvSessionListing:
        """One page of the tenant's sessions after ``cursor``, in id order, filtered by pin
        state and by idle time (at least ``min_idle_ms``)."""
        ...

    def get_kv_session(self, session_id: str) -> KvSessionInfo:
        """One session's accounting.

        Raises:
            NotFoundError: no such session. InvalidParamsError: a malformed id.
        """
        ...

    def release_kv_session(self, session_id: str, all_pages: bool = False) -> ReleaseResult:
        """Close the session and remove the members nothing else needs (with ``all_pages``,
        those other sessions share too); an unknown session releases nothing
        (``sessions == 0``)."""
        ...

    def release_stale_kv_sessions(
        self, max_idle_ms: int, include_pinned: bool = False
    ) -> ReleaseResult:
        """Release every session idle longer than ``max_idle_ms``; the totals."""
        ...

    def release_all_kv_sessions(self, confirm: bool = False) -> ReleaseResult:
        """Release every session of the tenant.

        Raises:
            InvalidParamsError: unless ``confirm``.
        """
        ...

    def release_kv_cache(self, keep_pinned: bool = True) -> ReleaseResult:
        """Remove every KV-cache object of the tenant (pinned sessions' ones unless
        ``keep_pinned`` is false)."""
        ...

    def stats(self) -> dict[str, int]:
        """The counters of the view the token gets (``tenant_view`` set in a tenant's)."""
        ...

    def segments(self) -> list[SegmentStatus]:
        """The segments of the view the token gets, with their use."""
        ...

    def close(self) -> None:
        """Release the connection; idempotent."""
        ...
