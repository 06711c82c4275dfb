"""Going on across a master failover: which calls are retried, and how the leader is followed.

With a master address ``etcd://...`` (see :mod:`mooncake_py.client.leader_discovery`), a call
that fails in transport (:class:`~mooncake_py.errors.MasterUnavailableError`) may be sent
again, to whichever master etcd names as the leader by then, until a retry deadline. Whether
it may depends on one question: could a repeat change the outcome?

- **Retried on any transport failure**: the RPCs :data:`RETRY_POLICY` marks idempotent. Sending
  them twice leaves the store as sending them once would (reads, probes, listings, pings,
  mounts that answer OK for what is already there), or at worst leaves a read lease or an
  existence hold that lapses at its TTL.
- **Retried only when the request provably never reached a master**: every other RPC
  (removals, session changes, task steps). Writes are not among them: a write start carries
  the client's attempt id and PutEnd / PutRevoke its write id, so a repeat finds what the
  lost first attempt did. Proof is a connection that could not be made
  (gRPC's "failed to connect to all addresses" or a refused connection; a refused connect on
  the stream channel; a channel a reconnect closed before the call used it):
  :class:`MasterNotReachedError`. Any other failure (a reset,
  an end of stream, a timeout after the request went out) leaves unknown whether the master
  ran it, so it surfaces as before: a repeated ``Remove`` would answer OBJECT_NOT_FOUND for a
  removal that succeeded.

Between attempts :meth:`LeaderFollower.follow` re-reads the leader key: when it names another
master the client switches its gRPC and stream channels there at once; when it still names the
failed one (its lease has not run out yet) or none, the attempt waits one poll interval
(:data:`VIEW_CHANGE_POLL_INTERVAL_S`). Attempts stop at the retry deadline,
:data:`DEFAULT_RETRY_DEADLINE_S` unless configured (``MOONCAKE_PY_MASTER_RETRY_DEADLINE_S``, or
the client's ``retry_deadline_s``), measured from the first failure; the last failure is then
raised. Each attempt keeps the call's own timeout, so a call takes at most the retry deadline
plus one timeout. A plain ``host:port`` master is never
retried here (a single master has nowhere else to go).

Thread-safety: :class:`LeaderFollower` serializes switches with a lock; threads that failed
against the same connection cause one switch between them (a generation counter tells a thread
that another one switched meanwhile, so it retries at once without reading etcd again).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from mooncake_py.errors import UnavailableError

if TYPE_CHECKING:
    # Only typed here: plain ``host:port`` clients import this module but never etcd's stubs.
    from .leader_discovery import LeaderDiscovery, MasterView

log = logging.getLogger(__name__)

VIEW_CHANGE_POLL_INTERVAL_S = 0.2
"""Pause between two reads of the leader key while it names no live master (upstream's
``kViewChangePollInterval``)."""

# A master (or etcd endpoint) that comes back is dialed again soon, not after gRPC's default
# backoff (1 s growing to 120 s), which would outlast the lease that decides failover.
FAST_RECONNECT_OPTIONS: list[tuple[str, int]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

LEADER_LEASE_TTL_S = 5.0
"""The leader key's lease TTL the masters use (upstream's ``DEFAULT_MASTER_VIEW_LEASE_TTL_SEC``)."""

DEFAULT_RETRY_DEADLINE_S = 2 * LEADER_LEASE_TTL_S + 2.0
"""12 s: the dead leader's lease runs out (at most one TTL), a standby wins and starts serving
(up to another TTL), plus a margin for the reads and reconnects in between."""

RETRY_DEADLINE_ENV = "MOONCAKE_PY_MASTER_RETRY_DEADLINE_S"

_IDEMPOTENT = True
_ONLY_UNSENT = False

RETRY_POLICY: dict[str, tuple[bool, str]] = {
    # -- segments and liveness
    "Ping": (_IDEMPOTENT, "a probe; it only refreshes the client's TTL"),
    "ServiceReady": (_IDEMPOTENT, "reads the version and the stream port"),
    "MountSegment": (_IDEMPOTENT, "mounting a mounted segment answers OK"),
    "ReMountSegment": (_IDEMPOTENT, "OK at once for a client already registered"),
    "UnmountSegment": (_IDEMPOTENT, "unmounting an unknown segment answers OK"),
    # -- reads
    "GetReplicaList": (_IDEMPOTENT, "a read; a lease from a lost answer lapses at its TTL"),
    "BatchGetReplicaList": (_IDEMPOTENT, "as GetReplicaList, per key"),
    "EndReads": (_IDEMPOTENT, "a repeat can only answer LEASE_EXPIRED: the copy is distrusted"),
    "ExistKey": (_IDEMPOTENT, "a read; a lost existence hold lapses at its TTL"),
    "BatchExistKey": (_IDEMPOTENT, "as ExistKey, per key"),
    "ProbeKey": (_IDEMPOTENT, "a read that leases nothing"),
    "BatchProbeKey": (_IDEMPOTENT, "a read; its holds, if any, lapse at their TTL"),
    "GetStats": (_IDEMPOTENT, "a read"),
    "ListSegments": (_IDEMPOTENT, "a read"),
    "GetKvSession": (_IDEMPOTENT, "a read"),
    "ListKvSessionKeys": (_IDEMPOTENT, "a read of one page, named by its cursor"),
    "ListKvSessions": (_IDEMPOTENT, "a read of one page, named by its cursor"),
    "QueryTask": (_IDEMPOTENT, "a read"),
    # -- writes: ids make a repeat find what the lost first attempt did
    "PutStart": (
        _IDEMPOTENT,
        "its attempt id makes a repeat answer the write the first attempt started",
    ),
    "BatchPutStart": (_IDEMPOTENT, "as PutStart, per key"),
    "PutStartWithKvSessions": (_IDEMPOTENT, "as PutStart (the tags were added once)"),
    "BatchPutStartWithKvSessions": (_IDEMPOTENT, "as PutStart, per key"),
    "UpsertStart": (_IDEMPOTENT, "as PutStart: a repeat does not preempt its own write"),
    "BatchUpsertStart": (_IDEMPOTENT, "as UpsertStart, per key"),
    "UpsertStartWithKvSessions": (_IDEMPOTENT, "as UpsertStart"),
    "BatchUpsertStartWithKvSessions": (_IDEMPOTENT, "as UpsertStart, per key"),
    "PutEnd": (
        _IDEMPOTENT,
        "its write id makes a repeat safe: OK again for the write it ended, INVALID_WRITE "
        "rather than ending a later write of the key",
    ),
    "BatchPutEnd": (_IDEMPOTENT, "as PutEnd, per key"),
    "PutRevoke": (
        _IDEMPOTENT,
        "its write id makes a repeat change nothing: it finds nothing of that write in flight",
    ),
    "BatchPutRevoke": (_IDEMPOTENT, "as PutRevoke, per key"),
    # -- removals
    "Remove": (_ONLY_UNSENT, "a repeat answers OBJECT_NOT_FOUND for a removal that worked"),
    "BatchRemove": (_ONLY_UNSENT, "as Remove, per key"),
    "RemoveByRegex": (_ONLY_UNSENT, "a repeat counts 0 for keys the first attempt removed"),
    "RemoveAll": (_ONLY_UNSENT, "as RemoveByRegex"),
    "BatchReplicaClear": (_ONLY_UNSENT, "a repeat misreports the replicas already cleared"),
    # -- KV sessions: each changes session state
    "AttachKvSession": (_ONLY_UNSENT, "changes a session's members"),
    "PinKvSession": (_ONLY_UNSENT, "changes a session's pin"),
    "UnpinKvSession": (_ONLY_UNSENT, "changes a session's pin"),
    "UpdateKvSession": (_ONLY_UNSENT, "changes a session's members"),
    "CloseKvSession": (_ONLY_UNSENT, "a repeat answers SESSION_NOT_FOUND for a close that worked"),
    "ReleaseKvSession": (_ONLY_UNSENT, "removes objects; a repeat misreports what was released"),
    "ReleaseStaleKvSessions": (_ONLY_UNSENT, "as ReleaseKvSession"),
    "ReleaseAllKvSessions": (_ONLY_UNSENT, "as ReleaseKvSession"),
    "ReleaseKvCache": (_ONLY_UNSENT, "as ReleaseKvSession"),
    # -- replica tasks: each moves a task along
    "CreateCopyTask": (_ONLY_UNSENT, "a repeat creates a second task, or finds the first"),
    "CreateMoveTask": (_ONLY_UNSENT, "as CreateCopyTask"),
    "FetchTasks": (_ONLY_UNSENT, "hands tasks out: a lost answer's tasks would not come again"),
    "StartTask": (_ONLY_UNSENT, "reserves the task's targets"),
    "FinishTask": (_ONLY_UNSENT, "a repeat answers TASK_NOT_FOUND for a finish that worked"),
    "FetchDiskTasks": (_ONLY_UNSENT, "hands tasks and deletions out, never again"),
    "FinishDiskTasks": (_ONLY_UNSENT, "a repeat answers TASK_NOT_FOUND for a finish that worked"),
    "RegisterDiskReplicas": (_ONLY_UNSENT, "a repeat answers OBJECT_ALREADY_EXISTS"),
    "DemoteObjects": (_IDEMPOTENT, "a repeat finds the objects on disk already"),
    "DropDiskReplicas": (_IDEMPOTENT, "a repeat finds the replicas gone and changes nothing"),
}
"""Per RPC: (retried on any transport failure, why). An RPC missing here is treated as not
idempotent (retried only when it never reached a master)."""


def retried_on_any_failure(rpc_name: str) -> bool:
    """Whether ``rpc_name`` may be repeated after any transport failure (see the module
    docstring); False for RPCs that may be repeated only when they never reached a master."""
    policy = RETRY_POLICY.get(rpc_name)
    return policy is not None and policy[0]


class MasterNotReachedError(UnavailableError):
    """A call failed before reaching any master: no connection could be made (a refused
    connect), so the master certainly did not run it. Raised with code RPC_FAIL, like every
    transport failure; handlers of :class:`~mooncake_py.errors.MasterUnavailableError` see no
    difference."""


def grpc_never_reached(detail: str) -> bool:
    """Whether a gRPC UNAVAILABLE failure with ``detail`` means the request was never sent: the
    channel found no master to connect to. O(len(detail)).

    A master that lost the leadership while answering ("this master lost the leadership: the
    call's changes were not replicated") did run the call, and part of what it wrote may be in
    the log already, so that answer is not counted here: only idempotent RPCs repeat it.
    """
    return (
        "failed to connect to all addresses" in detail
        or "Connection refused" in detail
        # A master whose leadership ended refuses calls before running them.
        or "the call was not run" in detail
    )


def closed_channel(exc: ValueError) -> bool:
    """Whether gRPC raised ``exc`` because the call was made on a channel closed meanwhile (a
    reconnect replaced it): nothing was sent."""
    return "closed channel" in str(exc)


def retry_deadline_s(explicit: float | None = None) -> float:
    """The retry deadline in seconds: ``explicit``, else ``MOONCAKE_PY_MASTER_RETRY_DEADLINE_S``,
    else :data:`DEFAULT_RETRY_DEADLINE_S`.

    Raises:
        ValueError: the value is not a number >= 0.
    """
    if explicit is None:
        raw = os.environ.get(RETRY_DEADLINE_ENV, "")
        explicit = float(raw) if raw.strip() else DEFAULT_RETRY_DEADLINE_S
    if not explicit >= 0:  # also refuses NaN
        raise ValueError(f"the master retry deadline must be >= 0 s: {explicit}")
    return explicit


class LeaderFollower:
    """Keeps a client on the master etcd names as the leader.

    Args:
        discovery: reads the leader key.
        current_address: returns the address the client now calls.
        switch: points the client at a new address (its channels), called under the lock.
    """

    def __init__(
        self,
        discovery: LeaderDiscovery,
        current_address: Callable[[], str],
        switch: Callable[[str], None],
    ) -> None:
        self.discovery = discovery
        self._current_address = current_address
        self._switch = switch
        self._lock = threading.Lock()
        self.generation = 0
        """Counts switches; read before an attempt, it tells whether one happened since."""

    def _read_quietly(self) -> MasterView | None:
        try:
            return self.discovery.read_current_view()
        except UnavailableError as exc:
            log.debug("cannot read the leader: %s", exc)
            return None

    def follow(self, seen_generation: int, deadline: float) -> None:
        """After an attempt made at ``seen_generation`` failed: switch to the leader etcd names
        if it is another master, else wait one poll interval (never past ``deadline``).

        Returns at once when another thread switched since ``seen_generation``. Never raises
        for etcd failures (they count as "no leader named yet").

        Complexity: one etcd read (at most one per endpoint when some are down).
        """
        with self._lock:
            if self.generation != seen_generation:
                return
            view = self._read_quietly()
            if view is not None and view.leader_address != self._current_address():
                self._switch_to(view.leader_address)
                return
        time.sleep(max(0.0, min(VIEW_CHANGE_POLL_INTERVAL_S, deadline - time.monotonic())))

    def recheck(self) -> bool:
        """Switch to the leader etcd names now if it is another master; returns whether a
        switch happened. Never raises for etcd failures."""
        with self._lock:
            view = self._read_quietly()
            if view is None or view.leader_address == self._current_address():
                return False
            self._switch_to(view.leader_address)
            return True

    def reconnect(self) -> None:
        """Re-read the leader and point the client at it, also when it is the same master
        (a fresh connection); keeps the current address when etcd names none."""
        with self._lock:
            view = self._read_quietly()
            self._switch_to(view.leader_address if view is not None else self._current_address())

    def _switch_to(self, address: str) -> None:
        previous = self._current_address()
        self._switch(address)
        self.generation += 1
        if address != previous:
            log.info("following the leader master to %s (was %s)", address, previous)

    def close(self) -> None:
        """Close the etcd channels."""
        self.discovery.close()
