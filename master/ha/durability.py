"""What ``--enable_ha`` and ``--enable_snapshot`` make of a master's start.

- **Neither**: the metadata lives in memory only (nothing here runs).
- **--enable_snapshot** (one master): the log and snapshots go to ``--snapshot_dir``
  (:class:`~.directory_log.DirectoryLogStore`); with ``--enable_snapshot_restore`` the
  master first rebuilds its state from them (:func:`recover_image`,
  :func:`~.restore.restore_sliced`); without it, it starts empty and saves an empty snapshot so
  that a later restore does not resurrect an older life's objects.
- **--enable_ha**: the master is a *standby* first: it loads the newest snapshot and every
  record from etcd (:class:`~.etcd_log.EtcdLogStore`) and follows the log as the leader
  appends, while it campaigns (:class:`~.election.LeaderElection`). Once it wins, it reads
  the records the old leader appended last (its appends are fenced by the election, so none
  can land after the old lease ended), restores the state from its image and starts serving;
  losing the leadership later is fatal (``on_fatal``: the process exits and comes back as a
  standby).

Either way a :class:`~.replicator.Replicator` then makes every change durable before its
call is answered.

Thread-safety: runs on the master's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from mooncake_py import capability
from mooncake_py._wire import ha_records
from mooncake_py.ha_names import parse_etcd_endpoints

from ..config import MasterConfig
from ..service.facade import MasterService
from .log_store import LogStore, LogStoreError, RecordsDropped
from .replicator import Replicator
from .restore import RestoreReport, restore_sliced
from .rows import RowImage, TimeBase
from .snapshot import decode_image, encode_image

if TYPE_CHECKING:
    from .election import LeaderElection
    from .etcd_client import EtcdClient

log = logging.getLogger(__name__)

T = TypeVar("T")


async def recover_image(store: LogStore) -> RowImage:
    """The newest snapshot in ``store`` with every record after it applied.

    Raises:
        LogStoreError: the store could not be read.
        ValueError: a snapshot or record does not decode, or records are missing.

    Complexity: O(snapshot rows + records).
    """
    for _ in range(3):
        loaded = await store.load_snapshot()
        image = RowImage()
        if loaded is not None:
            seq, tables = loaded
            image = decode_image(tables)
            image.seq = seq
        try:
            await catch_up(store, image, reload=False)
        except RecordsDropped:
            continue  # a newer snapshot was saved between the two reads: load that one
        return image
    raise RecordsDropped("the log kept moving past every snapshot loaded")


async def catch_up(store: LogStore, image: RowImage, reload: bool = True) -> None:
    """Apply to ``image`` every record stored after its ``seq``. Records dropped meanwhile by
    a snapshot (a reader too far behind) make it load the newest snapshot instead, unless
    ``reload`` is False (then :class:`RecordsDropped` is raised).

    Raises:
        LogStoreError: the store could not be read.
        ValueError: a record does not decode or does not follow.
    """
    while True:
        try:
            batch = await store.records_after(image.seq)
        except RecordsDropped:
            if not reload:
                raise
            log.info("records after %d were dropped: loading the newest snapshot", image.seq)
            image.replace_with(await recover_image(store))
            continue
        if not batch:
            return
        for _, blob in batch:
            image.apply(ha_records.decode_record(blob))


async def _patiently(what: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt()`` until it does not fail with :class:`LogStoreError` (etcd down or
    unreachable): a standby waits for its store rather than exiting."""
    delay = 0.1
    while True:
        try:
            return await attempt()
        except RecordsDropped:
            raise
        except LogStoreError as exc:
            log.warning("%s failed (%s); retrying in %.1f s", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 2.0)


def quarantine_seconds(config: MasterConfig) -> float:
    """How long a restored master keeps ranges it cannot account for: the longest a reader
    (its lease, its capability) or a preempted writer of the old leader may still touch them."""
    return max(
        config.default_kv_lease_ttl / 1000.0,
        config.capability_ttl_sec,
        config.put_start_release_timeout_sec,
    )


def read_hold_seconds(config: MasterConfig) -> float:
    """How long a restored master holds the ranges it frees: the longest a reader of the old
    leader (its lease, its capability) may still be copying from them. Writers are not
    concerned: a restored write in flight is ended, revoked or swept as on any master."""
    return max(config.default_kv_lease_ttl / 1000.0, config.capability_ttl_sec)


async def _stop_task(task: asyncio.Task[None], attempts: int = 10) -> None:
    """Cancel ``task`` and wait until it ends, cancelling again if a cancellation is lost
    (Python 3.11's ``wait_for`` can swallow one that arrives as its awaitable completes)."""
    for _ in range(attempts):
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if done:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                task.result()
            return
    log.warning("the log follower did not stop; it ends with the store")


class MetadataDurability:
    """The durability a master's configuration asks for (see the module docstring).

    Args:
        config: the master's configuration.
        service: its service (restored into before it serves).
        on_fatal: called when the master must stop answering (leadership lost).

    Attributes:
        replicator: the running replicator, once :meth:`before_serving` returned (None when
            the metadata lives in memory only).
        role: ``"memory"``, ``"single"``, ``"standby"`` or ``"leader"``.
        restored: what the restore did, if one ran.
        promoted_at: ``time.monotonic()`` when this master became leader (0: never).
    """

    def __init__(
        self,
        config: MasterConfig,
        service: MasterService,
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self._config = config
        self._service = service
        self._on_fatal = on_fatal
        self.replicator: Replicator | None = None
        self.role = "memory"
        self.restored: RestoreReport | None = None
        self.promoted_at = 0.0
        self._store: LogStore | None = None
        self._election: LeaderElection | None = None
        self._etcd: EtcdClient | None = None
        self._watch: asyncio.Task[None] | None = None
        self._advertised = ""

    @property
    def enabled(self) -> bool:
        """Whether the configuration asks for a durable log at all."""
        return self._config.enable_ha or self._config.enable_snapshot

    async def before_serving(self, advertise: str, on_standby: Callable[[], None]) -> None:
        """Set the durability up; returns when this master may serve (at once without HA,
        once it leads with HA).

        Args:
            advertise: the ``host:port`` clients reach this master at (published as leader).
            on_standby: called once the standby follows the log (HA only), before waiting.

        Raises:
            LogStoreError, ValueError: the log could not be read or does not decode.
        """
        if self._config.enable_ha:
            await self._lead(advertise, on_standby)
        elif self._config.enable_snapshot:
            await self._single()

    async def _single(self) -> None:
        from .directory_log import DirectoryLogStore

        config = self._config
        store = DirectoryLogStore(
            config.snapshot_directory(), retention=config.snapshot_retention_count
        )
        self._store = store
        self.role = "single"
        if config.enable_snapshot_restore:
            image = await recover_image(store)
            await self._restore(image)
            last = image.seq
        else:
            last = await store.last_seq()
            fresh = RowImage()
            fresh.seq = last
            await store.save_snapshot(last, encode_image(fresh))
        self._start_replicator(last)

    async def _lead(self, advertise: str, on_standby: Callable[[], None]) -> None:
        from .election import LeaderElection
        from .etcd_client import EtcdClient
        from .etcd_log import EtcdLogStore

        config = self._config
        self._advertised = advertise
        endpoints = parse_etcd_endpoints(config.etcd_endpoints)
        # The log has a client of its own: the election's calls are bounded by a fraction of
        # the lease TTL, too little for reading a large snapshot.
        etcd = self._etcd = EtcdClient(endpoints)
        election = self._election = LeaderElection(
            endpoints, config.cluster_id, advertise, ttl_s=config.ha_lease_ttl_sec
        )
        store = EtcdLogStore(
            etcd,
            config.cluster_id,
            election=election,
            retention=config.snapshot_retention_count,
            close_client=False,
        )
        self._store = store
        self.role = "standby"
        image = await _patiently("loading the metadata", lambda: recover_image(store))
        follower = asyncio.get_running_loop().create_task(self._follow(store, image))
        on_standby()
        try:
            await election.campaign()
        finally:
            await _stop_task(follower)
        try:
            # The old leader's appends are fenced now: read what it appended last.
            await _patiently("catching up with the log", lambda: catch_up(store, image))
            await self._restore(image)
            self.role = "leader"
            self.promoted_at = time.monotonic()
            self._start_replicator(image.seq)
        except BaseException:
            # Leave the leadership to another standby at once rather than at the lease's end.
            with contextlib.suppress(Exception):
                await election.resign()
            raise
        self._watch = asyncio.get_running_loop().create_task(self._watch_leadership())

    async def _follow(self, store: LogStore, image: RowImage) -> None:
        """A standby's tail of the log, into ``image``, until cancelled: a follower that fell
        behind the pruning loads the newest snapshot; other failures are retried."""
        while True:
            try:
                async for _, blob in store.follow(image.seq):
                    image.apply(ha_records.decode_record(blob))
            except RecordsDropped:
                log.info("the standby fell behind the log: loading the newest snapshot")
                image.replace_with(
                    await _patiently("loading the metadata", lambda: recover_image(store))
                )
            except (LogStoreError, ValueError) as exc:
                log.warning("following the log failed (%s); reading it again", exc)
                await asyncio.sleep(0.5)
                with contextlib.suppress(LogStoreError, ValueError):
                    await catch_up(store, image)

    async def _watch_leadership(self) -> None:
        assert self._election is not None
        await self._election.wait_lost()
        lost = RuntimeError(f"lost the leadership of the HA cluster: {self._election.lost_reason}")
        if self.replicator is not None:
            # Calls waiting for their records are refused now; none is answered as durable.
            self.replicator.fail(lost)
        self._on_fatal(lost)

    async def _restore(self, image: RowImage) -> None:
        """Restore ``image`` into the service in slices, letting the event loop (the
        election's lease renewals) run between them."""
        context = self._service.context
        times = TimeBase(context.clock(), capability.now_ms())
        steps = restore_sliced(
            context.state,
            image,
            times,
            quarantine_seconds(self._config),
            read_hold_seconds(self._config),
        )
        while True:
            with context.lock:
                report = next(steps)
            if report is not None:
                break
            await asyncio.sleep(0)
        self.restored = report
        log.info(
            "restored %d objects (%d dropped), %d sessions, %d segments at record %d; "
            "%d ranges held for %.0f s",
            report.objects,
            report.dropped_objects,
            report.sessions,
            report.segments,
            image.seq,
            report.quarantined,
            quarantine_seconds(self._config),
        )

    def _start_replicator(self, last_seq: int) -> None:
        assert self._store is not None
        config = self._config
        self.replicator = Replicator(
            self._service,
            self._store,
            last_seq,
            capability.now_ms,
            snapshot_interval_s=config.snapshot_interval_seconds,
            snapshot_records=config.snapshot_log_records,
            on_fatal=self._on_fatal,
        )
        self.replicator.start()

    def serving(self) -> bool:
        """Whether this master may answer calls now: always without HA; with HA, while its
        election holds (checked against the local lease deadline, so a master paused past
        its lease refuses calls the moment it runs again, before any timer could tell it).
        O(1)."""
        return self._election is None or self._election.is_leader

    def leader_view(self) -> dict[str, object] | None:
        """Upstream's ``/leader`` view of this master once it leads an HA cluster: its
        published address and the election's revision (the view version); None otherwise."""
        if self.role != "leader" or self._election is None:
            return None
        return {
            "leader_address": self._advertised,
            "view_version": self._election.leader_revision,
            "cluster_id": self._config.cluster_id,
        }

    async def close(self) -> None:
        """Flush (best effort), stop replicating, resign and close the store."""
        if self._watch is not None:
            self._watch.cancel()
        if self.replicator is not None:
            await self.replicator.close()
        if self._election is not None:
            with contextlib.suppress(Exception):
                await self._election.resign()
            with contextlib.suppress(Exception):
                await self._election.close()
        if self._store is not None:
            with contextlib.suppress(Exception):
                await self._store.close()
        if self._etcd is not None:
            with contextlib.suppress(Exception):
                await self._etcd.close()
