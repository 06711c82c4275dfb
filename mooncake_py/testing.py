"""Start real masters for tests and examples: in this process (port 0) or as a subprocess.

``InProcessMaster`` runs a :class:`MasterServer` on its own event loop in a background thread,
so synchronous test code and clients in the same process can use it. ``MasterProcess`` runs
``python -m mooncake_py.master`` and reads the chosen port from its first line of output.
:func:`wait_until` and :meth:`InProcessMaster.wait_for_leases_to_end` wait for state instead of
for a guessed length of time.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any

from mooncake_py.master import event_loop
from mooncake_py.master.clock import monotonic_clock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.server import MasterServer
from mooncake_py.master.service.facade import MasterService


class InProcessMaster:
    """A real gRPC master on 127.0.0.1, in a background thread of this process.

    Args:
        clock: time source (pass a ``FakeClock`` to drive leases and timeouts by hand).
        background: run the reaper and sweeper timers.
        **overrides: :class:`MasterConfig` fields (``port`` defaults to 0).

    Attributes:
        address: ``127.0.0.1:<port>`` once started.
        clock: the master's time source.
        service: the :class:`MasterService` behind it (call its steps and ``check()``).
    """

    def __init__(
        self,
        clock: Callable[[], float] = monotonic_clock,
        background: bool = True,
        **overrides: Any,
    ) -> None:
        overrides.setdefault("port", 0)
        overrides.setdefault("metrics_port", 0)
        overrides.setdefault("rpc_address", "127.0.0.1")
        self.config = MasterConfig(**overrides)
        self.clock = clock
        self._server = MasterServer(self.config, clock=clock, background=background)
        self._loop = event_loop.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="mooncake-master", daemon=True
        )
        self.address = ""

    @property
    def service(self) -> MasterService:
        """The service state of this master."""
        return self._server.service

    @property
    def metrics_port(self) -> int:
        """The HTTP port (metrics, admin paths, memory API, dashboard); 0 until started or
        when disabled."""
        return self._server.metrics_port

    def wait_for_leases_to_end(
        self, keys: Iterable[str], tenant: str = "default", timeout_s: float = 10.0
    ) -> None:
        """Return once no read lease or existence hold protects any of ``keys`` (an absent key
        holds none), so they may be removed and evicted again. Leases end when their readers
        end them, or at their TTL on the master's clock (with a ``FakeClock``, advance it).

        Raises:
            AssertionError: a lease still runs after ``timeout_s`` (real) seconds.
        """
        pending = list(keys)

        def leases_ended() -> bool:
            service = self.service
            service.sweep_expired_puts(self.clock())  # ends the leases whose TTL ran out
            return not any(service.is_leased(tenant, key) for key in pending)

        wait_until(leases_ended, timeout_s, what=f"the read leases of {len(pending)} key(s) end")

    def start(self) -> InProcessMaster:
        """Start serving; returns self."""
        self._thread.start()
        future: Future[int] = asyncio.run_coroutine_threadsafe(self._server.start(), self._loop)
        port = future.result(timeout=30)
        self.address = f"127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        """Stop serving and end the background thread."""
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._server.stop(0), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> InProcessMaster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class MasterProcess:
    """A master in a child process, listening on 127.0.0.1 on a free port.

    Args:
        args: extra command-line flags for the master.
        env: extra environment variables.
        wrapper: a command prefix to run the master under (e.g. ``ip netns exec host1``).

    Attributes:
        address: ``127.0.0.1:<gRPC port>`` once started.
        metrics_port: the HTTP port (metrics, memory API, dashboard) once started; 0 when
            disabled.
    """

    def __init__(
        self,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        wrapper: Sequence[str] = (),
    ) -> None:
        self._args = ["--port", "0", "--metrics_port", "0", "--rpc_address", "127.0.0.1", *args]
        self._env = {**os.environ, **(env or {})}
        # A command the master runs under (``ip netns exec NS`` for a test host of its own).
        self._wrapper = list(wrapper)
        self.process: subprocess.Popen[str] | None = None
        self.address = ""
        self.metrics_port = 0

    def start(self, timeout_s: float = 30.0, standby: bool = False) -> MasterProcess:
        """Launch and wait for the "listening on" line; returns self.

        Args:
            standby: an HA master: return once it stands by (prints "standing by") and
                read its "listening on" line later with :meth:`wait_leading`.

        Raises:
            RuntimeError: the master exited or did not report its port in time.
        """
        self.process = subprocess.Popen(
            [*self._wrapper, sys.executable, "-m", "mooncake_py.master", *self._args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self._env,
        )
        line = _readline_with_timeout(self.process, timeout_s)
        if standby:
            if "standing by" not in line:
                self.stop()
                raise RuntimeError(f"master did not stand by: {line!r}")
            return self
        return self._listening(line)

    def wait_leading(self, timeout_s: float = 30.0) -> MasterProcess:
        """For a master started with ``standby=True``: wait until it leads and serves.

        Raises:
            RuntimeError: it exited or did not report its port in time.
        """
        assert self.process is not None
        return self._listening(_readline_with_timeout(self.process, timeout_s))

    def _listening(self, line: str) -> MasterProcess:
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"master did not start: {line!r}{self._stderr_tail()}")
        found = re.search(r"listening on (\S+):(\d+)(?: http on port (\d+))?", line)
        if found is None:
            self.stop()
            raise RuntimeError(f"master did not report its port: {line!r}")
        host = found.group(1)
        if host in ("0.0.0.0", "::", "[::]"):
            host = "127.0.0.1"
        self.address = f"{host}:{found.group(2)}"
        self.metrics_port = int(found.group(3) or 0)
        return self

    def _stderr_tail(self, lines: int = 15) -> str:
        """The last lines the (stopped) child wrote to stderr, for an error message."""
        if self.process is None or self.process.poll() is None or self.process.stderr is None:
            return ""
        tail = self.process.stderr.read().splitlines()[-lines:]
        return ("; stderr:\n" + "\n".join(tail)) if tail else ""

    @property
    def pid(self) -> int:
        """The child's process id."""
        assert self.process is not None
        return self.process.pid

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Signal the child and wait for it; returns its exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def __enter__(self) -> MasterProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def wait_until(
    condition: Callable[[], object],
    timeout_s: float = 10.0,
    poll_s: float = 0.01,
    what: str = "the condition holds",
) -> None:
    """Return as soon as ``condition()`` is true, checking every ``poll_s`` seconds.

    Raises:
        AssertionError: still false after ``timeout_s`` seconds (``what`` names it).
    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting until {what}")
        time.sleep(poll_s)


def _readline_with_timeout(process: subprocess.Popen[str], timeout_s: float) -> str:
    result: list[str] = []
    reader = threading.Thread(
        target=lambda: result.append(process.stdout.readline() if process.stdout else "")
    )
    reader.daemon = True
    reader.start()
    reader.join(timeout_s)
    return result[0] if result else ""
