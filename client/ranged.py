"""Ranged transfers: look objects up (or reserve them) once, then move byte ranges of them with
no master round trip per range.

An engine that loads or saves its KV cache layer by layer moves, for every layer, one small range
of each of many objects. Doing a lookup (or a PutStart) per layer would cost one master round
trip per layer; a *session* pays it once:

- **Read sessions** (:meth:`RangedSessions.batch_get_session_start`): one GetReplicaList for the
  keys, whose read leases this client then holds until :meth:`~RangedSessions.batch_get_session_end`
  (or :meth:`~RangedSessions.close`). While they are held the objects' bytes stay put on the
  master (removal, eviction and upsert retire the memory instead of reusing it), so each
  :meth:`~RangedSessions.batch_get_into_multi_buffer_ranges` copies ranges straight from the
  cached replica descriptors. A lease lasts at most its TTL: a range read that would finish
  after it answers LEASE_EXPIRED (the bytes may have been handed out again) and the caller
  starts a fresh session.
- **Write sessions** (:meth:`RangedSessions.batch_put_session_start`): one PutStart per key
  reserves the replicas and answers the write's id; ranged writes
  (:meth:`~RangedSessions.batch_put_from_multi_buffer_ranges`) go straight into every reserved
  replica; :meth:`~RangedSessions.batch_put_session_end` makes an object visible (PutEnd, naming
  its write id) only once every byte of it was written, and
  :meth:`~RangedSessions.batch_put_session_revoke` (PutRevoke) gives the reservation back.
- :meth:`RangedSessions.get_into_ranges` is the single-call form: one lookup for every key, the
  ranges, then the leases end at once.

Sessions are per client and named by their keys: one read session and one write session per
key at a time. Ending a session never waits for other keys; a session in use by a concurrent
transfer ends when that transfer finishes (its lease or reservation is never dropped under a
copy). Closing ends every read session and revokes every write session at once.

Thread-safety: every method may be called from several threads at once. Transfers run outside
the session table's lock.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from mooncake_py.types import ReplicaListResult

from .api_queries import check_keys, invalid_params
from .core import ClientCore
from .data_plane import ReadItem
from .ranged_writes import (
    INVALID,
    LEASE_EXPIRED,
    NOT_FOUND,
    OK,
    TRANSFER_FAIL,
    ReadSession,
    WriteSessions,
    shifted_replicas,
)
from .results import BatchResult


class RangedSessions(WriteSessions):
    """Read and write sessions of one typed :class:`~mooncake_py.Client` (the write half
    comes from :class:`~mooncake_py.client.ranged_writes.WriteSessions`).

    Args:
        client: the joined client whose core, registered buffers and clock the transfers use.

    Methods raise :class:`~mooncake_py.errors.InvalidParamsError` for a malformed call (lists of
    different lengths, a bad key, a closed client or session table) and otherwise return
    per-key (or per-range) outcomes; see each method.
    """

    def batch_get_session_start(self, keys: Sequence[str]) -> BatchResult[None]:
        """Look ``keys`` up once (one GetReplicaList) and hold their read leases.

        A key that already had a read session gets a fresh one (the old lease ends). A key
        repeated in ``keys`` gets one session. Complexity: one master round trip.

        Returns:
            Per key: ok (a session is open), or the lookup's code (OBJECT_NOT_FOUND,
            REPLICA_IS_NOT_READY, RPC_FAIL, ...; then the key has no session).

        Raises:
            InvalidParamsError: a bad key, or a closed client.
        """
        core = self._core()
        check_keys(keys)
        unique = list(dict.fromkeys(keys))
        if not unique:
            return BatchResult.of_codes(keys, [])
        started = self._now()
        located = core.locate(unique)
        codes: dict[str, int] = {}
        stale: list[ReadSession] = []
        with self._lock:
            closed = self._closed
            for key, loc in zip(unique, located, strict=True):
                codes[key] = INVALID if closed else loc.code
                old = None if closed else self._reads.pop(key, None)
                if old is not None:
                    stale.append(old)
                if loc.code == OK and not closed:
                    self._reads[key] = ReadSession(loc, started)
        if closed:
            core.drop_reads(located)  # closed meanwhile: nothing may stay held
        self._end_read_sessions(core, stale)
        return BatchResult.of_codes(keys, [codes[k] for k in keys])

    def batch_get_into_multi_buffer_ranges(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        all_src_offsets: Sequence[Sequence[int]],
    ) -> BatchResult[int]:
        """Copy, per key, the ranges ``[all_src_offsets[i][j], + all_sizes[i][j])`` of its object
        into registered memory at ``all_buffer_ptrs[i][j]``, from the session's replica list
        (no master call).

        Returns:
            Per key the bytes copied (the sum of its sizes), or: OBJECT_NOT_FOUND when the key
            has no read session; INVALID_PARAMS when its three lists differ in length, a size or
            offset is negative, a range runs past the object's end or a destination is not
            inside a registered buffer (nothing of the key is copied); LEASE_EXPIRED when the
            session's lease TTL passed (before or during the copy: the bytes may have changed);
            TRANSFER_FAIL when no replica could be read. Zero-size ranges are skipped.

        Raises:
            InvalidParamsError: the four lists differ in length, a bad key, a closed client.
        """
        core = self._core()
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes) == len(all_src_offsets):
            raise invalid_params("keys, all_buffer_ptrs, all_sizes, all_src_offsets differ")
        check_keys(keys)
        codes = [NOT_FOUND] * len(keys)
        values: list[int | None] = [None] * len(keys)
        used: list[tuple[int, ReadSession]] = []
        with self._lock:
            for i, key in enumerate(keys):
                session = self._reads.get(key)
                if session is not None:
                    session.users += 1
                    used.append((i, session))
        try:
            items: list[ReadItem] = []
            owners: list[int] = []
            for i, session in used:
                loc = session.located
                if self._expired(session):
                    codes[i] = LEASE_EXPIRED
                    continue
                ranges = self._plan(all_buffer_ptrs[i], all_sizes[i], all_src_offsets[i], loc.size)
                if ranges is None:
                    codes[i] = INVALID
                    continue
                codes[i], values[i] = OK, sum(len(view) for view, _ in ranges)
                for view, offset in ranges:
                    items.append(ReadItem(shifted_replicas(loc.replicas, offset, len(view)), view))
                    owners.append(i)
            for i, code in zip(owners, core.data.read(items), strict=True):
                if code != OK and codes[i] == OK:
                    codes[i], values[i] = TRANSFER_FAIL, None
            for i, session in used:
                # A copy that finished after the TTL may hold bytes handed out meanwhile.
                if codes[i] == OK and self._expired(session):
                    codes[i], values[i] = LEASE_EXPIRED, None
        finally:
            self._release_reads(core, [s for _, s in used])
        return BatchResult(keys, codes, values)

    def batch_get_session_end(self, keys: Sequence[str]) -> BatchResult[None]:
        """End the read sessions of ``keys``: their leases end at once (one one-way EndReads,
        no round trip), or, for a session a concurrent transfer is copying from, when that
        copy finishes.

        Returns:
            Per key: ok, or OBJECT_NOT_FOUND when it had no read session.

        Raises:
            InvalidParamsError: a bad key, or a closed client.
        """
        core = self._core()
        check_keys(keys)
        codes: list[int] = []
        ending: list[ReadSession] = []
        with self._lock:
            for key in keys:
                session = self._reads.pop(key, None)
                codes.append(NOT_FOUND if session is None else OK)
                if session is not None:
                    ending.append(session)
        self._end_read_sessions(core, ending)
        return BatchResult.of_codes(keys, codes)

    def _expired(self, session: ReadSession) -> bool:
        ttl_ms = session.located.lease_ttl_ms
        return bool(ttl_ms) and (self._now() - session.started) * 1000.0 >= ttl_ms

    def _release_reads(self, core: ClientCore, used: Sequence[ReadSession]) -> None:
        """Drop one use of each session; end the leases of those ended meanwhile."""
        finished: list[ReadSession] = []
        with self._lock:
            for session in used:
                session.users -= 1
                if session.ended and session.users == 0:
                    finished.append(session)
        if finished:
            core.drop_reads([s.located for s in finished])

    def _end_read_sessions(self, core: ClientCore, sessions: Sequence[ReadSession]) -> None:
        """End sessions already removed from the table: now, or by their last user."""
        now: list[ReplicaListResult] = []
        with self._lock:
            for session in sessions:
                session.ended = True
                if session.users == 0:
                    now.append(session.located)
        if now:
            core.drop_reads(now)

    # ------------------------------------------------------------------------------------------
    # Single-call form and lifecycle

    def get_into_ranges(
        self,
        buffer_ptrs: Sequence[int],
        all_keys: Sequence[Sequence[str]],
        all_dst_offsets: Sequence[Sequence[Sequence[int]]],
        all_src_offsets: Sequence[Sequence[Sequence[int]]],
        all_sizes: Sequence[Sequence[Sequence[int]]],
    ) -> list[list[list[int]]]:
        """Copy byte ranges of many objects into registered buffers with one lookup.

        For buffer ``b``, its key ``k = all_keys[b][i]`` and range ``j``: the
        ``all_sizes[b][i][j]`` bytes at offset ``all_src_offsets[b][i][j]`` of the object go to
        ``buffer_ptrs[b] + all_dst_offsets[b][i][j]`` (which must be registered memory). The
        read leases end when the copies are done.

        Returns:
            ``result[b][i][j]``: the bytes copied for that range, or a negative code:
            OBJECT_NOT_FOUND (and the lookup's other codes) for every range of a key that was
            not found; INVALID_PARAMS for a range with a negative value, past the object's end
            or outside registered memory, and for every range of a key whose three lists differ
            in length; TRANSFER_FAIL; LEASE_EXPIRED for a copy that outlived its lease and
            that the master does not vouch for.

        Raises:
            InvalidParamsError: the five top-level lists (or one buffer's key and offset lists)
                differ in length, a bad key, a closed client.
        """
        core = self._core()
        count = len(buffer_ptrs)
        if not count == len(all_keys) == len(all_dst_offsets) == len(all_src_offsets):
            raise invalid_params("buffer_ptrs, all_keys and the offset lists differ in length")
        if len(all_sizes) != count:
            raise invalid_params("buffer_ptrs and all_sizes differ in length")
        for b in range(count):
            n = len(all_keys[b])
            if not n == len(all_dst_offsets[b]) == len(all_src_offsets[b]) == len(all_sizes[b]):
                raise invalid_params(f"buffer {b}: keys and range lists differ in length")
        flat = [key for keys in all_keys for key in keys]
        check_keys(flat)
        unique = list(dict.fromkeys(flat))
        index = {key: i for i, key in enumerate(unique)}
        started = self._now()
        located = core.locate(unique) if unique else []
        results: list[list[list[int]]] = []
        try:
            items: list[ReadItem] = []
            cells: list[tuple[list[int], int, int]] = []  # (result list, range index, key index)
            for b in range(count):
                per_buffer: list[list[int]] = []
                for i, key in enumerate(all_keys[b]):
                    loc = located[index[key]]
                    dst, src, sizes = all_dst_offsets[b][i], all_src_offsets[b][i], all_sizes[b][i]
                    out, ranges = self._range_cells(buffer_ptrs[b], dst, src, sizes, loc)
                    per_buffer.append(out)
                    for j, view, offset in ranges:
                        replicas = shifted_replicas(loc.replicas, offset, len(view))
                        items.append(ReadItem(replicas, view))
                        cells.append((out, j, index[key]))
                results.append(per_buffer)
            for (out, j, _), code in zip(cells, core.data.read(items), strict=True):
                if code != OK:
                    out[j] = TRANSFER_FAIL
        except BaseException:
            core.drop_reads(located)
            raise
        expired = set(core.end_reads(located, started))
        if expired:
            for out, j, k in cells:
                if k in expired and out[j] >= 0:
                    out[j] = LEASE_EXPIRED
        return results

    def _range_cells(
        self,
        base: int,
        dst: Sequence[int],
        src: Sequence[int],
        sizes: Sequence[int],
        loc: ReplicaListResult,
    ) -> tuple[list[int], list[tuple[int, memoryview, int]]]:
        """Per range of one key: its size when it can be copied, else its code; and the ranges
        to copy as (range index, registered view, offset in the object)."""
        out: list[int] = []
        ranges: list[tuple[int, memoryview, int]] = []
        try:
            if not len(dst) == len(src) == len(sizes):
                return [INVALID] * max(len(sizes), 1), []
            for j, raw in enumerate(zip(dst, src, sizes, strict=True)):
                d, s, n = (operator.index(v) for v in raw)  # integers of any kind only
                if loc.code != OK:
                    out.append(loc.code)
                elif n < 0 or d < 0 or s < 0 or s + n > loc.size:
                    out.append(INVALID)
                elif n == 0:
                    out.append(0)
                else:
                    view = self._views(base + d, n)
                    out.append(INVALID if view is None else n)
                    if view is not None:
                        ranges.append((j, view, s))
            return out, ranges
        except TypeError:
            return [INVALID] * max(len(sizes), 1), []

    def close(self) -> None:
        """End every read session and revoke every write session, at once (sessions in use
        end when their transfers finish). Idempotent; never raises."""
        with self._lock:
            self._closed = True
            reads = list(self._reads.values())
            writes = [s for s in self._writes.values() if s is not None]
            self._reads.clear()
            for session in writes:
                del self._writes[session.key]
                if session.users:
                    session.revoked = True
            idle = [s for s in writes if not s.users]
        core = self._client._core
        if core is None:
            return  # the client left: the master ends its leases and writes when it expires
        self._end_read_sessions(core, reads)
        if idle:
            self._revoke(core, idle)
