"""Fenced writes to etcd: txns that only apply while this master still holds the leadership,
and the packing of many writes into few txns that etcd accepts.

Every write of the log store goes through :meth:`LeaderFence.txn`. With an election, the txn
carries the compare ``create_revision(leader_key) == election.leader_revision``: a master
whose lease expired, or whose key another master has since re-created, has its writes refused
by etcd itself, whatever that master believes. Its failure branch reads the leader key, which
tells a lost leadership (:class:`~.log_store.LeadershipLost`) from the caller's own compares.

Thread-safety: one event loop; stateless apart from the objects it was given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from mooncake_py.ha_names import leader_key

from .election import LeaderElection
from .etcd_client import (
    EtcdClient,
    EtcdError,
    KeyValue,
    TxnResult,
    compare_create_revision,
    range_op,
)
from .log_store import LeadershipLost, LogStoreError

T = TypeVar("T")

TXN_BUDGET_BYTES = 1200 * 1024
"""Payload bytes per txn: under etcd's default request limit (``--max-request-bytes``,
1.5 MiB) with room for keys and framing."""

TXN_MAX_OPS = 120
"""Operations per txn branch: under etcd's default ``--max-txn-ops`` (128)."""

OP_OVERHEAD_BYTES = 64
"""What one put costs on top of its key and value, for packing (protobuf framing, generous)."""


def pack(
    items: Sequence[T],
    size_of: Callable[[T], int],
    budget: int = TXN_BUDGET_BYTES,
    max_ops: int = TXN_MAX_OPS,
) -> Iterator[list[T]]:
    """Consecutive runs of ``items``, each within ``budget`` bytes and ``max_ops`` items (an
    item larger than the budget gets a run of its own). O(len(items))."""
    run: list[T] = []
    used = 0
    for item in items:
        size = size_of(item) + OP_OVERHEAD_BYTES
        if run and (used + size > budget or len(run) >= max_ops):
            yield run
            run, used = [], 0
        run.append(item)
        used += size
    if run:
        yield run


class LeaderFence:
    """Runs the txns of one cluster's log store, fenced by ``election`` when one is given.

    Args:
        client: the etcd connection.
        cluster_id: names the leader key.
        election: the leadership that fences the writes; None for an unfenced store (one
            writer by construction, e.g. tools and tests).
    """

    def __init__(
        self, client: EtcdClient, cluster_id: str, election: LeaderElection | None
    ) -> None:
        self.client = client
        self.election = election
        self.key = leader_key(cluster_id)

    def _compares(self) -> list[Any]:
        if self.election is None:
            return []
        # Known locally to be over (deadline passed, key lost): etcd would likely refuse too,
        # and if its lease has not quite expired there, writing now would be unsafe.
        if not self.election.is_leader:
            raise LeadershipLost(
                f"this master is not the leader ({self.election.lost_reason or 'not elected'})"
            )
        return [compare_create_revision(self.key, self.election.leader_revision)]

    async def txn(
        self,
        compare: Sequence[Any],
        success: Sequence[Any],
        failure: Sequence[Any] = (),
    ) -> TxnResult:
        """Run a txn whose compares are the fence's plus ``compare``.

        Returns:
            The result; on failure (a compare of the caller's failed), ``ranges`` holds the
            results of ``failure``'s range operations only.

        Raises:
            LeadershipLost: this master is not the leader (known locally, or the fence's
                compare failed in etcd; nothing was written).
            LogStoreError: etcd refused the txn or could not be reached.
        """
        fence = self._compares()
        fence_reads = [range_op(self.key)] if fence else []
        try:
            result = await self.client.txn([*fence, *compare], success, [*fence_reads, *failure])
        except EtcdError as error:
            raise LogStoreError(str(error)) from error
        if result.succeeded or not fence:
            return result
        holder: KeyValue | None = result.ranges[0][0] if result.ranges[0] else None
        assert self.election is not None
        if holder is None or holder.create_revision != self.election.leader_revision:
            raise LeadershipLost(
                "the leader key is gone or belongs to another master"
                if holder is None
                else f"{holder.value.decode(errors='replace')} now leads"
            )
        return TxnResult(result.succeeded, result.revision, result.ranges[1:])
