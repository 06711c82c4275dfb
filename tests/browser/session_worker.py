"""A client process that also tags its writes with KV sessions and pins sessions, driven by
JSON lines on stdin like ``tests/integration/client_worker.py`` (whose operations it keeps).

Run as ``python -m tests.browser.session_worker`` from the repository root.
"""

from __future__ import annotations

from mooncake_py import ReplicateConfig
from tests.integration.client_worker import Worker, main, value_for


class SessionWorker(Worker):
    """:class:`Worker` plus session operations."""

    def op_put_tagged(self, key: str, size: int, sessions: list[str]) -> int:
        """Put ``size`` deterministic bytes at ``key``, a member of every one of ``sessions``."""
        config = ReplicateConfig(kv_sessions=[sessions])
        return self.store.put(key, value_for(key, size), config)

    def op_pin(self, session_id: str) -> None:
        """Pin ``session_id`` (its pages are kept by stale releases that skip pinned ones)."""
        self.store.pin_kv_session(session_id)


if __name__ == "__main__":
    main(SessionWorker())
