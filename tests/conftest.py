"""Shared fixtures: real masters (in-process on port 0, and as a subprocess) and real client
processes, all on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mooncake_py import MooncakeDistributedStore
from mooncake_py.master.clock import FakeClock
from mooncake_py.testing import InProcessMaster, MasterProcess
from tests.conftest_etcd import etcd_cluster, etcd_server  # noqa: F401
from tests.line_worker import call_worker

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "integration" / "client_worker.py"


class ClientProcess:
    """A client in a child process, driven through ``client_worker.py``."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=REPO_ROOT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def call(self, op: str, **kwargs: Any) -> Any:
        """Run one operation in the child and return its result (raises on its error)."""
        return call_worker(self.process, op, **kwargs)

    def kill(self) -> None:
        """SIGKILL: no cleanup runs in the child."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(RuntimeError, BrokenPipeError, OSError):
                self.call("close")
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def master() -> Iterator[InProcessMaster]:
    """A real master in this process on a free port, with its background timers."""
    with InProcessMaster() as running:
        yield running
        running.service.check()


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def clocked_master(fake_clock: FakeClock) -> Iterator[InProcessMaster]:
    """A real master whose time only moves when the test advances ``fake_clock``."""
    with InProcessMaster(clock=fake_clock, background=False) as running:
        yield running
        running.service.check()


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[str]]]:
    """Worker processes a test starts (appends); killed and reaped after it."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


@pytest.fixture
def master_process() -> Iterator[MasterProcess]:
    """A real master as a child process."""
    with MasterProcess() as running:
        yield running


@pytest.fixture
def client_processes() -> Iterator[list[ClientProcess]]:
    """A list to append started :class:`ClientProcess` objects to; all stopped at the end."""
    started: list[ClientProcess] = []
    yield started
    for client in started:
        client.stop()


@pytest.fixture
def make_store() -> Iterator[Any]:
    """Factory of set-up in-process stores: ``make_store(master_address, segment_bytes)``."""
    stores: list[MooncakeDistributedStore] = []

    def make(address: str, segment_bytes: int = 64 << 20, **extra: Any) -> MooncakeDistributedStore:
        store = MooncakeDistributedStore()
        config = {
            "local_hostname": "127.0.0.1",
            "metadata_server": "P2PHANDSHAKE",
            "global_segment_size": segment_bytes,
            "master_server_address": address,
            **extra,
        }
        assert store.setup(config) == 0
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


def client_config(address: str, segment_bytes: int) -> dict[str, Any]:
    """A setup dict for a client of ``address`` contributing ``segment_bytes``."""
    return {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": segment_bytes,
        "master_server_address": address,
    }
