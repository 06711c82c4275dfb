"""A segment owner's disk tier: its directory, its mount, and the thread that runs its tasks.

A client set up with ``enable_ssd_offload`` and a memory segment keeps a disk tier
(:class:`DiskTierHost`):

- it claims a tier directory under ``ssd_offload_path`` (:class:`~.disk_store.DiskStore`: files
  found there from an earlier run are indexed) and mounts it with the master as a segment with
  ``disk=True`` whose size is the quota (``ssd_offload_quota``, by default 90 % of the
  filesystem's free space). The tier's id, capability key and high-water offset live in the
  directory (:data:`IDENTITY_FILE`, mode 0600), so a process restarted on it mounts the same
  tier: the master hands it over with its objects if its old self has not expired yet, hands
  it the deletions decided while it was away, and never hands out an offset below the
  high-water mark;
- it registers the files found (:meth:`DiskTierHost.register_found`), so objects written before a
  restart are readable again; a file whose key the master already has, or that the tier cannot
  hold, is deleted;
- a thread polls the master for disk tasks (FetchDiskTasks): a *spill* writes an object from the
  owner's own segment memory into a file (written, synced as configured, renamed: only complete
  files are ever served), a *promotion* copies a file into a memory range reserved for it in the
  segment; each outcome is reported (FinishDiskTasks). Deletions handed out with the tasks are
  done first. Polls come every :data:`BUSY_POLL_S` while there is work, backing off to
  :data:`IDLE_POLL_S` when there is none.
- its transfer service serves READ requests on the disk segment from the files
  (:meth:`~.disk_store.DiskStore.read_range`), under the master's capabilities as for memory.

Thread-safety: :meth:`start` and :meth:`close` from the owning thread; the poller runs on its own.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Sequence

from mooncake_py.capability import new_segment_key
from mooncake_py.errors import ErrorCode, MooncakeError
from mooncake_py.types import (
    DiskReplicaEntry,
    DiskTask,
    DiskTaskKind,
    SegmentInfo,
)

from .disk_store import DiskStore, DiskWrite
from .master_rpc import MasterClient
from .transfer_server import DiskSource

log = logging.getLogger(__name__)

BUSY_POLL_S = 0.002
"""Pause between two polls while the master hands out work."""
IDLE_POLL_S = 0.05
"""Longest pause between two polls when there is none."""
FETCH_BATCH = 64
"""Disk tasks asked for per poll."""
REGISTER_CHUNK = 2048
"""Files registered per RegisterDiskReplicas call."""
IDENTITY_FILE = "tier.json"
"""The tier's id, capability key and high-water offset, in its directory."""
DEFAULT_QUOTA_SHARE = 0.9
"""Share of the filesystem's free space a tier takes when no quota is configured."""

_OK = int(ErrorCode.OK)
# Refusals that say the files are someone else's (a tenant the tier may not hold, a tier that
# is not this client's): they are left alone.
_NOT_OURS = (int(ErrorCode.ILLEGAL_CLIENT), int(ErrorCode.SEGMENT_NOT_FOUND))


def default_quota(path: str) -> int:
    """:data:`DEFAULT_QUOTA_SHARE` of the free space of the filesystem holding ``path``."""
    os.makedirs(path, exist_ok=True)
    return max(1, int(shutil.disk_usage(path).free * DEFAULT_QUOTA_SHARE))


class DiskTierHost:
    """One owner's disk tier (see the module docstring).

    Args:
        master: the owner's master connection.
        client_id: the owner's client id.
        memory: the owner's segment memory (the source of spills, the target of promotions).
        memory_segment_id: that segment's id.
        path: ``ssd_offload_path``.
        quota_bytes: the tier's size; None for :func:`default_quota`.
        fsync: sync each file (and the directory once per batch) before reporting it done.
        name, endpoint, host_id: as the memory segment's (the same transfer service serves
            both).
        owner: who the tier's files belong to (the client's tenant, or its token's digest):
            it claims only directories of that owner, or empty ones.

    Raises:
        OSError: the directory cannot be created, locked or read.
    """

    def __init__(
        self,
        master: MasterClient,
        client_id: str,
        memory: memoryview,
        memory_segment_id: str,
        path: str,
        quota_bytes: int | None,
        fsync: bool,
        name: str,
        endpoint: str,
        host_id: str,
        owner: str = "",
    ) -> None:
        self._master = master
        self._client_id = client_id
        self._memory = memory
        self._memory_segment_id = memory_segment_id
        quota = quota_bytes if quota_bytes else default_quota(path)
        self._owner = owner
        self.store = DiskStore(path, fsync=fsync, capacity_bytes=quota, owner=owner)
        try:
            segment_id, self.key, high_water = self._identity()
        except BaseException:
            self.store.close()
            raise
        ends = [e.offset + e.size for e in self.store.entries()]
        self._high_water = max([high_water, *ends])
        self.segment_uuid = uuid.UUID(segment_id).bytes
        self.info = SegmentInfo(
            id=segment_id,
            name=name,
            base=self._high_water,  # a disk tier's base: no offset below it is handed out
            size=quota,
            te_endpoint=endpoint,
            host_id=host_id,
            capability_key=self.key,
            disk=True,
        )
        self._reregister = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mooncake-disk", daemon=True)
        self.spilled = 0  # files written for the master, for tests and metrics
        self.promoted = 0
        self.deleted = 0
        self.failed = 0

    # -- identity --------------------------------------------------------------------------

    def _identity(self) -> tuple[str, bytes, int]:
        """(tier id, capability key, high-water offset) from :data:`IDENTITY_FILE`, or fresh
        ones (written there) for a new directory or an unreadable file."""
        path = os.path.join(self.store.directory, IDENTITY_FILE)
        try:
            with open(path, encoding="utf-8") as handle:
                saved = json.load(handle)
            segment_id = str(uuid.UUID(saved["segment_id"]))
            key = bytes.fromhex(saved["key"])
            high_water = int(saved.get("high_water", 0))
            mine = saved.get("owner", self._owner) == self._owner
            if mine and len(key) == len(new_segment_key()) and high_water >= 0:
                return segment_id, key, high_water
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning(
                "disk tier %s: unreadable %s (%s): a new identity", path, IDENTITY_FILE, exc
            )
        segment_id, key = str(uuid.uuid4()), new_segment_key()
        self._save_identity(segment_id, key, 0)
        return segment_id, key, 0

    def _save_identity(self, segment_id: str, key: bytes, high_water: int) -> None:
        """Write :data:`IDENTITY_FILE` atomically (mode 0600: it holds the tier's key)."""
        path = os.path.join(self.store.directory, IDENTITY_FILE)
        staged = f"{path}.part"
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            saved = {
                "segment_id": segment_id,
                "key": key.hex(),
                "high_water": high_water,
                "owner": self._owner,
            }
            json.dump(saved, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staged, path)

    def _raise_high_water(self, tasks: Sequence[DiskTask]) -> None:
        """Record that offsets up to the end of ``tasks``' files were handed out (before the
        files are written, so a restart never reuses one of them)."""
        top = max(t.disk_offset + t.size for t in tasks)
        if top > self._high_water:
            self._high_water = top
            try:
                self._save_identity(self.info.id, self.key, top)
            except OSError as exc:
                log.warning("disk tier: cannot record its high-water offset: %s", exc)
            self._publish_high_water()

    def _publish_high_water(self) -> None:
        """Mount (and remount, after a master restart) with the current high-water mark, so a
        fresh master hands out no offset of a file this tier holds."""
        if self.info.base != self._high_water:
            self.info = dataclasses.replace(self.info, base=self._high_water)

    # -- joining ---------------------------------------------------------------------------

    def mount(self) -> int:
        """Mount the tier with the master; 0 or the master's code (UNABLE_OFFLOAD when the
        master refuses disk tiers)."""
        return int(self._master.mount_segment(self._client_id, self.info))

    def register_found(self) -> tuple[int, int]:
        """Register every file the tier directory holds; delete the ones the master refuses.

        Returns:
            (registered, refused).
        Raises:
            MooncakeError: the master could not be reached.
        """
        entries = self.store.entries()
        registered = refused = 0
        for start in range(0, len(entries), REGISTER_CHUNK):
            chunk = entries[start : start + REGISTER_CHUNK]
            codes = self._master.register_disk_replicas(
                self._client_id,
                self.info.id,
                [DiskReplicaEntry(e.tenant, e.key, e.offset, e.size) for e in chunk],
            )
            # Files of a tenant this tier may not hold are someone else's: left alone.
            doomed = [
                e.offset
                for e, code in zip(chunk, codes, strict=True)
                if code != _OK and code not in _NOT_OURS
            ]
            registered += sum(1 for code in codes if code == _OK)
            refused += len(chunk) - sum(1 for code in codes if code == _OK)
            if doomed:
                self.store.delete(doomed)
        self._publish_high_water()
        if entries:
            log.info("disk tier %s: %d objects found again", self.store.directory, registered)
        return registered, refused

    def start(self) -> None:
        """Start running disk tasks."""
        self._thread.start()

    def reregister_soon(self) -> None:
        """Ask the tier's thread to register its files again (after a remount: the master may
        have forgotten them). Runs between two task batches, so a file and the report of the
        spill that wrote it are never in flight at once."""
        self._reregister.set()

    def lookup(self, segment_uuid: bytes) -> tuple[memoryview | DiskSource, bytes] | None:
        """The transfer service's view of the tier (see :data:`~.transfer_server.SegmentLookup`)."""
        if segment_uuid != self.segment_uuid:
            return None
        return self.store, self.key

    # -- the poller ------------------------------------------------------------------------

    def _run(self) -> None:
        pause = BUSY_POLL_S
        while not self._stop.wait(pause):
            try:
                if self._reregister.is_set():
                    self._reregister.clear()
                    self.register_found()
                worked = self.run_once()
            except MooncakeError as exc:
                log.debug("disk task poll failed: %s", exc)
                worked = False
            except Exception:  # never let the tier's thread die of one bad task
                log.exception("disk task poll failed")
                worked = False
            pause = BUSY_POLL_S if worked else min(IDLE_POLL_S, pause * 2)

    def run_once(self) -> bool:
        """Fetch and run one batch of disk tasks; True when there was anything to do.

        Raises:
            MooncakeError: the master could not be reached.
        """
        batch = self._master.fetch_disk_tasks(self._client_id, FETCH_BATCH)
        for segment_id, offsets in batch.deletes:
            if segment_id == self.info.id:
                self.deleted += self.store.delete(offsets)
        damaged = self.store.take_quarantined()
        if damaged:
            # Files a read found torn or corrupt: the master stops handing out their replicas.
            self._master.drop_disk_replicas(
                self._client_id,
                self.info.id,
                [DiskReplicaEntry(e.tenant, e.key, e.offset, e.size) for e in damaged],
            )
        if not batch.tasks:
            return bool(batch.deletes or damaged)
        spills = [t for t in batch.tasks if t.kind is DiskTaskKind.SPILL]
        promotions = [t for t in batch.tasks if t.kind is DiskTaskKind.PROMOTE]
        ids: list[int] = []
        codes: list[int] = []
        # Promotions first: they are quick reads, and their memory is reserved for them only
        # until their task times out.
        for task in promotions:
            ids.append(task.task_id)
            codes.append(self._promote(task))
        if spills:
            self._raise_high_water(spills)
            ids += [t.task_id for t in spills]
            codes += self._spill(spills)
        self.failed += sum(1 for c in codes if c != _OK)
        answers = self._master.finish_disk_tasks(self._client_id, ids, codes)
        # A spill the master no longer knows (it expired, or a new master took over) wrote a
        # file nobody will read: it goes, so the tier's files and the master's ranges agree.
        reports = zip(ids, codes, answers, strict=False)
        written = {t.task_id: t for t in spills}
        stray = [
            written[task_id].disk_offset
            for task_id, code, answer in reports
            if task_id in written and code == _OK and answer != _OK
        ]
        if stray:
            self.store.delete(stray)
        return True

    def _memory_range(self, task: DiskTask) -> memoryview | None:
        if task.memory_segment_id != self._memory_segment_id:
            return None
        end = task.memory_offset + task.size
        if task.memory_offset < 0 or end > len(self._memory):
            return None
        return self._memory[task.memory_offset : end]

    def _spill(self, tasks: Sequence[DiskTask]) -> list[int]:
        """Write every spill's bytes to its file, in one batch (one directory sync)."""
        codes = [int(ErrorCode.INVALID_PARAMS)] * len(tasks)
        writes: list[DiskWrite] = []
        positions: list[int] = []
        for i, task in enumerate(tasks):
            view = self._memory_range(task)
            if view is None or task.disk_segment_id != self.info.id:
                continue
            writes.append(DiskWrite(task.disk_offset, task.tenant, task.key, view))
            positions.append(i)
        if writes:
            for i, code in zip(positions, self.store.write_batch(writes), strict=True):
                codes[i] = code
        self.spilled += sum(1 for c in codes if c == _OK)
        return codes

    def _promote(self, task: DiskTask) -> int:
        """Copy a file into the memory range reserved for it."""
        view = self._memory_range(task)
        if view is None or task.disk_segment_id != self.info.id:
            return int(ErrorCode.INVALID_PARAMS)
        code = self.store.read_into(
            task.disk_offset, task.size, view, tenant=task.tenant, key=task.key
        )
        if code == _OK:
            self.promoted += 1
        return code

    # -- leaving ---------------------------------------------------------------------------

    def close(self, unmount: Callable[[str], object] | None = None) -> None:
        """Stop the poller (a batch in progress finishes first), unmount the tier with
        ``unmount`` when given, release the directory. The files stay: a restarted owner finds
        them. Never raises."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        try:  # the deletions decided meanwhile, so no removed object comes back at a restart
            batch = self._master.fetch_disk_tasks(self._client_id, 0)
            for segment_id, offsets in batch.deletes:
                if segment_id == self.info.id:
                    self.deleted += self.store.delete(offsets)
        except MooncakeError as exc:
            log.debug("last fetch of disk deletions failed: %s", exc)
        if unmount is not None:
            try:
                unmount(self.info.id)
            except MooncakeError as exc:
                log.debug("unmounting the disk tier failed: %s", exc)
        self.store.close()
