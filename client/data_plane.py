"""Moves replica bytes between a caller's buffers and segments, choosing the path per replica.

Paths, best first:

1. the replica lives in this client's own segment: one memcpy;
2. it lives in another client's segment on this host (same ``host_id``) and its capability
   allows MAP: the owner hands its memory over a local socket once per segment
   (:mod:`.local_share`, cached by :mod:`.peer_mappings`), then one memcpy per transfer; a
   failed handover falls back to path 3 (and is not retried for a few seconds);
3. otherwise: the owner's TCP transfer service, pipelining every op for one peer on one
   connection.

``force_tcp`` (``MOONCAKE_PY_FORCE_TCP=1``) skips paths 1 and 2 so that tests and benchmarks
exercise the network path on one host.

Thread-safety: safe to call from several threads at once.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from mooncake_py.capability import grant_of
from mooncake_py.errors import ErrorCode, TransferError
from mooncake_py.tls import TlsConfig
from mooncake_py.types import ReplicaDescriptor

from .local_share import allows_map
from .peer_mappings import PeerMappings
from .segment import LocalSegment, MappedMemory
from .transfer import OP_READ, OP_WRITE, TransferClient, TransferOp

# Below this, a slice assignment is as fast as anything else.
MEMMOVE_MIN_BYTES = 64 * 1024
# From this size on, a copy is split across two threads: one thread alone does not reach the
# machine's memory bandwidth (measured here: 22 GB/s with one, 30 GB/s with two, for 16 MiB).
PARALLEL_COPY_MIN_BYTES = 4 * 1024 * 1024
_copy_helper: concurrent.futures.ThreadPoolExecutor | None = None
_copy_helper_lock = threading.Lock()


def _forget_helper() -> None:
    # A forked child inherits the executor but not its thread: start a fresh one on demand.
    global _copy_helper
    _copy_helper = None


os.register_at_fork(after_in_child=_forget_helper)


def _helper() -> concurrent.futures.ThreadPoolExecutor:
    global _copy_helper
    with _copy_helper_lock:
        if _copy_helper is None:
            _copy_helper = concurrent.futures.ThreadPoolExecutor(1, "mooncake-copy")
        return _copy_helper


def _address(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def copy_bytes(dst: memoryview, src: memoryview) -> None:
    """Copy ``src`` into the start of ``dst`` (byte views), as fast as this process can.

    Large copies between writable views use ``memmove`` (which releases the GIL), split in
    two halves on two threads from ``PARALLEL_COPY_MIN_BYTES`` on. Thread-safe.
    """
    size = len(src)
    if size < MEMMOVE_MIN_BYTES or src.readonly or dst.readonly:
        dst[:size] = src
        return
    target, source = _address(dst), _address(src)
    if size < PARALLEL_COPY_MIN_BYTES:
        ctypes.memmove(target, source, size)
        return
    half = (size // 2) & ~4095
    second = _helper().submit(ctypes.memmove, target + half, source + half, size - half)
    ctypes.memmove(target, source, half)
    second.result()


def view_of_address(address: int, size: int) -> memoryview:
    """A writable byte view of ``size`` bytes at raw ``address`` (caller guarantees validity)."""
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B")


@dataclass(slots=True)
class WriteItem:
    """Write ``parts`` (concatenated) to every replica in ``replicas``."""

    replicas: Sequence[ReplicaDescriptor]
    parts: Sequence[memoryview]


@dataclass(slots=True)
class ReadItem:
    """Read one replica out of ``replicas`` into ``buffer`` (exactly the object's size), or,
    when ``parts`` is given, scatter it over ``parts`` in order (their sizes add up to exactly
    the object's size; ``buffer`` is then ignored)."""

    replicas: Sequence[ReplicaDescriptor]
    buffer: memoryview | None
    parts: Sequence[memoryview] | None = None

    def destinations(self) -> Sequence[memoryview]:
        """Where the object's bytes go, in order."""
        if self.parts is not None:
            return self.parts
        return [] if self.buffer is None else [self.buffer]


class DataPlane:
    """Chooses a path per replica and performs batched transfers.

    Args:
        host_id: this machine's id (see :func:`mooncake_py.client.segment.host_id`).
        local_segment: the segment this client contributes, if any.
        force_tcp: always use the TCP path.
        tls: TLS settings for connections to peers' transfer services (None: plaintext).
    """

    def __init__(
        self,
        host_id: str,
        local_segment: LocalSegment | None,
        force_tcp: bool,
        tls: TlsConfig | None = None,
    ) -> None:
        self.host_id = host_id
        self.force_tcp = force_tcp
        self._local = local_segment
        self._peers = PeerMappings()
        self._tcp = TransferClient(tls=tls)
        # Objects read from a disk tier's replica (upstream's offload read count).
        self.disk_reads = 0
        self._disk_reads_lock = threading.Lock()

    def own_memory_of(self, replica: ReplicaDescriptor) -> memoryview | None:
        """A view of the replica's bytes when it lies in this client's own segment (whatever
        ``force_tcp`` says: the bytes are this process's memory), else None."""
        if self._local is not None and replica.segment_id == self._local.segment_id:
            return self._local.view[replica.offset : replica.offset + replica.size]
        return None

    def memory_of(self, replica: ReplicaDescriptor) -> memoryview | None:
        """A view of the replica's bytes when they are mapped in this process, else None."""
        if self.force_tcp:
            return None
        if self._local is not None and replica.segment_id == self._local.segment_id:
            return self._local.view[replica.offset : replica.offset + replica.size]
        mapped = self._peer_mapping(replica)
        if mapped is None:
            return None
        return mapped.view[replica.offset : replica.offset + replica.size]

    def mapped_address(self, replica: ReplicaDescriptor) -> tuple[int, MappedMemory] | None:
        """Address of the replica's bytes in this process and the mapping that keeps them valid,
        or None when the replica is not mapped here."""
        if self.force_tcp:
            return None
        if self._local is not None and replica.segment_id == self._local.segment_id:
            return self._local.address + replica.offset, self._local
        mapped = self._peer_mapping(replica)
        return None if mapped is None else (mapped.address + replica.offset, mapped)

    def _peer_mapping(self, replica: ReplicaDescriptor) -> MappedMemory | None:
        """The mapping of a same-host peer's segment holding ``replica`` (handed over by its
        owner the first time), or None: another host, no MAP in the capability, or no
        handover (the caller then uses TCP)."""
        if replica.host_id != self.host_id or not allows_map(replica.capability):
            return None
        return self._peers.get(
            replica.segment_id, replica.capability, replica.offset + replica.size
        )

    def write(self, items: Sequence[WriteItem]) -> list[int]:
        """Write every item to all of its replicas.

        Returns:
            Per item: 0, or TRANSFER_FAIL when any replica could not be written.
        """
        results = [0] * len(items)
        remote: dict[str, list[tuple[int, TransferOp]]] = {}
        # Looked up once: batches of small values spend more here than in their copies.
        local = None if self.force_tcp else self._local
        local_id = local.segment_id if local is not None else ""
        local_view = local.view if local is not None else None
        for index, item in enumerate(items):
            for replica in item.replicas:
                if local_view is not None and replica.segment_id == local_id:
                    parts = item.parts
                    start = replica.offset
                    if len(parts) == 1:
                        copy_bytes(local_view[start : start + replica.size], parts[0])
                    else:
                        _copy_parts_into(local_view[start : start + replica.size], parts)
                    continue
                memory = self.memory_of(replica)
                if memory is not None:
                    _copy_parts_into(memory, item.parts)
                    continue
                offset = replica.offset
                grant = grant_of(replica.capability)
                for part in item.parts:
                    op = TransferOp(OP_WRITE, replica.segment_id, offset, part, grant)
                    remote.setdefault(replica.te_endpoint, []).append((index, op))
                    offset += len(part)
        for endpoint, indexed_ops in remote.items():
            for index, code in self._run_remote(endpoint, indexed_ops):
                if code != 0:
                    results[index] = int(ErrorCode.TRANSFER_FAIL)
        return results

    def read(self, items: Sequence[ReadItem]) -> list[int]:
        """Fill each item's destinations from one of its replicas, trying the next one on
        failure.

        A replica mapped here is copied with one memcpy per destination part; a remote one is
        read with one ranged TCP request per part, every request for one peer pipelined on
        one connection.

        Returns:
            Per item: 0, or TRANSFER_FAIL when no replica could be read.
        """
        results = [int(ErrorCode.TRANSFER_FAIL)] * len(items)
        pending = self._read_own_segment(items, results)
        attempt = 0
        while pending:
            remote: dict[str, list[tuple[int, TransferOp]]] = {}
            from_disk: set[int] = set()
            for index in pending:
                replicas = _ordered_for_read(items[index].replicas, self)
                if attempt >= len(replicas):
                    continue
                replica = replicas[attempt]
                if replica.disk:
                    from_disk.add(index)
                memory = self.memory_of(replica)
                parts = items[index].destinations()
                if memory is not None:
                    _copy_into_parts(parts, memory)
                    results[index] = 0
                    continue
                ops = remote.setdefault(replica.te_endpoint, [])
                offset = replica.offset
                grant = grant_of(replica.capability)
                for part in parts:
                    ops.append(
                        (index, TransferOp(OP_READ, replica.segment_id, offset, part, grant))
                    )
                    offset += len(part)
            still_pending: list[int] = []
            for endpoint, indexed_ops in remote.items():
                failed: set[int] = set()
                indices: dict[int, None] = {}
                for index, code in self._run_remote(endpoint, indexed_ops):
                    indices[index] = None
                    if code != 0:
                        failed.add(index)
                for index in indices:
                    if index in failed:
                        still_pending.append(index)
                    else:
                        results[index] = 0
                        if index in from_disk:
                            self._count_disk_read()
            pending = still_pending
            attempt += 1
        return results

    def _count_disk_read(self) -> None:
        with self._disk_reads_lock:
            self.disk_reads += 1

    def _read_own_segment(self, items: Sequence[ReadItem], results: list[int]) -> list[int]:
        """Copy out of this client's own segment every item with a replica there (the cheapest
        path: no mapping to look up, no peer), setting its result to 0.

        Returns:
            The indices of the other items, in order.
        """
        local = None if self.force_tcp else self._local
        if local is None:
            return list(range(len(items)))
        local_id, local_view = local.segment_id, local.view
        others: list[int] = []
        for index, item in enumerate(items):
            own = next((r for r in item.replicas if r.segment_id == local_id), None)
            if own is None:
                others.append(index)
                continue
            memory = local_view[own.offset : own.offset + own.size]
            if item.parts is None:
                if item.buffer is not None:
                    copy_bytes(item.buffer, memory[: len(item.buffer)])
            else:
                _copy_into_parts(item.parts, memory)
            results[index] = 0
        return others

    def _run_remote(
        self, endpoint: str, indexed_ops: list[tuple[int, TransferOp]]
    ) -> list[tuple[int, int]]:
        try:
            codes = self._tcp.run(endpoint, [op for _, op in indexed_ops])
        except TransferError:
            codes = [int(ErrorCode.TRANSFER_FAIL)] * len(indexed_ops)
        return [(index, code) for (index, _), code in zip(indexed_ops, codes, strict=True)]

    def prune_dead_peers(self) -> list[str]:
        """Unmap segments whose owner process died or stopped serving them (their bytes are
        no longer authoritative, and the mapping would keep their memory alive).

        Returns:
            The segment ids unmapped.
        """
        return self._peers.prune()

    def close(self) -> None:
        """Drop peer mappings and pooled connections."""
        self._tcp.close()
        self._peers.close()


def _copy_parts_into(memory: memoryview, parts: Sequence[memoryview]) -> None:
    offset = 0
    for part in parts:
        copy_bytes(memory[offset : offset + len(part)], part)
        offset += len(part)


def _copy_into_parts(parts: Sequence[memoryview], memory: memoryview) -> None:
    """Scatter the start of ``memory`` over ``parts``, in order."""
    offset = 0
    for part in parts:
        copy_bytes(part, memory[offset : offset + len(part)])
        offset += len(part)


def _ordered_for_read(
    replicas: Sequence[ReplicaDescriptor], plane: DataPlane
) -> list[ReplicaDescriptor]:
    """Memory replicas before disk ones, and among those, replicas on this host first
    (cheapest path), then the rest in the master's order."""
    if len(replicas) < 2:
        return list(replicas)
    if plane.force_tcp:
        return sorted(replicas, key=lambda r: r.disk)
    return sorted(replicas, key=lambda r: (r.disk, r.host_id != plane.host_id))
