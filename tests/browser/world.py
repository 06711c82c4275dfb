"""A store for the dashboard to show: a real master in this process (gRPC and HTTP on free
ports) and real client processes that mount a segment each and write session-tagged objects.

Used by the browser tests and by ``python -m tests.browser.screenshot``.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mooncake_py.testing import InProcessMaster
from tests.line_worker import call_worker

REPO_ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
DISK_QUOTA = 256 * MIB


class SessionClient:
    """A client in a child process (``tests.browser.session_worker``) with one segment.

    Args:
        master_address: the master's gRPC ``host:port``.
        segment_bytes: the segment it mounts.
        token: its Bearer token, for a master with ``--auth_tokens_file``.
        disk_root: a directory for a disk tier of :data:`DISK_QUOTA` bytes ("" for none).

    Raises:
        RuntimeError: its setup failed (or, on :meth:`call`, the operation failed).
    """

    def __init__(
        self, master_address: str, segment_bytes: int, token: str = "", disk_root: str = ""
    ) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.browser.session_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
        )
        config: dict[str, Any] = {
            "local_hostname": "127.0.0.1",
            "metadata_server": "P2PHANDSHAKE",
            "global_segment_size": segment_bytes,
            "master_server_address": master_address,
        }
        if token:
            config["auth_token"] = token
        if disk_root:
            config.update(
                enable_ssd_offload=True, ssd_offload_path=disk_root, ssd_offload_quota=DISK_QUOTA
            )
        code = self.call("setup", config=config, buffer_bytes=MIB)
        if code != 0:
            self.stop()
            raise RuntimeError(f"client setup failed with {code}")

    def call(self, op: str, **kwargs: Any) -> Any:
        """Run one operation in the child; returns its result."""
        return call_worker(self.process, op, **kwargs)

    def put(self, key: str, size: int, *sessions: str) -> None:
        """Write ``key`` (``size`` bytes) as a member of ``sessions``."""
        code = self.call("put_tagged", key=key, size=size, sessions=list(sessions))
        if code != 0:
            raise RuntimeError(f"put {key!r} failed with {code}")

    def stop(self) -> None:
        """Close the store (unmounting its segment) and wait for the process to end."""
        if self.process.poll() is None:
            with contextlib.suppress(RuntimeError, BrokenPipeError, OSError):
                self.call("close")
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class World:
    """A running master and its clients.

    Attributes:
        master: the in-process master.
        base_url: ``http://127.0.0.1:<http port>`` (the dashboard and the memory API).
        clients: the client processes, one segment each.
        token: the Bearer token the memory API needs ("" without tokens).
    """

    master: InProcessMaster
    base_url: str
    clients: list[SessionClient] = field(default_factory=list)
    token: str = ""

    def get(self, path: str) -> Any:
        """GET a memory API path; returns its parsed JSON (raises on an error status)."""
        request = urllib.request.Request(self.base_url + path)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.loads(reply.read())

    def all_sessions(self, limit: int = 1000) -> list[dict[str, Any]]:
        """Every session of the listing, following ``next_cursor`` over pages of ``limit``
        (one page, the default, has every ``idle_ms`` as of the same instant)."""
        sessions: list[dict[str, Any]] = []
        cursor = ""
        while True:
            page = self.get(f"/v1/memory/sessions?limit={limit}&cursor={cursor}")
            sessions += page["sessions"]
            cursor = page["next_cursor"]
            if not cursor:
                return sessions


# (key, size, sessions) written by the first client, then by the second. "shared" belongs to
# both alpha and beta, so their exclusive bytes are a MiB below their bytes; every size is a
# multiple of the allocator's alignment, so freed bytes equal these sizes exactly.
FIRST_WRITES: Sequence[tuple[str, int, tuple[str, ...]]] = (
    ("shared-prefix", 1 * MIB, ("conv-alpha", "conv-beta")),
    ("alpha-0", 3 * MIB, ("conv-alpha",)),
    ("beta-0", 2 * MIB, ("conv-beta",)),
)
SECOND_WRITES: Sequence[tuple[str, int, tuple[str, ...]]] = (
    ("gamma-0", 2 * MIB, ("conv-gamma",)),
    ("gamma-1", MIB // 2, ("conv-gamma",)),
    ("delta-0", 5 * MIB, ("conv-delta",)),
    ("epsilon-0", MIB // 4, ("conv-epsilon",)),
)
PINNED = "conv-gamma"


@contextlib.contextmanager
def running_world(
    segment_bytes: int = 32 * MIB,
    clients: int = 2,
    tokens_file: str = "",
    token: str = "",
    occupancy_sample_sec: float = 5.0,
    disk_root: str = "",
) -> Iterator[World]:
    """A master with ``clients`` client processes mounted, nothing written yet.

    Args:
        segment_bytes: each client's segment.
        clients: how many client processes (segments).
        tokens_file: the master's ``--auth_tokens_file`` ("" for none).
        token: the clients' (and :meth:`World.get`'s) token.
        occupancy_sample_sec: the master's occupancy sampling period.
        disk_root: give each client a disk tier in a directory of its own under this one
            ("" for none).
    """
    overrides: dict[str, Any] = {"occupancy_sample_sec": occupancy_sample_sec}
    if tokens_file:
        overrides["auth_tokens_file"] = tokens_file
    with InProcessMaster(**overrides) as master:
        port = master._server.metrics_port  # noqa: SLF001 - the bound HTTP port
        world = World(master, f"http://127.0.0.1:{port}", token=token)
        try:
            for index in range(clients):
                disk = str(Path(disk_root) / f"client-{index}") if disk_root else ""
                world.clients.append(SessionClient(master.address, segment_bytes, token, disk))
            yield world
        finally:
            for client in world.clients:
                client.stop()


def write_sessions(world: World) -> None:
    """Write the five sessions of :data:`FIRST_WRITES` and :data:`SECOND_WRITES`, spread over
    the clients, and pin :data:`PINNED`."""
    # Pauses between steps keep the sessions' last-token times (and so their idle times) far
    # enough apart that ordering by idle time has no ties, even across listing pages read a
    # few ms apart.
    for key, size, sessions in FIRST_WRITES:
        world.clients[0].put(key, size, *sessions)
        time.sleep(0.05)
    for key, size, sessions in SECOND_WRITES:
        world.clients[-1].put(key, size, *sessions)
        time.sleep(0.05)
    world.clients[0].call("pin", session_id=PINNED)
