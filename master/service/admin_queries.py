"""Read-only queries of the master's state for the HTTP admin endpoints.

:class:`AdminQueries` is built beside the facade from ``MasterService.context`` (the lock, the
state, the clock and the tenant rule) and answers what upstream's admin paths ask: the keys of
a tenant, where an object's replicas are, and the mounted segments.

**Probes hold nothing.** Upstream's ``/query_key`` goes through ``GetReplicaList`` and so
grants a read lease (and renews the object's recency). Here every query only *describes*: no
read lease, no existence hold, no recency change, no counter. An object described a moment ago
may therefore be removed, evicted or replaced the next moment; a reader that wants the bytes
must read them through a client, which leases them for the length of its copy.

**Bounded lock holds.** No query holds the service lock for a time that grows with the store:

- :meth:`AdminQueries.key_chunks` takes a snapshot of references to every object under one
  hold of the lock (one C-level copy of a list of references, the same snapshot bulk removal
  takes) and then filters and yields the keys with the lock free. An object's tenant and key
  never change, so reading them unlocked is safe. The listing is the table as it was at the
  snapshot; objects written later are not in it, objects removed since still are.
- :meth:`AdminQueries.describe_sliced` looks keys up in slices
  (:func:`~mooncake_py.master.service.slices.map_in_slices`), one hold of the lock each.
- Segment queries are O(segments) under one hold (a master has a few hundred segments at most).

Thread-safety: every method may be called from any thread; each takes the context's lock as
described and returns values that share nothing mutable with the state.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator, Sequence

from mooncake_py.errors import ErrorCode

from ..state.objects import ObjectMetadata, valid_key
from ..state.segments import MountedSegment
from .context import ServiceContext
from .slices import Steps, drive, map_in_slices
from .tenant_views import tenant_bytes_on

KEY_CHUNK = 4096
"""Keys per chunk yielded by :meth:`AdminQueries.key_chunks`: large enough that writing a
chunk costs far more than yielding it, small enough that a chunk's text stays a few hundred KiB."""


class SegmentStatus(enum.IntEnum):
    """Upstream's segment life cycle (``SegmentStatus``). Here a mounted segment is always
    ``OK``: segments are neither drained nor unmounted gracefully, only mounted and withdrawn."""

    UNDEFINED = 0
    OK = 1
    DRAINING = 2
    DRAINED = 3
    GRACEFULLY_UNMOUNTING = 4
    UNMOUNTING = 5


@dataclasses.dataclass(frozen=True, slots=True)
class BufferDescriptor:
    """Where one replica's bytes are, in upstream's ``AllocatedBuffer::Descriptor`` terms.

    Attributes:
        size: the object's size in bytes.
        buffer_address: the replica's address in its owner's process (segment base + offset).
        protocol: the owner's transfer protocol (``tcp``).
        transport_endpoint: ``host:port`` of the owner's transfer service.
    """

    size: int
    buffer_address: int
    protocol: str
    transport_endpoint: str


@dataclasses.dataclass(frozen=True, slots=True)
class Description:
    """One key described: ``code`` OK with its readable replicas, or why there are none
    (OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY while its first write is in flight,
    INVALID_PARAMS for a malformed key)."""

    code: ErrorCode
    replicas: tuple[BufferDescriptor, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentDetail:
    """One mounted segment and its allocator's use; ``disk`` for a disk tier (its size and
    capacity are its quota, its used bytes those its files hold)."""

    name: str
    segment_id: str
    client_id: str
    base: int
    size: int
    te_endpoint: str
    protocol: str
    status: SegmentStatus
    used_bytes: int
    capacity_bytes: int
    disk: bool = False

    @property
    def tier(self) -> str:
        """``"disk"`` or ``"memory"``."""
        return DISK_TIER if self.disk else MEMORY_TIER


MEMORY_TIER = "memory"
DISK_TIER = "disk"
TIERS = (MEMORY_TIER, DISK_TIER)
"""The tiers a segment may be in, as answers name them."""


class AdminQueries:
    """The state queries behind the HTTP admin endpoints (see the module docstring).

    Args:
        context: the shared lock, state, clock and tenant rule (``MasterService.context``).
    """

    def __init__(self, context: ServiceContext) -> None:
        self._lock = context.lock
        self._state = context.state
        self._clock = context.clock
        self.slices_run = 0  # lock holds taken by key listings, over this object's life (tests)

    # -- keys --------------------------------------------------------------------------------

    def key_chunks(self, tenant: str, chunk: int = KEY_CHUNK) -> Iterator[list[str]]:
        """The keys of ``tenant`` (an effective tenant, already resolved), in chunks.

        The snapshot is taken *now*, before this returns, under one hold of the lock; the
        chunks are then produced with the lock free, so a slow consumer (a slow HTTP reader)
        never holds the master up. Every object of the tenant present at the snapshot is
        listed, whether readable or still being written (as upstream's ``GetAllKeys``).

        Returns:
            An iterator of non-empty lists of at most ``chunk`` keys, in the table's order.

        Complexity: O(objects) references copied under the lock (a C-level copy); then
        O(objects) unlocked to filter.
        """
        with self._lock:
            self.slices_run += 1
            # iter() over the table copies its values once; the walk below reads the copy.
            snapshot: Iterator[ObjectMetadata] = iter(self._state.objects.snapshot())
        return _filter_keys(snapshot, tenant, chunk)

    # -- objects -----------------------------------------------------------------------------

    def describe(self, tenant: str, key: str) -> Description:
        """Describe one key of ``tenant`` (an effective tenant); see :meth:`describe_sliced`."""
        return drive(self.describe_sliced(tenant, [key]))[0]

    def describe_sliced(self, tenant: str, keys: Sequence[str]) -> Steps[list[Description]]:
        """Describe each key of ``tenant`` (an effective tenant), granting nothing.

        Returns:
            One :class:`Description` per key, in order: OK with the COMPLETE replicas (where a
            client would read them), OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY, or INVALID_PARAMS
            for a key that is not a valid key.

        Complexity: O(keys x replicas), in slices of the service lock.
        """
        state = self._state

        def step(_: int, key: str, now: float) -> Description:
            meta = state.objects.get((tenant, key))
            if meta is None:
                code = ErrorCode.OBJECT_NOT_FOUND if valid_key(key) else ErrorCode.INVALID_PARAMS
                return Description(code)
            readable = meta.complete_replicas()
            if not readable:
                return Description(ErrorCode.REPLICA_IS_NOT_READY)
            described = []
            for replica in readable:
                mounted = state.segments.get(replica.segment_id)
                if mounted is None:  # cannot happen: unmounting drops its replicas first
                    continue
                info = mounted.info
                described.append(
                    BufferDescriptor(
                        size=meta.size,
                        buffer_address=info.base + replica.offset,
                        protocol=info.protocol,
                        transport_endpoint=info.te_endpoint,
                    )
                )
            return Description(ErrorCode.OK, tuple(described))

        return (yield from map_in_slices(self._lock, keys, self._clock, step))

    # -- segments ----------------------------------------------------------------------------

    def segments(self, tenant: str | None = None) -> list[SegmentDetail]:
        """Every mounted segment (``tenant`` None), or those ``tenant`` may use, in mount
        order, memory segments and disk tiers alike; see
        :mod:`~mooncake_py.master.service.tenant_views`: a segment that is not the tenant's
        own (shared, unowned) shows no client id and only the tenant's bytes. A tenant may use
        a disk tier on the same terms as a memory segment (its own, shared or unowned).

        Complexity: O(segments) under one hold of the lock; a tenant's bytes on a segment are
        read from the state's tenant tallies in O(1).
        """
        with self._lock:
            segments = self._state.segments
            if tenant is None:
                return [
                    _detail(m, m.client_id, m.allocator.used_bytes) for m in segments.all_segments()
                ]
            details = []
            # MountedSegment.usable_by, not SegmentManager.usable_by: the latter lists only
            # placement candidates (memory), and a tenant is shown the disk tiers it may use.
            for m in segments.all_segments():
                if not m.usable_by(tenant):
                    continue
                if m.tenant == tenant and not m.info.shared:
                    details.append(_detail(m, m.client_id, m.allocator.used_bytes))
                    continue
                used, _ = tenant_bytes_on(self._state, m, tenant)
                details.append(_detail(m, m.client_id if m.tenant == tenant else "", used))
            return details

    def tenant_disk_bytes(self) -> dict[str, int]:
        """Bytes each tenant's objects hold in disk tiers (every disk replica, written or being
        written), for every tenant with objects; empty when no disk tier is mounted.

        Complexity: O(tenants x disk tiers) under one hold of the lock, each term O(1) (the
        object table's tenant tallies count bytes per segment).
        """
        with self._lock:
            disks = [m.info.id for m in self._state.segments.disk_segments()]
            if not disks:
                return {}
            tallies = self._state.objects.tallies
            return {
                tenant: sum(tallies.share_on(tenant, segment_id)[0] for segment_id in disks)
                for tenant, _ in tallies.items()
            }

    def segment_names(self, tenant: str | None = None) -> list[str]:
        """Each visible segment's name once (several segments may share one), in mount
        order (``tenant`` as for :meth:`segments`). O(segments)."""
        return list(dict.fromkeys(detail.name for detail in self.segments(tenant)))

    def segment_usage(self, name: str, tenant: str | None = None) -> tuple[int, int] | None:
        """(used bytes, capacity bytes) of the visible memory segments named ``name``, summed;
        None when none has that name (``tenant`` as for :meth:`segments`). A disk tier carries
        its owner's segment name but is not counted: upstream's segment query reports memory.
        O(segments)."""
        named = [d for d in self.segments(tenant) if d.name == name and not d.disk]
        if not named:
            return None
        return sum(d.used_bytes for d in named), sum(d.capacity_bytes for d in named)

    def segment_status(self, name: str, tenant: str | None = None) -> SegmentStatus | None:
        """The status of the visible segment named ``name``, None when there is none
        (``tenant`` as for :meth:`segments`). O(segments)."""
        statuses = [detail.status for detail in self.segments(tenant) if detail.name == name]
        return statuses[0] if statuses else None


def _detail(m: MountedSegment, client_id: str, used_bytes: int) -> SegmentDetail:
    return SegmentDetail(
        name=m.info.name,
        segment_id=m.info.id,
        client_id=client_id,
        base=m.info.base,
        size=m.info.size,
        te_endpoint=m.info.te_endpoint,
        protocol=m.info.protocol,
        status=SegmentStatus.OK,
        used_bytes=used_bytes,
        capacity_bytes=m.allocator.capacity,
        disk=m.is_disk,
    )


def _filter_keys(objects: Iterator[ObjectMetadata], tenant: str, chunk: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for meta in objects:
        if meta.tenant == tenant:
            batch.append(meta.key)
            if len(batch) >= chunk:
                yield batch
                batch = []
    if batch:
        yield batch
