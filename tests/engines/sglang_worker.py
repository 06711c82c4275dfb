"""One SGLang HiCache process: SGLang's own ``MooncakeStore`` / ``MooncakeEmbeddingStore``
over real SGLang host KV pools (CPU), saving or loading pages through mooncake-py.

Argument (JSON): ``mode`` (``mha`` page_first MHA, ``mla`` layer_first MLA, ``v2`` a draft
pool through ``batch_set_v2`` / ``batch_get_v2`` with a session id, ``emb`` the embedding
store, ``standalone`` ``standalone_storage=1`` through a standalone service, ``linker`` the
direct linker's offload and layer-wise load), ``role`` (``save`` or ``load``), ``master``,
``metrics_port``, ``check_server``, ``keys``, ``pages`` (page numbers to use), ``seed``,
``session_id``, ``service`` (the standalone service's address).
Answer: per-page SHA-256 digests of the host bytes saved or loaded, and the engine's results.
"""

from __future__ import annotations

from typing import Any

import torch
from worker_io import digest, run

PAGE_SIZE = 4
LAYERS = 3
HEADS = 2
HEAD_DIM = 16
DEVICE_TOKENS = 64
SEGMENT_BYTES = 64 << 20


def storage_config(args: dict[str, Any], is_mla: bool, page_first: bool) -> Any:
    """SGLang's storage config, with the Mooncake settings in ``extra_config`` (its first
    config source)."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    extra = {
        "master_server_address": args["master"],
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "protocol": "tcp",
        "device_name": "",
        "global_segment_size": SEGMENT_BYTES,
        "master_metrics_port": args["metrics_port"],
        "check_server": bool(args.get("check_server", False)),
        "standalone_storage": bool(args.get("standalone_storage", False)),
    }
    return HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=is_mla,
        enable_storage_metrics=False,
        is_page_first_layout=page_first,
        model_name="tiny/engine-test-model",
        extra_config=extra,
    )


def mha_host_pool(layout: str, allocator_type: str = "default") -> Any:
    """SGLang's MHA host pool, built from a CPU device pool as HiCache builds it."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    device_pool = MHATokenToKVPool(
        size=DEVICE_TOKENS,
        page_size=PAGE_SIZE,
        dtype=torch.bfloat16,
        head_num=HEADS,
        head_dim=HEAD_DIM,
        layer_num=LAYERS,
        device="cpu",
        enable_memory_saver=False,
        enable_alt_stream=False,
    )
    return MHATokenToKVPoolHost(
        device_pool._mha_buffer_info(),
        2.0,
        0,
        PAGE_SIZE,
        layout,
        pin_memory=False,
        device="cpu",
        allocator_type=allocator_type,
        device_capacity_tokens=DEVICE_TOKENS,
        start_layer=0,
        end_layer=LAYERS,
    )


def mla_host_pool(layout: str) -> Any:
    """SGLang's MLA host pool over a CPU MLA device pool."""
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    device_pool = MLATokenToKVPool(
        size=DEVICE_TOKENS,
        page_size=PAGE_SIZE,
        dtype=torch.bfloat16,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        layer_num=LAYERS,
        device="cpu",
        enable_memory_saver=False,
    )
    return MLATokenToKVPoolHost(
        device_pool._mla_buffer_info(),
        2.0,
        0,
        PAGE_SIZE,
        layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=DEVICE_TOKENS,
        start_layer=0,
        end_layer=LAYERS,
        target_layer_num=LAYERS,
    )


def fill(tensor: torch.Tensor, seed: int) -> None:
    """Seeded random bytes over the whole buffer, so every page differs."""
    raw = tensor.view(torch.uint8).reshape(-1)
    generator = torch.Generator().manual_seed(seed)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))


def page_indices(pages: list[int]) -> torch.Tensor:
    """Host token indices of whole pages, as HiCache passes them."""
    return torch.cat([torch.arange(p * PAGE_SIZE, (p + 1) * PAGE_SIZE) for p in pages])


def page_digests(host_pool: Any, pages: list[int]) -> list[str]:
    """The digest of each page's bytes, via the pool's own zero-copy metadata."""
    out = []
    for page in pages:
        ptrs, sizes = host_pool.get_page_buffer_meta(page_indices([page]))
        out.append(digest(ptrs, sizes))
    return out


def hicache(args: dict[str, Any]) -> dict[str, Any]:
    """Save or load pages with ``MooncakeStore`` (modes ``mha``, ``mla``, ``v2``)."""
    from sglang.srt.mem_cache.hicache_storage import (
        HiCacheStorageExtraInfo,
        PoolName,
        PoolTransfer,
    )
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    mode, role, keys, pages = args["mode"], args["role"], args["keys"], args["pages"]
    is_mla = mode == "mla"
    layout = "layer_first" if is_mla else "page_first"
    host = mla_host_pool(layout) if is_mla else mha_host_pool(layout)
    fill(host.kv_buffer, args["seed"] if role == "save" else 0)
    store = MooncakeStore(storage_config(args, is_mla, layout != "layer_first"), host)
    store.register_mem_pool_host(host)
    answer: dict[str, Any] = {}
    if mode == "v2":
        # The KV anchor pool goes through v1 as HiCache sends it; the draft pool, an extra
        # pool, through v2 with the writing request's session id.
        draft = mha_host_pool("page_first")
        fill(draft.kv_buffer, args["seed"] + 1 if role == "save" else 0)
        store.register_mem_host_pool_v2(draft, PoolName.DRAFT)
        transfer = PoolTransfer(name=PoolName.DRAFT, host_indices=page_indices(pages), keys=keys)
        if role == "save":
            info = HiCacheStorageExtraInfo(extra_info={"session_id": args["session_id"]})
            answer["kv_results"] = store.batch_set_v1(keys, page_indices(pages))
            answer["results"] = store.batch_set_v2([transfer], info)[PoolName.DRAFT]
        else:
            hits = store.batch_exists_v2(keys, [transfer])
            answer["kv_exists"] = hits.kv_hit_pages
            answer["exists"] = hits.extra_pool_hit_pages.get(PoolName.DRAFT, 0)
            answer["kv_results"] = store.batch_get_v1(keys, page_indices(pages))
            answer["results"] = store.batch_get_v2([transfer])[PoolName.DRAFT]
            page = store.store.list_kv_session_keys(args["session_id"])
            answer["session_keys"] = sorted(page.keys)
        answer["draft_digests"] = page_digests(draft, pages)
    elif role == "save":
        answer["results"] = store.batch_set_v1(keys, page_indices(pages))
        # A second save finds every key and puts nothing (the exist-then-put path).
        answer["resave"] = store.batch_set_v1(keys, page_indices(pages))
    else:
        answer["exists"] = store.batch_exists(keys)
        answer["results"] = store.batch_get_v1(keys, page_indices(pages))
    answer["digests"] = page_digests(host, pages)
    args["_keep"]["store"] = store
    return answer


def embedding(args: dict[str, Any]) -> dict[str, Any]:
    """Save or load embeddings with ``MooncakeEmbeddingStore``: one-buffer values through
    ``batch_put`` / ``batch_get`` and two-buffer values through the multi-buffer calls."""
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_embedding_store import (
        MooncakeEmbeddingStore,
    )

    role, hashes = args["role"], args["keys"]
    count, width = len(hashes), 4096
    # Rows 0..count-1: single values; rows count.. : two halves of multi-buffer values.
    buffer = torch.empty((3 * count, width), dtype=torch.uint8)
    fill(buffer, args["seed"] if role == "save" else 0)
    store = MooncakeEmbeddingStore(storage_config(args, False, True))
    store.register_buffer(buffer)
    singles = [buffer[i].data_ptr() for i in range(count)]
    multi = [
        [buffer[count + 2 * i].data_ptr(), buffer[count + 2 * i + 1].data_ptr()]
        for i in range(count)
    ]
    multi_sizes = [[width, width // 2] for _ in range(count)]
    multi_hashes = [h + "-multi" for h in hashes]
    answer: dict[str, Any] = {}
    if role == "save":
        answer["results"] = store.batch_put(hashes, singles, [width] * count)
        answer["multi_results"] = store.batch_put_from_multi_buffers(
            multi_hashes, multi, multi_sizes
        )
    else:
        answer["exists"] = store.batch_is_exist(hashes + multi_hashes)
        answer["results"] = store.batch_get(hashes, singles, [width] * count)
        answer["multi_results"] = store.batch_get_into_multi_buffers(
            multi_hashes, multi, multi_sizes
        )
    answer["digests"] = [digest([p], [width]) for p in singles]
    answer["multi_digests"] = [digest(p, s) for p, s in zip(multi, multi_sizes, strict=True)]
    args["_keep"]["store"] = store
    return answer


def standalone(args: dict[str, Any]) -> dict[str, Any]:
    """``standalone_storage=1``: the host pool is allocated by SGLang's
    ``MooncakeHostTensorAllocator`` (``allocator_type="mooncake"``, over
    ``mooncake.store.MooncakeHostMemAllocator``) and the store is a thin ``setup_dummy``
    client of this host's standalone store service; pages are then saved or loaded as in
    ``mha`` mode, the bytes moving in the service."""
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import (
        MooncakeHostTensorAllocator,
        MooncakeStore,
    )

    role, keys, pages = args["role"], args["keys"], args["pages"]
    host = mha_host_pool("page_first", allocator_type="mooncake")
    assert isinstance(host.allocator, MooncakeHostTensorAllocator), type(host.allocator)
    fill(host.kv_buffer, args["seed"] if role == "save" else 0)
    config = storage_config({**args, "standalone_storage": True}, False, True)
    config.extra_config["client_server_address"] = args["service"]
    store = MooncakeStore(config, host)
    store.register_mem_pool_host(host)
    args["_keep"]["store"] = store
    answer: dict[str, Any] = {}
    if role == "save":
        answer["results"] = store.batch_set_v1(keys, page_indices(pages))
    else:
        answer["exists"] = store.batch_exists(keys)
        answer["results"] = store.batch_get_v1(keys, page_indices(pages))
    answer["digests"] = page_digests(host, pages)
    return answer


def linker(args: dict[str, Any]) -> dict[str, Any]:
    """SGLang's ``MooncakeDirectLinker`` between a CPU MHA device pool and the store: save
    runs its ``offload`` and offload thread (``batch_set_v2`` of one packed object per
    page); load runs ``lookup`` and ``load_layer_wise`` (a get session, one ranged read per
    layer, then the session's end) into other pages of the device pool.

    The linker is built from SGLang's own pool entry (``_mha_device_pool_entry``), pool group
    and ``MooncakeStore``, with the attributes its constructor sets; the constructor itself
    is bypassed because it reads the scheduler's ``CacheInitParams``, server args and model
    globals. ``record_offload_ready`` (CUDA events on the forward stream) returns no events:
    the device pool is host memory that is already written.
    """
    import threading
    from queue import Queue

    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
    from sglang.srt.mem_cache.hybrid_cache.linker_pool_assembler import (
        DevicePoolGroup,
        _mha_device_pool_entry,
    )
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_direct_linker import (
        MooncakeDirectLinker,
        _storage_suffix,
    )
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore
    from sglang.srt.mem_cache.unified_cache.unified_cache_linker import LayerWiseLoadCounter

    role, keys, pages = args["role"], args["keys"], args["pages"]
    device_pool = MHATokenToKVPool(
        size=DEVICE_TOKENS,
        page_size=PAGE_SIZE,
        dtype=torch.bfloat16,
        head_num=HEADS,
        head_dim=HEAD_DIM,
        layer_num=LAYERS,
        device="cpu",
        enable_memory_saver=False,
        enable_alt_stream=False,
    )
    for layer, buffer in enumerate([*device_pool.k_buffer, *device_pool.v_buffer]):
        fill(buffer, args["seed"] + layer if role == "save" else 0)
    entry = _mha_device_pool_entry(
        PoolName.KV, device_pool, {i: i for i in range(LAYERS)}, PAGE_SIZE
    )
    group = DevicePoolGroup([entry], num_layers=LAYERS, page_size=PAGE_SIZE)
    storage = MooncakeStore(storage_config(args, False, False), mem_pool=None)

    link = MooncakeDirectLinker.__new__(MooncakeDirectLinker)
    link.forward_stream = None
    link.page_size = PAGE_SIZE
    link.pool_group = group
    link.pools = group.entry_map
    link.num_layers = LAYERS
    link.offload_owner = True
    link.storage = storage
    storage.mem_pool_host = group
    storage.registered_pools = link.pools
    storage.mla_suffix = storage.mha_suffix = _storage_suffix(
        rank_replicated=False, tp_rank=0, attn_cp_rank=0, pp_rank=0
    )
    link.register_buffers()
    link.mla_broadcaster = None
    link.layer_done_counter = LayerWiseLoadCounter(LAYERS, None)
    link.pending_loads = {}
    link.gc_frozen = False
    link.offload_queue = Queue()
    link.offload_results = Queue()
    link.stats = {"lookup": 0, "load": 0, "offload": 0}
    link.record_offload_ready = lambda: []
    args["_keep"]["store"] = storage

    indices = page_indices(pages)
    # The scheduler names device slots; the pool group maps them to storage transfers.
    transfer = PoolTransfer(name=PoolName.KV, device_indices=indices, keys=keys)
    answer: dict[str, Any] = {}
    if role == "save":
        threading.Thread(target=link.offload_thread_func, daemon=True).start()
        answer["queued"] = link.offload([transfer])
        answer["results"] = [link.offload_results.get(timeout=120)]
    else:
        answer["restorable"] = link.lookup("req-0", [transfer])
        answer["queued"] = link.load("req-0", [transfer])
        counter = link.layer_done_counter
        index = counter.update_producer()
        # What the load thread runs for the batch start_layer_wise_loading hands it.
        link.load_layer_wise(index, [link.pending_loads.pop("req-0")])
        errors = [repr(f.exception(timeout=60)) for f in counter.futures[index]]
        answer["layer_errors"] = [e for e in errors if e != "None"]
    answer["digests"] = [
        digest(*entry.get_page_buffer_meta(page_indices([page]))) for page in pages
    ]
    return answer


def main(args: dict[str, Any]) -> dict[str, Any]:
    """Dispatch on ``mode``."""
    if args["mode"] == "linker":
        return linker(args)
    if args["mode"] == "emb":
        return embedding(args)
    if args["mode"] == "standalone":
        return standalone(args)
    return hicache(args)


if __name__ == "__main__":
    run(main)
