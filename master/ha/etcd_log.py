"""The master's metadata log and snapshots in etcd, fenced by the leader election.

Records live under :func:`~mooncake_py.ha_names.log_prefix` as ``<seq:020d>`` (fixed width,
so etcd's key order is sequence order); snapshots under
:func:`~mooncake_py.ha_names.snapshot_prefix` (see :mod:`.etcd_snapshots`). The leader
appends; standbys :meth:`EtcdLogStore.follow` the log and take over from it.

Every write is a txn fenced on the leader key's ``create_revision`` (see :mod:`.etcd_fence`)
and, for records, on the first record's key not existing yet (``version == 0``): a deposed
leader's append is refused by etcd, and so is one that would overwrite a record.

Thread-safety: one event loop; one ``append`` or ``save_snapshot`` at a time, concurrently
with any number of readers and followers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence

from mooncake_py.ha_names import log_prefix, snapshot_prefix

from .election import LeaderElection
from .etcd_client import (
    EtcdClient,
    EtcdCompacted,
    EtcdError,
    TxnResult,
    compare_version,
    prefix_end,
    put_op,
    range_op,
)
from .etcd_fence import LeaderFence, pack
from .etcd_snapshots import LATEST, SnapshotStore, seq_of_latest, seq_part
from .log_store import MAX_RECORD_BYTES, LeadershipLost, LogStoreError, RecordsDropped

log = logging.getLogger(__name__)

FOLLOW_BATCH = 1024
"""Records per range read while a follower catches up."""

FOLLOW_IDLE_S = 5.0
"""How long a follower's watch may stay silent before it re-reads with a range: a watch on a
connection that died without a reset never reports an error."""


class EtcdLogStore:
    """A :class:`~.log_store.LogStore` in etcd.

    Args:
        client: the etcd connection (closed by :meth:`close` when ``close_client``).
        cluster_id: the masters' cluster id (names the keys).
        election: the leadership that fences every write; None for an unfenced store (a
            single writer by construction: tools, tests).
        retention: how many complete snapshots to keep (>= 1). Records after the oldest
            kept snapshot are kept too, so each kept snapshot can still be replayed from.
        close_client: whether :meth:`close` closes ``client``.

    Raises:
        ValueError: ``retention`` < 1.
    """

    def __init__(
        self,
        client: EtcdClient,
        cluster_id: str,
        election: LeaderElection | None = None,
        retention: int = 2,
        *,
        close_client: bool = True,
    ) -> None:
        if retention < 1:
            raise ValueError(f"retention must be at least 1, not {retention}")
        self.client = client
        self.retention = retention
        self.prefix = log_prefix(cluster_id)
        self._end = prefix_end(self.prefix)
        self._fence = LeaderFence(client, cluster_id, election)
        self._snapshots = SnapshotStore(self._fence, snapshot_prefix(cluster_id))
        self._close_client = close_client
        self._closed = False
        # The next sequence number, as of this store's last successful write; None: read it
        # from etcd (at start, and after any failed write, which may have stored part).
        self._next_seq: int | None = None

    def _key(self, seq: int) -> bytes:
        return self.prefix + seq_part(seq)

    def _seq_of(self, key: bytes) -> int:
        return int(key[len(self.prefix) :])

    async def append(self, first_seq: int, records: Sequence[bytes]) -> None:
        """Store ``records`` as ``first_seq, first_seq + 1, ...`` (see
        :meth:`.log_store.LogStore.append`).

        The records are packed into as few txns as fit etcd's request limit (about 1.2 MiB
        and 120 records each). An append of more than one txn that fails midway has stored a
        prefix of the records: the caller does not acknowledge them, and :meth:`last_seq`
        tells where the log really ends. A txn retried after a lost reply is recognised
        (the records are there, byte for byte) and counts as stored.

        Raises:
            ValueError: a record is over :data:`MAX_RECORD_BYTES`, or ``first_seq`` is not
                the next sequence number (a retry whose first records are stored, with these
                very contents, is not an overlap: the rest is appended).
            LeadershipLost: the leader compare failed or the election is known lost; nothing
                of that txn was stored.
            LogStoreError: etcd failed or could not be reached.

        Complexity: one txn per ~1.2 MiB, plus one read when the next number is not known.
        """
        batch = list(records)
        for index, record in enumerate(batch):
            if len(record) > MAX_RECORD_BYTES:
                raise ValueError(
                    f"record {first_seq + index} is {len(record)} bytes, over the limit of "
                    f"{MAX_RECORD_BYTES}"
                )
        expected = self._next_seq if self._next_seq is not None else await self.last_seq() + 1
        if first_seq < expected <= first_seq + len(batch):
            # A retry of an append that stored a prefix (a lost reply, a multi-txn append
            # that failed midway): the stored part must be these very records.
            stored = await self.records_after(first_seq - 1, limit=expected - first_seq)
            if [record for _, record in stored] != batch[: expected - first_seq]:
                raise ValueError(
                    f"append at {first_seq} overlaps stored records with other contents "
                    f"(the next sequence number is {expected})"
                )
            batch = batch[expected - first_seq :]
            first_seq = expected
        if first_seq != expected:
            raise ValueError(f"append at {first_seq}, but the next sequence number is {expected}")
        self._next_seq = None
        seq = first_seq
        for run in pack(batch, len):
            await self._append_run(seq, run)
            seq += len(run)
        self._next_seq = seq

    async def _append_run(self, first_seq: int, run: list[bytes]) -> None:
        keys = [self._key(first_seq + offset) for offset in range(len(run))]
        result = await self._fence.txn(
            [compare_version(keys[0], 0)],
            [put_op(key, record) for key, record in zip(keys, run, strict=True)],
            [range_op(keys[0], keys[-1] + b"\0")],
        )
        if result.succeeded:
            return
        stored = [(kv.key, kv.value) for kv in result.ranges[0]]
        if stored == list(zip(keys, run, strict=True)):
            return  # an earlier attempt of this very txn was applied
        raise LogStoreError(f"record {first_seq} is already stored with other contents")

    async def records_after(self, seq: int, limit: int = 1024) -> list[tuple[int, bytes]]:
        """Up to ``limit`` records above ``seq`` in order (see
        :meth:`.log_store.LogStore.records_after`); one linearizable read.

        Raises:
            LogStoreError: etcd could not be read, the record after ``seq`` was dropped by a
                snapshot's pruning, or the stored records have a gap.
        """
        records, _revision = await self._read_after(seq, limit)
        return records

    async def _read_after(self, seq: int, limit: int) -> tuple[list[tuple[int, bytes]], int]:
        """The records above ``seq`` and the revision of the read."""
        try:
            result = await self.client.txn(
                [],
                [
                    range_op(self._key(seq + 1), self._end, limit=limit),
                    range_op(self._snapshots.prefix + LATEST),
                ],
            )
        except EtcdError as error:
            raise LogStoreError(str(error)) from error
        found, latest = result.ranges
        records = [(self._seq_of(kv.key), kv.value) for kv in found]
        for expected, (stored, _value) in enumerate(records, start=seq + 1):
            if stored != expected:
                if expected == seq + 1:
                    raise RecordsDropped(
                        f"records after {seq} were dropped (the log resumes at {stored}): "
                        "load the snapshot"
                    )
                raise LogStoreError(f"the log has a gap: record {expected} is missing")
        if not records and seq_of_latest(latest[0] if latest else None) > seq:
            raise RecordsDropped(f"records after {seq} were dropped by a snapshot: load it")
        return records, result.revision

    async def last_seq(self) -> int:
        """The last stored sequence number: the newest record's, else the newest snapshot's,
        else 0. One linearizable read.

        Raises:
            LogStoreError: etcd could not be read.
        """
        try:
            result: TxnResult = await self.client.txn(
                [],
                [
                    range_op(self.prefix, self._end, limit=1, descending=True, keys_only=True),
                    range_op(self._snapshots.prefix + LATEST),
                ],
            )
        except EtcdError as error:
            raise LogStoreError(str(error)) from error
        newest, latest = result.ranges
        snapshot_seq = seq_of_latest(latest[0] if latest else None)
        return max(self._seq_of(newest[0].key) if newest else 0, snapshot_seq)

    async def follow(self, seq: int) -> AsyncIterator[tuple[int, bytes]]:
        """Every record above ``seq`` in order, as it is stored, without end.

        Reads what exists with ranges, then watches the log from the revision after the
        last read. A watch that ends (etcd restarted, history compacted, the connection
        silent for :data:`FOLLOW_IDLE_S`) is replaced by a new range read and watch from
        the last record yielded, so nothing is skipped or repeated. While etcd is
        unreachable it retries with a backoff of up to 1 s.

        Raises (from the iteration):
            LogStoreError: the records after the last one yielded were dropped by a snapshot
                (the follower fell too far behind: it must load the snapshot), or the store
                was closed.
        """
        last = seq
        backoff = 0.05
        while True:
            try:
                records, revision = await self._read_after(last, FOLLOW_BATCH)
            except LogStoreError as error:
                if not isinstance(error.__cause__, EtcdError) or self.client.closed:
                    raise
                log.info("log follower: %s; retrying", error)
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, 1.0)
                continue
            backoff = 0.05
            for record in records:
                yield record
                last = record[0]
            if len(records) == FOLLOW_BATCH:
                continue
            watch = self.client.watch(self.prefix, self._end, start_revision=revision + 1)
            try:
                async with contextlib.aclosing(watch):
                    while True:
                        events = await asyncio.wait_for(anext(watch), FOLLOW_IDLE_S)
                        for kv in (event.kv for event in events if not event.deleted):
                            stored = self._seq_of(kv.key)
                            if stored == last + 1:
                                yield stored, kv.value
                                last = stored
                            elif stored > last + 1:
                                raise _Resync
            except (asyncio.TimeoutError, _Resync, StopAsyncIteration, EtcdCompacted):
                continue  # the range read catches up at once
            except EtcdError as error:
                if self.client.closed:
                    raise LogStoreError("the log store was closed") from error
                log.info("log follower's watch ended: %s; re-reading", error)
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, 1.0)

    async def save_snapshot(self, seq: int, tables: Mapping[str, bytes]) -> None:
        """Store a snapshot as of record ``seq``, then prune (see
        :meth:`.etcd_snapshots.SnapshotStore.save` and ``prune``). A failed pruning is logged,
        not raised: the snapshot is stored and the next one prunes again.

        Raises:
            ValueError: a table name is empty or holds ``/``.
            LeadershipLost, LogStoreError: the snapshot was not stored.
        """
        await self._snapshots.save(seq, tables)
        self._next_seq = None
        try:
            through = await self._snapshots.prune(self.retention, self.prefix)
            log.info("snapshot %d stored; log pruned through %d", seq, through)
        except (LeadershipLost, LogStoreError) as error:
            log.warning("snapshot %d stored, but pruning failed: %s", seq, error)

    async def load_snapshot(self) -> tuple[int, dict[str, bytes]] | None:
        """The newest complete snapshot, verified (see
        :meth:`.etcd_snapshots.SnapshotStore.load`), or None."""
        return await self._snapshots.load()

    async def close(self) -> None:
        """Close the etcd client if this store owns it; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._close_client:
            await self.client.close()


class _Resync(Exception):
    """A follower's watch saw a record beyond the next one: re-read with a range."""
