"""Upstream Mooncake Store for ``--compare-mooncake``: its virtual environment and its master.

Upstream's Python client comes from the PyPI wheel ``mooncake-transfer-engine-non-cuda``,
installed into a virtual environment of its own (default ``.bench-venv-mooncake/`` at the
repository root, so that nothing of it reaches mooncake-py's environment). The wheel needs
Debian's ``libibverbs1`` even when no RDMA device is used. Nothing is installed unless asked
(``--install-deps``): otherwise a missing piece is reported with the commands that add it.

The wheel ships ``mooncake_master``. :class:`UpstreamMaster` starts it on free loopback ports
with its HTTP metadata server enabled (clients then use ``http://127.0.0.1:<port>/metadata``)
and its metrics server bound to loopback too, and stops it by pid. Clients additionally need
``MC_TCP_BIND_ADDRESS=127.0.0.1`` (:data:`CLIENT_ENV`), without which they advertise a
non-loopback address.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from tests.bench.common import ROOT, free_port

PACKAGE = "mooncake-transfer-engine-non-cuda"
VERSION = "0.3.13.post1"
DEFAULT_VENV = ROOT / ".bench-venv-mooncake"
VENV_ENV = "MOONCAKE_BENCH_UPSTREAM_VENV"
APT_PACKAGE = "libibverbs1"
APT_COMMAND = f"apt-get update && apt-get install -y {APT_PACKAGE}"
CLIENT_ENV: dict[str, str | None] = {
    "MC_TCP_BIND_ADDRESS": "127.0.0.1",  # advertise and bind loopback only
}


class UpstreamUnavailable(RuntimeError):
    """Upstream cannot run here; the message says what is missing and how to add it."""


def default_venv() -> Path:
    """The upstream virtual environment: ``$MOONCAKE_BENCH_UPSTREAM_VENV`` or the default."""
    return Path(os.environ.get(VENV_ENV) or DEFAULT_VENV)


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def install_commands(venv: Path) -> list[str]:
    """What a user runs to make upstream available."""
    python = venv_python(venv)
    return [
        APT_COMMAND,
        f"python3.11 -m venv {venv}",
        f"{python} -m pip install '{PACKAGE}=={VERSION}' numpy",
    ]


def libibverbs_present() -> bool:
    """Whether the dynamic loader finds ``libibverbs.so.1``."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        listing = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
        if "libibverbs.so.1" in listing:
            return True
    return any(
        Path(d, "libibverbs.so.1").exists()
        for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64")
    )


def master_binary(venv: Path) -> Path | None:
    """The ``mooncake_master`` executable the wheel ships (the ELF, so that its pid is the
    master's own), else the console script."""
    for found in sorted(venv.glob("lib/python*/site-packages/mooncake/mooncake_master")):
        if found.is_file() and os.access(found, os.X_OK):
            return found
    script = venv / "bin" / "mooncake_master"
    return script if script.exists() else None


def probe(venv: Path) -> str:
    """Import upstream's store in its venv; "" when it loads, else the error text."""
    python = venv_python(venv)
    if not python.exists():
        return f"no virtual environment at {venv}"
    result = subprocess.run(
        [str(python), "-c", "import numpy, mooncake.store"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd="/",
    )
    return "" if result.returncode == 0 else (result.stderr.strip().splitlines() or ["?"])[-1]


def ensure(venv: Path, install_deps: bool, log: IO[str] = sys.stderr) -> Path:
    """Make sure upstream can run; returns the venv's python.

    Args:
        venv: the upstream virtual environment.
        install_deps: create the venv, pip-install the wheel and apt-get ``libibverbs1`` when
            missing; without it a missing piece raises.

    Raises:
        UpstreamUnavailable: something is missing (the message lists the commands to run) or an
            install step failed.
    """
    if install_deps:
        _install(venv, log)
    problem = probe(venv)
    if not problem and master_binary(venv) is None:
        problem = f"mooncake_master not found in {venv}"
    if problem:
        hint = "libibverbs1 is missing. " if not libibverbs_present() else ""
        raise UpstreamUnavailable(
            f"upstream Mooncake is not usable: {problem}\n{hint}"
            "Run (or pass --install-deps to let the benchmark run them):\n  "
            + "\n  ".join(install_commands(venv))
        )
    return venv_python(venv)


def unusable_reason(install_deps: bool = False) -> str:
    """ "" when upstream in the default venv can run (after installing it, with
    ``install_deps``); otherwise the first line of why not, for a report's "skipped" line."""
    try:
        ensure(default_venv(), install_deps=install_deps)
    except UpstreamUnavailable as exc:
        return str(exc).splitlines()[0]
    return ""


def _run(command: Sequence[str], log: IO[str]) -> None:
    print(f"[install] {' '.join(command)}", file=log, flush=True)
    result = subprocess.run(command, stdout=log, stderr=log, check=False)
    if result.returncode != 0:
        raise UpstreamUnavailable(f"{' '.join(command)} failed with {result.returncode}")


def _install(venv: Path, log: IO[str]) -> None:
    if not libibverbs_present():
        apt = shutil.which("apt-get")
        if apt is None or os.geteuid() != 0:
            raise UpstreamUnavailable(f"libibverbs1 is missing; as root run: {APT_COMMAND}")
        _run([apt, "update"], log)
        _run([apt, "install", "-y", APT_PACKAGE], log)
    python = venv_python(venv)
    if not python.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        _run([base, "-m", "venv", str(venv)], log)
    if probe(venv):
        _run([str(python), "-m", "pip", "install", "-q", f"{PACKAGE}=={VERSION}", "numpy"], log)


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


class UpstreamMaster:
    """Upstream's ``mooncake_master`` on 127.0.0.1 with its HTTP metadata server.

    Args:
        venv: the upstream virtual environment.
        log_path: where its output goes.
        lease_ms: ``default_kv_lease_ttl``.
        eviction: keep upstream's eviction defaults; False sets the high watermark to 1.0.

    Attributes:
        address: ``127.0.0.1:<rpc port>`` once started.
        metadata: the clients' ``metadata_server`` URL.
    """

    def __init__(self, venv: Path, log_path: Path, lease_ms: int, eviction: bool) -> None:
        binary = master_binary(venv)
        if binary is None:
            raise UpstreamUnavailable(f"mooncake_master not found in {venv}")
        self.binary = binary
        self.log_path = log_path
        self.lease_ms = lease_ms
        self.eviction = eviction
        self.process: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.metadata = ""

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def _args(self, rpc: int, http: int, metrics: int) -> list[str]:
        args = [
            str(self.binary),
            "--rpc_address=127.0.0.1",
            f"--rpc_port={rpc}",
            "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={http}",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={metrics}",
            "--enable_metric_reporting=false",
            f"--default_kv_lease_ttl={self.lease_ms}",
            "--logtostderr",
            "--minloglevel=1",
        ]
        if not self.eviction:
            args.append("--eviction_high_watermark_ratio=1.0")
        return args

    def start(self, timeout_s: float = 30.0, attempts: int = 3) -> UpstreamMaster:
        """Start on free ports and wait until its RPC and metadata ports accept connections.

        Raises:
            RuntimeError: it exited or stayed unreachable (after ``attempts`` tries on fresh
                ports, in case another program took a port in between).
        """
        problem = ""
        for _ in range(attempts):
            rpc, http, metrics = free_port(), free_port(), free_port()
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    self._args(rpc, http, metrics),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    cwd=self.log_path.parent,
                )
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self.process.poll() is None:
                if _accepts(rpc) and _accepts(http):
                    self.address = f"127.0.0.1:{rpc}"
                    self.metadata = f"http://127.0.0.1:{http}/metadata"
                    return self
                time.sleep(0.1)
            problem = f"exit status {self.process.poll()}"
            self.stop()
        tail = self.log_path.read_text(errors="replace").splitlines()[-10:]
        raise RuntimeError(f"upstream master did not start ({problem}):\n" + "\n".join(tail))

    def stop(self) -> int | None:
        """SIGTERM by pid, then SIGKILL; returns the exit status."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode
