"""The memory API against its own OpenAPI document, property-based: requests generated from
/openapi.json (valid and invalid bodies and query strings) sent to a real master holding real
sessions; every answer must be documented (status, content type, schema) and none a 5xx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from mooncake_py import MooncakeDistributedStore, ReplicateConfig
from mooncake_py.master.openapi import openapi_document
from mooncake_py.testing import InProcessMaster
from tests.fuzz.common import EXAMPLES

schema = schemathesis.openapi.from_dict(openapi_document())

TOKENS = {"token-a": "tenant-a", "token-admin": {"tenant": "ops", "role": "admin"}}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, InProcessMaster]]:
    """A master requiring tokens, with tenant A's sessions (some shared, one pinned) and a
    disk tier (so that answers carry both tiers)."""
    tokens = Path(tmp_path_factory.mktemp("tokens")) / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    with InProcessMaster(auth_tokens_file=str(tokens)) as master:
        store = MooncakeDistributedStore()
        config = {
            "master_server_address": master.address,
            "global_segment_size": 16 << 20,
            "enable_ssd_offload": True,
            "ssd_offload_path": str(tmp_path_factory.mktemp("disk")),
            "ssd_offload_quota": 64 << 20,
        }
        assert store.setup({**config, "auth_token": "token-a"}) == 0
        try:
            for i in range(40):
                sessions = [f"conv-{i % 7}", f"conv-{(i + 1) % 7}"]
                assert store.put(f"k{i}", b"x" * 4096, ReplicateConfig(kv_sessions=[sessions])) == 0
            store.pin_kv_session("conv-3")
            port = master.metrics_port
            yield f"http://127.0.0.1:{port}", master
            master.service.check()
        finally:
            store.close()


@schema.parametrize()
@settings(
    # Derandomized like the default fuzz run, so CI sees the same requests every time;
    # MOONCAKE_PY_FUZZ_EXAMPLES=N (make fuzz) explores N fresh ones per operation.
    max_examples=EXAMPLES or 25,
    derandomize=not EXAMPLES,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@pytest.mark.parametrize("token", ["token-a", "token-admin"])
def test_every_answer_is_documented(
    case: schemathesis.Case, token: str, served: tuple[str, InProcessMaster]
) -> None:
    base_url, _ = served
    case.call_and_validate(base_url=base_url, headers={"Authorization": f"Bearer {token}"})
