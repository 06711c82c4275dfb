"""A KV-offload connector for serving engines, on top of the public store API.

The engine side of the store: page keys from chained token-page hashes (SGLang HiCache's
model-aware format), a prefix probe, saves that write only missing pages and treat
NO_AVAILABLE_HANDLE as back-pressure, loads where a miss means recompute, and the KV-session
life cycle of a conversation (attach hits, pin while live, compact, close or release)::

    from mooncake_py.connector import KVConnector, Page, PageKeys, page_hashes

    connector = KVConnector(store, PageKeys(model="meta-llama/Llama-3.1-8B", rank=0))
    hashes = page_hashes(token_ids, page_tokens=64)
    hit = connector.lookup(hashes)
    loaded = connector.load(hashes[:hit], buffers[:hit], session_id="conv-1")
    ...  # prefill from page `loaded` on
    connector.pin("conv-1")
    connector.save([Page(h, ptr, size) for ...], session_id="conv-1")

:class:`AsyncKVConnector` offers the same over :class:`~mooncake_py.AsyncClient`.

The connector probes without leases and leases only what it loads: lookups and the probe
before a save are ``batch_probe_key`` calls, which hold nothing on the master, and loads are
reads, whose leases end as soon as their copies are done.
"""

from mooncake_py.connector.aio import AsyncKVConnector
from mooncake_py.connector.keys import PageKeys, chain_hash, page_hashes
from mooncake_py.connector.planning import Buffer, Page, SaveResult
from mooncake_py.connector.sync import KVConnector

__all__ = [
    "AsyncKVConnector",
    "Buffer",
    "KVConnector",
    "Page",
    "PageKeys",
    "SaveResult",
    "chain_hash",
    "page_hashes",
]
