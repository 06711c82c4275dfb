"""LMCache 0.5.6 ``mooncakestore`` connector over mooncake-py: LMCache's own
``MooncakestoreConnector`` puts KV chunks in one process and another process on the same host
gets them, in zero-copy mode and in metadata mode, byte for byte."""

from __future__ import annotations

import random

import pytest

from tests.engines.common import EngineWorker

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize(
    "save_chunk_meta",
    [False, True],
    ids=["zero_copy", "metadata"],
)
def test_put_then_get(workers, engine_master, save_chunk_meta):
    """Zero-copy: ``batch_put_from`` from the registered CPU buffer, ``batch_get_into``
    into it. Metadata: ``put_parts(key, metadata, kv)`` and ``batch_get_buffer``, whose
    results LMCache wraps with ``torch.frombuffer``."""
    hashes = [random.getrandbits(60) for _ in range(4)]
    common = {"master": engine_master.address, "hashes": hashes, "save_chunk_meta": save_chunk_meta}
    saver = EngineWorker("lmcache_worker.py", {**common, "role": "save", "seed": 5})
    workers.append(saver)
    saved = saver.result()
    assert saved["registered"]
    assert saved["exists"] == [True] * len(hashes)
    loader = EngineWorker("lmcache_worker.py", {**common, "role": "load"})
    workers.append(loader)
    loaded = loader.result()
    assert loaded["exists"] == [True] * len(hashes)
    assert loaded["found"] == [True] * len(hashes)
    assert loaded["digests"] == saved["digests"]
