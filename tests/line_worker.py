"""Driving a worker process that reads one JSON request per line on stdin and answers one
JSON line ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}`` on stdout (the
protocol of every ``*_worker.py`` the tests start)."""

from __future__ import annotations

import json
import subprocess
from typing import Any


def call_worker(process: subprocess.Popen[str], op: str, **kwargs: Any) -> Any:
    """Send ``{"op": op, **kwargs}`` to ``process`` and return the answer's result.

    Raises:
        RuntimeError: the process died before answering, or answered an error.
    """
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
    process.stdin.flush()
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"worker process {process.pid} died (exit {process.poll()})")
    answer = json.loads(line)
    if not answer["ok"]:
        raise RuntimeError(answer["error"])
    return answer["result"]
