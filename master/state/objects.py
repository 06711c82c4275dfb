"""The object table (the records themselves are in :mod:`.records`, re-exported here).

An object is the value stored under one (tenant, key). It owns one or more replicas, each a byte
range in some mounted segment. The table keeps two secondary indexes that the background steps
and segment removal need without scanning every object:

- ``processing``: objects with a write in flight, in put-start order (oldest first);
- ``by_segment``: for each segment, the objects that have a replica in it. It lives in the
  segments' allocators: the allocation of each replica is *tagged* with its object's record
  (:meth:`.allocator.OffsetAllocator.tag`), which takes the place of the allocation's size
  in the allocator's map, so the index costs no memory of its own. The table reaches the
  allocators through ``allocator_of``; a segment that is not mounted has no index.

The table files each record under its key alone: ``_objects`` maps a key to its record, or,
for a key that several tenants use, to a dict of their records by tenant. No (tenant, key)
tuple is kept per object (the records build :attr:`~.records.ObjectMetadata.object_id` on
demand), and a lookup stays one dict probe plus a tenant comparison. The processing index is
keyed by the records themselves, for the same reason.

It also keeps each tenant's figures (objects, bytes held, bytes per segment) in
:attr:`ObjectTable.tallies` (:mod:`.tenant_tally`), updated by the same four mutations.

Thread-safety: none. The master service serializes every call under its lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

from mooncake_py.types import ReplicaStatus

from .records import (
    _COMPLETE,
    _PROCESSING,
    ObjectId,
    ObjectMetadata,
    PendingSoftPin,
    RareFields,
    Replica,
)
from .tenant_tally import TenantTallies

if TYPE_CHECKING:
    from ..ha.journal import Journal

__all__ = [
    "MAX_KEY_BYTES",
    "ObjectId",
    "ObjectMetadata",
    "ObjectTable",
    "PendingSoftPin",
    "RareFields",
    "Replica",
    "valid_key",
]

MAX_KEY_BYTES = 4096


def valid_key(key: object) -> bool:
    """A key is a non-empty string of at most ``MAX_KEY_BYTES`` UTF-8 bytes."""
    if not isinstance(key, str):
        return False
    # A UTF-8 character takes at most 4 bytes, so short keys need no encoding to be checked.
    if len(key) <= MAX_KEY_BYTES // 4:
        return len(key) > 0
    return len(key.encode("utf-8", "surrogatepass")) <= MAX_KEY_BYTES


class ObjectTable:
    """All objects, found by (tenant, key), plus the indexes described in the module docstring.

    Iteration order (:meth:`snapshot`): first-insertion order of the keys; the objects of a
    key several tenants hold come together at that key's place.

    Every mutation of an object's replica list goes through this class so the indexes stay
    exact; :meth:`check` verifies them against a recount.
    """

    def __init__(
        self,
        on_reweigh: Callable[[ObjectMetadata], None] | None = None,
        allocator_of: Callable[[str], Any] | None = None,
    ) -> None:
        """Args:
        on_reweigh: told of every object whose replicas changed (session accounting).
        allocator_of: the allocator of a mounted segment id (None when not mounted), where
            the segment index lives. Without it the table keeps no segment index, and
            :meth:`objects_on_segment` scans every object.
        """
        self._on_reweigh = on_reweigh
        self._allocator_of = allocator_of
        # Key -> its record, or {tenant: record} (two or more) for a key several tenants hold.
        self._objects: dict[str, ObjectMetadata | dict[str, ObjectMetadata]] = {}
        self._count = 0
        # How many keys of ``_objects`` hold a dict of tenants (0: every value is a record).
        self._shared_keys = 0
        # Record -> put start time. Insertion order is put-start order: re-puts delete and
        # reinsert, so the oldest in-flight write is always first.
        self._processing: dict[ObjectMetadata, float] = {}
        self._groups: dict[tuple[str, str], dict[ObjectId, None]] = {}
        # Read-only outside this class: every change below keeps it exact.
        self.tallies = TenantTallies()
        # Told of every object whose image changes, when the metadata is replicated.
        self.journal: Journal | None = None
        # The client's attempt id of each write in flight that named one (a repeat of that
        # call gets the same write); entries go when the write stops being in flight.
        self._attempts: dict[ObjectId, int] = {}

    def __len__(self) -> int:
        return self._count

    def get(self, object_id: ObjectId) -> ObjectMetadata | None:
        """Return the object or None. O(1): one dict probe and a tenant comparison."""
        held = self._objects.get(object_id[1])
        if held is None:
            return None
        if held.__class__ is ObjectMetadata:
            return held if held.tenant == object_id[0] else None  # type: ignore[union-attr]
        return held.get(object_id[0])  # type: ignore[union-attr]

    def items_of_tenant(self, tenant: str) -> list[ObjectMetadata]:
        """Snapshot of the objects in ``tenant``. O(total objects)."""
        return [m for m in self.snapshot() if m.tenant == tenant]

    def __iter__(self) -> Iterator[ObjectMetadata]:
        return iter(self.snapshot())

    def snapshot(self) -> list[ObjectMetadata]:
        """Every object now, as a list of references the caller may walk while the table
        changes (one C-level copy while no key is shared by tenants: O(objects) with a tiny
        constant)."""
        if not self._shared_keys:
            return list(self._objects.values())  # type: ignore[arg-type]
        every: list[ObjectMetadata] = []
        for held in self._objects.values():
            if held.__class__ is ObjectMetadata:
                every.append(held)  # type: ignore[arg-type]
            else:
                every.extend(held.values())  # type: ignore[union-attr]
        return every

    def insert(self, meta: ObjectMetadata) -> None:
        """Add a new object. Raises KeyError when the id is already present."""
        key = meta.key
        objects = self._objects
        filed = objects.get(key)
        if filed is None:
            objects[key] = meta
        elif filed.__class__ is ObjectMetadata:
            if filed.tenant == meta.tenant:  # type: ignore[union-attr]
                raise KeyError(f"object {meta.object_id!r} already exists")
            objects[key] = {filed.tenant: filed, meta.tenant: meta}  # type: ignore[union-attr,dict-item]
            self._shared_keys += 1
        else:
            if meta.tenant in filed:  # type: ignore[operator]
                raise KeyError(f"object {meta.object_id!r} already exists")
            filed[meta.tenant] = meta  # type: ignore[index]
        self._count += 1
        if meta.group_id:
            self._groups.setdefault((meta.tenant, meta.group_id), {})[meta.object_id] = None
        allocator_of = self._allocator_of
        if allocator_of is not None:
            held = meta._replicas  # noqa: SLF001 - the table owns the record's replicas
            if held.__class__ is Replica:
                allocator = allocator_of(held.segment_id)  # type: ignore[union-attr]
                if allocator is not None:
                    allocator.tag(held.offset, meta)  # type: ignore[union-attr]
            else:
                for replica in held:  # type: ignore[union-attr]
                    self._index_segment(meta, replica)
        self.tallies.on_inserted(meta)
        self._refresh_processing(meta)
        if self.journal is not None:
            self.journal.object(meta.object_id)

    def holds_key(self, key: str) -> bool:
        """Whether any tenant has an object under ``key``. O(1)."""
        return key in self._objects

    def insert_run(
        self,
        tenant: str,
        keys: Sequence[str],
        metas: Sequence[ObjectMetadata],
        segment_id: str,
        allocator: Any,
        offsets: Sequence[int],
        started: float,
        attempt_id: int = 0,
    ) -> None:
        """:meth:`insert` of new objects of one write call, a run of one allocator: what
        inserting each would do, with the indexes updated by C-level bulk operations.

        The caller vouches for what :meth:`insert` would otherwise find out or branch on:
        ``metas[i]`` is ``tenant``'s object under ``keys[i]``, no tenant has an object under
        any of ``keys`` (see :meth:`holds_key`) and they are distinct; each record has no
        group, was started at ``started`` and has one PROCESSING replica, of its ``size``, at
        ``offsets[i]`` on ``segment_id``, whose allocator (``allocator``) has just made the
        run (:meth:`~.allocator.OffsetAllocator.allocate_run`). A non-zero ``attempt_id`` is
        recorded for each (:meth:`set_attempt`).

        Complexity: O(len(metas)), a few C-level passes.
        """
        self._objects.update(zip(keys, metas, strict=True))
        self._count += len(metas)
        if self._allocator_of is not None:
            allocator.tag_run(offsets, metas)
        self.tallies.on_inserted_run(
            tenant, segment_id, len(metas), sum(meta.size for meta in metas)
        )
        self._processing.update(dict.fromkeys(metas, started))
        if attempt_id:
            self._attempts.update(dict.fromkeys(zip(repeat(tenant), keys), attempt_id))
        if self.journal is not None:
            for meta in metas:
                self.journal.object(meta.object_id)

    def erase_run(self, metas: Sequence[ObjectMetadata]) -> None:
        """:meth:`drop_replicas` of every replica, then :meth:`erase`, of each of ``metas``,
        with the figures updated once per (tenant, segment): what the caller does for
        removals it has found to be plain. The caller vouches for each record: it is in the
        table, once in ``metas``, with one COMPLETE replica and no group, and its memory is
        given back right after (the allocation is left tagged with the record, as free()
        reads the size from it). O(len(metas))."""
        objects = self._objects
        attempts = self._attempts
        runs: dict[tuple[str, str], list[int]] = {}
        direct = 0
        for meta in metas:
            key = meta.key
            if objects.get(key) is meta:
                del objects[key]
                direct += 1
            else:  # a key several tenants hold (_pop counts it)
                self._pop((meta.tenant, key))
            if attempts:
                attempts.pop((meta.tenant, key), None)
            replica: Replica = meta._replicas  # type: ignore[assignment]  # noqa: SLF001
            figures = runs.get((meta.tenant, replica.segment_id))
            if figures is None:
                runs[(meta.tenant, replica.segment_id)] = [1, replica.size]
            else:
                figures[0] += 1
                figures[1] += replica.size
            meta._replicas = ()  # noqa: SLF001 - as drop_replicas leaves it
            meta.readable = False
        self._count -= direct
        on_erased_run = self.tallies.on_erased_run
        for (tenant, segment_id), (count, size) in runs.items():
            on_erased_run(tenant, segment_id, count, size)
        if self.journal is not None:
            for meta in metas:
                self.journal.object(meta.object_id)

    def erase(self, object_id: ObjectId) -> ObjectMetadata | None:
        """Remove an object and its index entries; returns it (or None if absent)."""
        meta = self._pop(object_id)
        if meta is None:
            return None
        self._processing.pop(meta, None)
        self._attempts.pop(object_id, None)
        if self._allocator_of is not None:
            for replica in meta.replicas:
                self._unindex_segment(meta, replica)
        self.tallies.on_erased(meta)
        if self.journal is not None:
            self.journal.object(object_id)
        if meta.group_id:
            group = self._groups[(meta.tenant, meta.group_id)]
            group.pop(object_id, None)
            if not group:
                del self._groups[(meta.tenant, meta.group_id)]
        return meta

    def _pop(self, object_id: ObjectId) -> ObjectMetadata | None:
        """Take the record of ``object_id`` out of ``_objects`` (None: absent). O(1)."""
        tenant, key = object_id
        objects = self._objects
        held = objects.get(key)
        if held is None:
            return None
        if held.__class__ is ObjectMetadata:
            if held.tenant != tenant:  # type: ignore[union-attr]
                return None
            del objects[key]
            meta: ObjectMetadata | None = held  # type: ignore[assignment]
        else:
            meta = held.pop(tenant, None)  # type: ignore[union-attr,arg-type]
            if meta is None:
                return None
            if len(held) == 1:  # type: ignore[arg-type]
                # Back to a record of its own (the key keeps its place in the order).
                objects[key] = next(iter(held.values()))  # type: ignore[union-attr]
                self._shared_keys -= 1
        self._count -= 1
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
        if self._allocator_of is not None:
            for replica in dropped:
                self._unindex_segment(meta, replica)
        self._refresh_processing(meta)
        if self._on_reweigh is not None:
            self._on_reweigh(meta)
        if self.journal is not None:
            self.journal.object(meta.object_id)

    def add_replicas(self, meta: ObjectMetadata, replicas: Sequence[Replica]) -> None:
        """Give ``meta`` more replicas (an upsert that reallocated)."""
        meta.replicas = (*meta.replicas, *replicas)
        if self._allocator_of is not None:
            for replica in replicas:
                self._index_segment(meta, replica)
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
        held = meta._replicas  # noqa: SLF001
        if held.__class__ is Replica:
            if held.status is _PROCESSING:  # type: ignore[union-attr]
                held.status = _COMPLETE  # type: ignore[union-attr]
                flipped = True
        else:
            for replica in held:  # type: ignore[union-attr]
                if replica.status is _PROCESSING:
                    replica.status = _COMPLETE
                    flipped = True
        # ``readable`` was exact before: a COMPLETE replica now is an old one or a flipped one.
        meta.readable = meta.readable or flipped
        self._processing.pop(meta, None)
        if self._attempts:
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
        found = [self.get(o) for o in self._groups.get((tenant, group_id), ())]
        return [m for m in found if m is not None]  # all of them: the index is exact

    def objects_on_segment(self, segment_id: str) -> list[ObjectId]:
        """Ids of objects with a replica in ``segment_id``. O(result)."""
        if self._allocator_of is None:
            return [
                m.object_id
                for m in self.snapshot()
                if any(r.segment_id == segment_id for r in m.replicas)
            ]
        allocator = self._allocator_of(segment_id)
        if allocator is None:
            return []
        return [owner.object_id for owner in allocator.owners()]

    def oldest_processing(self) -> Iterator[tuple[ObjectId, float]]:
        """In-flight writes, oldest put start first. Safe to mutate the table while iterating."""
        return iter([(meta.object_id, started) for meta, started in self._processing.items()])

    def _refresh_processing(self, meta: ObjectMetadata) -> None:
        """Re-derive what depends on replica states: the processing index and ``readable``.
        One pass over the replicas, no allocation: it runs at every put start and end."""
        readable = writing = False
        held = meta._replicas  # noqa: SLF001
        if held.__class__ is Replica:
            status = held.status  # type: ignore[union-attr]
            readable = status is _COMPLETE
            writing = status is _PROCESSING
        else:
            for replica in held:  # type: ignore[union-attr]
                status = replica.status
                if status is _COMPLETE:
                    readable = True
                elif status is _PROCESSING:
                    writing = True
        meta.readable = readable
        if writing:
            if meta not in self._processing:
                self._processing[meta] = meta.put_start_time
        else:
            self._processing.pop(meta, None)
            if self._attempts:
                self._attempts.pop(meta.object_id, None)

    def _index_segment(self, meta: ObjectMetadata, replica: Replica) -> None:
        # A replica whose allocation is missing is left out: check() reports it.
        allocator = self._allocator_of(replica.segment_id)  # type: ignore[misc]
        if allocator is not None:
            allocator.tag(replica.offset, meta)

    def _unindex_segment(self, meta: ObjectMetadata, replica: Replica) -> None:
        # Before the record's size changes: the allocation reads its size from the record.
        allocator = self._allocator_of(replica.segment_id)  # type: ignore[misc]
        if allocator is not None:
            allocator.untag(replica.offset, meta)

    def check(self, allocators: Mapping[str, Any] | None = None) -> None:
        """Verify the indexes against a recount. O(objects + replicas + allocations).

        Args:
            allocators: every mounted segment's allocator by segment id; their tags (the
                segment index) must name exactly the replicas on them. None: only the
                replicas' own segments are looked at (a stale tag elsewhere goes unseen).

        Raises:
            AssertionError: an index disagrees with the objects, or an object is malformed.
        """
        expected_segments: dict[str, set[tuple[ObjectId, int]]] = {}
        expected_processing: set[ObjectMetadata] = set()
        expected_groups: dict[tuple[str, str], set[ObjectId]] = {}
        for oid, meta in self._filed():
            if meta.group_id:
                expected_groups.setdefault((meta.tenant, meta.group_id), set()).add(oid)
            if meta.object_id != oid:
                raise AssertionError(f"object stored under {oid!r} says {meta.object_id!r}")
            rare = meta._rare  # noqa: SLF001
            if rare is not None and rare.is_default():
                raise AssertionError(f"object {oid!r} keeps a side record of defaults")
            if not meta.replicas:
                raise AssertionError(f"object {oid!r} has no replica")
            held = meta._replicas  # noqa: SLF001
            if held.__class__ is not Replica and len(held) == 1:  # type: ignore[arg-type]
                raise AssertionError(f"object {oid!r} holds its one replica in a tuple")
            segments = [r.segment_id for r in meta.replicas]
            if len(set(segments)) != len(segments):
                raise AssertionError(f"object {oid!r} has two replicas in one segment")
            for replica in meta.replicas:
                expected_segments.setdefault(replica.segment_id, set()).add((oid, replica.offset))
            if meta.is_writing():
                expected_processing.add(meta)
            if meta.readable != any(r.status is ReplicaStatus.COMPLETE for r in meta.replicas):
                raise AssertionError(f"object {oid!r} readable flag is stale")
        if self._allocator_of is not None:
            self._check_segment_index(expected_segments, allocators)
        if {g: set(m) for g, m in self._groups.items()} != expected_groups:
            raise AssertionError("group index disagrees with objects")
        if set(self._processing) != expected_processing:
            raise AssertionError("processing index disagrees with replica states")
        for meta, started in self._processing.items():
            # The sweep of stuck writes judges each write by the time kept here.
            if started != meta.put_start_time:
                raise AssertionError(f"processing index keeps a stale start for {meta.key!r}")
        if not set(self._attempts) <= {m.object_id for m in expected_processing}:
            raise AssertionError("an attempt id outlived its write")
        self.tallies.check(self.snapshot())

    def _filed(self) -> list[tuple[ObjectId, ObjectMetadata]]:
        """Every record with the (tenant, key) it is filed under, after checking the shape of
        ``_objects``: a dict of tenants holds two or more records, ``_shared_keys`` counts
        those dicts, and ``_count`` every record. O(objects).

        Raises:
            AssertionError: the shape or a count is wrong.
        """
        filed: list[tuple[ObjectId, ObjectMetadata]] = []
        shared = 0
        for key, held in self._objects.items():
            if held.__class__ is ObjectMetadata:
                filed.append(((held.tenant, key), held))  # type: ignore[union-attr,arg-type]
                continue
            if not isinstance(held, dict) or len(held) < 2:
                raise AssertionError(f"key {key!r} holds {held!r}: neither a record nor tenants")
            shared += 1
            filed.extend(((tenant, key), meta) for tenant, meta in held.items())
        if shared != self._shared_keys:
            raise AssertionError(f"{shared} keys shared by tenants, counted {self._shared_keys}")
        if len(filed) != self._count:
            raise AssertionError(f"{len(filed)} objects filed, counted {self._count}")
        return filed

    def _check_segment_index(
        self,
        expected: dict[str, set[tuple[ObjectId, int]]],
        allocators: Mapping[str, Any] | None,
    ) -> None:
        assert self._allocator_of is not None
        if allocators is None:
            allocators = {}
            for segment_id in expected:
                allocator = self._allocator_of(segment_id)
                if allocator is not None:
                    allocators[segment_id] = allocator
        for segment_id, allocator in allocators.items():
            if self._allocator_of(segment_id) is not allocator:
                raise AssertionError(f"segment {segment_id}: the table reaches another allocator")
            tagged: set[tuple[ObjectId, int]] = set()
            for offset, _ in allocator.allocations():
                owner = allocator.owner_of(offset)
                if owner is None:
                    continue
                object_id = owner.object_id
                if self.get(object_id) is not owner:
                    raise AssertionError(f"segment {segment_id}: tag of a gone object at {offset}")
                tagged.add((object_id, offset))
            if tagged != expected.get(segment_id, set()):
                raise AssertionError(f"segment index of {segment_id} disagrees with replicas")
