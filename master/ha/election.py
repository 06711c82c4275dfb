"""Leader election of the masters of one cluster on etcd (upstream Mooncake's scheme).

The leader is whoever holds :func:`~mooncake_py.ha_names.leader_key`: a master grants itself a
lease, then writes its ``host:port`` there under that lease in a txn that only succeeds when
the key does not exist. It keeps the lease alive; when it dies or is cut off, the lease
expires, etcd deletes the key, and a waiting candidate (watching the key) takes over. The
key's ``create_revision`` is the leader's fencing token: writes to the log carry a compare on
it, so a deposed leader's writes fail even before it notices.

A leader also keeps a local deadline, the send time of the last successful grant or keepalive
plus the TTL: etcd cannot have let the lease expire before it, so a leader that passes it
without a renewal stops counting itself as leader, even when etcd is unreachable.

Thread-safety: one event loop; ``campaign`` must not be awaited twice at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Sequence

from mooncake_py.ha_names import leader_key

from .etcd_client import (
    DEFAULT_TIMEOUT_S,
    EtcdClient,
    EtcdError,
    compare_create_revision,
    put_op,
    range_op,
)

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 5.0
"""Upstream's leader lease TTL."""

RESIGNED = "resigned"
""":attr:`LeaderElection.lost_reason` after :meth:`LeaderElection.resign`."""


class LeaderElection:
    """One master's candidacy for the leadership of ``cluster_id``.

    Args:
        endpoints: the etcd endpoints (a spec for
            :func:`~mooncake_py.ha_names.parse_etcd_endpoints`, pairs, or an
            :class:`EtcdClient`, which the election then uses but does not close).
        cluster_id: the masters' cluster id (names the leader key).
        address: this master's ``host:port``, the value clients read from the leader key.
        ttl_s: the lease TTL: how long a dead leader can hold the key. etcd counts whole
            seconds (the lease asks for ``ceil(ttl_s)``, and at least 1).

    Raises:
        ValueError: ``ttl_s`` not positive, or no valid endpoint.
    """

    def __init__(
        self,
        endpoints: str | Sequence[tuple[str, int]] | EtcdClient,
        cluster_id: str,
        address: str,
        ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be positive, not {ttl_s}")
        self.ttl_s = ttl_s
        self.cluster_id = cluster_id
        self.address = address
        self.key = leader_key(cluster_id)
        # One attempt per endpoint must fit well inside a TTL for renewals to be retried.
        timeout_s = min(DEFAULT_TIMEOUT_S, ttl_s / 4)
        self._owns_client = not isinstance(endpoints, EtcdClient)
        self.client = (
            endpoints
            if isinstance(endpoints, EtcdClient)
            else EtcdClient(endpoints, timeout_s=timeout_s)
        )
        self._lease_id = 0
        self._stale_lease = 0
        self._leader_revision = 0
        self._deadline = 0.0
        self._lost = asyncio.Event()
        self._lost.set()
        self.lost_reason = "never elected"
        self._keepalive: asyncio.Task[None] | None = None

    @property
    def leader_revision(self) -> int:
        """The ``create_revision`` of this master's leader key: the fencing token. Valid once
        :meth:`campaign` returned; 0 before."""
        return self._leader_revision

    @property
    def lease_id(self) -> int:
        """The etcd lease holding the leader key (0 when not leader)."""
        return self._lease_id if self.is_leader else 0

    @property
    def is_leader(self) -> bool:
        """Whether this master is leader: elected, not known to have lost, and within the
        local deadline. O(1)."""
        return not self._lost.is_set() and time.monotonic() < self._deadline

    async def campaign(self) -> None:
        """Return once this master is the leader (at once when it already is).

        While another master holds the key, this waits for the key's deletion (a watch,
        re-checked every TTL in case a watch silently stalls); while etcd is unreachable, it
        retries with a backoff up to half a TTL. Cancelling it is safe: a lease it granted
        expires by itself.

        Raises:
            EtcdError: the etcd client was closed.
        """
        if self.is_leader:
            return
        # A leadership lost locally (deadline passed while etcd was away) may still hold the
        # key in etcd: dropping it lets this campaign, or another master's, win at once.
        await self._stop_keepalive()
        if self._lease_id:
            self._stale_lease, self._lease_id = self._lease_id, 0
        backoff = 0.05
        while True:
            try:
                if await self._try_once():
                    return
                backoff = 0.05
            except EtcdError as error:
                if self.client.closed:
                    raise
                log.info("leader campaign for %s: %s; retrying", self.cluster_id, error)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.ttl_s / 2)

    async def _try_once(self) -> bool:
        """One grant + txn; True when won, False after waiting for the holder's key to go."""
        if self._stale_lease:
            await self.client.lease_revoke(self._stale_lease)
            self._stale_lease = 0
        sent = time.monotonic()
        lease_id, _granted = await self.client.lease_grant(max(1, math.ceil(self.ttl_s)))
        result = await self.client.txn(
            [compare_create_revision(self.key, 0)],
            [put_op(self.key, self.address.encode(), lease=lease_id), range_op(self.key)],
            [range_op(self.key)],
        )
        holder = result.ranges[0][0] if result.ranges and result.ranges[0] else None
        # A txn retried after a lost reply fails its compare on our own key: still a win.
        if holder is not None and holder.lease == lease_id:
            self._become_leader(lease_id, holder.create_revision, sent)
            return True
        with contextlib.suppress(EtcdError):
            await self.client.lease_revoke(lease_id)
        if holder is not None:
            log.info(
                "master %s waits: %s leads", self.address, holder.value.decode(errors="replace")
            )
            await self._wait_for_deletion(result.revision)
        return False

    async def _wait_for_deletion(self, seen_revision: int) -> None:
        """Return when the leader key is deleted after ``seen_revision``, or after a TTL (the
        caller then looks again)."""

        async def watch_until_deleted() -> None:
            async for events in self.client.watch(self.key, start_revision=seen_revision + 1):
                if any(event.deleted for event in events):
                    return

        with contextlib.suppress(asyncio.TimeoutError, EtcdError):
            await asyncio.wait_for(watch_until_deleted(), self.ttl_s)

    def _become_leader(self, lease_id: int, revision: int, sent: float) -> None:
        self._lease_id = lease_id
        self._leader_revision = revision
        self._deadline = sent + self.ttl_s
        self._lost = asyncio.Event()
        self.lost_reason = ""
        self._keepalive = asyncio.get_running_loop().create_task(
            self._keep_alive(lease_id, revision), name=f"leader-lease-{self.cluster_id}"
        )
        log.info("master %s leads %s (revision %d)", self.address, self.cluster_id, revision)

    def _lose(self, reason: str) -> None:
        if not self._lost.is_set():
            log.log(
                logging.INFO if reason == RESIGNED else logging.WARNING,
                "master %s lost the leadership of %s: %s",
                self.address,
                self.cluster_id,
                reason,
            )
            self.lost_reason = reason
            self._lost.set()

    async def _keep_alive(self, lease_id: int, revision: int) -> None:
        """Refresh the lease every TTL/3 (retrying sooner after a failure) and check the key is
        still ours, until the leadership is lost."""
        interval = self.ttl_s / 3
        next_refresh = time.monotonic() + interval
        while not self._lost.is_set():
            now = time.monotonic()
            if now >= self._deadline:
                self._lose("the lease was not renewed within its TTL")
                return
            await asyncio.sleep(max(0.0, min(next_refresh, self._deadline) - now))
            sent = time.monotonic()
            if sent >= self._deadline:
                continue
            try:
                ttl = await asyncio.wait_for(
                    self.client.lease_keepalive(lease_id), self._deadline - sent
                )
                if ttl <= 0:
                    self._lose("etcd reports the lease expired")
                    return
                self._deadline = sent + self.ttl_s
                next_refresh = sent + interval
                holder = await asyncio.wait_for(self.client.get(self.key), interval)
                if holder is None or holder.create_revision != revision:
                    self._lose("the leader key was deleted or taken over")
                    return
            except (asyncio.TimeoutError, EtcdError) as error:
                log.info(
                    "leader lease keepalive failed: %s; retrying", error or type(error).__name__
                )
                next_refresh = time.monotonic() + interval / 4

    async def wait_lost(self) -> None:
        """Complete when this master is no longer leader (at once if it is not): the lease was
        refused or expired, the key was deleted or re-created by another, the local deadline
        passed without a renewal (within ``ttl_s`` even with etcd unreachable), or
        :meth:`resign`/:meth:`close` was called. :attr:`lost_reason` says which."""
        lost = self._lost
        while not lost.is_set():
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                self._lose("the lease was not renewed within its TTL")
                break
            # The keepalive task normally sets the event; the deadline is checked here too so
            # that a stalled task cannot hide a loss.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(lost.wait(), remaining)

    async def resign(self) -> None:
        """Give up the leadership: stop renewing and revoke the lease, so the key goes at once
        and another master can win. When etcd cannot be reached the key goes when the lease
        expires. A no-op when not leader."""
        was_leader = not self._lost.is_set()
        await self._stop_keepalive()
        lease_id, self._lease_id = self._lease_id, 0
        self._lose(RESIGNED)
        if was_leader and lease_id:
            try:
                await self.client.lease_revoke(lease_id)
            except EtcdError as error:
                log.warning(
                    "revoking the leader lease failed (it expires in %s s): %s", self.ttl_s, error
                )

    async def _stop_keepalive(self) -> None:
        task, self._keepalive = self._keepalive, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def current_leader(self) -> str | None:
        """The leader's ``host:port`` as etcd has it now, or None when there is no leader.

        Raises:
            EtcdError: etcd could not be read.
        """
        holder = await self.client.get(self.key)
        return holder.value.decode() if holder is not None else None

    async def close(self) -> None:
        """Resign (if leader) and close the etcd client this election created; idempotent."""
        await self.resign()
        if self._owns_client:
            await self.client.close()
