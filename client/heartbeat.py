"""The client's heartbeat: ping the master every second, remount when asked, reconnect.

A master that restarted, or expired this client, or a new leader that never knew it, answers
NEED_REMOUNT; the heartbeat then re-registers every segment the client holds, without the
caller doing anything. Each ping is one attempt (never retried: a failed ping counts as one,
as upstream's heartbeat counts them). After ``RECONNECT_AFTER_FAILURES`` consecutive failed
pings the channel is rebuilt: to the same address for a plain master, to the master etcd names
as the leader now for ``etcd://`` (upstream: "switch after 3 failed pings"). With ``etcd://``
the heartbeat also re-reads the leader every ``LEADER_RECHECK_EVERY`` beats while pings
succeed, so a client still answered by a master that lost the leadership moves to the new one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from mooncake_py.errors import MooncakeError
from mooncake_py.types import ClientStatus, SegmentInfo

from .master_rpc import MasterClient

log = logging.getLogger(__name__)

PING_INTERVAL_S = 1.0
RECONNECT_AFTER_FAILURES = 3
PING_TIMEOUT_S = 2.0
"""A ping unanswered this long counts as failed: a master that went silent (a partition
dropping its packets) is noticed in seconds, not after the client's call timeout."""
LEADER_RECHECK_EVERY = 5
"""Beats between two reads of the leader key while pings succeed (``etcd://`` masters)."""


class Heartbeat:
    """Background pinger for one client.

    Args:
        master: the master client.
        client_id: this client's id.
        segments: returns the segments to remount.
        interval_s: seconds between pings.
        housekeeping: called after each ping (local cleanup that needs no master).
        on_remounted: called after a remount the master accepted (a disk tier re-registers
            its files: the master may have forgotten them); its errors are logged.
    """

    def __init__(
        self,
        master: MasterClient,
        client_id: str,
        segments: Callable[[], Sequence[SegmentInfo]],
        interval_s: float = PING_INTERVAL_S,
        housekeeping: Callable[[], object] | None = None,
        on_remounted: Callable[[], object] | None = None,
    ) -> None:
        self._master = master
        self._client_id = client_id
        self._segments = segments
        self._housekeeping = housekeeping
        self._on_remounted = on_remounted
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._failures = 0
        self._beats = 0
        self.remounts = 0
        self.master_reachable = True
        self._thread = threading.Thread(target=self._run, name="mooncake-heartbeat", daemon=True)

    def start(self) -> None:
        """Start pinging."""
        self._thread.start()

    def beat(self) -> None:
        """One heartbeat: ping, and remount if the master asks; reconnect (following the
        leader) after repeated failures. Never raises."""
        self._beats += 1
        if self._beats % LEADER_RECHECK_EVERY == 0 and self._master.follow_leader_if_moved():
            self._failures = 0
        try:
            code, status, _ = self._master.call_once(
                "Ping", self._client_id, timeout_s=min(PING_TIMEOUT_S, self._master.timeout_s)
            )
            if code == 0 and status == ClientStatus.NEED_REMOUNT:
                code = self._master.remount_segments(self._client_id, self._segments())
                self.remounts += 1
                log.info("remounted segments (code %d)", code)
                if code == 0 and self._on_remounted is not None:
                    self._on_remounted()
        except MooncakeError as exc:
            self._failures += 1
            self.master_reachable = False
            log.debug("ping failed (%d in a row): %s", self._failures, exc)
            if self._failures % RECONNECT_AFTER_FAILURES == 0:
                self._master.reconnect()
            elif self._master.follow_leader_if_moved():
                # etcd already names another leader: no need to wait for more failures.
                self._failures = 0
            return
        self._failures = 0
        self.master_reachable = True
        if self._master.use_stream and not self._master.stream_connected:
            self._master.connect_stream()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.beat()
            if self._housekeeping is not None:
                try:
                    self._housekeeping()
                except Exception:
                    log.exception("client housekeeping failed")

    def stop(self) -> None:
        """Stop pinging and wait for the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
