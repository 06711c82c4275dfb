"""Engine tests run only when asked for: ``MOONCAKE_PY_ENGINES=1``, in ``.engines-venv``.

Without the variable nothing here is collected, so the default ``pytest -q`` of the
repository neither runs nor fails these tests (their engines are not installed there).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from mooncake_py.testing import MasterProcess

ENABLED = os.environ.get("MOONCAKE_PY_ENGINES") == "1"

collect_ignore_glob = [] if ENABLED else ["*.py"]

if ENABLED:
    from tests.engines.common import EngineWorker, free_port


@pytest.fixture
def metrics_port() -> int:
    """The port the master serves ``/get_all_segments`` and ``/metrics`` on."""
    return free_port()


@pytest.fixture
def engine_master(metrics_port: int) -> Iterator[MasterProcess]:
    """A real master process on 127.0.0.1 with a known metrics port."""
    with MasterProcess(["--metrics_port", str(metrics_port)]) as running:
        yield running


@pytest.fixture
def workers() -> Iterator[list[EngineWorker]]:
    """A list to append started workers to; all released (exited) at the end."""
    started: list[EngineWorker] = []
    yield started
    for worker in reversed(started):
        worker.release()
