"""Shared helpers of the store benchmark: sizes, statistics and JSON-lines child processes.

Every child the benchmark starts is a :class:`Child`: a ``python -m tests.bench.<module>``
process that prints one JSON object per line on stdout and reads commands (one JSON object per
line) on stdin. Children exit when their stdin closes, so a parent that dies abruptly does not
leave them behind; :meth:`Child.stop` ends one by its pid (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
ROOT = Path(__file__).resolve().parents[2]
FORCE_TCP_ENV = "MOONCAKE_PY_FORCE_TCP"


def size_label(size: int) -> str:
    """``1MiB``, ``256KiB``, ``64B``."""
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if size >= unit and size % unit == 0:
            return f"{size // unit}{name}"
    return f"{size}B"


def latency_summary(times_s: Sequence[float]) -> dict[str, float]:
    """Per-call latency figures in microseconds (p50, p90, p99, mean, min, max) and the count."""
    if not times_s:
        return {"calls": 0}
    us = np.asarray(times_s, dtype=np.float64) * 1e6
    return {
        "calls": int(us.size),
        "p50_us": float(np.percentile(us, 50)),
        "p90_us": float(np.percentile(us, 90)),
        "p99_us": float(np.percentile(us, 99)),
        "mean_us": float(us.mean()),
        "min_us": float(us.min()),
        "max_us": float(us.max()),
    }


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence (0.0 for an empty one)."""
    return float(np.median(np.asarray(values, dtype=np.float64))) if len(values) else 0.0


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """The 25th and 75th percentiles of the reps (both the value itself for one rep)."""
    if not len(values):
        return 0.0, 0.0
    q1, q3 = np.percentile(np.asarray(values, dtype=np.float64), [25, 75])
    return float(q1), float(q3)


def relative_spread(values: Sequence[float]) -> float | None:
    """Half the interquartile range over the median (0.05 = "+-5%"); None below 2 reps."""
    mid = median(values)
    if len(values) < 2 or mid <= 0:
        return None
    q1, q3 = quartiles(values)
    return (q3 - q1) / 2 / mid


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for programs that cannot be told to pick one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ChildError(RuntimeError):
    """A child process failed, answered with an error, or did not answer in time."""


class Child:
    """A JSON-lines child process: ``python -m <module> [args]`` run from the repository root.

    Args:
        name: label used in messages and the log file name.
        module: the module to run.
        args: extra command-line arguments.
        env: environment changes; a value of None removes the variable.
        log_dir: where the child's stderr goes (``<log_dir>/<name>.log``).
        python: the interpreter (default: this one); upstream's workers run in their own venv.
    """

    def __init__(
        self,
        name: str,
        module: str,
        args: Sequence[str] = (),
        env: dict[str, str | None] | None = None,
        log_dir: Path | None = None,
        python: str | None = None,
    ) -> None:
        self.name = name
        environment = dict(os.environ)
        for key, value in (env or {}).items():
            if value is None:
                environment.pop(key, None)
            else:
                environment[key] = value
        self.log_path = (log_dir / f"{name}.log") if log_dir is not None else None
        self._log: IO[bytes] | None = open(self.log_path, "wb") if self.log_path else None  # noqa: SIM115
        self.process = subprocess.Popen(
            [python or sys.executable, "-m", module, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log if self._log is not None else subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
            env=environment,
        )
        self.pid = self.process.pid
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"bench-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        for line in stdout:
            self._lines.put(line)
        self._lines.put("")

    def receive(self, timeout_s: float) -> dict[str, Any]:
        """The next JSON line from the child.

        Raises:
            ChildError: the child exited, sent an error, or stayed silent for ``timeout_s``.
        """
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise ChildError(f"{self.name}: no answer within {timeout_s:.0f} s") from None
        if not line:
            raise ChildError(f"{self.name} exited ({self.process.poll()}); {self.log_tail()}")
        message: dict[str, Any] = json.loads(line)
        if "error" in message:
            raise ChildError(f"{self.name}: {message['error']}")
        return message

    def send(self, **command: Any) -> None:
        """Send one command without waiting (collect the answer with :meth:`receive`)."""
        stdin = self.process.stdin
        if stdin is None or self.process.poll() is not None:
            raise ChildError(f"{self.name} is not running; {self.log_tail()}")
        stdin.write(json.dumps(command) + "\n")
        stdin.flush()

    def call(self, timeout_s: float = 300.0, **command: Any) -> dict[str, Any]:
        """Send one command and wait for its answer."""
        self.send(**command)
        return self.receive(timeout_s)

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of the child's stderr log, for error messages."""
        if self.log_path is None or not self.log_path.exists():
            return "no log"
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return "log tail:\n" + "\n".join(text) if text else "empty log"

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """Close stdin (the child's cue to clean up and exit), then SIGTERM and SIGKILL by pid."""
        process = self.process
        if process.poll() is None and process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=timeout_s)
        if process.poll() is None:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        if process.poll() is None:
            process.kill()
            process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return process.returncode


def reply(stream: IO[str], message: dict[str, Any]) -> None:
    """Child side: write one JSON line and flush."""
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def protocol_stdout() -> IO[str]:
    """Child side: a private handle on the real stdout, with ``sys.stdout`` sent to stderr.

    Anything a library prints then cannot corrupt the JSON-lines protocol.
    """
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return protocol
