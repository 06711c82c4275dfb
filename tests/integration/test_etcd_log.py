"""The etcd log store on a real etcd: ordered appends, refused gaps and oversized records,
fencing by the election, snapshots (large, torn, pruning), and a follower that survives an
etcd restart."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest

from mooncake_py.ha_names import log_prefix, snapshot_prefix
from mooncake_py.master.ha.election import LeaderElection
from mooncake_py.master.ha.etcd_client import EtcdClient, EtcdCompacted, prefix_end, put_op
from mooncake_py.master.ha.etcd_log import EtcdLogStore
from mooncake_py.master.ha.log_store import MAX_RECORD_BYTES, LeadershipLost, LogStoreError
from tests.conftest_etcd import etcd_server  # noqa: F401
from tests.etcd_server import EtcdServer

CLUSTER = "log-test"


@pytest.fixture
async def admin(etcd_server: EtcdServer) -> AsyncIterator[EtcdClient]:  # noqa: F811
    """A plain client for looking at (and tampering with) the keys directly."""
    client = EtcdClient(etcd_server.endpoint)
    yield client
    await client.close()


@pytest.fixture
async def store(etcd_server: EtcdServer) -> AsyncIterator[EtcdLogStore]:  # noqa: F811
    """An unfenced store (a single writer)."""
    opened = EtcdLogStore(EtcdClient(etcd_server.endpoint), CLUSTER)
    yield opened
    await opened.close()


async def test_appends_read_back_in_order(
    store: EtcdLogStore,
    etcd_server: EtcdServer,  # noqa: F811
    admin: EtcdClient,
) -> None:
    assert await store.last_seq() == 0
    await store.append(1, [b"one", b"two", b"three"])
    await store.append(4, [b"four"])
    assert await store.records_after(0) == [(1, b"one"), (2, b"two"), (3, b"three"), (4, b"four")]
    assert await store.records_after(2, limit=1) == [(3, b"three")]
    assert await store.records_after(4) == []

    # A group of 300 records of 10 KiB spans several txns (size and count limits).
    group = [os.urandom(10 << 10) for _ in range(300)]
    await store.append(5, group)
    stored = await store.records_after(4, limit=1000)
    assert [seq for seq, _ in stored] == list(range(5, 305))
    assert [value for _, value in stored] == group
    keys = await admin.range(log_prefix(CLUSTER), prefix_end(log_prefix(CLUSTER)), keys_only=True)
    assert [kv.key for kv in keys.kvs][:2] == [
        log_prefix(CLUSTER) + b"00000000000000000001",
        log_prefix(CLUSTER) + b"00000000000000000002",
    ]

    # Another store (a master restarting) reads where the log ends and goes on from there.
    reopened = EtcdLogStore(EtcdClient(etcd_server.endpoint), CLUSTER)
    try:
        assert await reopened.last_seq() == 304
        await reopened.append(305, [b"next"])
        assert await reopened.records_after(303) == [(304, group[-1]), (305, b"next")]
    finally:
        await reopened.close()


async def test_sequence_gaps_and_overlaps_are_refused(
    store: EtcdLogStore,
    etcd_server: EtcdServer,  # noqa: F811
) -> None:
    with pytest.raises(ValueError):
        await store.append(2, [b"gap"])
    await store.append(1, [b"a"])
    for first in (3, 1, 0):
        with pytest.raises(ValueError):
            await store.append(first, [b"x"])
    # A store that has never written reads the truth from etcd before its first append.
    other = EtcdLogStore(EtcdClient(etcd_server.endpoint), CLUSTER)
    try:
        with pytest.raises(ValueError):
            await other.append(1, [b"overwrite"])
        with pytest.raises(ValueError):
            await other.append(3, [b"gap"])
    finally:
        await other.close()
    assert await store.records_after(0) == [(1, b"a")]


async def test_records_over_the_limit_are_refused(store: EtcdLogStore) -> None:
    with pytest.raises(ValueError):
        await store.append(1, [b"ok", b"x" * (MAX_RECORD_BYTES + 1)])
    assert await store.last_seq() == 0
    largest = os.urandom(MAX_RECORD_BYTES)
    await store.append(1, [largest, largest])
    assert await store.records_after(0) == [(1, largest), (2, largest)]


async def test_a_deposed_leader_cannot_append(
    etcd_server: EtcdServer,  # noqa: F811
    admin: EtcdClient,
) -> None:
    # A long TTL: the first leader still believes it leads when it appends, so it is etcd's
    # compare on the leader key's create_revision that refuses the write.
    first = LeaderElection(etcd_server.endpoint, CLUSTER, "10.0.0.1:1", ttl_s=10.0)
    second = LeaderElection(etcd_server.endpoint, CLUSTER, "10.0.0.2:1", ttl_s=10.0)
    first_store = EtcdLogStore(first.client, CLUSTER, first, close_client=False)
    second_store = EtcdLogStore(second.client, CLUSTER, second, close_client=False)
    try:
        await first.campaign()
        await first_store.append(1, [b"by-first"])
        await first_store.save_snapshot(1, {"t": b"first's state"})

        await admin.lease_revoke(first.lease_id)  # as if its lease had expired
        await asyncio.wait_for(second.campaign(), 5)
        assert first.is_leader  # it has not noticed yet
        with pytest.raises(LeadershipLost):
            await first_store.append(2, [b"stale", b"writes"])
        with pytest.raises(LeadershipLost):
            await first_store.save_snapshot(2, {"t": b"stale state"})

        assert await second_store.last_seq() == 1
        await second_store.append(2, [b"by-second"])
        assert await second_store.records_after(1) == [(2, b"by-second")]
        assert await second_store.load_snapshot() == (1, {"t": b"first's state"})

        # Once the first knows it lost, it refuses without asking etcd.
        await asyncio.wait_for(first.wait_lost(), 10)
        with pytest.raises(LeadershipLost):
            await first_store.append(3, [b"stale"])
        assert await second_store.last_seq() == 2
    finally:
        await first.close()
        await second.close()


async def test_a_20_mb_snapshot_round_trips(store: EtcdLogStore, admin: EtcdClient) -> None:
    assert await store.load_snapshot() is None
    tables = {"objects": os.urandom(20 << 20), "segments": b"small", "empty": b""}
    await store.append(1, [b"r1", b"r2", b"r3"])
    await store.save_snapshot(3, tables)
    assert await store.load_snapshot() == (3, tables)
    assert await store.last_seq() == 3
    manifest = await admin.get(snapshot_prefix(CLUSTER) + b"00000000000000000003/manifest")
    assert manifest is not None and b'"chunks": 20' in manifest.value
    chunk = await admin.get(snapshot_prefix(CLUSTER) + b"00000000000000000003/objects/000019")
    assert chunk is not None and len(chunk.value) == 1 << 20


async def test_a_torn_snapshot_falls_back_to_the_previous_one(
    store: EtcdLogStore, admin: EtcdClient
) -> None:
    prefix = snapshot_prefix(CLUSTER)
    await store.append(1, [b"r1", b"r2"])
    await store.save_snapshot(2, {"t": b"state at 2" * 200_000})
    await store.append(3, [b"r3", b"r4"])
    await store.save_snapshot(4, {"t": b"state at 4" * 200_000})

    await admin.delete_range(prefix + b"00000000000000000004/manifest")
    assert await store.load_snapshot() == (2, {"t": b"state at 2" * 200_000})
    # The fallback snapshot can still be replayed from: its later records are kept.
    assert await store.records_after(2) == [(3, b"r3"), (4, b"r4")]

    await store.append(5, [b"r5"])
    await store.save_snapshot(5, {"t": b"state at 5" * 200_000, "u": b"other"})
    assert await store.load_snapshot() == (5, {"t": b"state at 5" * 200_000, "u": b"other"})
    await admin.delete_range(prefix + b"00000000000000000005/t/000001")
    assert await store.load_snapshot() == (2, {"t": b"state at 2" * 200_000})

    # A chunk that changed (same count, other bytes) fails its sha256.
    chunk = await admin.get(prefix + b"00000000000000000002/t/000000")
    assert chunk is not None
    await admin.txn([], [put_op(chunk.key, b"X" + chunk.value[1:])])
    assert await store.load_snapshot() is None


async def test_the_log_is_pruned_after_a_snapshot(store: EtcdLogStore, admin: EtcdClient) -> None:
    log_keys = log_prefix(CLUSTER)
    await store.append(1, [f"r{i}".encode() for i in range(1, 11)])
    await store.save_snapshot(6, {"t": b"six"})
    with pytest.raises(LogStoreError):
        await store.records_after(0)
    with pytest.raises(LogStoreError):
        await store.records_after(5)
    assert [seq for seq, _ in await store.records_after(6)] == [7, 8, 9, 10]
    remaining = await admin.range(log_keys, prefix_end(log_keys), keys_only=True)
    assert len(remaining.kvs) == 4
    assert await store.last_seq() == 10

    # With retention 2, records after the older kept snapshot stay until it goes.
    await store.save_snapshot(10, {"t": b"ten"})
    assert [seq for seq, _ in await store.records_after(6)] == [7, 8, 9, 10]
    await store.append(11, [b"r11", b"r12"])
    await store.save_snapshot(12, {"t": b"twelve"})
    assert await store.records_after(10) == [(11, b"r11"), (12, b"r12")]
    with pytest.raises(LogStoreError):
        await store.records_after(9)
    snapshots = await admin.range(
        snapshot_prefix(CLUSTER), prefix_end(snapshot_prefix(CLUSTER)), keys_only=True
    )
    assert all(b"00000000000000000006/" not in kv.key for kv in snapshots.kvs)
    assert await store.load_snapshot() == (12, {"t": b"twelve"})

    # etcd's history was compacted, so the deleted keys' space can be reclaimed.
    with pytest.raises(EtcdCompacted):
        async for _ in admin.watch(log_keys, prefix_end(log_keys), start_revision=1):
            break


async def test_follow_sees_new_records_across_an_etcd_restart(
    store: EtcdLogStore,
    etcd_server: EtcdServer,  # noqa: F811
) -> None:
    await store.append(1, [b"r1", b"r2"])
    follower = EtcdLogStore(EtcdClient(etcd_server.endpoint), CLUSTER)
    seen: list[tuple[int, bytes]] = []
    arrived = asyncio.Event()
    expected = [(i, f"r{i}".encode()) for i in range(1, 9)]

    async def tail() -> None:
        async for record in follower.follow(0):
            seen.append(record)
            if len(seen) >= len(expected):
                arrived.set()

    async def wait_for_count(count: int) -> None:
        while len(seen) < count:
            await asyncio.sleep(0.01)

    task = asyncio.create_task(tail())
    try:
        await asyncio.wait_for(wait_for_count(2), 10)
        await store.append(3, [b"r3", b"r4"])
        await asyncio.wait_for(wait_for_count(4), 10)

        await asyncio.to_thread(etcd_server.restart)
        await append_retrying(store, 5, [b"r5", b"r6"])
        await asyncio.wait_for(wait_for_count(6), 15)
        await store.append(7, [b"r7"])
        await store.append(8, [b"r8"])
        await asyncio.wait_for(arrived.wait(), 10)
        await asyncio.sleep(0.2)  # nothing more (no duplicates) arrives
        assert seen == expected
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await follower.close()


async def append_retrying(store: EtcdLogStore, first: int, records: list[bytes]) -> None:
    """Append once etcd is reachable again (the first call after a restart may find it still
    electing itself)."""
    for _ in range(50):
        try:
            await store.append(first, records)
            return
        except LogStoreError:
            await asyncio.sleep(0.1)
    await store.append(first, records)


async def test_follow_raises_when_behind_the_snapshot_or_closed(
    store: EtcdLogStore,
    etcd_server: EtcdServer,  # noqa: F811
    admin: EtcdClient,
) -> None:
    await store.append(1, [b"r1", b"r2", b"r3"])
    await store.save_snapshot(2, {"t": b"two"})
    follower = EtcdLogStore(EtcdClient(etcd_server.endpoint), CLUSTER)
    try:
        with pytest.raises(LogStoreError, match="dropped"):
            async for _ in follower.follow(0):
                pass
        # Compacting etcd's history under an idle follower does not lose records.
        records = follower.follow(2)
        assert await asyncio.wait_for(anext(records), 10) == (3, b"r3")
        pending = asyncio.ensure_future(anext(records))
        await asyncio.sleep(0.1)
        probe = await admin.txn([], [put_op(b"unrelated", b"x")])
        await admin.compact(probe.revision)
        await store.append(4, [b"r4"])
        assert await asyncio.wait_for(pending, 10) == (4, b"r4")

        pending = asyncio.ensure_future(anext(records))
        await asyncio.sleep(0.1)
        await follower.close()
        with pytest.raises(LogStoreError):
            await asyncio.wait_for(pending, 10)
    finally:
        await follower.close()


async def test_a_retry_of_a_partly_stored_append_appends_the_rest(
    store: EtcdLogStore,
    etcd_server: EtcdServer,  # noqa: F811
) -> None:
    """An append whose reply was lost (or that stopped midway) is retried with the same
    numbers: the stored prefix is recognised and the rest stored, nothing twice."""
    await store.append(1, [b"a", b"b"])
    # Another writer's view of the log (a fresh store) retries 1..4 after 1..2 landed.
    other = EtcdLogStore(EtcdClient(etcd_server.endpoint), CLUSTER)
    try:
        await other.append(1, [b"a", b"b", b"c", b"d"])
        assert await other.records_after(0) == [(1, b"a"), (2, b"b"), (3, b"c"), (4, b"d")]
        await other.append(1, [b"a", b"b", b"c", b"d"])  # all stored already: nothing to do
        with pytest.raises(ValueError):
            await other.append(3, [b"C", b"d", b"e"])  # other contents: an overlap
        assert await other.last_seq() == 4
    finally:
        await other.close()
