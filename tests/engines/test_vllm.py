"""vLLM 0.33.0 ``MooncakeStoreConnector`` worker side over mooncake-py: vLLM's own
``MooncakeStoreWorker`` saves a request's KV blocks in one process (its send thread:
``batch_is_exist`` then ``batch_put_from_multi_buffers``) and another process looks them up
and loads them (``batch_is_exist``, then its receive thread: ``batch_get_into_multi_buffers``,
with ``VLLM_MOONCAKE_STORE_TIER_LOG=1`` first ``batch_get_replica_desc``), byte for byte."""

from __future__ import annotations

import uuid

import pytest

from tests.engines.common import EngineWorker, free_port

pytestmark = pytest.mark.timeout(600)

BLOCK_SIZE = 16
SAVE_BLOCKS = [3, 4, 7, 9]
LOAD_BLOCKS = [20, 21, 22, 23]


@pytest.mark.parametrize("tier_log", [False, True], ids=["plain", "tier_log"])
def test_save_then_load(workers, engine_master, tier_log):
    """0 failed puts, a full lookup hit, 0 load errors, and the loaded blocks equal the
    saved ones in every layer."""
    num_tokens = BLOCK_SIZE * len(SAVE_BLOCKS)
    common = {
        "master": engine_master.address,
        "num_tokens": num_tokens,
        "request": uuid.uuid4().hex,
    }
    env = {
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_MOONCAKE_STORE_TIER_LOG": "1" if tier_log else "0",
    }
    saver = EngineWorker(
        "vllm_worker.py",
        {**common, "role": "save", "blocks": SAVE_BLOCKS, "seed": 11, "dist_port": free_port()},
        env,
    )
    workers.append(saver)
    saved = saver.result()
    # One completed store job (its id 1, on this one rank), with no failed key.
    assert saved["saved_jobs"] == {"1": 1}
    put = {k: saved["stats"][f"save_put_{k}"] for k in ("total_keys", "failed_keys", "error_count")}
    assert put == {"total_keys": len(SAVE_BLOCKS), "failed_keys": 0, "error_count": 0}
    loader = EngineWorker(
        "vllm_worker.py",
        {
            **common,
            "role": "load",
            "blocks": LOAD_BLOCKS,
            "dist_port": free_port(),
            "tier_log": tier_log,
        },
        env,
    )
    workers.append(loader)
    loaded = loader.result()
    # A full hit is re-derived one block short so the last token is recomputed.
    assert loaded["lookup_hit_tokens"] >= num_tokens - BLOCK_SIZE
    assert loaded["load_error_blocks"] == []
    get = {
        k: loaded["stats"][f"load_get_{k}"] for k in ("total_keys", "failed_keys", "error_count")
    }
    assert get == {"total_keys": len(SAVE_BLOCKS), "failed_keys": 0, "error_count": 0}
    assert loaded["digests"] == saved["digests"]
    if tier_log:
        # batch_get_replica_desc answered a memory replica for every key.
        assert loaded["tiers"] == ["memory"]
