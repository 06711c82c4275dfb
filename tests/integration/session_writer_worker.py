"""A client process writing tagged objects for several tenants, for the CLI tests.

Requests and answers as in ``client_worker.py`` (JSON lines on stdin / stdout); every
operation names the tenant whose store (one per tenant, each with its own segment) it uses.
"""

from __future__ import annotations

from typing import Any

from mooncake_py import MooncakeDistributedStore, ObjectDataType, ReplicateConfig
from tests.integration.client_worker import Worker, main, value_for


class SessionWriter(Worker):
    """One store per tenant."""

    def __init__(self) -> None:
        super().__init__()
        self.stores: dict[str, MooncakeDistributedStore] = {}

    def op_join(self, tenant: str, config: dict[str, Any]) -> int:
        store = MooncakeDistributedStore()
        code = store.setup({**config, "tenant_id": tenant})
        if code == 0:
            self.stores[tenant] = store
        return code

    def op_put_tagged(self, tenant: str, key: str, size: int, sessions: list[str]) -> int:
        config = ReplicateConfig(kv_sessions=[sessions])
        return self.stores[tenant].put(key, value_for(key, size), config)

    def op_put_typed(self, tenant: str, key: str, size: int, data_type: str) -> int:
        config = ReplicateConfig(data_type=ObjectDataType[data_type])
        return self.stores[tenant].put(key, value_for(key, size), config)

    def op_pin(self, tenant: str, session: str) -> None:
        self.stores[tenant].pin_kv_session(session)

    def op_exist(self, tenant: str, keys: list[str]) -> list[int]:
        return self.stores[tenant].batch_is_exist(keys)

    def op_leave(self) -> int:
        codes = [store.close() for store in self.stores.values()]
        self.stores.clear()
        return min(codes, default=0)


if __name__ == "__main__":
    main(SessionWriter())
