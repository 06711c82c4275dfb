"""The client core: joins the store, and runs puts and gets as master RPCs plus transfers.

Write protocol for a batch: one BatchPutStart (the master reserves replicas), the transfers
(straight from the caller's buffers into the replicas), then one BatchPutEnd for the keys whose
every replica was written and one BatchPutRevoke for the others, so a failed write never leaves
a half-visible object. An existing key counts as success (first writer wins).

Writes name themselves: each start answers a write id, and the PutEnd / PutRevoke of that key
send it back, so they act on this write only (INVALID_WRITE when another write of the key
preempted it: the put failed).

Read protocol: one (Batch)GetReplicaList, which starts one read lease per found key, held by
this client (its ``read_id``); the transfers straight into the caller's buffer; then the end
of those leases (:meth:`ClientCore.end_reads`). While a lease is held the object's bytes stay
put on the master (removal, eviction and upsert retire the memory instead of freeing it), so
the client ends each lease right after its copy: one-way, costing no round trip, when the copy
finished within the lease TTL (measured on this client's clock from before the lookup); with
a synchronous EndReads when it outlived the TTL, and then only the keys the master answers
LEASE_EXPIRED for (their bytes may have changed under the copy) fail. The TTL itself only
bounds leases of readers that died. Every OK lookup result is ended exactly once, whether its
copy succeeded, failed, or never started.

Methods return codes (0 / negative ``ErrorCode``) or results per key; transport failures to the
master surface as RPC_FAIL / RPC_TIMEOUT codes. Thread-safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import socket
import time
import uuid
from collections.abc import Callable, Sequence

from mooncake_py.capability import new_segment_key
from mooncake_py.errors import ErrorCode, MooncakeError, error_for
from mooncake_py.types import PutStartResult, ReplicaListResult, ReplicateConfig, SegmentInfo

from .config import ClientConfig
from .data_plane import DataPlane, ReadItem, WriteItem
from .disk_tier_host import DiskTierHost
from .heartbeat import Heartbeat
from .local_share import LocalShareServer
from .master_rpc import MasterClient
from .segment import LocalSegment, host_id
from .task_worker import TaskWorker
from .transfer import TransferServer
from .transfer_server import PICK_FROM_UPSTREAM_PORTS, DiskSource

log = logging.getLogger(__name__)

OK = int(ErrorCode.OK)
ALREADY_EXISTS = int(ErrorCode.OBJECT_ALREADY_EXISTS)
NO_ROOM = int(ErrorCode.NO_AVAILABLE_HANDLE)
ROOM_WAIT_S = 20.0
"""How long a write waits for room while the master spills objects to disk tiers (below the
master's 30 s put_start_discard_timeout_sec, past which an unfinished write of the same batch
could be preempted)."""


def _listen_host(local_hostname: str) -> str:
    """The address to serve segments on: the host part of ``local_hostname``, resolved."""
    host = local_hostname.rsplit(":", 1)[0] if local_hostname.count(":") == 1 else local_hostname
    if host in ("", "localhost"):
        return "127.0.0.1"
    try:
        return socket.gethostbyname(host)
    except OSError:
        return "127.0.0.1"


class ClientCore:
    """A joined client: its segment, transfer service, master connection and heartbeat.

    Args:
        config: validated client configuration.
        clock: monotonic seconds; read leases are measured with it.

    Raises:
        MooncakeError: joining failed (master unreachable, segment cannot be created or
            mounted), as the code's family class; everything started so far is torn down.
        OSError: the segment's memory could not be created.
    """

    def __init__(self, config: ClientConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self.client_id = str(uuid.uuid4())
        # With a token and no explicit tenant, the token's tenant applies (sent as "").
        explicit = config.tenant_id != "default" or not config.auth_token
        self.tenant = config.tenant_id if explicit else ""
        self.host_id = host_id()
        self._segment: LocalSegment | None = None
        self._share: LocalShareServer | None = None
        # Shared with the master only: it keys the capabilities our data plane asks for.
        self._segment_key = new_segment_key()
        self._segment_uuid = b""  # its id's 16 bytes, as transfer requests name it
        self._server: TransferServer | None = None
        self._segment_info: SegmentInfo | None = None
        self.disk: DiskTierHost | None = None
        tls = config.tls_config()
        self.master = MasterClient(
            config.master_server_addr,
            config.rpc_timeout_s,
            config.master_transport == "auto",
            config.auth_token,
            tls=tls,
        )
        try:
            self._join()
            # Inside: a bad transfer setting (MOONCAKE_PY_TCP_SOCKET_BUFFER) must not leave
            # the segment mounted and the master connection open.
            self.data = DataPlane(self.host_id, self._segment, config.force_tcp, tls=tls)
        except BaseException:
            self.close()
            raise
        self.heartbeat = Heartbeat(
            self.master,
            self.client_id,
            self.segments,
            housekeeping=self.data.prune_dead_peers,
            on_remounted=None if self.disk is None else self.disk.reregister_soon,
        )
        self.heartbeat.start()
        # A client holding a segment does the replica tasks assigned to it (it has the bytes).
        self.tasks: TaskWorker | None = None
        if self._segment is not None:
            self.tasks = TaskWorker(self.master, self.client_id, self.data)
            self.tasks.start()
        if self.disk is not None:
            self.disk.start()

    @property
    def hostname(self) -> str:
        """The name of this client's segment (``host:port``)."""
        if self._segment_info is not None:
            return self._segment_info.name
        return self.config.local_hostname

    def segments(self) -> list[SegmentInfo]:
        """The segments this client contributes: none, its memory segment, and its disk tier
        when it keeps one."""
        if self._segment_info is None:
            return []
        if self.disk is None:
            return [self._segment_info]
        return [self._segment_info, self.disk.info]

    def _join(self) -> None:
        self.master.service_ready()  # fails fast when the master is unreachable
        self.master.connect_stream()
        if self.config.global_segment_size > 0:
            self._segment = LocalSegment(
                self.config.global_segment_size, prefault=self.config.prefault_segment
            )
            self._segment_uuid = uuid.UUID(self._segment.segment_id).bytes
            segment = self._segment
            # Bound before the mount makes the segment id known: nobody can hold the name.
            try:
                self._share = LocalShareServer(segment, self._segment_key)
            except OSError as exc:
                log.warning("no same-host shared memory for this segment (TCP only): %s", exc)
            self._server = TransferServer(
                _listen_host(self.config.local_hostname),
                self._lookup_segment,
                PICK_FROM_UPSTREAM_PORTS,
                tls=self.config.tls_config(),
            )
            name = self.config.local_hostname
            if name.count(":") != 1:
                name = f"{name}:{self._server.port}"
            self._segment_info = SegmentInfo(
                id=segment.segment_id,
                name=name,
                base=segment.address,
                size=segment.size,
                te_endpoint=self._server.endpoint,
                protocol=self.config.protocol,
                host_id=self.host_id,
                shared=self.config.shared_segment,
                capability_key=self._segment_key,
            )
            code = self.master.mount_segment(self.client_id, self._segment_info)
            if code != OK:
                raise error_for(code, "mounting the segment failed")
            if self.config.enable_ssd_offload:
                self._join_disk_tier(segment)
        elif self.config.enable_ssd_offload:
            log.warning("enable_ssd_offload ignored: this client contributes no segment")
        code = self.master.remount_segments(self.client_id, self.segments())
        if code != OK:
            raise error_for(code, "registering with the master failed")
        if self.disk is not None:
            self.disk.register_found()

    def _join_disk_tier(self, segment: LocalSegment) -> None:
        """Open the disk tier directory and mount it; a master that refuses disk tiers leaves
        this client without one (and says so)."""
        assert self._segment_info is not None and self._server is not None
        path = self.config.ssd_offload_path
        try:
            disk = DiskTierHost(
                self.master,
                self.client_id,
                segment.view,
                segment.segment_id,
                path,
                self.config.ssd_offload_quota or None,
                self.config.ssd_offload_fsync,
                self._segment_info.name,
                self._server.endpoint,
                self.host_id,
                owner=_files_owner(self.config),
            )
        except OSError as exc:
            # As upstream: the store works without its tier (and says so loudly).
            log.error("no disk tier: %s cannot be used (%s); evictions drop objects", path, exc)
            return
        code = disk.mount()
        if code != OK:
            disk.close()
            log.warning("the master refused the disk tier (code %d): evictions drop objects", code)
            return
        self.disk = disk

    def _lookup_segment(self, segment_uuid: bytes) -> tuple[memoryview | DiskSource, bytes] | None:
        # Called for every transfer request: compare bytes, build no UUID objects.
        if segment_uuid != self._segment_uuid or self._segment is None:
            disk = self.disk
            return None if disk is None else disk.lookup(segment_uuid)
        return self._segment.view, self._segment_key

    # -- writes ----------------------------------------------------------------------------

    def put_many(
        self,
        keys: Sequence[str],
        values: Sequence[Sequence[memoryview]],
        config: ReplicateConfig,
        upsert: bool = False,
    ) -> list[int]:
        """Store ``values[i]`` (its parts concatenated) under ``keys[i]``.

        Args:
            upsert: replace existing values instead of keeping them (first writer wins).

        Returns:
            Per key: 0 (for a put, also when the key already existed) or a negative code.
        """
        tags = config.kv_sessions
        if len(keys) != len(values) or (tags is not None and len(tags) != len(keys)):
            return [int(ErrorCode.INVALID_PARAMS)] * len(keys)
        if not keys:
            return []
        waits: list[int] = []
        results = self._put_round(keys, values, config, upsert, waits)
        # Keys the master found no room for while it was spilling objects to a disk tier (it
        # said how long to wait): the others are written and ended already; these are started
        # again after the wait, for up to ROOM_WAIT_S in all.
        pending = [i for i, wait in enumerate(waits) if wait]
        pending_waits = [waits[i] for i in pending]
        deadline = self._clock() + ROOM_WAIT_S if pending else 0.0
        while pending:
            pause = min(max(pending_waits) / 1000.0, deadline - self._clock())
            if pause <= 0:
                break
            time.sleep(pause)
            waits = []
            again = self._put_round(
                [keys[i] for i in pending],
                [values[i] for i in pending],
                config_for_keys(config, pending) if len(pending) < len(keys) else config,
                upsert,
                waits,
            )
            still: list[int] = []
            still_waits: list[int] = []
            for i, code, wait in zip(pending, again, waits, strict=True):
                results[i] = code
                if wait:
                    still.append(i)
                    still_waits.append(wait)
            pending, pending_waits = still, still_waits
        return results

    def _put_round(
        self,
        keys: Sequence[str],
        values: Sequence[Sequence[memoryview]],
        config: ReplicateConfig,
        upsert: bool,
        waits: list[int],
    ) -> list[int]:
        """One round of :meth:`put_many` (every key started once); ``waits`` gets, per key,
        the master's ``retry_after_ms`` for a key it found no room for (0 for the others)."""
        waits[:] = [0] * len(keys)
        sizes = [len(parts[0]) if len(parts) == 1 else sum(map(len, parts)) for parts in values]
        if 0 in sizes:
            return self._put_skipping_empty(keys, values, sizes, config, upsert)
        if not config.host_id:
            config = _with_host(config, self.host_id)
        try:
            starts = self._start(keys, sizes, config, upsert)
        except MooncakeError as exc:
            return [exc.code] * len(keys)
        codes = [s.code for s in starts]
        for i, start in enumerate(starts):
            if start.retry_after_ms and start.code == NO_ROOM:
                waits[i] = start.retry_after_ms
        # Upstream reports a put of an existing key as success; the old bytes stay.
        results = [OK if code == ALREADY_EXISTS else code for code in codes]
        if all(code == OK for code in codes):
            started: list[int] = list(range(len(codes)))
            items = [WriteItem(s.replicas, parts) for s, parts in zip(starts, values, strict=True)]
        else:
            started = [i for i, code in enumerate(codes) if code == OK]
            if not started:
                return results
            items = [WriteItem(starts[i].replicas, values[i]) for i in started]
        written = self.data.write(items)
        if all(code == OK for code in written):
            to_end, to_revoke = started, []
        else:
            to_end = [i for i, code in zip(started, written, strict=True) if code == OK]
            to_revoke = [i for i, code in zip(started, written, strict=True) if code != OK]
            for i, code in zip(started, written, strict=True):
                results[i] = code
        write_ids = [s.write_id for s in starts]
        try:
            self._finish(keys, write_ids, to_end, to_revoke, results)
        except MooncakeError as exc:
            for i in started:
                results[i] = exc.code
        return results

    def _start(
        self, keys: Sequence[str], sizes: list[int], config: ReplicateConfig, upsert: bool
    ) -> list[PutStartResult]:
        client, tenant = self.client_id, self.tenant
        if len(keys) == 1:
            start = self.master.upsert_start if upsert else self.master.put_start
            return [start(client, tenant, keys[0], sizes[0], config)]
        batch_start = self.master.batch_upsert_start if upsert else self.master.batch_put_start
        return batch_start(client, tenant, keys, sizes, config)

    def _put_skipping_empty(
        self,
        keys: Sequence[str],
        values: Sequence[Sequence[memoryview]],
        sizes: list[int],
        config: ReplicateConfig,
        upsert: bool,
    ) -> list[int]:
        """Empty values are INVALID_PARAMS; the other keys are written as usual."""
        results = [int(ErrorCode.INVALID_PARAMS)] * len(keys)
        kept = [i for i, size in enumerate(sizes) if size > 0]
        if kept:
            written = self.put_many(
                [keys[i] for i in kept],
                [values[i] for i in kept],
                config_for_keys(config, kept),
                upsert,
            )
            for i, code in zip(kept, written, strict=True):
                results[i] = code
        return results

    def _finish(
        self,
        keys: Sequence[str],
        write_ids: Sequence[int],
        to_end: list[int],
        to_revoke: list[int],
        results: list[int],
    ) -> None:
        """PutEnd the written keys and PutRevoke the others, each naming its start's write id;
        the end's codes go to ``results`` (INVALID_WRITE when the write was preempted)."""
        client, tenant = self.client_id, self.tenant
        if len(to_end) == 1:
            i = to_end[0]
            results[i] = self.master.put_end(client, tenant, keys[i], write_ids[i])
        elif to_end:
            # Every key written (the common case): the lists go as they are.
            every = len(to_end) == len(keys)
            end_keys = keys if every else [keys[i] for i in to_end]
            end_ids = write_ids if every else [write_ids[i] for i in to_end]
            codes = self.master.batch_put_end(client, tenant, end_keys, end_ids)
            for i, code in zip(to_end, codes, strict=True):
                results[i] = code
        if to_revoke:
            self.master.batch_put_revoke(
                client, tenant, [keys[i] for i in to_revoke], [write_ids[i] for i in to_revoke]
            )

    # -- reads -----------------------------------------------------------------------------

    def locate(self, keys: Sequence[str]) -> list[ReplicaListResult]:
        """Replica lists, each OK one starting a read lease held by this client; master
        failures become per-key codes. The caller must pass the result to
        :meth:`end_reads` (or :meth:`drop_reads`) once its copies are done."""
        try:
            if len(keys) == 1:
                return [self.master.get_replica_list(self.tenant, keys[0], self.client_id)]
            return self.master.batch_get_replica_list(self.tenant, keys, self.client_id)
        except MooncakeError as exc:
            return [ReplicaListResult(exc.code)] * len(keys)

    def read_located(
        self, located: Sequence[ReplicaListResult], buffers: Sequence[memoryview]
    ) -> list[int]:
        """Fill ``buffers[i]`` (exactly the object's size) from ``located[i]``.

        Args:
            located: successful replica lists.
            buffers: destinations, each exactly ``located[i].size`` bytes.

        Returns:
            Per item: 0 or TRANSFER_FAIL. Whether the bytes can be trusted is decided when
            the reads end (:meth:`end_reads`).
        """
        return self.data.read(
            [ReadItem(loc.replicas, buf) for loc, buf in zip(located, buffers, strict=True)]
        )

    def read_located_parts(
        self, located: Sequence[ReplicaListResult], parts: Sequence[Sequence[memoryview]]
    ) -> list[int]:
        """Scatter each object of ``located[i]`` over ``parts[i]``, in order.

        Args:
            located: successful replica lists.
            parts: destinations per object, their sizes adding up to exactly
                ``located[i].size`` bytes.

        Returns:
            Per item: 0 or TRANSFER_FAIL, as :meth:`read_located`.
        """
        return self.data.read(
            [ReadItem(loc.replicas, None, views) for loc, views in zip(located, parts, strict=True)]
        )

    def end_reads(self, located: Sequence[ReplicaListResult], started_at: float) -> list[int]:
        """End the read lease of every OK result of ``located`` (once each): the copies are
        done, successful or not.

        Args:
            located: what :meth:`locate` returned (entries that are not OK are skipped).
            started_at: this client's clock, read before the lookup; the TTL counts from it.

        Returns:
            The indices whose copies cannot be trusted: LEASE_EXPIRED answered by the master
            for a copy that outlived its TTL (its bytes may have changed), or no answer at all
            for one. Empty when every copy finished within its TTL: the leases are then ended
            one-way, without waiting.
        """
        elapsed_ms = (self._clock() - started_at) * 1000.0
        ids: list[int] = []
        owners: list[int] = []
        late: list[int] = []
        for i, loc in enumerate(located):
            if loc.code != OK:
                continue
            if loc.read_id:
                ids.append(loc.read_id)
                owners.append(i)
            if loc.lease_ttl_ms and elapsed_ms > loc.lease_ttl_ms:
                late.append(i)
        if not late:
            if ids:
                self.master.end_reads_one_way(self.client_id, ids)
            return []
        if not ids:
            return late  # a master without read ids: nothing can vouch for these copies
        try:
            answers = self.master.end_reads(self.client_id, ids)
        except MooncakeError as exc:
            log.debug("ending %d read(s) that outlived their lease failed: %s", len(ids), exc)
            return late  # nobody vouches for the copies that outlived their TTL
        expired = {i for i, code in zip(owners, answers, strict=True) if code != OK}
        expired.update(i for i in late if not located[i].read_id)
        return sorted(expired)

    def drop_reads(self, located: Sequence[ReplicaListResult]) -> None:
        """End the read lease of every OK result of ``located`` one-way, trusting nothing
        (a lookup that needed no copy, such as ``get_size``, or copies abandoned)."""
        ids = [loc.read_id for loc in located if loc.code == OK and loc.read_id]
        if ids:
            self.master.end_reads_one_way(self.client_id, ids)

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Unmount, stop serving, release the segment's memory (freed by the kernel once no
        peer maps it any more). Never raises."""
        heartbeat = getattr(self, "heartbeat", None)
        if heartbeat is not None:
            heartbeat.stop()
        tasks = getattr(self, "tasks", None)
        if tasks is not None:
            tasks.stop()
        if self.disk is not None:
            client_id = self.client_id
            self.disk.close(lambda segment_id: self.master.unmount_segment(client_id, segment_id))
        if self._segment_info is not None:
            with contextlib.suppress(MooncakeError):
                self.master.unmount_segment(self.client_id, self._segment_info.id)
        data = getattr(self, "data", None)
        if data is not None:
            data.close()
        if self._share is not None:
            self._share.close()
        if self._server is not None:
            self._server.close()
        if self._segment is not None:
            self._segment.close()
        self.master.close()


def _files_owner(config: ClientConfig) -> str:
    """Who a disk tier's files belong to, as its directory records it: the token's digest when
    a token decides the tenant (its name is the master's to say), else the tenant."""
    if config.auth_token:
        return "token:" + hashlib.sha256(config.auth_token.encode()).hexdigest()[:32]
    return f"tenant:{config.tenant_id}"


def config_for_keys(config: ReplicateConfig, indices: Sequence[int]) -> ReplicateConfig:
    """``config`` for the keys at ``indices`` of a batch: per-key lists sliced to match."""
    groups, tags = config.group_ids, config.kv_sessions
    return dataclasses.replace(
        config,
        group_ids=None if groups is None else [groups[i] for i in indices],
        kv_sessions=None if tags is None else [tags[i] for i in indices],
    )


def _with_host(config: ReplicateConfig, host: str) -> ReplicateConfig:
    """``config`` with ``host_id=host``, the caller's config left as it is.

    A shallow copy of the fields alone: :func:`dataclasses.replace` would check every field
    again through ``ReplicateConfig.__setattr__``, and :func:`copy.copy` costs as much as a
    put's encoding, although the fields were checked when the caller set them and ``host``
    is this process's own host id. The copy's lists are the caller's (never changed here).
    """
    copied: ReplicateConfig = object.__new__(type(config))
    fields = copied.__dict__
    fields.update(config.__dict__)
    fields["host_id"] = host
    return copied
