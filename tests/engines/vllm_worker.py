"""One vLLM worker process: vLLM's own ``MooncakeStoreWorker`` (MooncakeStoreConnector's
worker side) saving or loading KV blocks of CPU KV-cache tensors through mooncake-py.

Argument (JSON): ``role`` (``save`` or ``load``), ``master``, ``blocks`` (the KV-cache block
ids the request's tokens live in), ``num_tokens``, ``seed``, ``tier_log``.
Answer: per-block SHA-256 digests over every layer, and the worker's own failure counters.

One stand-in: ``wait_for_save`` records a ``torch.cuda.Event`` that the save thread waits on
before it reads the GPU KV cache; there is no CUDA here and the KV cache is host memory
already written, so ``torch.cuda.Event`` is replaced by an event whose ``record`` and
``synchronize`` do nothing.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

import torch
from worker_io import digest, run

BLOCK_SIZE = 16
NUM_BLOCKS = 32
LAYERS = 2
KV_HEADS = 2
HEAD_DIM = 16
SEGMENT_BYTES = 64 << 20
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "num_hidden_layers": LAYERS,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
}


class _NoCudaEvent:
    """``torch.cuda.Event`` without CUDA: the KV cache is host memory, nothing to wait for."""

    def record(self, stream: Any = None) -> None:
        """Nothing to record."""

    def synchronize(self) -> None:
        """Nothing to wait for."""


def _files(args: dict[str, Any]) -> tuple[str, str]:
    """A tiny local model directory (config.json only) and vLLM's Mooncake config file."""
    root = tempfile.mkdtemp(prefix="vllm-engine-test-")
    model_dir = os.path.join(root, "tiny-llama")
    os.makedirs(model_dir)
    with open(os.path.join(model_dir, "config.json"), "w") as out:
        json.dump(MODEL_CONFIG, out)
    config_path = os.path.join(root, "mooncake.json")
    with open(config_path, "w") as out:
        json.dump(
            {
                "metadata_server": "P2PHANDSHAKE",
                "master_server_address": args["master"],
                "protocol": "tcp",
                "device_name": "",
                "global_segment_size": SEGMENT_BYTES,
                "local_buffer_size": 16 << 20,
            },
            out,
        )
    return model_dir, config_path


def _worker(args: dict[str, Any]) -> tuple[Any, dict[str, torch.Tensor]]:
    """vLLM's config objects, parallel state (one rank, gloo) and the store worker, with the
    KV caches registered as the model runner registers them."""
    model_dir, config_path = _files(args)
    os.environ["MOONCAKE_CONFIG_PATH"] = config_path
    from vllm.config import (
        CacheConfig,
        KVTransferConfig,
        ModelConfig,
        ParallelConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker import (
        MooncakeStoreWorker,
    )
    from vllm.distributed.parallel_state import (
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
    )

    model_config = ModelConfig(
        model=model_dir, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=512
    )
    cache_config = CacheConfig(block_size=BLOCK_SIZE)
    cache_config.num_gpu_blocks = NUM_BLOCKS
    vllm_config = VllmConfig(
        model_config=model_config,
        cache_config=cache_config,
        parallel_config=ParallelConfig(),
        kv_transfer_config=KVTransferConfig(
            kv_connector="MooncakeStoreConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"load_async": True},
        ),
    )
    layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=KV_HEADS, head_size=HEAD_DIM, dtype=torch.bfloat16
    )
    # Blocks first: one contiguous region per layer, NUM_BLOCKS blocks of K and V.
    shape = (NUM_BLOCKS, 2, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    kv_caches = {name: torch.zeros(shape, dtype=torch.bfloat16) for name in layer_names}
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[
            KVCacheTensor(
                size=kv_caches[name].nbytes,
                layers=[name],
                layer_stride=kv_caches[name].nbytes,
                block_stride=kv_caches[name][0].nbytes,
            )
            for name in layer_names
        ],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=layer_names, kv_cache_spec=spec)],
    )
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{args['dist_port']}",
            backend="gloo",
        )
        ensure_model_parallel_initialized(1, 1)
        worker = MooncakeStoreWorker(vllm_config, kv_cache_config)
        worker.register_kv_caches(kv_caches)
    return worker, kv_caches


def _block_digests(kv_caches: dict[str, torch.Tensor], blocks: list[int]) -> list[str]:
    """Per block, the digest of its bytes in every layer (K and V)."""
    caches = list(kv_caches.values())
    return [
        digest([c[b].data_ptr() for c in caches], [c[b].nbytes for c in caches]) for b in blocks
    ]


def _wait(condition: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the connector's transfer thread did not finish")
        time.sleep(0.01)


def main(args: dict[str, Any]) -> dict[str, Any]:
    """Save (``wait_for_save``) or load (``start_load_kv``) one request's blocks."""
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import (
        LoadSpec,
        MooncakeStoreConnectorMetadata,
        ReqMeta,
    )
    from vllm.v1.core.kv_cache_utils import BlockHash

    torch.cuda.Event = _NoCudaEvent  # type: ignore[assignment,misc]
    worker, kv_caches = _worker(args)
    args["_keep"]["closers"] = [worker.close]
    blocks, num_tokens = args["blocks"], args["num_tokens"]
    # The scheduler's block hashes: one per full block of the prompt.
    block_hashes = [
        BlockHash(f"{args['request']}-{i}".encode()) for i in range(num_tokens // BLOCK_SIZE)
    ]
    answer: dict[str, Any] = {}
    if args["role"] == "save":
        for cache in kv_caches.values():
            generator = torch.Generator().manual_seed(args["seed"])
            raw = cache.view(torch.uint8).reshape(-1)
            raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))
            args["seed"] += 1
        request = ReqMeta(
            req_id="req-save",
            token_len_chunk=num_tokens,
            block_ids=(list(blocks),),
            block_hashes=block_hashes,
            can_save=True,
            store_job_id=1,
            prefill_end_tokens=num_tokens,
            num_prompt_tokens=num_tokens,
        )
        metadata = MooncakeStoreConnectorMetadata(set(), set())
        metadata.add_request(request)
        worker.wait_for_save(metadata)
        thread = worker.kv_send_thread
        _wait(lambda: thread.request_queue.unfinished_tasks == 0)
        answer["saved_jobs"] = thread.take_completed_saves()
    else:
        answer["lookup_hit_tokens"] = worker.lookup(num_tokens, block_hashes).hit_length
        request = ReqMeta(
            req_id="req-load",
            token_len_chunk=num_tokens,
            block_ids=(list(blocks),),
            block_hashes=block_hashes,
            load_spec=LoadSpec(
                vllm_cached_tokens=0, kvpool_cached_tokens=num_tokens, can_load=True
            ),
        )
        metadata = MooncakeStoreConnectorMetadata(set(), set())
        metadata.add_request(request)
        worker.start_load_kv(metadata)
        done: set[str] = set()

        def finished() -> bool:
            done.update(worker.get_finished(set(), metadata)[1])
            return "req-load" in done

        _wait(finished)
        answer["load_error_blocks"] = sorted(worker.get_block_ids_with_load_errors())
        if args.get("tier_log"):
            # What the receive thread's tier log classified each key as (it logs only counts).
            from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker import (
                _get_replica_tiers_by_key,
            )

            keys = [worker.token_dbs[0].key_for(h) for h in block_hashes]
            answer["tiers"] = sorted(set(_get_replica_tiers_by_key(worker.store, keys).values()))
    stats = worker.get_kv_connector_stats()
    # The connector's own per-operation counters (keys, bytes, failed keys, errors).
    answer["stats"] = stats.reduce() if stats is not None else {}
    answer["digests"] = _block_digests(kv_caches, blocks)
    return answer


if __name__ == "__main__":
    run(main)
