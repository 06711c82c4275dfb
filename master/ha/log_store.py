"""Where the master's metadata log and snapshots live: the contract every store keeps.

The master's state changes reach a :class:`LogStore` as *records*: opaque byte strings, each
at most :data:`MAX_RECORD_BYTES`, numbered by consecutive sequence numbers from 1. A record
the store acknowledged (its ``append`` returned) is durable: a master that recovers from the
store reads it back. Every so often the master saves a *snapshot* (its whole state as of a
sequence number, as named tables of bytes: Parquet files); recovery loads the newest snapshot
and replays the records after it. Saving a snapshot lets the store drop the records it covers.

Two stores implement this: :class:`~.directory_log.DirectoryLogStore` (one master, a local
directory) and :class:`~.etcd_log.EtcdLogStore` (the records and snapshots in etcd, appends
fenced by the leader's election, followed by standbys).

Thread-safety: a store is used from one event loop; its coroutines may be awaited
concurrently only where a method says so.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol

MAX_RECORD_BYTES = 1 << 20
"""The largest record a store accepts (etcd's default request limit is 1.5 MiB)."""


class LogStoreError(Exception):
    """The store could not do what was asked (I/O failure, store unreachable, corrupt data)."""


class RecordsDropped(LogStoreError):
    """The records asked for were dropped when a newer snapshot was saved: the reader is too
    far behind and must load the newest snapshot, then read the records after it."""


class LeadershipLost(LogStoreError):
    """An append was refused because this master no longer holds the leadership that fences
    the log: another master may be writing it. Nothing of the refused append was stored."""


class LogStore(Protocol):
    """A durable, ordered log of records plus snapshots (see the module docstring)."""

    async def append(self, first_seq: int, records: Sequence[bytes]) -> None:
        """Durably store ``records`` as sequence numbers ``first_seq``, ``first_seq + 1``, ...

        ``first_seq`` must be one more than the last stored sequence number (1 for an empty
        log); callers await one append at a time. Either every record is stored or none is.

        Raises:
            ValueError: a record is larger than :data:`MAX_RECORD_BYTES`, or ``first_seq`` is
                not the next number.
            LeadershipLost: the store is fenced and this master is no longer the leader.
            LogStoreError: the records could not be stored (the caller must not acknowledge
                the changes they carry).
        """
        ...

    async def records_after(self, seq: int, limit: int = 1024) -> list[tuple[int, bytes]]:
        """Up to ``limit`` stored records with sequence numbers above ``seq``, in order.

        Raises:
            LogStoreError: the store could not be read, or a record after ``seq`` was dropped
                (``seq`` is older than the newest snapshot's sequence number).
        """
        ...

    def follow(self, seq: int) -> AsyncIterator[tuple[int, bytes]]:
        """Every record above ``seq`` as it is stored, in order, without end (a standby's
        tail); stores with a single writer raise :class:`NotImplementedError`."""
        ...

    async def save_snapshot(self, seq: int, tables: Mapping[str, bytes]) -> None:
        """Durably store a snapshot of the state as of record ``seq``; once stored, records up
        to ``seq`` and older snapshots beyond the store's retention may be dropped.

        Raises:
            LeadershipLost: as for :meth:`append`.
            LogStoreError: the snapshot could not be stored (the previous one still counts).
        """
        ...

    async def load_snapshot(self) -> tuple[int, dict[str, bytes]] | None:
        """The newest complete snapshot, ``(seq, tables)``, or None when there is none. A
        snapshot that was not completely stored is never returned.

        Raises:
            LogStoreError: the store could not be read.
        """
        ...

    async def last_seq(self) -> int:
        """The last stored sequence number (the snapshot's when no record follows it; 0 for
        an empty store)."""
        ...

    async def close(self) -> None:
        """Release the store's connections and files; idempotent."""
        ...
