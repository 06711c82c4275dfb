"""The leader's replication: every change durable in the log before its call is answered.

Flow. The state's mutation points mark dirty rows in the :class:`~.journal.Journal`. After a
call ran, its transport asks :meth:`Replicator.needed` (did the call mark anything?); if so
it kicks a flush and waits for :meth:`Replicator.durable` (or, off the event loop,
:meth:`Replicator.wait_durable_blocking`) before it answers. One flush at a time (group
commit): under the service lock it takes the dirty sets, captures their current images into
records of at most :data:`~.log_store.MAX_RECORD_BYTES` and numbers them; then it appends them
to the :class:`~.log_store.LogStore` and wakes every call waiting for those numbers. Calls
that ran while a flush was in flight go into the next one, so the number of appends follows
the store's latency, not the call rate.

Snapshots. Every ``snapshot_interval_s``, or once ``snapshot_records`` records were
appended since the last one, the leader walks its state in slices
(:func:`~.snapshot.capture_sliced`), replays the records appended meanwhile over the walk's
image, encodes it as Parquet off the event loop and saves it; the store then drops the
records it covers, which bounds the log's length.

Failure. An append refused with :class:`~.log_store.LeadershipLost` is fatal: another master
may be writing the log, so this one must stop answering; ``on_fatal`` is called (the process
exits; a standby takes over). Other store failures are retried with backoff while the waiting
calls wait (their clients time out if it lasts).

Thread-safety: runs on the master's event loop; :meth:`needed` and
:meth:`wait_durable_blocking` may be called from other threads (the HTTP server's).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from mooncake_py._wire import ha_records

from ..service.facade import MasterService
from .journal import DirtyRows, Journal
from .log_store import MAX_RECORD_BYTES, LeadershipLost, LogStore, LogStoreError
from .rows import RowCapture, TimeBase
from .snapshot import capture_sliced, encode_image

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)
ROWS_PER_SLICE = 2048
FLUSH_TICK_S = 0.1
"""How soon changes no call waits for (background steps) are flushed."""
"""Rows captured per hold of the service lock (about a millisecond's work)."""
# Every repeated field of a record, in the order a split keeps them (withdrawals first,
# ranges last); a field missing here would be lost when a large record is split.
_SPLIT_FIELDS = (
    "unmounted_segments",
    "objects",
    "removed_objects",
    "sessions",
    "removed_sessions",
    "segments",
    "removed_segments",
    "clients",
    "removed_clients",
    "memberships",
    "ranges",
)


class Replicator:
    """The leader's side of the log (see the module docstring).

    Args:
        service: the master service whose state is replicated.
        store: where records and snapshots go.
        last_seq: the last record already in ``store`` (the next one is ``last_seq + 1``).
        wall_ms: the wall clock, ms.
        snapshot_interval_s: seconds between snapshots (0: only by record count).
        snapshot_records: records between snapshots (0: only by time).
        on_fatal: called once, on the loop, when this master must stop (leadership lost).

    Attributes:
        journal: where the state marks its changes.
        appends: appends done (each one group commit).
        records: records appended.
        snapshots: snapshots saved.
    """

    def __init__(
        self,
        service: MasterService,
        store: LogStore,
        last_seq: int,
        wall_ms: Callable[[], int],
        snapshot_interval_s: float = 600.0,
        snapshot_records: int = 100_000,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._service = service
        self._store = store
        self._state = service.context.state
        self._lock = service.context.lock
        self._clock = service.context.clock
        self._wall_ms = wall_ms
        self.journal = Journal()
        self._capture = RowCapture(self._state, self._times)
        # Flushes are numbered (generations): a call waits for the generation that took its
        # changes. Records get sequence numbers once captured.
        self._taken = 0  # generations whose dirty rows were taken (under the service lock)
        self._durable_gen = 0  # generations whose records the store acknowledged
        self._assigned = last_seq  # last sequence number given to a record
        self._durable = last_seq  # last record the store acknowledged
        self._snapshot_seq = last_seq
        self._snapshot_interval_s = snapshot_interval_s
        self._snapshot_records = snapshot_records
        self._on_fatal = on_fatal
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flushing = False
        self._kick_pending = False
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._tiebreak = itertools.count()
        self._durable_changed = threading.Condition()
        self._snapshot_task: asyncio.Task[None] | None = None
        self._snapshotting = False
        # While a snapshot is taken: the records appended since its walk began, to replay
        # over the walk's image without reading them back from the store.
        self._replay: list[tuple[int, bytes]] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        self._closed = False
        self.appends = 0
        self.records = 0
        self.snapshots = 0

    def _times(self) -> TimeBase:
        return TimeBase(self._clock(), self._wall_ms())

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Attach the journal to the state and start the snapshot timer, on the running loop.
        Changes made before this are not replicated (a restore happens before it)."""
        self._loop = asyncio.get_running_loop()
        with self._lock:
            self._state.attach_journal(self.journal)
        self._snapshot_task = self._loop.create_task(self._snapshot_timer())
        self._ticker = self._loop.create_task(self._tick())

    async def close(self, flush_timeout_s: float = 5.0) -> None:
        """Flush what is dirty (best effort, at most ``flush_timeout_s``; not at all once
        failed), stop the timer; the store stays open."""
        if self._closed:
            return
        if self._failed is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.flush(), flush_timeout_s)
        self._closed = True
        self.fail(RuntimeError("the replicator was closed"))
        for task in (self._snapshot_task, self._ticker):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    @property
    def durable_seq(self) -> int:
        """The last record the store acknowledged."""
        return self._durable

    @property
    def failed(self) -> BaseException | None:
        """Why this replicator stopped for good (leadership lost), or None."""
        return self._failed

    # -- calls -----------------------------------------------------------------------------

    def needed(self, marks_before: int) -> int:
        """The flush generation a call must see durable before it is answered (0 when it
        changed nothing); kicks a flush. ``marks_before`` is :attr:`Journal.marks` read before
        the call. Safe from any thread. O(1)."""
        if self.journal.marks == marks_before:
            return 0
        with self._lock:
            generation = self._taken + (1 if self.journal.dirty else 0)
        self._kick()
        return generation

    @property
    def durable_generation(self) -> int:
        """The last flush generation the store acknowledged."""
        return self._durable_gen

    async def durable(self, generation: int) -> None:
        """Return once flush ``generation`` (from :meth:`needed`) is durable.

        Raises:
            LeadershipLost: this master lost the leadership before it was.
        """
        if self._durable_gen >= generation:
            return
        if self._failed is not None:
            raise LeadershipLost(str(self._failed))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (generation, next(self._tiebreak), future))
        await future

    def wait_durable_blocking(self, generation: int, timeout: float) -> bool:
        """:meth:`durable` for a thread off the event loop; False on timeout or failure."""
        deadline = time.monotonic() + timeout
        with self._durable_changed:
            while self._durable_gen < generation:
                left = deadline - time.monotonic()
                if left <= 0 or self._failed is not None:
                    return False
                self._durable_changed.wait(left)
        return True

    def _kick(self) -> None:
        loop = self._loop
        if loop is None or self._kick_pending:
            return
        self._kick_pending = True
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.call_soon(self._start_flush)
        else:
            loop.call_soon_threadsafe(self._start_flush)

    def _start_flush(self) -> None:
        self._kick_pending = False
        if not self._flushing and self._failed is None and not self._closed:
            self._flushing = True
            asyncio.get_running_loop().create_task(self._flush_loop())

    # -- flushing --------------------------------------------------------------------------

    async def flush(self) -> None:
        """Make everything marked so far durable (waits for the flush in flight too)."""
        with self._lock:
            generation = self._taken + (1 if self.journal.dirty else 0)
        if generation > self._durable_gen:
            self._kick()
            await self.durable(generation)

    async def _flush_loop(self) -> None:
        try:
            await self._flush_dirty()
        except Exception as exc:  # a bug must not leave every later call waiting forever
            log.exception("replication failed")
            self._fail(exc)
        finally:
            self._flushing = False
        if self.journal.dirty and self._failed is None:
            self._kick()

    async def _flush_dirty(self) -> None:
        """Flush until nothing is dirty (one generation per round)."""
        while self.journal.dirty and self._failed is None:
            with self._lock:
                self._taken += 1
                generation = self._taken
                dirty = self.journal.take()
            records = await self._capture_sliced(dirty)
            first = self._assigned + 1
            for offset, record in enumerate(records):
                record.seq = first + offset
            self._assigned += len(records)
            blobs = [record.SerializeToString() for record in records]
            if await self._append(first, blobs):
                if self._replay is not None:
                    self._replay.extend(enumerate(blobs, first))
                self._mark_durable(generation, self._assigned)

    async def _capture_sliced(self, dirty: DirtyRows) -> list[ha_records.LogRecord]:
        """The records of ``dirty`` (unnumbered, each small enough to store), captured
        :data:`ROWS_PER_SLICE` rows per hold of the service lock, so a flush of a huge batch
        never stalls other calls."""
        records: list[ha_records.LogRecord] = []
        parts = self._capture.records(dirty, ROWS_PER_SLICE)
        while True:
            with self._lock:
                record = next(parts, None)
            if record is None:
                return records
            records.extend(_split(record))
            await asyncio.sleep(0)

    async def _append(self, first: int, blobs: list[bytes]) -> bool:
        """Append until stored (True) or the leadership is lost (False)."""
        attempt = 0
        while True:
            try:
                await self._store.append(first, blobs)
                break
            except LeadershipLost as exc:
                self._fail(exc)
                return False
            except (LogStoreError, OSError) as exc:
                if self._failed is not None:
                    return False  # stopped meanwhile (leadership lost, closed)
                delay = RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)]
                attempt += 1
                log.warning("log append of %d record(s) failed (%s); retrying", len(blobs), exc)
                await asyncio.sleep(delay)
        self.appends += 1
        self.records += len(blobs)
        return True

    def _mark_durable(self, generation: int, seq: int) -> None:
        self._durable = seq
        self._durable_gen = generation
        waiters = self._waiters
        while waiters and waiters[0][0] <= generation:
            _, _, future = heapq.heappop(waiters)
            if not future.done():
                future.set_result(None)
        with self._durable_changed:
            self._durable_changed.notify_all()
        if (
            self._snapshot_records
            and seq - self._snapshot_seq >= self._snapshot_records
            and not self._snapshotting
        ):
            asyncio.get_running_loop().create_task(self.snapshot())

    def fail(self, exc: BaseException) -> None:
        """Stop for good: every waiting call gets :class:`LeadershipLost`, no more appends
        (the election lost the leadership, or the master stops). Idempotent."""
        self._fail(exc, fatal=False)

    def _fail(self, exc: BaseException, fatal: bool = True) -> None:
        if self._failed is not None:
            return
        self._failed = exc
        log.error("replication stopped: %s", exc)
        for _, _, future in self._waiters:
            if not future.done():
                future.set_exception(LeadershipLost(str(exc)))
        self._waiters.clear()
        with self._durable_changed:
            self._durable_changed.notify_all()
        if fatal and self._on_fatal is not None:
            self._on_fatal(exc)

    # -- snapshots -------------------------------------------------------------------------

    async def _tick(self) -> None:
        """Flush what the background steps changed (evictions, expiries, sweeps): no call
        waits for those, so nothing else would."""
        while self._failed is None and not self._closed:
            await asyncio.sleep(FLUSH_TICK_S)
            if self.journal.dirty and not self._flushing:
                self._kick()

    async def _snapshot_timer(self) -> None:
        if self._snapshot_interval_s <= 0:
            return
        while True:
            await asyncio.sleep(self._snapshot_interval_s)
            if self._durable > self._snapshot_seq:
                await self.snapshot()

    async def snapshot(self) -> int:
        """Save a snapshot of the state now; returns its sequence number (0: one was already
        being taken, or it failed and the previous one still counts)."""
        if self._snapshotting or self._failed is not None:
            return 0
        self._snapshotting = True
        try:
            self._replay = []
            walk = capture_sliced(self._state, self._lock, self._times, lambda: self._assigned)
            image = None
            for step in walk:
                if step is not None:
                    image = step
                    break
                await asyncio.sleep(0)
            assert image is not None
            await self.flush()
            walk_seq = image.seq
            for _, blob in self._replay:
                image.apply(ha_records.decode_record(blob))  # older than the walk: ignored
            self._replay = None
            tables = await asyncio.to_thread(encode_image, image)
            await self._store.save_snapshot(image.seq, tables)
            self._snapshot_seq = max(self._snapshot_seq, image.seq)
            self.snapshots += 1
            log.info("snapshot at record %d (walk began after %d)", image.seq, walk_seq)
            return image.seq
        except LeadershipLost as exc:
            self._fail(exc)
            return 0
        except (LogStoreError, OSError, ValueError) as exc:
            log.warning("snapshot failed: %s", exc)
            return 0
        finally:
            self._snapshotting = False
            self._replay = None


def _split(record: ha_records.LogRecord) -> list[ha_records.LogRecord]:
    """``record`` as records of at most MAX_RECORD_BYTES encoded (a huge session row set or
    a few huge keys), in order; every part carries the record's counters. O(rows)."""
    if record.ByteSize() <= MAX_RECORD_BYTES:
        return [record]
    parts: list[ha_records.LogRecord] = []
    budget = MAX_RECORD_BYTES - 4096
    current = _header_of(record)
    size = 0
    for field in _SPLIT_FIELDS:
        for item in getattr(record, field):
            item_size = item.ByteSize() + 8 if hasattr(item, "ByteSize") else len(item) + 8
            if size + item_size > budget and size:
                parts.append(current)
                current = _header_of(record)
                size = 0
            target = getattr(current, field)
            if hasattr(item, "ByteSize"):
                target.add().CopyFrom(item)
            else:
                target.append(item)
            size += item_size
    parts.append(current)
    return parts


def _header_of(record: ha_records.LogRecord) -> ha_records.LogRecord:
    header = ha_records.LogRecord(
        seq=record.seq,
        wall_ms=record.wall_ms,
        next_write_id=record.next_write_id,
        next_replica_id=record.next_replica_id,
    )
    header.kv_cache_released_tenants.extend(record.kv_cache_released_tenants)
    return header
