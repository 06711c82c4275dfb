"""Replica descriptors, as upstream's ``get_replica_desc`` / ``batch_get_replica_desc`` return.

Upstream's module registers ``ReplicaDescriptor`` (``status``, ``is_memory_replica()``,
``is_disk_replica()``, ``is_local_disk_replica()``, ``get_memory_descriptor()``,
``get_disk_descriptor()``), ``MemoryDescriptor`` (``buffer_descriptor``), ``DiskDescriptor``
(``file_path``, ``object_size``) and ``Descriptor`` (``size``, ``buffer_address``,
``transport_endpoint``). The classes here have those names and members. A replica in a segment
owner's disk tier (``enable_ssd_offload``) answers ``is_disk_replica()`` and
``is_local_disk_replica()`` True and ``is_memory_replica()`` False, and has a
:class:`DiskDescriptor` (``file_path`` names the owner and the file, ``owner:offset``);
``get_memory_descriptor()`` / ``get_disk_descriptor()`` raise RuntimeError for the other kind,
as upstream does.

Descriptors are snapshots built from a GetReplicaList answer whose read lease was ended at
once: they say where the bytes were, not that they are still there.

(:class:`mooncake_py.types.ReplicaDescriptor` is the wire form the master answers; the
:class:`ReplicaDescriptor` here is what the Python API hands out.)
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING

from mooncake_py.errors import MooncakeError
from mooncake_py.types import ReplicaDescriptor as WireReplica
from mooncake_py.types import ReplicaListResult, ReplicaStatus

if TYPE_CHECKING:
    from .core import ClientCore


class Descriptor:
    """Where one replica's bytes are (upstream's ``AllocatedBuffer::Descriptor``).

    Attributes:
        size: the replica's bytes.
        buffer_address: their address in the owning client's process (its segment's base
            plus the replica's offset); 0 when the segment was no longer mounted when the
            descriptor was built.
        transport_endpoint: the owner's ``host:port`` as it names itself (its segment name,
            ``local_hostname:port``), as upstream reports it; the address actually dialled
            may differ (``127.0.0.1`` for ``localhost``).
        segment_name: the owning client's segment name (its ``get_hostname()``); not in
            upstream's class.
        protocol: the transport the owner advertises (``tcp``); not in upstream's class.
    """

    __slots__ = ("buffer_address", "protocol", "segment_name", "size", "transport_endpoint")

    def __init__(
        self,
        size: int = 0,
        buffer_address: int = 0,
        transport_endpoint: str = "",
        segment_name: str = "",
        protocol: str = "tcp",
    ) -> None:
        self.size = size
        self.buffer_address = buffer_address
        self.transport_endpoint = transport_endpoint
        self.segment_name = segment_name
        self.protocol = protocol

    def __repr__(self) -> str:
        return (
            f"<Descriptor size={self.size} buffer_address={self.buffer_address} "
            f"transport_endpoint={self.transport_endpoint}>"
        )


class MemoryDescriptor:
    """A memory replica's location (upstream's ``MemoryDescriptor``).

    Attributes:
        buffer_descriptor: the :class:`Descriptor` of its bytes.
    """

    __slots__ = ("buffer_descriptor",)

    def __init__(self, buffer_descriptor: Descriptor) -> None:
        self.buffer_descriptor = buffer_descriptor

    def __repr__(self) -> str:
        return f"<MemoryDescriptor {self.buffer_descriptor!r}>"


class DiskDescriptor:
    """A disk replica's location (upstream's ``DiskDescriptor``): in the disk tier of the
    segment owner ``file_path`` names (``owner segment name:16 hex digits of its offset``).

    Attributes:
        file_path: the file holding the object.
        object_size: the object's bytes.
    """

    __slots__ = ("file_path", "object_size")

    def __init__(self, file_path: str = "", object_size: int = 0) -> None:
        self.file_path = file_path
        self.object_size = object_size

    def __repr__(self) -> str:
        return f"<DiskDescriptor file_path={self.file_path} object_size={self.object_size}>"


class ReplicaDescriptor:
    """One replica of an object (upstream's ``ReplicaDescriptor``): in memory, or in its
    segment owner's disk tier.

    Attributes:
        status: its :class:`~mooncake_py.ReplicaStatus` when the lookup answered
            (``COMPLETE`` for every replica a lookup returns).
    """

    __slots__ = ("_memory", "_disk", "status")

    def __init__(
        self,
        status: ReplicaStatus,
        memory: MemoryDescriptor | None,
        disk: DiskDescriptor | None = None,
    ) -> None:
        self.status = status
        self._memory = memory
        self._disk = disk

    def is_memory_replica(self) -> bool:
        """True for a replica in a memory segment."""
        return self._memory is not None

    def is_disk_replica(self) -> bool:
        """True for a replica in a segment owner's disk tier."""
        return self._disk is not None

    def is_local_disk_replica(self) -> bool:
        """True for a replica in a segment owner's disk tier (a client's local disk)."""
        return self._disk is not None

    def get_memory_descriptor(self) -> MemoryDescriptor:
        """Where the replica's bytes are in memory.

        Raises:
            RuntimeError: it is a disk replica, as upstream raises.
        """
        if self._memory is None:
            raise RuntimeError("not a memory replica: it is in a disk tier")
        return self._memory

    def get_disk_descriptor(self) -> DiskDescriptor:
        """Where the replica's bytes are on disk.

        Raises:
            RuntimeError: it is a memory replica, as upstream raises.
        """
        if self._disk is None:
            raise RuntimeError("not a disk replica: it is in memory")
        return self._disk

    def __repr__(self) -> str:
        where = f"memory {self._memory!r}" if self._memory is not None else f"disk {self._disk!r}"
        return f"<ReplicaDescriptor status={self.status.name} {where}>"


class SegmentDirectory:
    """Base addresses and protocols of the segments replicas name, to build descriptors.

    A segment's base never changes while it is mounted, so answers are cached; a replica in
    a segment not seen yet costs one ListSegments, which also replaces the cache (so it
    holds only segments mounted at the last listing).

    Thread-safety: safe to share between threads. Complexity: O(replicas) per call, plus one
    listing O(segments) when an unknown segment appears.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[str, tuple[int, str]] = {}

    def describe(self, core: ClientCore, located: ReplicaListResult) -> list[ReplicaDescriptor]:
        """Descriptors of the replicas of one successful lookup, in the master's order."""
        return [self._descriptor(core, replica) for replica in located.replicas]

    def _descriptor(self, core: ClientCore, replica: WireReplica) -> ReplicaDescriptor:
        try:
            status = ReplicaStatus(replica.status)
        except ValueError:
            status = ReplicaStatus.UNDEFINED
        if replica.disk:
            path = f"{replica.segment_name}:{replica.offset:016x}"
            return ReplicaDescriptor(status, None, DiskDescriptor(path, replica.size))
        base, protocol = self._segment(core, replica.segment_id)
        buffer = Descriptor(
            size=replica.size,
            buffer_address=base + replica.offset if base else 0,
            transport_endpoint=replica.segment_name or replica.te_endpoint,
            segment_name=replica.segment_name,
            protocol=protocol,
        )
        return ReplicaDescriptor(status, MemoryDescriptor(buffer))

    def _segment(self, core: ClientCore, segment_id: str) -> tuple[int, str]:
        with self._lock:
            known = self._known.get(segment_id)
        if known is not None:
            return known
        fresh = {s.id: (s.base, s.protocol) for s in core.segments()}
        # On failure the address stays 0: a descriptor is still useful without it.
        with contextlib.suppress(MooncakeError):
            fresh.update((s.id, (s.base, s.protocol)) for s, *_ in core.master.list_segments())
        # Segment ids are never reused, so one that is not mounted now never will be again.
        answer = fresh.setdefault(segment_id, (0, "tcp"))
        with self._lock:
            self._known = fresh
        return answer
