"""Client liveness: who has pinged recently, and who is in good standing.

A client's deadline is pushed to ``now + client_ttl`` by each ping or mount. A client whose
deadline passes is expired: the service unmounts its segments. Only ``ReMountSegment`` puts a
client into good standing (``ok``); until then its pings answer NEED_REMOUNT, which is how a
client learns that the master restarted or forgot it.

Thread-safety: none. The master service serializes every call under its lock.
"""

from __future__ import annotations


class ClientRegistry:
    """Deadlines of live clients, oldest first.

    Args:
        ttl_s: seconds a client may stay silent before it is expired.
    """

    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        # Insertion order is touch order: touching deletes and reinserts, so the first entry
        # always has the earliest deadline and expiry scans stop at the first live client.
        self._deadlines: dict[str, float] = {}
        self._ok: set[str] = set()

    def touch(self, client_id: str, now: float) -> None:
        """Record that ``client_id`` is alive at ``now``. O(1)."""
        self._deadlines.pop(client_id, None)
        self._deadlines[client_id] = now + self._ttl_s

    def mark_ok(self, client_id: str) -> None:
        """Put a client into good standing (after it remounted its segments)."""
        self._ok.add(client_id)

    def is_ok(self, client_id: str) -> bool:
        """True when the client remounted since it was last expired or since master start."""
        return client_id in self._ok

    def forget(self, client_id: str) -> None:
        """Drop a client entirely (it closed)."""
        self._deadlines.pop(client_id, None)
        self._ok.discard(client_id)

    def pop_expired(self, now: float) -> list[str]:
        """Remove and return clients whose deadline is at or before ``now``. O(expired)."""
        expired: list[str] = []
        for client_id, deadline in self._deadlines.items():
            if deadline > now:
                break
            expired.append(client_id)
        for client_id in expired:
            self.forget(client_id)
        return expired

    def __len__(self) -> int:
        return len(self._deadlines)

    @property
    def active_count(self) -> int:
        """Clients in good standing."""
        return len(self._ok)
