"""Read leases held by their readers, and the memory they keep alive.

A read lease (a *hold*) starts when a client looks an object up to read it (GetReplicaList)
and ends when that client says its copy is done (EndReads). While a hold lasts, the bytes of
the replicas it names stay where they are: removing, evicting, replacing or releasing the
object *retires* those replicas instead of freeing them, and a retired replica's memory goes
back to its allocator the moment its last hold ends. The lease TTL only bounds how long a
reader that died or hung keeps memory: a hold whose deadline passes *expires*.

An expired hold leaves a *late read* record behind, so a reader whose copy outlived its TTL
can still be told whether its bytes were intact: the record is *clobbered* when a writer may
have changed the range (the range was handed out again after it was freed, or the replica was
rewritten in place). Ending a late read answers OK unless it was clobbered; ending an id the
master does not know answers LEASE_EXPIRED.

Existence checks (ExistKey) take a lighter *existence hold* per (client, object): it keeps the
object from being evicted before more convenient victims and from being removed without force,
ends when the same client's next read of the object takes over (that read's own hold then
protects it), and otherwise lapses at its deadline. It protects no bytes, so it never retires
memory.

Reads by one client of one object through the same replicas share one hold with a count, so
the number of holds is bounded by clients x objects however often hot keys are read.

Every method is O(1) or O(replicas of the object) unless stated. Thread-safety: none; the
service serializes calls under its lock.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from mooncake_py.errors import ErrorCode

from .objects import ObjectId, ObjectMetadata, Replica

MAX_LATE_READS = 65536
"""Late-read records kept at most; the oldest are forgotten first (their readers then get
LEASE_EXPIRED, the safe answer)."""
LATE_READ_MEMORY_S = 60.0
"""Seconds a late-read record is kept for a reader that has not come back."""


@dataclasses.dataclass(slots=True)
class ReadHold:
    """Reads in flight by one client of one object through one set of replicas."""

    id: int
    client_id: str
    meta: ObjectMetadata
    replica_ids: tuple[int, ...]
    deadline: float
    count: int = 1


@dataclasses.dataclass(slots=True)
class LateRead:
    """A hold that expired before its reader ended it."""

    client_id: str
    replica_ids: tuple[int, ...]
    expired_at: float
    clobbered: bool = False


@dataclasses.dataclass(slots=True)
class _Watch:
    """A freed range that late readers may still be copying out of."""

    start: int
    end: int
    hold_ids: set[int]


class ReadLeases:
    """All read and existence holds, retired buffers and late-read records.

    Args:
        free: gives a replica's memory back to its allocator (the caller's segment manager).
    """

    def __init__(self, free: Callable[[Replica], None]) -> None:
        self._free = free
        self._ids = itertools.count(1)
        self._holds: dict[int, ReadHold] = {}
        self._shared: dict[tuple[str, ObjectId, tuple[int, ...]], int] = {}
        self._by_client: dict[str, set[int]] = {}
        self._replica_readers: dict[int, int] = {}
        self._deadlines: list[tuple[float, int]] = []
        # Replicas no object owns any more, kept until their readers are done.
        self._retired: dict[int, Replica] = {}
        self._late: OrderedDict[int, LateRead] = OrderedDict()
        self._late_by_replica: dict[int, set[int]] = {}
        self._watches: dict[str, list[_Watch]] = {}
        # Existence holds: client -> object -> deadline, and object -> clients holding it.
        self._exists: dict[str, dict[ObjectId, float]] = {}
        self._exist_by_object: dict[ObjectId, dict[str, None]] = {}
        # (earliest deadline, sequence, client, objects): one entry per call that added holds;
        # renewals push nothing (an entry whose holds were renewed is pushed again).
        self._exist_deadlines: list[tuple[float, int, str, list[ObjectId]]] = []
        self._exist_seq = itertools.count()
        self.expired_holds = 0  # monotonic count, for metrics

    # -- read holds ------------------------------------------------------------------------

    def grant(
        self, client_id: str, meta: ObjectMetadata, replicas: Sequence[Replica], deadline: float
    ) -> int:
        """Start one read of ``replicas`` of ``meta`` by ``client_id``; returns the hold id.

        The same client's existence hold on the object, if any, ends: this read takes over.
        """
        # One replica (the common read): no generator. This runs for every key read.
        replica_ids = (replicas[0].id,) if len(replicas) == 1 else tuple(r.id for r in replicas)
        shared_key = (client_id, (meta.tenant, meta.key), replica_ids)
        hold_id = self._shared.get(shared_key)
        if hold_id is not None:
            hold = self._holds[hold_id]
            hold.count += 1
            hold.deadline = max(hold.deadline, deadline)
        else:
            hold_id = next(self._ids)
            hold = ReadHold(hold_id, client_id, meta, replica_ids, deadline)
            self._holds[hold_id] = hold
            self._shared[shared_key] = hold_id
            mine = self._by_client.get(client_id)
            if mine is None:
                self._by_client[client_id] = {hold_id}
            else:
                mine.add(hold_id)
            heapq.heappush(self._deadlines, (deadline, hold_id))
        readers = self._replica_readers
        for rid in replica_ids:
            readers[rid] = readers.get(rid, 0) + 1
        if self._exist_by_object:
            self._drop_exist(client_id, meta.object_id)
        return hold_id

    def end(self, client_id: str, hold_ids: Iterable[int]) -> list[ErrorCode]:
        """The reader's copies are done: end one read per id.

        Returns:
            Per id: OK when the bytes were protected for the whole copy (the hold was still
            there, or it expired but nothing may have changed the range since);
            LEASE_EXPIRED when a writer may have changed them, or the id is unknown (or
            belongs to another client).
        """
        results: list[ErrorCode] = []
        for hold_id in hold_ids:
            hold = self._holds.get(hold_id)
            if hold is not None and hold.client_id == client_id:
                self._end_one(hold)
                results.append(ErrorCode.OK)
                continue
            late = self._late.get(hold_id)
            if late is not None and late.client_id == client_id:
                self._forget_late(hold_id)
                results.append(ErrorCode.LEASE_EXPIRED if late.clobbered else ErrorCode.OK)
                continue
            results.append(ErrorCode.LEASE_EXPIRED)
        return results

    def _end_one(self, hold: ReadHold) -> None:
        hold.count -= 1
        self._release_replicas(hold.replica_ids)
        if hold.count == 0:
            self._drop_hold(hold)

    def _drop_hold(self, hold: ReadHold) -> None:
        del self._holds[hold.id]
        del self._shared[(hold.client_id, hold.meta.object_id, hold.replica_ids)]
        mine = self._by_client[hold.client_id]
        mine.discard(hold.id)
        if not mine:
            del self._by_client[hold.client_id]

    def _release_replicas(self, replica_ids: Iterable[int], times: int = 1) -> None:
        readers = self._replica_readers
        for rid in replica_ids:
            left = readers[rid] - times
            if left:
                readers[rid] = left
                continue
            del readers[rid]
            retired = self._retired.pop(rid, None)
            if retired is not None:
                self._free_replica(retired)

    def is_read(self, meta: ObjectMetadata) -> bool:
        """True while some reader may be copying one of ``meta``'s current replicas."""
        readers = self._replica_readers
        return bool(readers) and any(r.id in readers for r in meta.replicas)

    def untouched(self, meta: ObjectMetadata, replica: Replica) -> bool:
        """Whether nothing holds ``meta`` (whose one replica is ``replica``): no read of the
        replica in flight or late, and no existence hold on the object, so removing it frees
        its memory at once and ends no hold. O(1)."""
        return (
            replica.id not in self._replica_readers
            and replica.id not in self._late_by_replica
            and (not self._exist_by_object or (meta.tenant, meta.key) not in self._exist_by_object)
        )

    def readers_of(self, replica: Replica) -> int:
        """Reads in flight through ``replica``."""
        return self._replica_readers.get(replica.id, 0)

    # -- memory ----------------------------------------------------------------------------

    def retire_or_free(self, replica: Replica) -> bool:
        """``replica`` leaves its object: keep its memory for its readers, or free it now.

        Returns:
            True when the memory is kept (retired) for readers still copying.
        """
        readers = self._replica_readers.get(replica.id, 0)
        if readers:
            self._retired[replica.id] = replica
            return True
        self._free_replica(replica)
        return False

    def _free_replica(self, replica: Replica) -> None:
        self._free(replica)
        late_ids = self._late_by_replica.get(replica.id)
        if late_ids:
            # Late readers may still be copying from this range: watch for its reuse.
            watch = _Watch(replica.offset, replica.offset + replica.size, set(late_ids))
            self._watches.setdefault(replica.segment_id, []).append(watch)

    def on_allocated(self, segment_id: str, offset: int, size: int) -> None:
        """A range was handed out: late reads of any overlapping freed range are clobbered.
        O(watches on the segment)."""
        watches = self._watches.get(segment_id)
        if not watches:
            return
        end = offset + size
        late = self._late
        kept: list[_Watch] = []
        for watch in watches:
            if watch.start < end and offset < watch.end:
                self._clobber(watch.hold_ids)
            elif any(hold_id in late for hold_id in watch.hold_ids):
                kept.append(watch)  # (watches whose late readers are all gone are dropped)
        if kept:
            self._watches[segment_id] = kept
        else:
            del self._watches[segment_id]

    def on_rewritten(self, replicas: Iterable[Replica]) -> None:
        """``replicas`` are being rewritten in place: their late reads are clobbered."""
        for replica in replicas:
            late_ids = self._late_by_replica.get(replica.id)
            if late_ids:
                self._clobber(set(late_ids))

    def _clobber(self, hold_ids: Iterable[int]) -> None:
        for hold_id in hold_ids:
            late = self._late.get(hold_id)
            if late is not None:
                late.clobbered = True

    def retired_bytes(self) -> int:
        """Bytes kept for readers of replicas no object owns. O(retired)."""
        return sum(r.size for r in self._retired.values())

    def retired_count(self) -> int:
        """Retired replicas waiting for their readers."""
        return len(self._retired)

    def retired_on(self, segment_id: str) -> int:
        """Retired replicas in ``segment_id``. O(retired)."""
        return sum(1 for r in self._retired.values() if r.segment_id == segment_id)

    # -- expiry ----------------------------------------------------------------------------

    def expire_due(self, now: float) -> int:
        """End every hold whose deadline has passed (its reader died or hung), leaving a
        late-read record; drop lapsed existence holds and old late records.

        Returns:
            The number of read holds expired. Amortized O(log holds) per expired hold.
        """
        expired = 0
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, hold_id = heapq.heappop(deadlines)
            hold = self._holds.get(hold_id)
            if hold is None:
                continue
            if hold.deadline > now:  # extended by a later read: look again then
                heapq.heappush(deadlines, (hold.deadline, hold_id))
                continue
            self._expire(hold, now)
            expired += 1
        exist_deadlines = self._exist_deadlines
        while exist_deadlines and exist_deadlines[0][0] <= now:
            _, _, client_id, object_ids = heapq.heappop(exist_deadlines)
            mine = self._exists.get(client_id, {})
            renewed: list[ObjectId] = []
            next_due = 0.0
            for object_id in object_ids:
                deadline = mine.get(object_id)
                if deadline is None:
                    continue
                if deadline <= now:
                    self._drop_exist(client_id, object_id)
                else:  # renewed by a later check: look again then
                    renewed.append(object_id)
                    next_due = deadline if not next_due else min(next_due, deadline)
            if renewed:
                entry = (next_due, next(self._exist_seq), client_id, renewed)
                heapq.heappush(exist_deadlines, entry)
        late = self._late
        while late:
            oldest_id, oldest = next(iter(late.items()))
            if len(late) <= MAX_LATE_READS and oldest.expired_at + LATE_READ_MEMORY_S > now:
                break
            self._forget_late(oldest_id)
        self.expired_holds += expired
        return expired

    def _expire(self, hold: ReadHold, now: float) -> None:
        self._late[hold.id] = LateRead(hold.client_id, hold.replica_ids, now)
        for rid in hold.replica_ids:
            self._late_by_replica.setdefault(rid, set()).add(hold.id)
        self._drop_hold(hold)
        self._release_replicas(hold.replica_ids, hold.count)

    def _forget_late(self, hold_id: int) -> None:
        late = self._late.pop(hold_id)
        for rid in late.replica_ids:
            ids = self._late_by_replica.get(rid)
            if ids is not None:
                ids.discard(hold_id)
                if not ids:
                    del self._late_by_replica[rid]
        if not self._late_by_replica:
            self._watches.clear()

    def next_deadline(self) -> float | None:
        """The earliest deadline of a read hold, or None (a lower bound: may be stale)."""
        return self._deadlines[0][0] if self._deadlines else None

    # -- existence holds -------------------------------------------------------------------

    def grant_exist(self, client_id: str, object_ids: Sequence[ObjectId], deadline: float) -> None:
        """An existence check by ``client_id`` found ``object_ids``: hold each until
        ``deadline`` (never shortening a hold), or until this client reads it.

        Complexity: O(len(object_ids)) dict operations and at most one heap push.
        """
        mine = self._exists.get(client_id)
        if mine is None:
            mine = self._exists[client_id] = {}
        by_object = self._exist_by_object
        added: list[ObjectId] = []
        for object_id in object_ids:
            previous = mine.get(object_id)
            if previous is None:
                mine[object_id] = deadline
                holders = by_object.get(object_id)
                if holders is None:
                    by_object[object_id] = {client_id: None}
                else:
                    holders[client_id] = None
                added.append(object_id)
            elif deadline > previous:
                mine[object_id] = deadline
        if added:
            entry = (deadline, next(self._exist_seq), client_id, added)
            heapq.heappush(self._exist_deadlines, entry)

    def _drop_exist(self, client_id: str, object_id: ObjectId) -> None:
        mine = self._exists.get(client_id)
        if mine is None or mine.pop(object_id, None) is None:
            return
        if not mine:
            del self._exists[client_id]
        checkers = self._exist_by_object[object_id]
        del checkers[client_id]
        if not checkers:
            del self._exist_by_object[object_id]

    def drop_checks(self, object_id: ObjectId) -> None:
        """``object_id`` is gone: the existence holds on it end. O(its holds)."""
        for client_id in list(self._exist_by_object.get(object_id, ())):
            self._drop_exist(client_id, object_id)

    def checked_objects(self) -> list[ObjectId]:
        """Every object an existence hold protects. O(result)."""
        return list(self._exist_by_object)

    def is_checked(self, object_id: ObjectId) -> bool:
        """True while an existence hold protects ``object_id``."""
        return object_id in self._exist_by_object

    # -- clients and segments --------------------------------------------------------------

    def drop_client(self, client_id: str) -> None:
        """``client_id`` is gone: its holds end now (it copies nothing any more).
        O(its holds)."""
        for hold_id in list(self._by_client.get(client_id, ())):
            hold = self._holds[hold_id]
            self._drop_hold(hold)
            self._release_replicas(hold.replica_ids, hold.count)
        for object_id in list(self._exists.get(client_id, ())):
            self._drop_exist(client_id, object_id)

    def drop_segment(self, segment_id: str) -> None:
        """``segment_id`` is gone: its retired buffers and watches vanish with it, and late
        reads from it are clobbered. O(retired + late)."""
        for rid in [i for i, r in self._retired.items() if r.segment_id == segment_id]:
            del self._retired[rid]
            self._clobber(set(self._late_by_replica.get(rid, ())))
        for watch in self._watches.pop(segment_id, []):
            self._clobber(watch.hold_ids)

    def forget_replicas(self, replicas: Iterable[Replica]) -> None:
        """``replicas`` vanished with their segment: their late reads are clobbered."""
        for replica in replicas:
            ids = self._late_by_replica.get(replica.id)
            if ids:
                self._clobber(set(ids))

    # -- introspection ---------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Sizes for metrics: active holds and reads, retired buffers, late records."""
        return {
            "read_holds": len(self._holds),
            "reads_in_flight": sum(h.count for h in self._holds.values()),
            "retired_buffers": len(self._retired),
            "late_reads": len(self._late),
            "existence_holds": sum(len(m) for m in self._exists.values()),
            "expired_read_holds": self.expired_holds,
        }

    def check(self) -> None:
        """Verify the indexes against a recount. O(holds + retired + late).

        Raises:
            AssertionError: an index disagrees with the holds.
        """
        readers: dict[int, int] = {}
        for hold_id, hold in self._holds.items():
            if hold.count <= 0:
                raise AssertionError(f"hold {hold_id} has count {hold.count}")
            if self._shared.get((hold.client_id, hold.meta.object_id, hold.replica_ids)) != hold_id:
                raise AssertionError(f"hold {hold_id} is not indexed for sharing")
            if hold_id not in self._by_client.get(hold.client_id, ()):
                raise AssertionError(f"hold {hold_id} is not indexed by client")
            for rid in hold.replica_ids:
                readers[rid] = readers.get(rid, 0) + hold.count
        if readers != self._replica_readers:
            raise AssertionError("replica reader counts disagree with the holds")
        if len(self._shared) != len(self._holds):
            raise AssertionError("sharing index has stale entries")
        if sum(len(ids) for ids in self._by_client.values()) != len(self._holds):
            raise AssertionError("client index has stale entries")
        for rid, replica in self._retired.items():
            if replica.id != rid or rid not in self._replica_readers:
                raise AssertionError(f"retired replica {rid} has no reader")
        late_index: dict[int, set[int]] = {}
        for hold_id, late in self._late.items():
            for rid in late.replica_ids:
                late_index.setdefault(rid, set()).add(hold_id)
        if late_index != self._late_by_replica:
            raise AssertionError("late-read index disagrees with the records")
        indexed: dict[ObjectId, set[str]] = {}
        for client_id, mine in self._exists.items():
            if not mine:
                raise AssertionError(f"client {client_id!r} has an empty existence-hold map")
            for object_id in mine:
                indexed.setdefault(object_id, set()).add(client_id)
        if indexed != {o: set(c) for o, c in self._exist_by_object.items()}:
            raise AssertionError("existence-hold index disagrees with the holds")
