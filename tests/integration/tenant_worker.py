"""A tenant's client process for the isolation tests: ``client_worker``'s operations plus
sessions and the identifiers another tenant would need to attack it.

Requests and answers as in ``client_worker.py`` (JSON lines on stdin / stdout).
"""

from __future__ import annotations

from typing import Any

from mooncake_py import ReplicateConfig
from tests.integration.client_worker import Worker, digest, main, value_for


class TenantWorker(Worker):
    """A client holding a segment, values and a pinned session of one tenant."""

    def op_put_tagged(self, keys: list[str], size: int, session: str) -> int:
        config = ReplicateConfig(kv_sessions=[[session]] * len(keys))
        return self.store.put_batch(keys, [value_for(k, size) for k in keys], config)

    def op_pin(self, session: str) -> None:
        self.store.pin_kv_session(session)

    def op_session(self, session: str) -> dict[str, Any]:
        info = self.store.get_kv_session(session)
        keys = self.store.list_kv_session_keys(session).keys
        return {"pinned": info.pinned, "members": info.member_count, "keys": sorted(keys)}

    def op_identity(self) -> dict[str, Any]:
        core = self.store.client._core  # noqa: SLF001 - the identifiers an attacker would use
        segment = core.segments()[0]
        return {
            "client_id": core.client_id,
            "segment_id": segment.id,
            "endpoint": segment.te_endpoint,
            "host_id": segment.host_id,
            "name": segment.name,
        }

    def op_digests(self, keys: list[str]) -> list[str]:
        return [digest(self.store.get(k)) for k in keys]

    def op_healthy(self) -> bool:
        return bool(self.store.client.master_reachable)


if __name__ == "__main__":
    main(TenantWorker())
