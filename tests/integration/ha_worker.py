"""A client process for the metadata durability tests, driven by JSON lines on stdin.

It holds a store (and so a segment) that outlives the masters it talks to. Values are derived
from their keys (:func:`value_for`), so the test checks contents by digest without shipping
bytes. Requests: ``{"op": ..., ...}``; answers: one JSON line ``{"ok": true, "result": ...}``
or ``{"ok": false, "error": "..."}``.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from mooncake_py import MooncakeDistributedStore, ReplicateConfig
from tests.line_worker import serve_requests


def value_for(key: str, size: int) -> bytes:
    """Deterministic content of ``size`` bytes for ``key``."""
    block = hashlib.sha256(f"{key}/{size}".encode()).digest()
    return (block * (size // len(block) + 1))[:size]


class Worker:
    """One store and the calls the tests make through it."""

    def __init__(self) -> None:
        self.store = MooncakeDistributedStore()

    def op_setup(self, config: dict[str, Any]) -> int:
        return self.store.setup(config)

    def op_put(
        self, keys: list[str], sizes: list[int], sessions: list[list[str]], local: bool = False
    ) -> list[int]:
        """Put each key (tagged with its sessions); ``local`` places it in this process's own
        segment."""
        codes = []
        for key, size, tags in zip(keys, sizes, sessions, strict=True):
            options: dict[str, Any] = {"kv_sessions": [tags]} if tags else {}
            if local:
                options["preferred_segment"] = self.store.get_hostname()
            codes.append(self.store.put(key, value_for(key, size), ReplicateConfig(**options)))
        return codes

    def op_put_until_failure(self, prefix: str, count: int, size: int) -> list[str]:
        """Put ``prefix-0``, ``prefix-1``, ... until a put fails or ``count`` are done;
        returns the keys whose puts were acknowledged (every one before the failure)."""
        acked = []
        for i in range(count):
            key = f"{prefix}-{i}"
            if self.store.put(key, value_for(key, size)) != 0:
                break
            acked.append(key)
        return acked

    def op_put_for(self, prefix: str, seconds: float, size: int) -> list[list[Any]]:
        """Put ``prefix-0``, ``prefix-1``, ... for ``seconds``, through failures (a put that
        fails is not retried here); returns ``[key, code]`` of every put."""
        deadline = time.monotonic() + seconds
        results: list[list[Any]] = []
        while time.monotonic() < deadline:
            key = f"{prefix}-{len(results)}"
            results.append([key, self.store.put(key, value_for(key, size))])
        return results

    def op_check(self, keys: list[str], sizes: list[int]) -> list[str]:
        """Per key: "ok", "missing" or "wrong" (bytes differ from what was written)."""
        verdicts = []
        for key, size in zip(keys, sizes, strict=True):
            data = self.store.get(key)
            if not data:
                verdicts.append("missing")
            else:
                verdicts.append("ok" if bytes(data) == value_for(key, size) else "wrong")
        return verdicts

    def op_exist(self, keys: list[str]) -> list[int]:
        return list(self.store.batch_is_exist(keys))

    def op_remove(self, key: str) -> int:
        return self.store.remove(key)

    def op_pin(self, session_id: str) -> int:
        return self.store.pin_kv_session(session_id)

    def op_session(self, session_id: str) -> dict[str, Any] | None:
        info = self.store.get_kv_session(session_id)
        if info is None:
            return None
        return {
            "pinned": info.pinned,
            "member_count": info.member_count,
            "bytes": info.bytes,
            "exclusive_bytes": info.exclusive_bytes,
        }

    def op_tiers(self, keys: list[str]) -> list[list[str]]:
        """Per key, the tiers of its replicas ("memory" / "disk"; none when missing)."""
        found = self.store.batch_get_replica_desc(keys)
        return [
            ["disk" if d.is_disk_replica() else "memory" for d in found.get(key, [])]
            for key in keys
        ]

    def op_hostname(self) -> str:
        """The name of this process's segment."""
        return self.store.get_hostname()


def main() -> None:
    worker = Worker()
    serve_requests(worker)
    worker.store.close()


if __name__ == "__main__":
    main()
