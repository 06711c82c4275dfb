"""Real etcd servers for tests: one member (:class:`EtcdServer`) or a loopback cluster
(:class:`EtcdCluster`), each on free ports of 127.0.0.1 with its own temporary data dir.

The members run Debian's ``etcd-server`` (``/usr/bin/etcd``, or ``$MOONCAKE_PY_ETCD``) with
fsync on: the log store's durability is what the tests exercise. Small raft heartbeat and
election timeouts keep start-up and leader changes short (a single member is ready in about
0.1 s on a laptop disk).

When the binary is missing the caller is skipped (``pytest.skip``), unless
``MOONCAKE_PY_REQUIRE_ETCD=1``, in which case it fails (CI installs etcd and sets it).

Thread-safety: none; a server or cluster is driven from the test's thread.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import pytest

from mooncake_py.client.leader_discovery import LeaderDiscovery

ETCD_BINARY = os.environ.get("MOONCAKE_PY_ETCD", "/usr/bin/etcd")
READY_TIMEOUT_S = 15.0
"""How long a member may take to answer ``/health``; a generous bound for loaded CI hosts."""


def etcd_binary() -> str:
    """The etcd executable, or skip (fail when ``MOONCAKE_PY_REQUIRE_ETCD=1``) if absent."""
    if os.path.isfile(ETCD_BINARY) and os.access(ETCD_BINARY, os.X_OK):
        return ETCD_BINARY
    message = f"etcd is not installed at {ETCD_BINARY} (Debian package etcd-server)"
    if os.environ.get("MOONCAKE_PY_REQUIRE_ETCD") == "1":
        pytest.fail(message)
    pytest.skip(message)


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that were free on 127.0.0.1 a moment ago.

    All sockets stay bound until every port is chosen, so the ports differ from each other;
    another process may still take one before etcd binds it (rare on a test host).
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class EtcdServer:
    """One etcd member on 127.0.0.1 (a context manager: started on enter, killed and its data
    dir removed on exit).

    Args:
        name: the member's name.
        client_port, peer_port: the ports to listen on (free ones when None).
        initial_cluster: ``name=peer_url,...`` of every member, for a cluster member; None
            for a single-member cluster.
        data_root: the directory to hold the data dir and log; a fresh temporary directory
            (removed on exit) when None.
        heartbeat_ms, election_ms: raft's ``--heartbeat-interval`` and ``--election-timeout``.
    """

    def __init__(
        self,
        name: str = "member0",
        *,
        client_port: int | None = None,
        peer_port: int | None = None,
        initial_cluster: str | None = None,
        data_root: Path | None = None,
        heartbeat_ms: int = 10,
        election_ms: int = 100,
    ) -> None:
        self.binary = etcd_binary()
        if client_port is None or peer_port is None:
            client_port, peer_port = free_ports(2)
        self.name = name
        self.client_port = client_port
        self.peer_port = peer_port
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self._owns_root = data_root is None
        self.root = Path(tempfile.mkdtemp(prefix="etcd-")) if data_root is None else data_root
        self.data_dir = self.root / f"{name}.etcd"
        self.log_path = self.root / f"{name}.log"
        self.initial_cluster = initial_cluster or f"{name}={self.peer_url}"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT`` of the client port."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def command(self) -> list[str]:
        """The etcd command line of this member."""
        return [
            self.binary,
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={self.initial_cluster}",
            "--initial-cluster-state=new",
            f"--heartbeat-interval={self.heartbeat_ms}",
            f"--election-timeout={self.election_ms}",
            "--logger=zap",
            "--log-level=warn",
        ]

    def launch(self) -> None:
        """Start the process without waiting for it to be ready (see :meth:`wait_ready`)."""
        if self.running:
            raise RuntimeError(f"etcd {self.name} is already running")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def healthy(self) -> bool:
        """Whether the member answers ``/health`` with a leader in its cluster."""
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1.0) as response:
                return b'"true"' in response.read()
        except (OSError, urllib.error.URLError):
            return False

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Block until the member is healthy.

        Raises:
            RuntimeError: the process exited, or was not healthy within ``timeout_s``; the
                message carries the end of its log.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"etcd {self.name} exited:\n{self.log_tail()}")
            if self.healthy():
                return
            time.sleep(0.01)
        raise RuntimeError(f"etcd {self.name} not healthy after {timeout_s} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self) -> None:
        """Start the member (keeping its data dir) and wait until it is healthy."""
        self.launch()
        self.wait_ready()

    def kill(self) -> None:
        """SIGKILL the member (no shutdown runs) and reap it; a no-op when not running."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """Stop the member cleanly (SIGTERM), SIGKILL after 10 s; a no-op when not running."""
        self._signal(signal.SIGTERM)

    def restart(self) -> None:
        """SIGKILL the member, then start it again on the same ports and data dir."""
        self.kill()
        self.start()

    def _signal(self, signum: int) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signum)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def close(self) -> None:
        """Kill the member and remove the temporary directory it owns."""
        self.kill()
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> EtcdServer:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class EtcdCluster:
    """``n`` etcd members on loopback forming one cluster (a context manager).

    Args:
        n: the number of members.
        heartbeat_ms, election_ms: raft timing, larger than a single member's so that a
            loaded host does not trigger spurious elections.
    """

    def __init__(self, n: int = 3, *, heartbeat_ms: int = 25, election_ms: int = 250) -> None:
        etcd_binary()
        ports = free_ports(2 * n)
        self.root = Path(tempfile.mkdtemp(prefix="etcd-cluster-"))
        names = [f"member{i}" for i in range(n)]
        initial = ",".join(
            f"{name}=http://127.0.0.1:{ports[2 * i + 1]}" for i, name in enumerate(names)
        )
        self.members: list[EtcdServer] = [
            EtcdServer(
                name,
                client_port=ports[2 * i],
                peer_port=ports[2 * i + 1],
                initial_cluster=initial,
                data_root=self.root,
                heartbeat_ms=heartbeat_ms,
                election_ms=election_ms,
            )
            for i, name in enumerate(names)
        ]

    @property
    def endpoints(self) -> str:
        """Every member's client endpoint, as a master address: ``etcd://h:p;h:p;...``."""
        return "etcd://" + ";".join(member.endpoint for member in self.members)

    def stop(self, index: int) -> None:
        """Stop member ``index`` (SIGTERM); its data dir stays."""
        self.members[index].stop()

    def kill(self, index: int) -> None:
        """SIGKILL member ``index``; its data dir stays."""
        self.members[index].kill()

    def start(self, index: int) -> None:
        """Start member ``index`` again from its data dir and wait until it is healthy."""
        self.members[index].start()

    def running_members(self) -> Sequence[EtcdServer]:
        return [member for member in self.members if member.running]

    def close(self) -> None:
        for member in self.members:
            member.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> EtcdCluster:
        try:
            # Members wait for each other's votes, so all are launched before any is awaited.
            for member in self.members:
                member.launch()
            for member in self.members:
                member.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        with contextlib.suppress(OSError):
            self.close()


def leader_address(endpoints: str, cluster_id: str) -> str:
    """The leader's ``host:port`` now ("" while no master leads), read as a client reads it
    (:class:`~mooncake_py.client.leader_discovery.LeaderDiscovery`) from ``endpoints``
    (``h:p[;h:p]``).

    Raises:
        UnavailableError: no endpoint answered.
    """
    discovery = LeaderDiscovery(f"etcd://{endpoints}", cluster_id)
    try:
        view = discovery.read_current_view()
    finally:
        discovery.close()
    return view.leader_address if view is not None else ""
