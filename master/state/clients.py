"""Client liveness: who has pinged recently, and who is in good standing.

A client's deadline is pushed to ``now + client_ttl`` by each ping or mount. A client whose
deadline passes is expired: the service unmounts its segments. Only ``ReMountSegment`` puts a
client into good standing (``ok``); until then its pings answer NEED_REMOUNT, which is how a
client learns that the master restarted or forgot it.

With tokens required, each client id is also bound to the tenant that first used it
(:meth:`ClientRegistry.bind`). The binding lives as long as the client's registration: it is
forgotten with the client (expiry or close). A client id bound by calls that never register it
(no ping, no mount) is forgotten ``ttl`` after its binding, so the bindings stay bounded by the
clients seen within one ``client_ttl``.

Thread-safety: none. The master service serializes every call under its lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..ha.journal import Journal


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
        self._tenant_of: dict[str, str] = {}
        # Bound but never touched: binding deadline, in binding order (so oldest first).
        self._unregistered: dict[str, float] = {}
        # Told of every binding, good standing and forgetting, when the metadata is
        # replicated (deadlines are not: a new leader gives every client a fresh one).
        self.journal: Journal | None = None

    def touch(self, client_id: str, now: float) -> None:
        """Record that ``client_id`` is alive at ``now``. O(1)."""
        self._deadlines.pop(client_id, None)
        self._deadlines[client_id] = now + self._ttl_s
        self._unregistered.pop(client_id, None)

    def bind(self, client_id: str, tenant: str, now: float) -> bool:
        """Bind ``client_id`` to ``tenant`` unless it is bound already. O(1).

        Returns:
            True when the client id is (now) bound to ``tenant``; False when another tenant
            holds it.
        """
        holder = self._tenant_of.get(client_id)
        if holder is not None:
            return holder == tenant
        self._tenant_of[client_id] = tenant
        if self.journal is not None:
            self.journal.client(client_id)
        if client_id not in self._deadlines:
            self._unregistered[client_id] = now + self._ttl_s
        return True

    def tenant_of(self, client_id: str) -> str | None:
        """The tenant ``client_id`` is bound to, or None. O(1)."""
        return self._tenant_of.get(client_id)

    def mark_ok(self, client_id: str) -> None:
        """Put a client into good standing (after it remounted its segments)."""
        self._ok.add(client_id)
        if self.journal is not None:
            self.journal.client(client_id)

    def is_ok(self, client_id: str) -> bool:
        """True when the client remounted since it was last expired or since master start."""
        return client_id in self._ok

    def forget(self, client_id: str) -> None:
        """Drop a client entirely (it closed)."""
        self._deadlines.pop(client_id, None)
        self._ok.discard(client_id)
        self._tenant_of.pop(client_id, None)
        self._unregistered.pop(client_id, None)
        if self.journal is not None:
            self.journal.client(client_id)

    def known(self) -> set[str]:
        """Every client id with a deadline, a good standing or a binding. O(clients)."""
        return set(self._deadlines) | self._ok | set(self._tenant_of)

    def pop_expired(self, now: float) -> list[str]:
        """Remove and return clients whose deadline is at or before ``now``. O(expired)."""
        expired: list[str] = []
        for client_id, deadline in self._deadlines.items():
            if deadline > now:
                break
            expired.append(client_id)
        for client_id in expired:
            self.forget(client_id)
        unbound: list[str] = []
        for client_id, deadline in self._unregistered.items():
            if deadline > now:
                break
            unbound.append(client_id)
        for client_id in unbound:
            self.forget(client_id)
        return expired

    def __len__(self) -> int:
        return len(self._deadlines)

    def bound_count(self, tenant: str) -> int:
        """Client ids bound to ``tenant``. O(bindings)."""
        return sum(1 for t in self._tenant_of.values() if t == tenant)

    def check(self) -> None:
        """Verify that every unregistered binding is a binding of an unregistered client.

        Raises:
            AssertionError: the indexes disagree.
        """
        for client_id in self._unregistered:
            if client_id not in self._tenant_of or client_id in self._deadlines:
                raise AssertionError(f"client binding index broken at {client_id!r}")
        if not self._ok <= set(self._deadlines):
            raise AssertionError("a client in good standing is not registered")

    @property
    def active_count(self) -> int:
        """Clients in good standing."""
        return len(self._ok)
