"""The session table of ranged transfers and its write half: reserve objects once (PutStart),
write byte ranges into the reserved replicas with no master call, then publish each object
(PutEnd, only once every byte of it was written) or give the reservation back (PutRevoke).

See :mod:`mooncake_py.client.ranged` for the whole picture.

Thread-safety: every method may be called from several threads at once.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mooncake_py.errors import ErrorCode, MooncakeError
from mooncake_py.types import PutStartResult, ReplicaDescriptor, ReplicaListResult, ReplicateConfig

from .api_queries import check_keys, invalid_params
from .core import ClientCore, config_for_keys
from .data_plane import WriteItem
from .results import BatchResult

if TYPE_CHECKING:
    from .api import Client

OK = int(ErrorCode.OK)
INVALID = int(ErrorCode.INVALID_PARAMS)
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
EXISTS = int(ErrorCode.OBJECT_ALREADY_EXISTS)
LEASE_EXPIRED = int(ErrorCode.LEASE_EXPIRED)
BUSY = int(ErrorCode.OBJECT_REPLICA_BUSY)
TRANSFER_FAIL = int(ErrorCode.TRANSFER_FAIL)
# Answers that leave the master's state unknown: the write session is kept so that the caller
# (or close) can retry its end or revoke.
_TRANSIENT = frozenset({int(ErrorCode.RPC_FAIL), int(ErrorCode.RPC_TIMEOUT)})
# Past this many recorded ranges a write session's coverage is merged, bounding its memory.
_MERGE_AFTER = 64


@dataclasses.dataclass(eq=False)
class ReadSession:
    """A looked-up object whose read lease this client holds."""

    located: ReplicaListResult
    started: float  # the client's clock before the lookup: the lease's TTL counts from it
    users: int = 0  # transfers copying from it right now
    ended: bool = False  # its end was asked for; the last user ends the lease


@dataclasses.dataclass(eq=False)
class _WriteSession:
    """A reserved object being written range by range."""

    key: str
    start: PutStartResult
    size: int
    covered: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    users: int = 0
    revoked: bool = False  # revoked while in use; the last user sends the PutRevoke

    def add(self, begin: int, end: int) -> None:
        self.covered.append((begin, end))
        if len(self.covered) > _MERGE_AFTER:
            self.covered = _merged(self.covered)

    def complete(self) -> bool:
        merged = _merged(self.covered)
        self.covered = merged
        return len(merged) == 1 and merged[0] == (0, self.size)


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Disjoint, sorted union of half-open intervals. O(n log n)."""
    out: list[tuple[int, int]] = []
    for begin, end in sorted(intervals):
        if out and begin <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((begin, end))
    return out


def shifted_replicas(
    replicas: Sequence[ReplicaDescriptor], offset: int, size: int
) -> tuple[ReplicaDescriptor, ...]:
    """The ``size`` bytes at ``offset`` of each replica, as descriptors of their own (the data
    plane then moves just that range, over shared memory or one ranged TCP request)."""
    return tuple(dataclasses.replace(r, offset=r.offset + offset, size=size) for r in replicas)


_Range = tuple[memoryview, int]  # (caller memory, offset inside the object)


class SessionTable:
    """The read and write sessions of one typed :class:`~mooncake_py.Client` (the state
    :class:`WriteSessions` and :class:`~mooncake_py.client.ranged.RangedSessions` act on).

    Args:
        client: the joined client whose core, registered buffers and clock the transfers use.

    Methods raise :class:`~mooncake_py.errors.InvalidParamsError` for a malformed call (lists of
    different lengths, a bad key, a closed client or session table) and otherwise return
    per-key (or per-range) outcomes; see each method.
    """

    def __init__(self, client: Client) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._reads: dict[str, ReadSession] = {}
        self._writes: dict[str, _WriteSession | None] = {}  # None: its PutStart is in flight
        self._closed = False

    @property
    def client(self) -> Client:
        """The typed client these sessions belong to."""
        return self._client

    def _core(self) -> ClientCore:
        if self._closed:
            raise invalid_params("the ranged sessions are closed")
        return self._client._joined()  # the typed client's core: master, data plane, ids

    def _views(self, ptr: int, size: int) -> memoryview | None:
        return self._client._buffers.view(ptr, size)

    def _now(self) -> float:
        return self._client._clock()

    @property
    def open_reads(self) -> int:
        """Read sessions held now."""
        with self._lock:
            return len(self._reads)

    @property
    def open_writes(self) -> int:
        """Write sessions held now (reserved, neither ended nor revoked)."""
        with self._lock:
            return sum(1 for s in self._writes.values() if s is not None)

    def _plan(
        self,
        ptrs: Sequence[int],
        sizes: Sequence[int],
        offsets: Sequence[int],
        object_size: int,
    ) -> list[_Range] | None:
        """The ranges of one key as (registered view, offset in the object); None when the
        lists differ in length, a value is negative or not an int, a range runs past the
        object or its memory is not registered. O(ranges x log buffers)."""
        try:
            if not len(ptrs) == len(sizes) == len(offsets):
                return None
            ranges: list[_Range] = []
            for raw in zip(ptrs, sizes, offsets, strict=True):
                # Integers of any kind (numpy's too); floats and strings are refused.
                ptr, size, offset = (operator.index(v) for v in raw)
                if size < 0 or offset < 0 or offset + size > object_size:
                    return None
                if size == 0:
                    continue
                view = self._views(ptr, size)
                if view is None:
                    return None
                ranges.append((view, offset))
            return ranges
        except TypeError:
            return None


class WriteSessions(SessionTable):
    """The write half of the ranged sessions (a base class of
    :class:`~mooncake_py.client.ranged.RangedSessions`)."""

    def batch_put_session_start(
        self, keys: Sequence[str], sizes: Sequence[int], config: ReplicateConfig | None = None
    ) -> BatchResult[None]:
        """Reserve ``sizes[i]`` bytes for ``keys[i]`` (one BatchPutStart) for ranged writes.

        Nothing is visible to readers until :meth:`batch_put_session_end`. Complexity: one
        master round trip.

        Returns:
            Per key: ok (reserved), or OBJECT_ALREADY_EXISTS (the object exists or is being
            written, also by a write session of this client or an earlier occurrence of the key
            in ``keys``), INVALID_PARAMS (a size that is not positive, a bad config),
            NO_AVAILABLE_HANDLE (no room), RPC_FAIL, ...

        Raises:
            InvalidParamsError: keys and sizes differ in length, a bad key, a closed client, or
                per-key config lists (``kv_sessions``, ``session_ids``, ``group_ids``) whose
                length is not ``len(keys)``.
        """
        core = self._core()
        if len(keys) != len(sizes):
            raise invalid_params(f"{len(keys)} keys but {len(sizes)} sizes")
        check_keys(keys)
        config = _write_config(config or ReplicateConfig(), len(keys), core.host_id)
        codes = [INVALID] * len(keys)
        chosen: list[int] = []
        with self._lock:
            for i, (key, size) in enumerate(zip(keys, sizes, strict=True)):
                if key in self._writes:
                    codes[i] = EXISTS
                elif _positive(size):
                    self._writes[key] = None  # claimed: a concurrent start of it answers EXISTS
                    chosen.append(i)
        if not chosen:
            return BatchResult.of_codes(keys, codes)
        subset = config if len(chosen) == len(keys) else config_for_keys(config, chosen)
        chosen_keys = [keys[i] for i in chosen]
        chosen_sizes = [operator.index(sizes[i]) for i in chosen]
        try:
            if len(chosen) == 1:
                starts = [
                    core.master.put_start(
                        core.client_id, core.tenant, chosen_keys[0], chosen_sizes[0], subset
                    )
                ]
            else:
                starts = core.master.batch_put_start(
                    core.client_id, core.tenant, chosen_keys, chosen_sizes, subset
                )
        except MooncakeError as exc:
            starts = [PutStartResult(exc.code)] * len(chosen)
        except BaseException:
            with self._lock:  # unclaim, or these keys would answer EXISTS forever
                for key in chosen_keys:
                    if key in self._writes and self._writes[key] is None:
                        del self._writes[key]
            raise
        orphans: list[_WriteSession] = []
        with self._lock:
            for i, start, size in zip(chosen, starts, chosen_sizes, strict=True):
                codes[i] = start.code
                session = _WriteSession(keys[i], start, size) if start.code == OK else None
                if session is not None and not self._closed:
                    self._writes[keys[i]] = session
                    continue
                del self._writes[keys[i]]
                if session is not None:
                    orphans.append(session)  # closed meanwhile: give the room back at once
                    codes[i] = INVALID
        if orphans:
            self._revoke(core, orphans)
        return BatchResult.of_codes(keys, codes)

    def batch_put_from_multi_buffer_ranges(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        all_dst_offsets: Sequence[Sequence[int]],
    ) -> BatchResult[int]:
        """Write, per key, the registered memory ``(all_buffer_ptrs[i][j], all_sizes[i][j])`` at
        offset ``all_dst_offsets[i][j]`` of its reserved object, into every replica (no master
        call). Ranges may come in any order over several calls; overlapping ones overwrite.

        Returns:
            Per key the bytes written (the sum of its sizes), or: OBJECT_NOT_FOUND when the key
            has no write session; INVALID_PARAMS for bad ranges as
            :meth:`batch_get_into_multi_buffer_ranges` (nothing of the key is written);
            TRANSFER_FAIL when a replica could not be written (the session stays open: write
            again or revoke). Zero-size ranges are skipped.

        Raises:
            InvalidParamsError: the four lists differ in length, a bad key, a closed client.
        """
        core = self._core()
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes) == len(all_dst_offsets):
            raise invalid_params("keys, all_buffer_ptrs, all_sizes, all_dst_offsets differ")
        check_keys(keys)
        codes = [NOT_FOUND] * len(keys)
        values: list[int | None] = [None] * len(keys)
        used: list[tuple[int, _WriteSession]] = []
        with self._lock:
            for i, key in enumerate(keys):
                session = self._writes.get(key)
                if session is not None:
                    session.users += 1
                    used.append((i, session))
        try:
            items: list[WriteItem] = []
            owners: list[tuple[int, _WriteSession, int, int]] = []
            for i, session in used:
                ranges = self._plan(
                    all_buffer_ptrs[i], all_sizes[i], all_dst_offsets[i], session.size
                )
                if ranges is None:
                    codes[i] = INVALID
                    continue
                codes[i], values[i] = OK, sum(len(view) for view, _ in ranges)
                for view, offset in ranges:
                    replicas = shifted_replicas(session.start.replicas, offset, len(view))
                    items.append(WriteItem(replicas, [view]))
                    owners.append((i, session, offset, offset + len(view)))
            written = core.data.write(items)
            with self._lock:
                for (i, session, begin, end), code in zip(owners, written, strict=True):
                    if code == OK:
                        session.add(begin, end)
                    elif codes[i] == OK:
                        codes[i], values[i] = TRANSFER_FAIL, None
        finally:
            self._release_writes(core, [s for _, s in used])
        return BatchResult(keys, codes, values)

    def batch_put_session_end(self, keys: Sequence[str]) -> BatchResult[None]:
        """Make the objects of ``keys`` visible (one BatchPutEnd naming their write ids), each
        only if every one of its bytes was written.

        Returns:
            Per key: ok (visible; the session is over), or: OBJECT_NOT_FOUND (no write
            session); INVALID_PARAMS (not completely written: the session stays open);
            OBJECT_REPLICA_BUSY (a ranged write of it is running: the session stays open);
            INVALID_WRITE (a later write of the key preempted this one: the session is over);
            RPC_FAIL / RPC_TIMEOUT (the session stays open: end or revoke it again).

        Raises:
            InvalidParamsError: a bad key, or a closed client.
        """
        core = self._core()
        check_keys(keys)
        codes = [NOT_FOUND] * len(keys)
        ending: list[tuple[int, _WriteSession]] = []
        with self._lock:
            for i, key in enumerate(keys):
                session = self._writes.get(key)
                if session is None:
                    continue
                if session.users:
                    codes[i] = BUSY
                elif not session.complete():
                    codes[i] = INVALID
                else:
                    del self._writes[key]  # a repeat of the key in this call finds none
                    ending.append((i, session))
        if not ending:
            return BatchResult.of_codes(keys, codes)
        sessions = [s for _, s in ending]
        answers = self._master_batch(core, "end", sessions)
        self._settle(sessions, answers)
        for (i, _), code in zip(ending, answers, strict=True):
            codes[i] = code
        return BatchResult.of_codes(keys, codes)

    def batch_put_session_revoke(self, keys: Sequence[str]) -> BatchResult[None]:
        """Give back the reservations of ``keys`` (one BatchPutRevoke): the objects never
        become visible. A session a concurrent ranged write is using is revoked when that
        write finishes.

        Returns:
            Per key: ok, OBJECT_NOT_FOUND (no write session), or the master's code (RPC_FAIL /
            RPC_TIMEOUT keep the session: revoke it again, or close).

        Raises:
            InvalidParamsError: a bad key, or a closed client.
        """
        core = self._core()
        check_keys(keys)
        codes = [NOT_FOUND] * len(keys)
        now: list[tuple[int, _WriteSession]] = []
        with self._lock:
            for i, key in enumerate(keys):
                session = self._writes.get(key)
                if session is None:
                    continue
                del self._writes[key]
                codes[i] = OK
                if session.users:
                    session.revoked = True  # its last writer sends the PutRevoke
                else:
                    now.append((i, session))
        if now:
            answers = self._revoke(core, [s for _, s in now])
            for (i, _), code in zip(now, answers, strict=True):
                codes[i] = code
        return BatchResult.of_codes(keys, codes)

    def _release_writes(self, core: ClientCore, used: Sequence[_WriteSession]) -> None:
        finished: list[_WriteSession] = []
        with self._lock:
            for session in used:
                session.users -= 1
                if session.revoked and session.users == 0:
                    finished.append(session)
        if finished:
            self._revoke(core, finished)

    def _revoke(self, core: ClientCore, sessions: list[_WriteSession]) -> list[int]:
        """PutRevoke sessions already out of the table; a transient failure puts them back
        (unless closed: the master's release timeout or this client's expiry then frees
        them)."""
        answers = self._master_batch(core, "revoke", sessions)
        self._settle(sessions, answers)
        return answers

    def _settle(self, sessions: Sequence[_WriteSession], answers: Sequence[int]) -> None:
        """Put back the sessions whose end or revoke got no answer, so it can be retried."""
        with self._lock:
            for session, code in zip(sessions, answers, strict=True):
                if code in _TRANSIENT and not self._closed and session.key not in self._writes:
                    session.revoked = False
                    self._writes[session.key] = session

    @staticmethod
    def _master_batch(core: ClientCore, what: str, sessions: Sequence[_WriteSession]) -> list[int]:
        keys = [s.key for s in sessions]
        ids = [s.start.write_id for s in sessions]
        master, client, tenant = core.master, core.client_id, core.tenant
        try:
            if what == "end":
                if len(keys) == 1:
                    return [master.put_end(client, tenant, keys[0], ids[0])]
                return master.batch_put_end(client, tenant, keys, ids)
            if len(keys) == 1:
                return [master.put_revoke(client, tenant, keys[0], ids[0])]
            return master.batch_put_revoke(client, tenant, keys, ids)
        except MooncakeError as exc:
            return [exc.code] * len(keys)


def _write_config(config: ReplicateConfig, count: int, host: str) -> ReplicateConfig:
    """``config`` as a write of ``count`` keys sends it: ``session_ids`` folded into
    ``kv_sessions`` and this host's id filled in (as the typed client's writes do).

    Raises:
        InvalidParamsError: a per-key list whose length is not ``count``, or a tier this store
            does not have (NVMe-oF or DFS replicas).
    """
    if config.nof_replica_num or config.dfs_replica_num:
        raise invalid_params("no NVMe-oF or DFS tier: refusing to store fewer copies than asked")
    try:
        tags = config.session_tags(count)
    except ValueError as exc:
        raise invalid_params(str(exc)) from exc
    if config.group_ids is not None and len(config.group_ids) != count:
        raise invalid_params(f"{count} keys but {len(config.group_ids)} group_ids")
    return dataclasses.replace(
        config, kv_sessions=tags, session_ids=None, host_id=config.host_id or host
    )


def _positive(size: object) -> bool:
    """``size`` is an integer (not a bool) above 0."""
    if isinstance(size, bool):
        return False
    try:
        return operator.index(size) > 0  # type: ignore[arg-type]
    except TypeError:
        return False
