"""One LMCache process: LMCache's own ``MooncakestoreConnector`` over its own CPU backend
(``LocalCPUBackend`` and its allocator), putting or getting KV chunks through mooncake-py.

Argument (JSON): ``role`` (``save`` or ``load``), ``master``, ``hashes`` (chunk hashes),
``seed``, ``save_chunk_meta`` (False: zero-copy mode, ``batch_put_from`` / ``batch_get_into``;
True: metadata mode, ``put_parts`` / ``batch_get_buffer``).
Answer: per-chunk SHA-256 digests of the memory objects put or got.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import torch
from worker_io import run

CHUNK = 16
LAYERS = 2
HEADS = 2
HEAD_DIM = 16


def _connector(args: dict[str, Any], loop: asyncio.AbstractEventLoop) -> Any:
    """LMCache's config, metadata, CPU backend and Mooncake connector, as its storage
    manager builds them (the connector's Mooncake settings from ``extra_config``)."""
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.connector.mooncakestore_connector import (
        MooncakestoreConnector,
    )
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK,
        local_cpu=True,
        max_local_cpu_size=0.05,
        extra_config={
            "save_chunk_meta": args["save_chunk_meta"],
            "local_hostname": "127.0.0.1",
            "metadata_server": "P2PHANDSHAKE",
            "master_server_address": args["master"],
            "global_segment_size": 64 << 20,
            "local_buffer_size": 16 << 20,
            "protocol": "tcp",
            "transfer_timeout": 30,
        },
    )
    metadata = LMCacheMetadata(
        model_name="tiny-engine-test-model",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.bfloat16,
        kv_shape=(LAYERS, 2, CHUNK, HEADS, HEAD_DIM),
        chunk_size=CHUNK,
    )
    backend = LocalCPUBackend(config, metadata, dst_device="cpu")
    return MooncakestoreConnector(loop, backend, config), backend, metadata


def _digest(memory_obj: Any) -> str:
    return hashlib.sha256(memory_obj.raw_tensor.numpy().tobytes()).hexdigest()


def main(args: dict[str, Any]) -> dict[str, Any]:
    """Put (``batched_put``) or get (``batched_get``, after ``exists``) the chunks."""
    from lmcache.utils import CacheEngineKey

    loop = asyncio.new_event_loop()
    connector, backend, metadata = _connector(args, loop)
    args["_keep"]["closers"] = [lambda: loop.run_until_complete(connector.close())]
    keys = [
        CacheEngineKey("tiny-engine-test-model", 1, 0, int(h), torch.bfloat16)
        for h in args["hashes"]
    ]
    answer: dict[str, Any] = {"registered": connector.registered_buffer_ptr is not None}
    if args["role"] == "save":
        objs = []
        generator = torch.Generator().manual_seed(args["seed"])
        for _ in keys:
            obj = backend.allocate(metadata.get_shapes(), metadata.get_dtypes())
            raw = obj.raw_tensor.view(torch.uint8)
            raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))
            objs.append(obj)
        loop.run_until_complete(connector.batched_put(keys, objs))
        answer["exists"] = [bool(connector.exists_sync(k)) for k in keys]
        answer["digests"] = [_digest(o) for o in objs]
    else:
        answer["exists"] = [bool(loop.run_until_complete(connector.exists(k))) for k in keys]
        got = loop.run_until_complete(connector.batched_get(keys))
        answer["found"] = [o is not None for o in got]
        answer["digests"] = [_digest(o) if o is not None else None for o in got]
    return answer


if __name__ == "__main__":
    run(main)
