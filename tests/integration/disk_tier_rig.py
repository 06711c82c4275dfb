"""What the disk tier's integration tests share: driving a :mod:`.disk_host_worker` process,
the setup dicts of a segment owner with a disk tier and of a reader, and reading a tier's
directory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from mooncake_py.client.disk_tier_dir import OBJECTS_DIR
from tests.integration.client_worker import digest, value_for
from tests.line_worker import call_worker

REPO_ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def reader_config(address: str, **extra: Any) -> dict[str, Any]:
    """A client of ``address`` contributing no segment."""
    return {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": 0,
        "master_server_address": address,
        **extra,
    }


def host_config(
    address: str, segment_bytes: int, tier_root: Path | str, **extra: Any
) -> dict[str, Any]:
    """A client of ``address`` with a ``segment_bytes`` segment and a disk tier under
    ``tier_root``."""
    return {
        **reader_config(address),
        "global_segment_size": segment_bytes,
        "enable_ssd_offload": True,
        "ssd_offload_path": str(tier_root),
        **extra,
    }


def expected_digest(key: str, size: int = MIB) -> str:
    """The digest of the value the workers write under ``key``."""
    return digest(value_for(key, size))


def object_files(tier_root: Path | str) -> list[Path]:
    """Every complete object file under ``tier_root`` (all its tier directories)."""
    return sorted(Path(tier_root).glob(f"tier-*/{OBJECTS_DIR}/*"))


class DiskHostProcess:
    """A :mod:`.disk_host_worker` child in line mode, its stderr kept in ``log_path``.

    Args:
        log_path: where the child's stderr (its log) goes.
        env: extra environment variables.
    """

    def __init__(self, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self._log: IO[str] = open(log_path, "a")  # noqa: SIM115 - closed in stop/kill
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.disk_host_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=REPO_ROOT,
            env={**os.environ, **(env or {})},
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def call(self, op: str, **kwargs: Any) -> Any:
        """Run one operation in the child and return its result (raises on its error)."""
        return call_worker(self.process, op, **kwargs)

    def log_text(self) -> str:
        """What the child has logged so far."""
        self._log.flush()
        return self.log_path.read_text()

    def kill(self) -> None:
        """SIGKILL: nothing of the child's cleanup runs."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self._log.close()

    def stop(self) -> None:
        """Close the store (unmounting its segments) and wait; SIGKILL when it hangs."""
        if self.process.poll() is None:
            with contextlib.suppress(RuntimeError, BrokenPipeError, OSError):
                self.call("close")
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
