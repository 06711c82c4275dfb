"""The KV connector against a real master and two client processes (two engine ranks).

Each process hosts a segment and drives a :class:`KVConnector` on request over a pipe; page
bytes are derived from the page hash, so a process can check what another one wrote.
"""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pytest

from mooncake_py import AsyncClient, MooncakeDistributedStore
from mooncake_py.connector import (
    AsyncKVConnector,
    Buffer,
    KVConnector,
    Page,
    PageKeys,
    SaveResult,
    page_hashes,
)
from mooncake_py.connector.planning import plan_save, stored_prefix, tally_put
from mooncake_py.testing import InProcessMaster

MIB = 1 << 20
PAGE = 64 * 1024
PAGE_TOKENS = 16
BUFFER_PAGES = 64
KEYS = PageKeys(model="org/test-model", rank=0, prefix="conn-test")


def content(page_hash: str) -> bytes:
    """The bytes of a page: a digest of its hash, repeated."""
    return hashlib.blake2b(page_hash.encode(), digest_size=64).digest() * (PAGE // 64)


def chain(seed: int, pages: int, parent: str = "") -> list[str]:
    """Hashes of ``pages`` pages of tokens drawn from ``seed``, continuing ``parent``."""
    tokens = np.random.default_rng(seed).integers(0, 50_000, pages * PAGE_TOKENS).tolist()
    return page_hashes(tokens, PAGE_TOKENS, parent)


class _Engine:
    """The child's side: a store, a registered buffer and a connector."""

    def __init__(self, address: str, segment_bytes: int, batch_pages: int) -> None:
        self.store = MooncakeDistributedStore()
        config = {
            "local_hostname": "127.0.0.1",
            "metadata_server": "P2PHANDSHAKE",
            "global_segment_size": segment_bytes,
            "master_server_address": address,
        }
        assert self.store.setup(config) == 0
        self.buffer = np.zeros(BUFFER_PAGES * PAGE, dtype=np.uint8)
        self.base = int(self.buffer.ctypes.data)
        assert self.store.register_buffer(self.base, self.buffer.nbytes) == 0
        # The connector runs on the typed client; op_store checks the drop-in face's answers.
        self.connector = KVConnector(self.store.client, KEYS, batch_pages=batch_pages)

    def op_save(self, hashes: list[str], session: str | None) -> SaveResult:
        pages = []
        for i, page_hash in enumerate(hashes):
            self.buffer[i * PAGE : (i + 1) * PAGE] = np.frombuffer(content(page_hash), np.uint8)
            pages.append(Page(page_hash, self.base + i * PAGE, PAGE))
        return self.connector.save(pages, session)

    def op_load(self, hashes: list[str], session: str | None) -> tuple[int, bool]:
        self.buffer[:] = 0
        buffers = [Buffer(self.base + i * PAGE, PAGE) for i in range(len(hashes))]
        loaded = self.connector.load(hashes, buffers, session)
        view = self.buffer.data
        intact = all(view[i * PAGE : (i + 1) * PAGE] == content(hashes[i]) for i in range(loaded))
        return loaded, intact

    def op_connector(self, method: str, *args: Any) -> Any:
        return getattr(self.connector, method)(*args)

    def op_store(self, method: str, *args: Any) -> Any:
        return getattr(self.store, method)(*args)


def _serve(address: str, segment_bytes: int, batch_pages: int, conn: Connection) -> None:
    engine = _Engine(address, segment_bytes, batch_pages)
    conn.send(("ok", None))
    while (request := conn.recv()) is not None:
        op, args = request
        try:
            conn.send(("ok", getattr(engine, f"op_{op}")(*args)))
        except Exception as exc:  # reported to the test, which fails with it
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
    engine.store.close()


class EngineProcess:
    """A client process running a connector; ``call`` runs one operation in it."""

    def __init__(self, address: str, segment_bytes: int, batch_pages: int = 256) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(address, segment_bytes, batch_pages, child)
        )
        self.process.start()
        child.close()

    def wait_ready(self) -> None:
        assert self.conn.poll(60), "engine process did not start"
        assert self.conn.recv() == ("ok", None)

    def call(self, op: str, *args: Any) -> Any:
        self.conn.send((op, args))
        assert self.conn.poll(60), f"engine process did not answer {op}"
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(value)
        return value

    def stop(self) -> None:
        if self.process.is_alive():
            self.conn.send(None)
            self.process.join(timeout=15)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.conn.close()


def start_engines(address: str, segment_bytes: int, batch_pages: int = 256) -> list[EngineProcess]:
    engines = [EngineProcess(address, segment_bytes, batch_pages) for _ in range(2)]
    for engine in engines:
        engine.wait_ready()
    return engines


@pytest.fixture
def engines(master: InProcessMaster) -> Iterator[list[EngineProcess]]:
    """Two engine ranks on the shared ``master``, each hosting 8 MiB."""
    started = start_engines(master.address, 8 * MIB)
    yield started
    for engine in started:
        engine.stop()


def test_prefix_lookup_and_partial_hits(
    master: InProcessMaster, engines: list[EngineProcess]
) -> None:
    rank0, rank1 = engines
    system = chain(1, 4)
    first = system + chain(2, 4, system[-1])
    assert rank1.call("connector", "lookup", first) == 0
    saved = rank0.call("save", first, None)
    assert (saved.requested, saved.present, saved.written) == (8, 0, 8)
    assert saved.bytes_written == 8 * PAGE and not saved.backpressure
    # The other rank sees the whole prefix and reads it intact (keys are shared across ranks).
    assert rank1.call("connector", "lookup", first) == 8
    # The connector probes without leases and leases only what it loads, until it is loaded.
    assert master.service.stats()["existence_holds"] == 0
    assert not any(master.service.is_leased("default", KEYS.key(h)) for h in first)
    assert rank1.call("load", first, None) == (8, True)
    master.wait_for_leases_to_end([KEYS.key(h) for h in first], timeout_s=5.0)
    # A conversation sharing only the system prompt: a partial hit, then only the rest written.
    second = system + chain(3, 3, system[-1])
    assert rank1.call("connector", "lookup", second) == 4
    assert rank1.call("load", second, None) == (4, True)
    resaved = rank1.call("save", second, None)
    assert (resaved.present, resaved.written) == (4, 3)
    # A hole in the middle ends the prefix for lookups and loads alike: recompute from there.
    assert rank0.call("store", "remove", KEYS.key(first[5]), True) == 0
    assert rank1.call("connector", "lookup", first) == 5
    assert rank1.call("load", first, None) == (5, True)
    refill = rank0.call("save", first, None)
    assert (refill.present, refill.written) == (7, 1)
    assert rank1.call("connector", "lookup", first) == 8
    stats = master.service.stats()
    assert stats["objects"] == 8 + 3


def test_backpressure_on_a_full_store() -> None:
    # Pinned sessions may not be evicted here, so a store full of them must push back.
    with InProcessMaster(allow_evict_soft_pinned_objects=False) as master:
        holder, writer = start_engines(master.address, 2 * MIB, batch_pages=2)
        try:
            pinned = chain(10, 64)  # exactly the store: 2 ranks x 2 MiB / 64 KiB
            assert holder.call("save", pinned[:1], "hold").written == 1
            assert holder.call("connector", "pin", "hold") is True
            filled = holder.call("save", pinned, "hold")  # admitted already pinned
            assert (filled.present, filled.written, filled.backpressure) == (1, 63, False)
            extra = chain(11, 7)
            pushed = writer.call("save", extra, None)
            assert pushed.backpressure is True
            assert pushed.written == 0 and pushed.refused == 2 and pushed.skipped == 5
            assert pushed.errors == {-200: 2} and pushed.failed == 0
            # Nothing was lost or half-written; the engine just recomputes what is missing.
            assert writer.call("connector", "lookup", pinned) == 64
            assert writer.call("connector", "lookup", extra) == 0
            assert master.service.stats()["evicted_soft_pinned"] == 0
            # The lookups held nothing; once the session is ended, its pages are ordinary
            # cache again and saves succeed.
            assert not any(master.service.is_leased("default", KEYS.key(h)) for h in pinned)
            assert holder.call("connector", "end", "hold") is None
            again = writer.call("save", extra, None)
            assert (again.written, again.backpressure) == (7, False)
        finally:
            holder.stop()
            writer.stop()


def test_session_lifecycle_across_ranks() -> None:
    with InProcessMaster() as master:
        rank0, rank1 = start_engines(master.address, 4 * MIB)  # 128 pages in all
        try:
            system = chain(20, 4)
            conv1 = system + chain(21, 6, system[-1])
            conv2 = system + chain(22, 5, system[-1])
            # Turn 1 of conversation 1 on rank 0: computed, written tagged, then pinned.
            assert rank0.call("save", conv1, "c1").written == 10
            assert rank0.call("connector", "pin", "c1") is True
            # Conversation 2 on rank 1: the system prompt is a hit, attached when loaded.
            assert rank1.call("load", conv2[:4], "c2") == (4, True)
            saved = rank1.call("save", conv2, "c2")
            assert (saved.present, saved.written, saved.attached) == (4, 5, 4)
            info = rank1.call("store", "get_kv_session", "c2")
            assert (info.member_count, info.pinned) == (9, False)
            # Turn 2 of conversation 1 lands on rank 1: hits attached, new pages tagged.
            turn2 = conv1 + chain(23, 3, conv1[-1])
            assert rank1.call("connector", "lookup", turn2) == 10
            assert rank1.call("load", turn2[:10], "c1") == (10, True)
            assert rank1.call("save", turn2[10:], "c1").written == 3
            info = rank0.call("store", "get_kv_session", "c1")
            assert (info.member_count, info.pinned) == (13, True)
            # Pressure from untagged writes: the pinned conversation survives, the other not.
            for seed in range(30, 34):
                assert rank0.call("save", chain(seed, 40), None).backpressure is False
            assert rank1.call("connector", "lookup", turn2) == 13
            assert rank1.call("connector", "lookup", conv2) == 4  # the prompt is pinned by c1
            assert master.service.stats()["evicted_soft_pinned"] == 0
            # Compaction keeps only what the new context uses; dropped pages lose the pin.
            assert rank0.call("connector", "compact", "c1", system) is True
            info = rank0.call("store", "get_kv_session", "c1")
            assert (info.member_count, info.pinned) == (4, True)
            # A fresh conversation sharing the prompt, then abandoned: release frees what only
            # it holds and keeps the shared prompt (conversation 1 still holds it). The store is
            # full: the save evicts, and only conversation 1's pin keeps the prompt (lookups and
            # the save's probe hold nothing).
            conv3 = system + chain(24, 3, system[-1])
            assert rank0.call("connector", "attach", "c3", system) == 4
            saved = rank0.call("save", conv3, "c3")
            assert (saved.present, saved.written, saved.attached) == (4, 3, 4)
            released = rank1.call("connector", "end", "c3", True)
            assert (released.sessions, released.released_objects) == (1, 3)
            assert released.kept_shared == 4
            assert released.freed_bytes + released.pending_bytes == 3 * PAGE
            assert rank1.call("connector", "lookup", conv3) == 4
            # Drop the cold pages: below the eviction watermark, nothing evicts the unpinned
            # prompt before the last lookup (lookups do not refresh recency).
            cold = [KEYS.key(h) for seed in range(30, 34) for h in chain(seed, 40)]
            rank0.call("store", "batch_remove", cold, True)
            assert rank0.call("connector", "unpin", "c1") is True
            assert rank0.call("store", "get_kv_session", "c1").pinned is False
            # Ending conversation 1 closes its session; its data stays cached for reuse.
            assert rank1.call("connector", "end", "c1") is None
            with pytest.raises(RuntimeError, match="SESSION_NOT_FOUND"):
                rank0.call("store", "get_kv_session", "c1")
            assert rank0.call("connector", "pin", "c1") is False
            assert rank0.call("connector", "lookup", system) == 4
            master.service.check()
        finally:
            rank0.stop()
            rank1.stop()


async def test_async_connector_matches_the_sync_one(make_store) -> None:  # type: ignore[no-untyped-def]
    master = InProcessMaster().start()  # 10 s leases: only their ends free the pages soon
    store = make_store(master.address, 8 * MIB)
    buffer = np.zeros(8 * PAGE, dtype=np.uint8)
    base = int(buffer.ctypes.data)
    assert store.register_buffer(base, buffer.nbytes) == 0
    async with AsyncClient(store.client) as async_client:
        connector = AsyncKVConnector(async_client, KEYS, batch_pages=3)
        hashes = chain(40, 8)
        for i, page_hash in enumerate(hashes):
            buffer[i * PAGE : (i + 1) * PAGE] = np.frombuffer(content(page_hash), np.uint8)
        pages = [Page(h, base + i * PAGE, PAGE) for i, h in enumerate(hashes)]
        assert await connector.lookup(hashes) == 0
        assert (await connector.save(pages[:5], "a1")).written == 5
        assert await connector.lookup(hashes) == 5
        assert await connector.pin("a1") is True
        result = await connector.save(pages, "a1")
        assert (result.present, result.written, result.attached) == (5, 3, 5)
        buffer[:] = 0
        buffers = [Buffer(p.ptr, p.size) for p in pages]
        assert await connector.load(hashes, buffers, "a2") == 8
        assert buffer.tobytes() == b"".join(content(h) for h in hashes)
        assert await connector.compact("a1", hashes[:2]) is True
        assert store.get_kv_session("a1").member_count == 2
        assert await connector.unpin("missing") is False
        # The load's read leases end with its copies, long before their TTL.
        keys = [KEYS.key(h) for h in hashes]
        await asyncio.to_thread(master.wait_for_leases_to_end, keys, timeout_s=5.0)
        released = await connector.end("a2", release=True)
        assert released is not None and released.kept_shared == 2
        assert await connector.end("a1") is None
        # The sync connector over the same store sees the same state.
        assert KVConnector(store.client, KEYS).lookup(hashes) == 2
    store.close()
    master.stop()


def test_keys_and_decisions_follow_the_engines_conventions() -> None:
    # SGLang HiCache's model-aware format, '/' in the model name replaced by '-'.
    page = chain(50, 1)[0]
    keys = PageKeys(model="meta-llama/Llama-3.1-8B", rank=1, prefix="tag")
    assert keys.key(page) == f"tag_meta-llama-Llama-3.1-8B_{page}_1_kv"
    assert PageKeys(model="m").key(page) == f"m_{page}_0_kv"
    # Chained hashes: a page's hash depends on everything before it; partial pages get none.
    tokens = list(range(40))
    assert page_hashes(tokens, 16) == page_hashes(tokens[:32], 16)
    assert page_hashes(tokens, 16)[1] != page_hashes([99, *tokens[1:]], 16)[1]
    # A probe error is a miss for lookups, and a page to write for saves.
    assert stored_prefix([True, True, False, True]) == 2
    plan = plan_save([True, False, False, True])
    assert (plan.missing, plan.present) == ((1, 2), (0, 3))
    # Back-pressure skips the rest of the save; other errors are only counted.
    result = tally_put(SaveResult(requested=6), [PAGE] * 3, [0, -800, -200], remaining=3)
    assert (result.written, result.failed, result.refused, result.skipped) == (1, 1, 1, 3)
    assert result.backpressure and result.errors == {-800: 1, -200: 1}
