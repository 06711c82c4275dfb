"""What the tests of the CLI over gRPC and over HTTP share: running the CLI's ``main()``, the
client process writing tagged objects, and comparing a gRPC run with an HTTP run.

Used by :mod:`tests.integration.test_cli_http` and
:mod:`tests.integration.test_cli_http_security`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO
from unittest import mock

from mooncake_py.cli import main as cli_main
from tests.line_worker import call_worker

REPO_ROOT = Path(__file__).resolve().parents[2]
_CLI_ENV_VARS = (
    "MOONCAKE_MASTER",
    "MOONCAKE_AUTH_TOKEN",
    "MOONCAKE_TENANT_ID",
    "MOONCAKE_PY_HTTP",
    "MOONCAKE_PY_TLS_CA",
    "MOONCAKE_PY_TLS_CERT",
    "MOONCAKE_PY_TLS_KEY",
    "MOONCAKE_PY_TLS_SERVER_NAME",
)
_CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in _CLI_ENV_VARS}
TIME_FIELDS = ("created_at", "last_active_at")
SEGMENT_BYTES = 16 << 20


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``main(ARGS)`` with an empty stdin (not a terminal), only ``env`` of the CLI's
    variables set, stdout and stderr captured, the exit code as ``returncode``."""
    stdout, stderr = io.StringIO(), io.StringIO()
    stdin: TextIO = io.StringIO()
    with (
        mock.patch.dict(os.environ, {**_CLEAN_ENV, **(env or {})}, clear=True),
        mock.patch.object(sys, "stdin", stdin),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        code = cli_main(list(args))
    return subprocess.CompletedProcess(list(args), code, stdout.getvalue(), stderr.getvalue())


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (nothing listens there)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class WriterProcess:
    """The client process that writes the tenants' objects."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.session_writer_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=os.environ.copy(),
        )

    def call(self, op: str, **kwargs: Any) -> Any:
        return call_worker(self.process, op, **kwargs)

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                self.call("leave")
            self.process.kill()
        self.process.wait(timeout=10)


class Twins:
    """Two tenants filled alike on one master: one for the gRPC runs, one for the HTTP runs.

    Attributes:
        address: the master's gRPC ``host:port``.
        url: its memory API (``http://127.0.0.1:<metrics port>``).
        grpc_tenant, http_tenant: the twins.
    """

    def __init__(self, address: str, url: str, grpc_tenant: str, http_tenant: str) -> None:
        self.address = address
        self.url = url
        self.grpc_tenant = grpc_tenant
        self.http_tenant = http_tenant

    def run(self, *args: str, twin: bool = True) -> tuple[Any, Any]:
        """Run ``args`` over gRPC and over HTTP; with ``twin`` false both name the gRPC
        twin (for commands that change nothing)."""
        http_tenant = self.http_tenant if twin else self.grpc_tenant
        grpc = run_cli("--master", self.address, "--tenant", self.grpc_tenant, *args)
        http = run_cli("--http", self.url, "--tenant", http_tenant, *args)
        return grpc, http

    def same(self, *args: str, twin: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``args`` both ways and assert the same exit code, stdout and stderr (stderr
        with each run's address and tenant put back to the gRPC run's); returns the gRPC
        run."""
        grpc, http = self.run(*args, twin=twin)
        assert http.returncode == grpc.returncode, (grpc.stderr, http.stderr)
        assert http.stdout == grpc.stdout, args
        assert self.normalized(http.stderr) == grpc.stderr, args
        return grpc

    def normalized(self, text: str) -> str:
        """``text`` of an HTTP run as the gRPC run would say it."""
        return text.replace(self.url, self.address).replace(
            repr(self.http_tenant), repr(self.grpc_tenant)
        )

    def same_json(self, *args: str, twin: bool = True) -> Any:
        """Like :meth:`same` for ``--json`` output, session times compared within a second
        (the API gives whole seconds, and each call converts to wall time anew); returns
        the gRPC run's JSON."""
        grpc, http = self.run(*args, "--json", twin=twin)
        assert (grpc.returncode, http.returncode) == (0, 0), (grpc.stderr, http.stderr)
        assert self.normalized(http.stderr) == grpc.stderr
        expected, got = json.loads(grpc.stdout), json.loads(http.stdout)
        assert without_times(got) == without_times(expected), args
        for grpc_time, http_time in zip(_times(expected), _times(got), strict=True):
            assert abs(grpc_time - http_time) < 1.5, args
        return expected


def _rows(data: Any) -> list[dict[str, Any]]:
    return data if isinstance(data, list) else [data]


def without_times(data: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in TIME_FIELDS} for row in _rows(data)]


def _times(data: Any) -> list[float]:
    return [float(row[name]) for row in _rows(data) for name in TIME_FIELDS if name in row]


def segments_match(grpc: Any, http: Any) -> None:
    """The same segments, up to what the memory API may not carry (allocation counts,
    protocol, host id): those read ``-`` (null in JSON) over HTTP unless it carries them."""
    assert (grpc.returncode, http.returncode) == (0, 0), (grpc.stderr, http.stderr)
    assert http.stderr == grpc.stderr
    if grpc.stdout.startswith("["):
        expected, got = json.loads(grpc.stdout), json.loads(http.stdout)
        assert len(got) == len(expected) > 0
        for want, row in zip(expected, got, strict=True):
            for name, value in want.items():
                uncarried = name in UNCARRIED_SEGMENT_FIELDS and row[name] in (None, "")
                assert row[name] == value or uncarried, (name, row, want)
        return
    expected_lines, got_lines = grpc.stdout.splitlines(), http.stdout.splitlines()
    assert got_lines[0].split() == expected_lines[0].split()  # the same columns
    assert len(got_lines) == len(expected_lines) > 1
    header = expected_lines[0].split()
    for want_line, line in zip(expected_lines[1:], got_lines[1:], strict=True):
        want_cells, cells = _cells(want_line), _cells(line)
        assert len(cells) == len(want_cells) == len(header)
        for column, want, cell in zip(header, want_cells, cells, strict=True):
            assert cell == want or (column in ("ALLOCS", "PROTO") and cell == "-"), column


UNCARRIED_SEGMENT_FIELDS = ("allocations", "protocol", "host_id")


def _cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())
