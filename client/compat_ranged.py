"""Upstream's ranged-transfer calls on the drop-in store: put and get sessions and
``get_into_ranges``, with upstream's names, argument order, defaults and return conventions.

:class:`RangedTransfers` is a base class of
:class:`~mooncake_py.MooncakeDistributedStore` (listed before it), and
:class:`AsyncRangedTransfers` of :class:`~mooncake_py.AsyncMooncakeStore`. The work is done
by :class:`~mooncake_py.client.ranged.RangedSessions` over the store's typed client; these
methods only convert:

- the session calls return one int per key (0, a byte count for the ranged transfers, or a
  negative ``ErrorCode``); ``batch_get_session_end`` returns one int;
- ``get_into_ranges`` returns, per buffer, per key, per range, the bytes copied or a code
  (on a store attached with ``setup_dummy`` the standalone service does the read, into its
  mapping of the registered pool memory; the session calls need a joined store);
- nothing raises for bad values: before ``setup`` (or after ``close``) every key answers
  INVALID_PARAMS (-600), lists of different lengths answer -600 for every key, a bad range
  -600 for its key (or range). Arguments of the wrong type raise ``TypeError``, as upstream.

Sessions belong to the store: ``close`` ends its read sessions and revokes its write sessions
at once, before leaving.

Thread-safety: every method may be called from several threads at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from mooncake_py.errors import ErrorCode, MooncakeError
from mooncake_py.types import ReplicateConfig

from .mixin_bases import AsyncStoreBase, StoreBase
from .ranged import RangedSessions
from .results import BatchResult
from .standalone_client import StandaloneClient

if TYPE_CHECKING:
    from .api import Client

INVALID = int(ErrorCode.INVALID_PARAMS)
OK = int(ErrorCode.OK)


def _counts(result: BatchResult[int]) -> list[int]:
    """Per key the byte count where the code is 0, else the code."""
    return [
        v if c == OK and v is not None else c
        for c, v in zip(result.codes, result.values, strict=True)
    ]


class RangedTransfers(StoreBase):
    """Put sessions, get sessions and ``get_into_ranges`` (upstream's names and conventions).

    Written against :class:`~mooncake_py.MooncakeDistributedStore`'s ``client`` attribute
    (the typed client, None before setup) and its ``close``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ranged_lock = threading.Lock()
        self._ranged: RangedSessions | None = None
        # The client being closed: no new session table for it (its sessions would outlive it).
        self._ranged_retired: Client | None = None

    def _sessions(self) -> RangedSessions | None:
        """The session table of the current typed client (a new one after a new setup)."""
        client: Client | None = self.client
        if client is None:
            return None
        with self._ranged_lock:
            current = self._ranged
            if current is not None and current.client is client:
                return current
            if client is self._ranged_retired:
                return None
            fresh = self._ranged = RangedSessions(client)
        if current is not None:
            current.close()  # a previous setup's table: its client has left
        return fresh

    def _per_key(self, count: int, call: Callable[[RangedSessions], list[int]]) -> list[int]:
        sessions = self._sessions()
        if sessions is None:
            return [INVALID] * count
        try:
            return call(sessions)
        except MooncakeError as exc:
            return [exc.code] * count

    def close(self) -> int:
        """End this store's read sessions and revoke its write sessions, then leave (see
        ``MooncakeDistributedStore.close``). Returns 0."""
        with self._ranged_lock:
            sessions, self._ranged = self._ranged, None
            self._ranged_retired = self.client
        if sessions is not None:
            sessions.close()
        return super().close()

    # ------------------------------------------------------------------------------------------
    # Put sessions

    def batch_put_session_start(
        self, keys: Sequence[str], sizes: Sequence[int], config: ReplicateConfig | None = None
    ) -> list[int]:
        """Reserve ``sizes[i]`` bytes for ``keys[i]`` for ranged writes (one PutStart per key,
        in one round trip); nothing is visible until :meth:`batch_put_session_end`.

        Returns:
            Per key 0, or OBJECT_ALREADY_EXISTS (-705: the object exists or is being written,
            also by this store's own session of it), NO_AVAILABLE_HANDLE (-200),
            INVALID_PARAMS (-600: a size that is not positive, lists of different lengths, a bad
            key or config), RPC_FAIL (-900), ...
        """
        return self._per_key(
            len(keys), lambda s: list(s.batch_put_session_start(keys, sizes, config).codes)
        )

    def batch_put_from_multi_buffer_ranges(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        all_dst_offsets: Sequence[Sequence[int]],
    ) -> list[int]:
        """Write the registered ranges ``(all_buffer_ptrs[i][j], all_sizes[i][j])`` at offsets
        ``all_dst_offsets[i][j]`` of ``keys[i]``'s reserved object, into every replica, with no
        master call.

        Returns:
            Per key the bytes written (the sum of its sizes), or OBJECT_NOT_FOUND (-704: no put
            session), INVALID_PARAMS (-600: its lists differ in length, a negative value, a
            range past the reserved size or outside registered memory; nothing of it is
            written), TRANSFER_FAIL (-800; the session stays open).
        """
        return self._per_key(
            len(keys),
            lambda s: _counts(
                s.batch_put_from_multi_buffer_ranges(
                    keys, all_buffer_ptrs, all_sizes, all_dst_offsets
                )
            ),
        )

    def batch_put_session_end(self, keys: Sequence[str]) -> list[int]:
        """Make each object visible (PutEnd), only if every byte of it was written.

        Returns:
            Per key 0, or OBJECT_NOT_FOUND (-704: no put session), INVALID_PARAMS (-600: not
            completely written; the session stays open), OBJECT_REPLICA_BUSY (-714: a ranged
            write of it is running), INVALID_WRITE (-700: preempted by a later write),
            RPC_FAIL (-900: the session stays open, end or revoke it again).
        """
        return self._per_key(len(keys), lambda s: list(s.batch_put_session_end(keys).codes))

    def batch_put_session_revoke(self, keys: Sequence[str]) -> list[int]:
        """Give back the reservations (PutRevoke); the objects never become visible.

        Returns:
            Per key 0, OBJECT_NOT_FOUND (-704: no put session) or the master's code.
        """
        return self._per_key(len(keys), lambda s: list(s.batch_put_session_revoke(keys).codes))

    # ------------------------------------------------------------------------------------------
    # Get sessions

    def batch_get_session_start(self, keys: Sequence[str]) -> list[int]:
        """Look the keys up once and hold their read leases until
        :meth:`batch_get_session_end` (a key with a session gets a fresh one).

        Returns:
            Per key 0, or the lookup's code (OBJECT_NOT_FOUND -704, REPLICA_IS_NOT_READY -703,
            RPC_FAIL -900, ...; INVALID_PARAMS -600 for a bad key or before setup).
        """
        return self._per_key(len(keys), lambda s: list(s.batch_get_session_start(keys).codes))

    def batch_get_into_multi_buffer_ranges(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        all_src_offsets: Sequence[Sequence[int]],
    ) -> list[int]:
        """Copy the ranges ``[all_src_offsets[i][j], + all_sizes[i][j])`` of ``keys[i]`` into
        registered memory at ``all_buffer_ptrs[i][j]`` from the session's replica list, with no
        master call.

        Returns:
            Per key the bytes copied (the sum of its sizes), or OBJECT_NOT_FOUND (-704: no get
            session), INVALID_PARAMS (-600, as for the put side), LEASE_EXPIRED (-707: the
            session outlived its lease TTL; start a new one), TRANSFER_FAIL (-800).
        """
        return self._per_key(
            len(keys),
            lambda s: _counts(
                s.batch_get_into_multi_buffer_ranges(
                    keys, all_buffer_ptrs, all_sizes, all_src_offsets
                )
            ),
        )

    def batch_get_session_end(self, keys: Sequence[str]) -> int:
        """End the get sessions of ``keys``: their read leases end at once (one-way, no round
        trip). Keys without a session are skipped.

        Returns:
            0, or INVALID_PARAMS (-600) before setup or for a bad key.
        """
        sessions = self._sessions()
        if sessions is None:
            return INVALID
        try:
            sessions.batch_get_session_end(keys)
        except MooncakeError as exc:
            return exc.code
        return OK

    def get_into_ranges(
        self,
        buffer_ptrs: Sequence[int],
        all_keys: Sequence[Sequence[str]],
        all_dst_offsets: Sequence[Sequence[Sequence[int]]],
        all_src_offsets: Sequence[Sequence[Sequence[int]]],
        all_sizes: Sequence[Sequence[Sequence[int]]],
    ) -> list[list[list[int]]]:
        """Copy byte ranges of many objects into registered buffers with one lookup: for
        buffer ``b``, key ``all_keys[b][i]``, range ``j``, the ``all_sizes[b][i][j]`` bytes at
        ``all_src_offsets[b][i][j]`` of the object go to ``buffer_ptrs[b] +
        all_dst_offsets[b][i][j]``. The read leases end when the copies are done.

        Returns:
            ``result[b][i][j]``: the bytes copied, or a negative code (-704 for the ranges of a
            key not found, -600 for a bad range, -800, -707). When the lists' shapes differ,
            -600 for every range whose place is known (one per key where its range count is
            not).
        """
        client = self.client
        if isinstance(client, StandaloneClient):
            # Attached with setup_dummy: the service holds the segment and does the read.
            try:
                return client.get_into_ranges(
                    buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes
                )
            except MooncakeError as exc:
                return _shaped(all_keys, all_sizes, exc.code)
        sessions = self._sessions()
        if sessions is not None:
            try:
                return sessions.get_into_ranges(
                    buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes
                )
            except MooncakeError as exc:
                return _shaped(all_keys, all_sizes, exc.code)
        return _shaped(all_keys, all_sizes, INVALID)


def _shaped(
    all_keys: Sequence[Sequence[str]], all_sizes: Sequence[Sequence[Sequence[int]]], code: int
) -> list[list[list[int]]]:
    """``code`` in the result's shape: per buffer of ``all_keys``, per key, per range of
    ``all_sizes`` where that entry exists (else one)."""
    out: list[list[list[int]]] = []
    for b, keys in enumerate(all_keys):
        per_key: list[list[int]] = []
        for i in range(len(keys)):
            try:
                ranges = len(all_sizes[b][i]) or 1
            except (IndexError, TypeError):
                ranges = 1
            per_key.append([code] * ranges)
        out.append(per_key)
    return out


class AsyncRangedTransfers(AsyncStoreBase):
    """The ranged-transfer calls of :class:`RangedTransfers` as coroutines (run on the async
    store's worker threads), for :class:`~mooncake_py.AsyncMooncakeStore`; its ``store``
    must have :class:`RangedTransfers` among its bases. Same arguments and returns."""

    def _ranged_store(self) -> RangedTransfers:
        return cast(RangedTransfers, self.store)

    async def batch_put_session_start(
        self, keys: Sequence[str], sizes: Sequence[int], config: ReplicateConfig | None = None
    ) -> list[int]:
        """Coroutine of :meth:`RangedTransfers.batch_put_session_start`."""
        return await self._run(self._ranged_store().batch_put_session_start, keys, sizes, config)

    async def batch_put_from_multi_buffer_ranges(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        all_dst_offsets: Sequence[Sequence[int]],
    ) -> list[int]:
        """Coroutine of :meth:`RangedTransfers.batch_put_from_multi_buffer_ranges`."""
        call = self._ranged_store().batch_put_from_multi_buffer_ranges
        return await self._run(call, keys, all_buffer_ptrs, all_sizes, all_dst_offsets)

    async def batch_put_session_end(self, keys: Sequence[str]) -> list[int]:
        """Coroutine of :meth:`RangedTransfers.batch_put_session_end`."""
        return await self._run(self._ranged_store().batch_put_session_end, keys)

    async def batch_put_session_revoke(self, keys: Sequence[str]) -> list[int]:
        """Coroutine of :meth:`RangedTransfers.batch_put_session_revoke`."""
        return await self._run(self._ranged_store().batch_put_session_revoke, keys)

    async def batch_get_session_start(self, keys: Sequence[str]) -> list[int]:
        """Coroutine of :meth:`RangedTransfers.batch_get_session_start`."""
        return await self._run(self._ranged_store().batch_get_session_start, keys)

    async def batch_get_into_multi_buffer_ranges(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        all_src_offsets: Sequence[Sequence[int]],
    ) -> list[int]:
        """Coroutine of :meth:`RangedTransfers.batch_get_into_multi_buffer_ranges`."""
        call = self._ranged_store().batch_get_into_multi_buffer_ranges
        return await self._run(call, keys, all_buffer_ptrs, all_sizes, all_src_offsets)

    async def batch_get_session_end(self, keys: Sequence[str]) -> int:
        """Coroutine of :meth:`RangedTransfers.batch_get_session_end`."""
        return await self._run(self._ranged_store().batch_get_session_end, keys)

    async def get_into_ranges(
        self,
        buffer_ptrs: Sequence[int],
        all_keys: Sequence[Sequence[str]],
        all_dst_offsets: Sequence[Sequence[Sequence[int]]],
        all_src_offsets: Sequence[Sequence[Sequence[int]]],
        all_sizes: Sequence[Sequence[Sequence[int]]],
    ) -> list[list[list[int]]]:
        """Coroutine of :meth:`RangedTransfers.get_into_ranges`."""
        call = self._ranged_store().get_into_ranges
        return await self._run(
            call, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes
        )
