"""Snapshots of the master's state in etcd: tables split into chunks, a manifest written last.

Layout under :func:`~mooncake_py.ha_names.snapshot_prefix`::

    <seq:020d>/<table>/<chunk:06d>   at most CHUNK_BYTES of the table's bytes
    <seq:020d>/manifest              JSON {"seq", "tables": {name: {"chunks", "bytes", "sha256"}}}
    latest                           "<seq:020d>/manifest" of the newest snapshot

Chunks go first, each txn fenced; the manifest and ``latest`` go together in one fenced txn
at the end. So a snapshot without a manifest is incomplete and never loaded, and one whose
chunks do not match its manifest (count or sha256) is skipped for the one before it.

Thread-safety: one event loop.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from .etcd_client import EtcdClient, EtcdError, KeyValue, delete_op, prefix_end, put_op
from .etcd_fence import LeaderFence, pack
from .log_store import LogStoreError

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
"""The largest chunk value (etcd's request limit is 1.5 MiB)."""

READ_CHUNKS = 16
"""Chunks per range read when loading (16 MiB per response, under the channel's limit)."""

MANIFEST = b"manifest"
LATEST = b"latest"


def seq_part(seq: int) -> bytes:
    """The fixed-width sequence number of keys: 20 digits, so key order is numeric order."""
    return f"{seq:020d}".encode()


@dataclass(frozen=True)
class Manifest:
    """What a complete snapshot holds: per table, its chunk count, size and sha256."""

    seq: int
    tables: dict[str, tuple[int, int, str]]

    def to_json(self) -> bytes:
        tables = {
            name: {"chunks": chunks, "bytes": size, "sha256": digest}
            for name, (chunks, size, digest) in self.tables.items()
        }
        return json.dumps({"seq": self.seq, "tables": tables}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """Raises: ValueError (also KeyError/TypeError) on a malformed manifest."""
        body = json.loads(data)
        tables = {
            str(name): (int(entry["chunks"]), int(entry["bytes"]), str(entry["sha256"]))
            for name, entry in body["tables"].items()
        }
        return cls(int(body["seq"]), tables)


class SnapshotStore:
    """Saves, loads and prunes the snapshots under ``prefix``.

    Args:
        fence: runs the fenced writes.
        prefix: the snapshot prefix of the cluster.
    """

    def __init__(self, fence: LeaderFence, prefix: bytes) -> None:
        self.fence = fence
        self.client: EtcdClient = fence.client
        self.prefix = prefix

    def _key(self, seq: int, *parts: bytes) -> bytes:
        return b"/".join([self.prefix + seq_part(seq), *parts])

    def _table_prefix(self, seq: int, table: str) -> bytes:
        return self._key(seq, table.encode(), b"")

    async def save(self, seq: int, tables: Mapping[str, bytes]) -> None:
        """Store the snapshot of ``seq`` (see the module docstring for the order of writes).

        Writes ``sum(len(table)) / CHUNK_BYTES + 2`` txns, each of at most ~1.2 MiB. Saving
        the same ``seq`` again replaces it (it is unreadable meanwhile).

        Raises:
            ValueError: a table name is empty or holds ``/``, or ``seq`` is negative.
            LeadershipLost, LogStoreError: as :meth:`LeaderFence.txn`; the previous snapshot
                is untouched.
        """
        if seq < 0:
            raise ValueError(f"snapshot seq must not be negative, not {seq}")
        chunks: list[tuple[bytes, bytes]] = []
        entries: dict[str, tuple[int, int, str]] = {}
        for name, data in tables.items():
            if not name or "/" in name:
                raise ValueError(f"snapshot table name {name!r} must be non-empty without '/'")
            view = memoryview(data)
            count = (len(data) + CHUNK_BYTES - 1) // CHUNK_BYTES
            for index in range(count):
                piece = bytes(view[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES])
                chunks.append((self._table_prefix(seq, name) + f"{index:06d}".encode(), piece))
            entries[name] = (count, len(data), hashlib.sha256(data).hexdigest())
        # Leftovers of an earlier, failed save of this seq (a larger table's extra chunks)
        # would make the new one look corrupt.
        own_prefix = self._key(seq, b"")
        await self.fence.txn([], [delete_op(own_prefix, prefix_end(own_prefix))])
        for run in pack(chunks, lambda chunk: len(chunk[0]) + len(chunk[1])):
            await self.fence.txn([], [put_op(key, value) for key, value in run])
        manifest_key = self._key(seq, MANIFEST)
        await self.fence.txn(
            [],
            [
                put_op(manifest_key, Manifest(seq, entries).to_json()),
                put_op(self.prefix + LATEST, manifest_key[len(self.prefix) :]),
            ],
        )

    async def complete_seqs(self) -> list[int]:
        """Sequence numbers of the snapshots that have a manifest, newest first (not verified:
        see :meth:`load`). One keys-only range read over the snapshot keys.

        Raises:
            LogStoreError: etcd could not be read.
        """
        try:
            listing = await self.client.range(self.prefix, prefix_end(self.prefix), keys_only=True)
        except EtcdError as error:
            raise LogStoreError(str(error)) from error
        seqs = set()
        for kv in listing.kvs:
            name = kv.key[len(self.prefix) :]
            if name.endswith(b"/" + MANIFEST):
                seqs.add(int(name.split(b"/", 1)[0]))
        return sorted(seqs, reverse=True)

    async def latest_seq(self) -> int:
        """The sequence number ``latest`` names (0 when there is no snapshot); one read."""
        try:
            latest = await self.client.get(self.prefix + LATEST)
        except EtcdError as error:
            raise LogStoreError(str(error)) from error
        return seq_of_latest(latest)

    async def load(self) -> tuple[int, dict[str, bytes]] | None:
        """The newest snapshot whose manifest and chunks all check out, or None.

        Tries the snapshots with a manifest newest first (``latest`` names the newest unless
        its manifest was lost); a torn or corrupt one is logged and skipped.

        Raises:
            LogStoreError: etcd could not be read.
        """
        for seq in await self.complete_seqs():
            try:
                tables = await self._read(seq)
            except EtcdError as error:
                raise LogStoreError(str(error)) from error
            if tables is not None:
                return seq, tables
        return None

    async def _read(self, seq: int) -> dict[str, bytes] | None:
        """The tables of snapshot ``seq``, or None when it is torn or corrupt."""
        manifest_kv = await self.client.get(self._key(seq, MANIFEST))
        if manifest_kv is None:
            log.warning("snapshot %d has no manifest; skipped", seq)
            return None
        try:
            manifest = Manifest.from_json(manifest_kv.value)
        except (ValueError, KeyError, TypeError) as error:
            log.warning("snapshot %d has a malformed manifest (%s); skipped", seq, error)
            return None
        tables: dict[str, bytes] = {}
        for name, (count, size, digest) in manifest.tables.items():
            pieces = await self._read_chunks(self._table_prefix(seq, name), count)
            data = b"".join(pieces) if pieces is not None else None
            if data is None or len(data) != size or hashlib.sha256(data).hexdigest() != digest:
                log.warning("snapshot %d: table %r is torn or corrupt; skipped", seq, name)
                return None
            tables[name] = data
        return tables

    async def _read_chunks(self, table_prefix: bytes, count: int) -> list[bytes] | None:
        """The ``count`` chunks under ``table_prefix`` in order, or None when one is missing
        or an unexpected one is there."""
        pieces: list[bytes] = []
        start = table_prefix
        end = prefix_end(table_prefix)
        while True:
            result = await self.client.range(start, end, limit=READ_CHUNKS)
            for kv in result.kvs:
                if kv.key != table_prefix + f"{len(pieces):06d}".encode():
                    return None
                pieces.append(kv.value)
            if not result.more or not result.kvs:
                break
            start = result.kvs[-1].key + b"\0"
        return pieces if len(pieces) == count else None

    async def prune(self, retention: int, log_prefix: bytes) -> int:
        """Keep the ``retention`` newest complete snapshots; delete older snapshot keys and the
        log records up to the oldest kept snapshot (so falling back to any kept snapshot still
        finds every record after it), then compact etcd's history at the revision after.

        Returns:
            The sequence number up to which records were deleted (0 when none).

        Raises:
            LeadershipLost, LogStoreError: the deletion was refused or failed (the snapshot
                saved before still counts; the next prune retries).

        Complexity: one keys-only listing of the snapshot keys and two writes.
        """
        kept = (await self.complete_seqs())[:retention]
        if not kept:
            return 0
        oldest = kept[-1]
        result = await self.fence.txn(
            [],
            [
                delete_op(log_prefix, log_prefix + seq_part(oldest + 1)),
                delete_op(self.prefix, self.prefix + seq_part(oldest)),
            ],
        )
        try:
            # Deleted keys keep their space in etcd's history until it is compacted.
            await self.client.compact(result.revision)
        except EtcdError as error:
            raise LogStoreError(str(error)) from error
        return oldest


def seq_of_latest(latest: KeyValue | None) -> int:
    """The sequence number in a ``latest`` value (0 for None or a malformed value)."""
    if latest is None:
        return 0
    head = latest.value.split(b"/", 1)[0]
    return int(head) if head.isdigit() else 0
