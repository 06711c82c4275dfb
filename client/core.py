"""The client core: joins the store, and runs puts and gets as master RPCs plus transfers.

Write protocol for a batch: one BatchPutStart (the master reserves replicas), the transfers
(straight from the caller's buffers into the replicas), then one BatchPutEnd for the keys whose
every replica was written and one BatchPutRevoke for the others, so a failed write never leaves
a half-visible object. An existing key counts as success (first writer wins).

Read protocol: one (Batch)GetReplicaList, which grants a read lease, then the transfers straight
into the caller's buffer. A read whose transfer outlived the lease reports LEASE_EXPIRED rather
than bytes that may have been overwritten.

Methods return codes (0 / negative ``ErrorCode``) or results per key; transport failures to the
master surface as RPC_FAIL / RPC_TIMEOUT codes. Thread-safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import time
import uuid
from collections.abc import Callable, Sequence

from mooncake_py.errors import ErrorCode, MooncakeError, error_for
from mooncake_py.types import PutStartResult, ReplicaListResult, ReplicateConfig, SegmentInfo

from .config import ClientConfig
from .data_plane import DataPlane, ReadItem, WriteItem
from .heartbeat import Heartbeat
from .master_rpc import MasterClient
from .segment import LocalSegment, host_id, remove_stale_segment_files
from .transfer import TransferServer

log = logging.getLogger(__name__)

OK = int(ErrorCode.OK)
ALREADY_EXISTS = int(ErrorCode.OBJECT_ALREADY_EXISTS)


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
        OSError: the shared-memory segment could not be created.
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
        self._server: TransferServer | None = None
        self._segment_info: SegmentInfo | None = None
        self.master = MasterClient(
            config.master_server_addr,
            config.rpc_timeout_s,
            config.master_transport == "auto",
            config.auth_token,
        )
        try:
            self._join()
        except BaseException:
            self.close()
            raise
        self.data = DataPlane(self.host_id, self._segment, config.force_tcp)
        self.heartbeat = Heartbeat(
            self.master, self.client_id, self.segments, housekeeping=self.data.prune_dead_peers
        )
        self.heartbeat.start()

    @property
    def hostname(self) -> str:
        """The name of this client's segment (``host:port``)."""
        if self._segment_info is not None:
            return self._segment_info.name
        return self.config.local_hostname

    def segments(self) -> list[SegmentInfo]:
        """The segments this client contributes (zero or one)."""
        return [self._segment_info] if self._segment_info is not None else []

    def _join(self) -> None:
        self.master.service_ready()  # fails fast when the master is unreachable
        self.master.connect_stream()
        remove_stale_segment_files()
        if self.config.global_segment_size > 0:
            self._segment = LocalSegment(self.config.global_segment_size)
            segment = self._segment
            self._server = TransferServer(
                _listen_host(self.config.local_hostname), self._lookup_segment
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
                shm_path=segment.path,
            )
            code = self.master.mount_segment(self.client_id, self._segment_info)
            if code != OK:
                raise error_for(code, "mounting the segment failed")
        code = self.master.remount_segments(self.client_id, self.segments())
        if code != OK:
            raise error_for(code, "registering with the master failed")

    def _lookup_segment(self, segment_uuid: bytes) -> memoryview | None:
        segment = self._segment
        if segment is None or uuid.UUID(bytes=segment_uuid) != uuid.UUID(segment.segment_id):
            return None
        return segment.view

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
        sizes = [sum(len(p) for p in parts) for parts in values]
        if 0 in sizes:
            return self._put_skipping_empty(keys, values, sizes, config, upsert)
        if not config.host_id:
            config = _with_host(config, self.host_id)
        try:
            starts = self._start(keys, sizes, config, upsert)
        except MooncakeError as exc:
            return [exc.code] * len(keys)
        results = [_success_if_exists(s.code) for s in starts]
        started = [i for i, s in enumerate(starts) if s.code == OK]
        if not started:
            return results
        written = self.data.write([WriteItem(starts[i].replicas, values[i]) for i in started])
        to_end = [i for i, code in zip(started, written, strict=True) if code == OK]
        to_revoke = [i for i, code in zip(started, written, strict=True) if code != OK]
        for i, code in zip(started, written, strict=True):
            results[i] = code
        try:
            self._finish(keys, to_end, to_revoke, results)
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
        self, keys: Sequence[str], to_end: list[int], to_revoke: list[int], results: list[int]
    ) -> None:
        if len(to_end) == 1:
            results[to_end[0]] = self.master.put_end(self.client_id, self.tenant, keys[to_end[0]])
        elif to_end:
            codes = self.master.batch_put_end(
                self.client_id, self.tenant, [keys[i] for i in to_end]
            )
            for i, code in zip(to_end, codes, strict=True):
                results[i] = code
        if to_revoke:
            self.master.batch_put_revoke(self.client_id, self.tenant, [keys[i] for i in to_revoke])

    # -- reads -----------------------------------------------------------------------------

    def locate(self, keys: Sequence[str]) -> list[ReplicaListResult]:
        """Replica lists (granting read leases); master failures become per-key codes."""
        try:
            if len(keys) == 1:
                return [self.master.get_replica_list(self.tenant, keys[0])]
            return self.master.batch_get_replica_list(self.tenant, keys)
        except MooncakeError as exc:
            return [ReplicaListResult(exc.code)] * len(keys)

    def read_located(
        self, located: Sequence[ReplicaListResult], buffers: Sequence[memoryview], started_at: float
    ) -> list[int]:
        """Fill ``buffers[i]`` (exactly the object's size) from ``located[i]``.

        Args:
            located: successful replica lists.
            buffers: destinations, each exactly ``located[i].size`` bytes.
            started_at: this client's clock, read before the lookup; the lease counts from it.

        Returns:
            Per item: the object's size, TRANSFER_FAIL, or LEASE_EXPIRED.
        """
        codes = self.data.read(
            [ReadItem(loc.replicas, buf) for loc, buf in zip(located, buffers, strict=True)]
        )
        elapsed_ms = (self._clock() - started_at) * 1000.0
        results: list[int] = []
        for loc, code in zip(located, codes, strict=True):
            if code != OK:
                results.append(code)
            elif loc.lease_ttl_ms and elapsed_ms > loc.lease_ttl_ms:
                results.append(int(ErrorCode.LEASE_EXPIRED))
            else:
                results.append(loc.size)
        return results

    def lease_outlived(self, located: Sequence[ReplicaListResult], started_at: float) -> bool:
        """True when the time since ``started_at`` exceeds the shortest lease granted."""
        leases = [loc.lease_ttl_ms for loc in located if loc.code == OK and loc.lease_ttl_ms]
        return bool(leases) and (self._clock() - started_at) * 1000.0 > min(leases)

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Unmount, stop serving, delete the segment file. Never raises."""
        heartbeat = getattr(self, "heartbeat", None)
        if heartbeat is not None:
            heartbeat.stop()
        if self._segment_info is not None:
            with contextlib.suppress(MooncakeError):
                self.master.unmount_segment(self.client_id, self._segment_info.id)
        data = getattr(self, "data", None)
        if data is not None:
            data.close()
        if self._server is not None:
            self._server.close()
        if self._segment is not None:
            self._segment.close()
        self.master.close()


def config_for_keys(config: ReplicateConfig, indices: Sequence[int]) -> ReplicateConfig:
    """``config`` for the keys at ``indices`` of a batch: per-key lists sliced to match."""
    groups, tags = config.group_ids, config.kv_sessions
    return dataclasses.replace(
        config,
        group_ids=None if groups is None else [groups[i] for i in indices],
        kv_sessions=None if tags is None else [tags[i] for i in indices],
    )


def _success_if_exists(code: int) -> int:
    """Upstream reports a put of an existing key as success; the old bytes stay."""
    return OK if code == ALREADY_EXISTS else code


def _with_host(config: ReplicateConfig, host: str) -> ReplicateConfig:
    return dataclasses.replace(config, host_id=host)
