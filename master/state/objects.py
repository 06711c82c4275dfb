"""Object metadata records and the object table.

An object is the value stored under one (tenant, key). It owns one or more replicas, each a byte
range in some mounted segment. The table keeps two secondary indexes that the background steps
and segment removal need without scanning every object:

- ``processing``: objects with a write in flight, in put-start order (oldest first);
- ``by_segment``: for each segment, the objects that have a replica in it.

It also keeps each tenant's figures (objects, bytes held, bytes per segment) in
:attr:`ObjectTable.tallies` (:mod:`.tenant_tally`), updated by the same four mutations.

Thread-safety: none. The master service serializes every call under its lock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from mooncake_py.types import ReplicaStatus, SoftPinAction

from .tenant_tally import TenantTallies

if TYPE_CHECKING:
    from ..ha.journal import Journal

ObjectId = tuple[str, str]
"""(tenant, key): the identity of an object."""

MAX_KEY_BYTES = 4096

# Module-level names for the states the per-key paths compare by identity (enum members are
# singletons): a global lookup instead of a class attribute lookup each time.
_PROCESSING = ReplicaStatus.PROCESSING
_COMPLETE = ReplicaStatus.COMPLETE


def valid_key(key: object) -> bool:
    """A key is a non-empty string of at most ``MAX_KEY_BYTES`` UTF-8 bytes."""
    if not isinstance(key, str):
        return False
    # A UTF-8 character takes at most 4 bytes, so short keys need no encoding to be checked.
    if len(key) <= MAX_KEY_BYTES // 4:
        return len(key) > 0
    return len(key.encode("utf-8", "surrogatepass")) <= MAX_KEY_BYTES


@dataclasses.dataclass(slots=True)
class Replica:
    """One copy of an object's bytes: ``size`` bytes at ``offset`` inside ``segment_id``."""

    id: int
    segment_id: str
    offset: int
    size: int
    status: ReplicaStatus


@dataclasses.dataclass(slots=True)
class PendingSoftPin:
    """A soft-pin request admitted at put start, applied when the write completes."""

    action: SoftPinAction
    ttl_ms: int


class ObjectMetadata:
    """Everything the master knows about one object.

    Times are seconds on the service clock. ``fresh_until``: reads before it do not renew the
    object's recency again (it was read moments ago); read leases themselves are held by their
    readers (:mod:`.reads`). ``soft_pin_deadline`` is the committed TTL soft pin (0 means
    none); ``hard_pinned`` objects are never evicted. ``write_id`` names the write in flight
    (its PROCESSING replicas), 0 when none.

    Memory: one record per object, so it is a plain slotted class (no per-instance dict, no
    dataclass machinery); ``object_id`` is built once here and is the very tuple every index
    (object table, segment index, eviction policy) keys the object by, so the pair exists
    once per object. ``replicas`` is a tuple (48 bytes for one replica, against 88 for a
    grown list); every change replaces it through :class:`ObjectTable`. Absent optional
    parts are None, not empty containers. The record itself is 152 bytes; ``tenant`` and
    ``key`` are read from ``object_id``.
    """

    __slots__ = (
        "object_id",
        "size",
        "client_id",
        "put_start_time",
        "replicas",
        "data_type",
        "fresh_until",
        "write_id",
        "hard_pinned",
        "soft_pin_deadline",
        "pending_soft_pin",
        "group_id",
        "sessions",
        "readable",
        "session_weight",
    )

    def __init__(
        self,
        tenant: str,
        key: str,
        size: int,
        client_id: str,
        put_start_time: float,
        replicas: tuple[Replica, ...],
        data_type: int = 0,
        fresh_until: float = 0.0,
        write_id: int = 0,
        hard_pinned: bool = False,
        soft_pin_deadline: float = 0.0,
        pending_soft_pin: PendingSoftPin | None = None,
        group_id: str = "",
    ) -> None:
        # The tenant and key live in this pair only (see the properties below).
        self.object_id: ObjectId = (tenant, key)
        self.size = size
        self.client_id = client_id
        self.put_start_time = put_start_time
        self.replicas = replicas
        self.data_type = data_type
        self.fresh_until = fresh_until
        self.write_id = write_id
        self.hard_pinned = hard_pinned
        self.soft_pin_deadline = soft_pin_deadline
        self.pending_soft_pin = pending_soft_pin
        self.group_id = group_id
        # KV sessions holding this object (None rather than an empty set: most objects have
        # none).
        self.sessions: set[Any] | None = None
        # Whether a replica is COMPLETE, kept by ObjectTable on every replica change: the hot
        # lookup paths test it per key.
        self.readable = False
        # Bytes this object contributes to each of its sessions' accounting (size x replicas
        # when last reweighed); meaningful only while ``sessions`` is set.
        self.session_weight = 0

    @property
    def tenant(self) -> str:
        """The tenant the object belongs to (the first half of :attr:`object_id`)."""
        return self.object_id[0]

    @property
    def key(self) -> str:
        """The object's key in its tenant (the second half of :attr:`object_id`)."""
        return self.object_id[1]

    def __repr__(self) -> str:
        return (
            f"ObjectMetadata({self.tenant!r}, {self.key!r}, size={self.size}, "
            f"replicas={self.replicas!r}, write_id={self.write_id})"
        )

    def complete_replicas(self) -> list[Replica]:
        """Replicas that hold the whole value and may be read."""
        return [r for r in self.replicas if r.status == ReplicaStatus.COMPLETE]

    def processing_replicas(self) -> list[Replica]:
        """Replicas whose write has started and not yet ended."""
        return [r for r in self.replicas if r.status == ReplicaStatus.PROCESSING]

    def is_readable(self) -> bool:
        """True when at least one replica is COMPLETE. O(1)."""
        return self.readable

    def is_writing(self) -> bool:
        """True when a write to some replica is in flight. O(replicas), no allocation (a
        plain loop: it runs several times per write)."""
        for replica in self.replicas:  # noqa: SIM110 - any() would build a generator per call
            if replica.status is _PROCESSING:
                return True
        return False


class ObjectTable:
    """All objects, keyed by (tenant, key), plus the indexes described in the module docstring.

    Every mutation of an object's replica list goes through this class so the indexes stay
    exact; :meth:`check` verifies them against a recount.
    """

    def __init__(self, on_reweigh: Callable[[ObjectMetadata], None] | None = None) -> None:
        self._on_reweigh = on_reweigh
        self._objects: dict[ObjectId, ObjectMetadata] = {}
        # Insertion order is put-start order: re-puts delete and reinsert, so the oldest
        # in-flight write is always first.
        self._processing: dict[ObjectId, float] = {}
        self._by_segment: dict[str, dict[ObjectId, None]] = {}
        self._groups: dict[tuple[str, str], dict[ObjectId, None]] = {}
        # Read-only outside this class: every change below keeps it exact.
        self.tallies = TenantTallies()
        # Told of every object whose image changes, when the metadata is replicated.
        self.journal: Journal | None = None
        # The client's attempt id of each write in flight that named one (a repeat of that
        # call gets the same write); entries go when the write stops being in flight.
        self._attempts: dict[ObjectId, int] = {}

    def __len__(self) -> int:
        return len(self._objects)

    def get(self, object_id: ObjectId) -> ObjectMetadata | None:
        """Return the object or None. O(1)."""
        return self._objects.get(object_id)

    def items_of_tenant(self, tenant: str) -> list[ObjectMetadata]:
        """Snapshot of the objects in ``tenant``. O(total objects)."""
        return [m for (t, _), m in self._objects.items() if t == tenant]

    def __iter__(self) -> Iterator[ObjectMetadata]:
        return iter(self.snapshot())

    def snapshot(self) -> list[ObjectMetadata]:
        """Every object now, as a list of references the caller may walk while the table
        changes (one C-level copy: O(objects) with a tiny constant)."""
        return list(self._objects.values())

    def insert(self, meta: ObjectMetadata) -> None:
        """Add a new object. Raises KeyError when the id is already present."""
        oid = meta.object_id
        if oid in self._objects:
            raise KeyError(f"object {oid!r} already exists")
        self._objects[oid] = meta
        if meta.group_id:
            self._groups.setdefault((meta.tenant, meta.group_id), {})[oid] = None
        for replica in meta.replicas:
            self._by_segment.setdefault(replica.segment_id, {})[oid] = None
        self.tallies.on_inserted(meta)
        self._refresh_processing(meta)
        if self.journal is not None:
            self.journal.object(oid)

    def erase(self, object_id: ObjectId) -> ObjectMetadata | None:
        """Remove an object and its index entries; returns it (or None if absent)."""
        meta = self._objects.pop(object_id, None)
        if meta is None:
            return None
        self._processing.pop(object_id, None)
        self._attempts.pop(object_id, None)
        for replica in meta.replicas:
            self._unindex_segment(replica.segment_id, object_id)
        self.tallies.on_erased(meta)
        if self.journal is not None:
            self.journal.object(object_id)
        if meta.group_id:
            group = self._groups[(meta.tenant, meta.group_id)]
            group.pop(object_id, None)
            if not group:
                del self._groups[(meta.tenant, meta.group_id)]
        return meta

    def drop_replicas(self, meta: ObjectMetadata, doomed: Sequence[Replica]) -> None:
        """Remove ``doomed`` replicas from ``meta`` (the caller frees their memory); those no
        longer on it are ignored. O(replicas)."""
        doomed_ids = {r.id for r in doomed}
        before = meta.replicas
        kept = meta.replicas = tuple(r for r in before if r.id not in doomed_ids)
        # Counted from the object's own records: a doomed replica already gone is no change.
        dropped: Sequence[Replica]
        if not kept:
            dropped = before  # all of them: the usual case (removal, eviction, release)
        elif len(kept) == len(before):
            dropped = ()
        else:
            dropped = [r for r in before if r.id in doomed_ids]
        if dropped:
            self.tallies.on_replicas_dropped(meta, dropped)
        kept_segments = {r.segment_id for r in meta.replicas}
        for replica in doomed:
            if replica.segment_id not in kept_segments:
                self._unindex_segment(replica.segment_id, meta.object_id)
        self._refresh_processing(meta)
        if self._on_reweigh is not None:
            self._on_reweigh(meta)
        if self.journal is not None:
            self.journal.object(meta.object_id)

    def add_replicas(self, meta: ObjectMetadata, replicas: Sequence[Replica]) -> None:
        """Give ``meta`` more replicas (an upsert that reallocated)."""
        meta.replicas = (*meta.replicas, *replicas)
        for replica in replicas:
            self._by_segment.setdefault(replica.segment_id, {})[meta.object_id] = None
        self.tallies.on_replicas_added(meta, replicas)
        self._refresh_processing(meta)
        if self._on_reweigh is not None:
            self._on_reweigh(meta)
        if self.journal is not None:
            self.journal.object(meta.object_id)

    def mark_processing(self, meta: ObjectMetadata) -> None:
        """Flip every COMPLETE replica of ``meta`` back to PROCESSING (a rewrite in place;
        the caller made sure nobody is reading them)."""
        for replica in meta.replicas:
            if replica.status == ReplicaStatus.COMPLETE:
                replica.status = ReplicaStatus.PROCESSING
        self._refresh_processing(meta)
        if self.journal is not None:
            self.journal.object(meta.object_id)

    def mark_complete(self, meta: ObjectMetadata) -> None:
        """Flip every PROCESSING replica of ``meta`` to COMPLETE: it is readable and no longer
        being written (the processing index and ``readable`` follow at once). O(replicas)."""
        flipped = False
        for replica in meta.replicas:
            if replica.status is _PROCESSING:
                replica.status = _COMPLETE
                flipped = True
        # ``readable`` was exact before: a COMPLETE replica now is an old one or a flipped one.
        meta.readable = meta.readable or flipped
        self._processing.pop(meta.object_id, None)
        self._attempts.pop(meta.object_id, None)
        if self.journal is not None:
            self.journal.object(meta.object_id)

    def attempt_of(self, object_id: ObjectId) -> int:
        """The attempt id of the call that started the object's write in flight (0: none or
        not named). O(1)."""
        return self._attempts.get(object_id, 0)

    def set_attempt(self, meta: ObjectMetadata, attempt_id: int) -> None:
        """Remember the attempt id of the call that started ``meta``'s write in flight (the
        caller checked it is in flight). O(1)."""
        if attempt_id:
            self._attempts[meta.object_id] = attempt_id
            if self.journal is not None:
                self.journal.object(meta.object_id)

    def group_members(self, tenant: str, group_id: str) -> list[ObjectMetadata]:
        """Current members of a group. O(members)."""
        return [self._objects[o] for o in self._groups.get((tenant, group_id), ())]

    def objects_on_segment(self, segment_id: str) -> list[ObjectId]:
        """Ids of objects with a replica in ``segment_id``. O(result)."""
        return list(self._by_segment.get(segment_id, ()))

    def oldest_processing(self) -> Iterator[tuple[ObjectId, float]]:
        """In-flight writes, oldest put start first. Safe to mutate the table while iterating."""
        return iter(list(self._processing.items()))

    def _refresh_processing(self, meta: ObjectMetadata) -> None:
        """Re-derive what depends on replica states: the processing index and ``readable``.
        One pass over the replicas, no allocation: it runs at every put start and end."""
        readable = writing = False
        for replica in meta.replicas:
            status = replica.status
            if status is _COMPLETE:
                readable = True
            elif status is _PROCESSING:
                writing = True
        meta.readable = readable
        if writing:
            if meta.object_id not in self._processing:
                self._processing[meta.object_id] = meta.put_start_time
        else:
            self._processing.pop(meta.object_id, None)
            self._attempts.pop(meta.object_id, None)

    def _unindex_segment(self, segment_id: str, object_id: ObjectId) -> None:
        holders = self._by_segment.get(segment_id)
        if holders is None:
            return
        holders.pop(object_id, None)
        if not holders:
            del self._by_segment[segment_id]

    def check(self) -> None:
        """Verify the indexes against a recount. O(objects + replicas).

        Raises:
            AssertionError: an index disagrees with the objects, or an object is malformed.
        """
        expected_segments: dict[str, set[ObjectId]] = {}
        expected_processing: set[ObjectId] = set()
        expected_groups: dict[tuple[str, str], set[ObjectId]] = {}
        for oid, meta in self._objects.items():
            if meta.group_id:
                expected_groups.setdefault((meta.tenant, meta.group_id), set()).add(oid)
            if meta.object_id != oid:
                raise AssertionError(f"object stored under {oid!r} says {meta.object_id!r}")
            if not meta.replicas:
                raise AssertionError(f"object {oid!r} has no replica")
            segments = [r.segment_id for r in meta.replicas]
            if len(set(segments)) != len(segments):
                raise AssertionError(f"object {oid!r} has two replicas in one segment")
            for replica in meta.replicas:
                expected_segments.setdefault(replica.segment_id, set()).add(oid)
            if meta.is_writing():
                expected_processing.add(oid)
            if meta.readable != any(r.status is ReplicaStatus.COMPLETE for r in meta.replicas):
                raise AssertionError(f"object {oid!r} readable flag is stale")
        actual_segments = {s: set(v) for s, v in self._by_segment.items()}
        if actual_segments != expected_segments:
            raise AssertionError("segment index disagrees with replicas")
        if {g: set(m) for g, m in self._groups.items()} != expected_groups:
            raise AssertionError("group index disagrees with objects")
        if set(self._processing) != expected_processing:
            raise AssertionError("processing index disagrees with replica states")
        if not set(self._attempts) <= expected_processing:
            raise AssertionError("an attempt id outlived its write")
        self.tallies.check(self._objects.values())
