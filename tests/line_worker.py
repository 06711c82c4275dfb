"""Driving a worker process that reads one JSON request per line on stdin and answers one
JSON line ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}`` on stdout (the
protocol of every ``*_worker.py`` the tests start)."""

from __future__ import annotations

import json
import subprocess
import sys
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


def serve_requests(worker: object) -> None:
    """The worker side: answer each request line on stdin with ``worker.op_<op>(**args)``
    until stdin closes; an exception is answered as an error (the test fails with it)."""
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            answer = {"ok": True, "result": getattr(worker, f"op_{op}")(**request)}
        except Exception as exc:
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
