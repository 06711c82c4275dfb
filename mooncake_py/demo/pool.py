"""The demo's engine-worker processes: spawned, each serving job lists over a pipe."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from mooncake_py.demo.worker import Job, WorkerSpec, worker_main


class DemoError(RuntimeError):
    """The demo could not run, or a worker failed (a wrong page read included)."""


class WorkerPool:
    """Engine-worker processes (spawned), each serving job lists over a pipe.

    Attributes:
        disk_tier: every worker mounts a disk tier (its spec names a ``disk_dir``).
    """

    def __init__(self, specs: Sequence[WorkerSpec]) -> None:
        self.disk_tier = bool(specs) and all(spec.disk_dir is not None for spec in specs)
        context = multiprocessing.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[BaseProcess] = []
        for spec in specs:
            parent, child = context.Pipe()
            proc = context.Process(
                target=worker_main, args=(spec, child), name=f"demo-worker-{spec.rank}"
            )
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        try:
            for rank, conn in enumerate(self._conns):
                self._answer(rank, conn, timeout_s=60.0)
        except BaseException:
            self.stop()
            raise

    def _answer(self, rank: int, conn: Connection, timeout_s: float = 300.0) -> Any:
        if not conn.poll(timeout_s):
            raise DemoError(f"worker {rank} did not answer within {timeout_s:.0f} s")
        try:
            status, payload = conn.recv()
        except EOFError as exc:
            raise DemoError(f"worker {rank} died (exit {self._procs[rank].exitcode})") from exc
        if status == "error":
            raise DemoError(f"worker {rank} failed:\n{payload}")
        return payload

    def dispatch(self, jobs: Sequence[Sequence[Job]]) -> list[list[Any]]:
        """Send each worker its jobs, wait for all; outcomes per worker, in job order.

        Raises:
            DemoError: a worker failed (its traceback is in the message) or died.
        """
        busy = [rank for rank, batch in enumerate(jobs) if batch]
        for rank in busy:
            self._conns[rank].send(list(jobs[rank]))
        outcomes: list[list[Any]] = [[] for _ in jobs]
        for rank in busy:
            outcomes[rank] = self._answer(rank, self._conns[rank])
        return outcomes

    def stop(self) -> None:
        """Ask every worker to leave the store and exit; kill those that do not. Idempotent."""
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        for proc in self._procs:
            proc.join(timeout=15)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []
