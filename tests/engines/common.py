"""Test-side helpers: engine worker processes and the environment they run in."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests.engines.worker_io import RESULT_PREFIX

ENGINES_DIR = Path(__file__).resolve().parent
SHIM_DIR = ENGINES_DIR / "shim"
STUBS_DIR = ENGINES_DIR / "stubs"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for the master's metrics port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def engine_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of an engine worker: ``mooncake`` resolves to the shim (and
    ``torchvision`` to its import stub), nothing else of the tests is importable."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM_DIR), str(STUBS_DIR)])
    # The engines pick a GPU platform otherwise, or probe for one.
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    env.update(extra or {})
    return env


class EngineWorker:
    """One engine worker script in its own process.

    Args:
        script: file name under ``tests/engines``.
        args: its JSON argument.
        env: extra environment variables.
    """

    def __init__(self, script: str, args: dict[str, Any], env: dict[str, str] | None = None):
        self.script = script
        # Engines log a lot to stderr; a file keeps the pipe from filling up. It lives as
        # long as this object (for stderr_tail after the worker ended), so no `with`.
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, str(ENGINES_DIR / script), json.dumps(args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=engine_env(env),
            cwd=tempfile.gettempdir(),
        )

    def result(self, timeout_s: float = 240.0) -> dict[str, Any]:
        """The worker's answer; raises AssertionError (with its stderr tail) if it failed."""
        found: list[dict[str, Any]] = []

        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                if line.startswith(RESULT_PREFIX):
                    found.append(json.loads(line[len(RESULT_PREFIX) :]))
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not found:
            raise AssertionError(f"{self.script}: no answer in {timeout_s} s\n{self.stderr_tail()}")
        answer = found[0]
        if not answer.get("ok"):
            raise AssertionError(
                f"{self.script} failed: {answer.get('error')}\n{answer.get('traceback')}"
            )
        return answer

    def stderr_tail(self, chars: int = 6000) -> str:
        """The end of what the worker wrote to stderr."""
        self.stderr.seek(0)
        return self.stderr.read()[-chars:]

    def release(self) -> int:
        """Let the worker close its store and exit; returns its exit status."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
