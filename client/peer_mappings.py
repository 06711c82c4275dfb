"""Peers' side of same-host shared memory: one mapping per segment, handed over on first use.

A reader or writer whose replica lives on this host (same ``host_id``) and whose capability
allows MAP asks the segment's owner for its memory once (:func:`.local_share.request_handover`)
and then copies straight into or out of the mapping. Failures (no owner socket here: another
host; a refusal; a bad proof) are remembered for a short while, during which the caller uses
TCP. Mappings of owners that died or stopped serving are dropped by :meth:`PeerMappings.prune`
(heartbeat housekeeping), so a reader does not keep a dead owner's memory alive.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .local_share import Handover, HandoverRefused, request_handover, socket_name
from .segment import MappedMemory

log = logging.getLogger(__name__)


FAILURE_MEMORY_S = 5.0
"""After a failed handover a peer uses TCP for that segment for this long before it asks the
owner again (no socket here means another host: asking on every op would cost a syscall)."""
_MAX_FAILURES = 4096


@dataclass(slots=True)
class _Peer:
    handover: Handover

    def owner_alive(self) -> bool:
        """Whether the owner process still lives (its pidfd, else its pid). Never raises."""
        handover = self.handover
        if handover.owner_pidfd >= 0:
            # A pidfd polls readable once its process has exited (poll: any fd number).
            poller = select.poll()
            poller.register(handover.owner_pidfd, select.POLLIN)
            return not poller.poll(0)
        return handover.owner_pid <= 0 or _process_alive(handover.owner_pid)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, under another uid
        return True
    return True


def _name_bound(segment_id: str) -> bool:
    """Whether some process listens under the segment's name (a connect that is accepted or
    queued); the owner sees a connection that closes without a request."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect(socket_name(segment_id))
        except (BlockingIOError, InterruptedError):  # backlog full: someone listens
            return True
        except OSError:  # ECONNREFUSED: unbound
            return False
    return True


class PeerMappings:
    """Mappings of other clients' segments on this host, handed over on first use and cached
    per segment id. Thread-safe.

    A segment's id is fresh at every mount, so a mapping can never be taken for a newer
    segment of the same owner. Failed handovers are remembered for :data:`FAILURE_MEMORY_S`.

    Args:
        clock: monotonic seconds (failures are remembered on it).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._handover_lock = threading.Lock()  # one handover at a time: they are rare
        self._by_segment: dict[str, _Peer] = {}
        self._failed_until: dict[str, float] = {}
        self.handovers = 0
        """Handovers that succeeded (a counter, for tests and stats)."""

    def get(self, segment_id: str, cap: bytes, size_at_least: int) -> MappedMemory | None:
        """The mapping of ``segment_id``, asking its owner with ``cap`` the first time.

        Args:
            segment_id: the segment, as in the replica.
            cap: the replica's capability (it must allow MAP: :func:`allows_map`).
            size_at_least: bytes the caller needs mapped (the replica's end).

        Returns:
            The mapping, or None: no owner on this host, a refusal, a bad proof, a mapping too
            small, or a failure remembered from less than :data:`FAILURE_MEMORY_S` ago; the
            caller then uses TCP. Complexity: a dict look-up under a lock once mapped; one
            handover (a few syscalls, a connect) the first time.
        """
        # The hot path takes no lock: a dict read is atomic, and writers replace entries whole.
        peer = self._by_segment.get(segment_id)
        if peer is not None:
            memory = peer.handover.memory
            return memory if memory.size >= size_at_least else None
        until = self._failed_until.get(segment_id)
        if until is not None and self._clock() < until:
            return None
        with self._handover_lock:
            with self._lock:
                peer = self._by_segment.get(segment_id)
            if peer is None:
                peer = self._hand_over(segment_id, cap)
            if peer is None:
                return None
            memory = peer.handover.memory
            return memory if memory.size >= size_at_least else None

    def _hand_over(self, segment_id: str, cap: bytes) -> _Peer | None:
        try:
            handover = request_handover(segment_id, cap)
        except (OSError, HandoverRefused) as exc:
            log.debug("no shared memory for segment %s (TCP instead): %s", segment_id, exc)
            with self._lock:
                now = self._clock()
                if len(self._failed_until) >= _MAX_FAILURES:
                    self._failed_until = {s: t for s, t in self._failed_until.items() if t > now}
                self._failed_until[segment_id] = now + FAILURE_MEMORY_S
            return None
        peer = _Peer(handover)
        with self._lock:
            self._by_segment[segment_id] = peer
            self._failed_until.pop(segment_id, None)
            self.handovers += 1
        return peer

    def mapped_segments(self) -> list[str]:
        """The segment ids mapped now."""
        with self._lock:
            return list(self._by_segment)

    def owner_pid(self, segment_id: str) -> int | None:
        """The pid of a mapped segment's owner (SO_PEERCRED at handover), None if unmapped."""
        with self._lock:
            peer = self._by_segment.get(segment_id)
        return None if peer is None else peer.handover.owner_pid

    def forget(self, segment_id: str) -> None:
        """Drop a segment's mapping (its owner went away). It is not unmapped here: a transfer
        of another thread may be copying through it right now (a view or a raw address), so
        it unmaps when the last of them lets go of it, at once when none does. The memory is
        freed once nobody maps it."""
        with self._lock:
            peer = self._by_segment.pop(segment_id, None)
        if peer is not None:
            _close_pidfd(peer.handover)

    def prune(self) -> list[str]:
        """Forget the mappings whose owner died or stopped serving the segment, so this
        process does not keep a gone owner's memory alive (heartbeat housekeeping).

        Returns:
            The segment ids forgotten. Complexity: O(mappings): a poll of the owner's pidfd
            and a connect to its name each. Never raises.
        """
        with self._lock:
            peers = list(self._by_segment.items())
        gone = [sid for sid, peer in peers if not peer.owner_alive() or not _name_bound(sid)]
        for segment_id in gone:
            self.forget(segment_id)
        return gone

    def close(self) -> None:
        """Drop every mapping."""
        with self._lock:
            peers = list(self._by_segment.values())
            self._by_segment.clear()
        for peer in peers:
            _release(peer.handover)


def _release(handover: Handover) -> None:
    handover.memory.close()
    _close_pidfd(handover)


def _close_pidfd(handover: Handover) -> None:
    if handover.owner_pidfd >= 0:
        with contextlib.suppress(OSError):
            os.close(handover.owner_pidfd)
        handover.owner_pidfd = -1
