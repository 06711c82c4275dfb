"""Doing the replica copy and move tasks the master assigns to this client.

A client that contributes a segment runs a :class:`TaskWorker`: a thread that asks the master
for the tasks assigned to it every ``POLL_INTERVAL_S`` (FetchTasks), and for each one
reserves the targets and gets the source's descriptor (StartTask), copies the source replica
(in its own segment) into every target (shared memory on one host, the target owner's TCP
transfer service otherwise), then reports the outcome (FinishTask), which makes the copies
visible (a move also retires its source) or frees the reservation. A task the master cannot
start has already been failed by it. The worker never raises; a failed copy fails its task.

Asking for tasks is :class:`~mooncake_py.client.api_tasks.TaskCalls`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from mooncake_py.errors import ErrorCode, MooncakeError
from mooncake_py.types import ReplicaDescriptor

from .data_plane import DataPlane, WriteItem
from .master_rpc import MasterClient

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.2
"""How often a worker asks the master for tasks."""

FETCH_BATCH = 16
"""Tasks asked for per poll."""


class TaskWorker:
    """Runs the replica tasks the master assigns to this client, on a thread of its own.

    Args:
        master: the master connection.
        client_id: this client's id (tasks are assigned to it).
        data: the data plane that reaches the source (this client's segment) and the targets.
        interval_s: seconds between polls.

    Thread-safety: :meth:`start` and :meth:`stop` from one thread; the work runs on its own.
    """

    def __init__(
        self,
        master: MasterClient,
        client_id: str,
        data: DataPlane,
        interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        self._master = master
        self._client_id = client_id
        self._data = data
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.done = 0  # tasks this worker finished (either way), for tests and metrics
        self._thread = threading.Thread(target=self._run, name="mooncake-tasks", daemon=True)

    def start(self) -> None:
        """Start polling."""
        self._thread.start()

    def stop(self) -> None:
        """Stop polling; a task in progress finishes first."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                task_ids = self._master.fetch_tasks(self._client_id, FETCH_BATCH)
            except MooncakeError as exc:
                log.debug("fetching tasks failed: %s", exc)
                continue
            for task_id in task_ids:
                self.run_one(task_id)

    def run_one(self, task_id: str) -> None:
        """Start, copy and finish one fetched task. Never raises."""
        try:
            started = self._master.start_task(self._client_id, task_id)
            if started.code != ErrorCode.OK or started.source is None:
                return  # the master failed it already (or it is not ours)
            message = ""
            if started.targets:
                message = self._copy(started.source, started.targets)
            self._master.finish_task(self._client_id, task_id, not message, message)
            self.done += 1
        except MooncakeError as exc:
            # The master fails the task when it overstays; nothing else to undo here.
            log.warning("replica task %s: %s", task_id, exc)

    def _copy(self, source: ReplicaDescriptor, targets: Sequence[ReplicaDescriptor]) -> str:
        """Copy the source replica into every target; "" or why it failed."""
        view = self._data.own_memory_of(source)
        if view is None:
            return "the source replica is not in this client's segment"
        codes = self._data.write([WriteItem(targets, [view])])
        return "" if codes == [0] else f"writing the copies failed ({codes[0]})"
