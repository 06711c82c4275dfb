"""Run upstream Mooncake's Python store tests against mooncake-py and tabulate the outcomes.

Upstream's tests import ``mooncake.store``; this runner generates a shim package (a
``mooncake/__init__.py`` and ``mooncake/store.py`` that re-export ``mooncake_py``'s public
names) into a temporary directory and puts it first on ``PYTHONPATH``. For every test file it
starts a fresh master (``python -m mooncake_py.master`` on a free port) so that files do not
see each other's keys, sets the environment variables upstream's tests read (``MASTER_SERVER``,
``MOONCAKE_MASTER``, ``MC_METADATA_SERVER``, ``PROTOCOL``, ``DEVICE_NAME``, ``LOCAL_HOSTNAME``,
``DEFAULT_KV_LEASE_TTL``), and runs the file under pytest (which also runs ``unittest``
cases) in a subprocess with a per-test and a per-file timeout. Outcomes come from pytest's
JUnit XML. Variants (see :func:`variants_for`): a file that calls ``setup_dummy`` gets a
standalone client service (``mooncake_py.client.standalone``) on each 127.0.0.1 port it
names; a file that reads ``REAL_CLIENT_ADDRESS`` runs a second time in dummy-client mode; a
file that reads ``--client-id`` runs as two clients at once; a file that uses the disk tier
(upstream's SSD offload: it names ``enable_ssd_offload`` or a ``MOONCAKE_OFFLOAD_*`` variable,
or its name contains ``ssd_offload``) runs with ``MOONCAKE_OFFLOAD_ENABLED=true``,
``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`` set to a fresh directory of its own, and a master started
with ``--enable_offload true --promotion_on_hit true`` (upstream's ``offload_on_evict: true`` is
how this master always spills).

The upstream test files are not part of this repository: put them in a directory (any
layout; every ``test_*.py`` below it is run) and pass it as ``--tests-dir``.

Usage::

    .venv/bin/python tests/upstream/run.py [--tests-dir /tmp/upstream_tests]
        [--python PYTHON] [--timeout 120] [--file-timeout 1200] [-k SUBSTRING ...]
        [--json OUT.json] [--keep-logs DIR]

``--python`` picks the interpreter of the master, the services and the tests (it must have
mooncake-py, pytest and, for the tensor tests, torch installed).

Exit status: 0 when every collected test passed or was skipped, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

DEFAULT_TESTS_DIR = Path("/tmp/upstream_tests")
# Upstream's tests sleep this long "for the lease to expire"; the master is started with it.
LEASE_TTL_MS = 5000
# The standalone client service port upstream's dummy-client tests use by default.
DUMMY_PORT = 50052
# The addresses a test file names; those other than the master's are standalone services.
DUMMY_ADDRESS = re.compile(r"""["']127\.0\.0\.1:(\d+)["']""")
# What marks a test file as one of upstream's SSD-offload (disk tier) tests: in its text, or in
# its name (test_ssd_offload_in_evict.py only says "set the environment" in a comment).
DISK_TIER_MARKERS = ("enable_ssd_offload", "MOONCAKE_OFFLOAD_")
DISK_TIER_NAME_MARKER = "ssd_offload"
# The master flags such a file runs under: the disk tier on, promotion of read objects on.
DISK_TIER_MASTER_ARGS = ("--enable_offload", "true", "--promotion_on_hit", "true")

SHIM_INIT = '''\
"""Shim: upstream's ``mooncake`` package name over mooncake-py."""
'''

SHIM_STORE = '''\
"""Shim: ``mooncake.store`` re-exports mooncake-py's public names."""

import mooncake_py as _impl
from mooncake_py import *  # noqa: F401,F403


def __getattr__(name):
    """Fall back to any attribute of ``mooncake_py`` not listed in its ``__all__``."""
    try:
        return getattr(_impl, name)
    except AttributeError:
        raise AttributeError(f"module 'mooncake.store' has no attribute {name!r}") from None
'''

SHIM_CONFIG = '''\
"""Shim: ``mooncake.mooncake_config`` is mooncake-py's."""

from mooncake_py.mooncake_config import *  # noqa: F401,F403
'''

SHIM_REMOTE_TENSOR_BATCH = '''\
"""Shim: ``mooncake.remote_tensor_batch`` is mooncake-py's."""

from mooncake_py.remote_tensor_batch import *  # noqa: F401,F403
'''

SHIM_STORE_FILE_IO = '''\
"""Shim: ``mooncake.store_file_io`` is mooncake-py's."""

from mooncake_py.store_file_io import *  # noqa: F401,F403
'''


@dataclass
class Outcome:
    """One test's result.

    Attributes:
        file: the test file, relative to the tests directory.
        test: ``Class.method`` (or the function name) as pytest reports it.
        outcome: ``passed``, ``failed``, ``error``, ``skipped`` or ``timeout``.
        message: the first line of the failure, error or skip reason ("" when passed).
        detail: the failure's full text (traceback), for the JSON report.
    """

    file: str
    test: str
    outcome: str
    message: str = ""
    detail: str = ""


def write_shim(root: Path) -> Path:
    """Write the ``mooncake`` shim package under ``root``; returns the directory to put on
    ``PYTHONPATH``."""
    package = root / "mooncake"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(SHIM_INIT)
    (package / "store.py").write_text(SHIM_STORE)
    (package / "mooncake_config.py").write_text(SHIM_CONFIG)
    (package / "remote_tensor_batch.py").write_text(SHIM_REMOTE_TENSOR_BATCH)
    (package / "store_file_io.py").write_text(SHIM_STORE_FILE_IO)
    return root


def find_test_files(tests_dir: Path, filters: Sequence[str]) -> list[Path]:
    """Every ``test_*.py`` below ``tests_dir`` whose relative path contains one of
    ``filters`` (all of them when ``filters`` is empty), sorted."""
    files = sorted(p for p in tests_dir.rglob("test_*.py") if p.is_file())
    if filters:
        files = [p for p in files if any(f in str(p.relative_to(tests_dir)) for f in filters)]
    return files


class Service:
    """A child process that prints a line containing ``listening on`` once it serves.

    Args:
        argv: the command line.
        env: its environment.
        log_path: where its output goes once the ready line was read.
    """

    def __init__(self, argv: Sequence[str], env: dict[str, str], log_path: Path) -> None:
        self.argv = list(argv)
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen[str] | None = None
        self.ready_line = ""

    def start(self, timeout_s: float = 60.0) -> str:
        """Launch it and wait for its ready line; returns that line.

        Raises:
            RuntimeError: it exited, or printed no ready line within ``timeout_s``.
        """
        self.process = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            start_new_session=True,
        )
        lines: list[str] = []
        found = threading.Event()

        def pump() -> None:
            assert self.process is not None and self.process.stdout is not None
            with self.log_path.open("w") as log:
                for line in self.process.stdout:
                    log.write(line)
                    log.flush()
                    if not found.is_set():
                        lines.append(line)
                        if "listening on" in line:
                            self.ready_line = line.strip()
                            found.set()

        threading.Thread(target=pump, daemon=True).start()
        if not found.wait(timeout_s):
            self.stop()
            raise RuntimeError(f"{self.argv[2:4]} did not start: {''.join(lines)[-2000:]!r}")
        return self.ready_line

    def stop(self) -> None:
        """SIGTERM it (SIGKILL after 15 s) and wait."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_master(
    python: str, env: dict[str, str], log_path: Path, extra_args: Sequence[str] = ()
) -> tuple[Service, str]:
    """Start a master on a free port of 127.0.0.1 with ``extra_args`` appended to its command
    line; returns it and its ``host:port``."""
    master = Service(
        [
            python,
            "-m",
            "mooncake_py.master",
            "--port",
            "0",
            "--metrics_port",
            "0",
            "--rpc_address",
            "127.0.0.1",
            "--default_kv_lease_ttl",
            f"{LEASE_TTL_MS}ms",
            *extra_args,
        ],
        env,
        log_path,
    )
    line = master.start()
    # The log's line goes on after the port ("... listening on 127.0.0.1:42913 (plaintext)").
    port = re.search(r"listening on [^\s:]+:(\d+)", line)
    if port is None:
        raise RuntimeError(f"cannot read the master's port from {line!r}")
    return master, "127.0.0.1:" + port.group(1)


def dummy_ports(source: str) -> list[int]:
    """The standalone-service ports a test file that calls ``setup_dummy`` names."""
    if "setup_dummy(" not in source:
        return []
    ports = {int(port) for port in DUMMY_ADDRESS.findall(source)}
    return sorted(port for port in ports if port not in (0, 50051, 8080))


def test_env(base: dict[str, str], shim: Path, master: str, runtime: Path) -> dict[str, str]:
    """The environment upstream's tests read, for a master at ``master``; standalone-service
    sockets go to the private directory ``runtime`` so that their fixed ports cannot collide
    with services other runs on this host started."""
    env = dict(base)
    runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), base.get("PYTHONPATH", "")) if p)
    env.update(
        MASTER_SERVER=master,
        MOONCAKE_MASTER=master,
        MC_METADATA_SERVER="P2PHANDSHAKE",
        PROTOCOL="tcp",
        DEVICE_NAME="",
        LOCAL_HOSTNAME="localhost",
        DEFAULT_KV_LEASE_TTL=str(LEASE_TTL_MS),
        PYTHONUNBUFFERED="1",
        MOONCAKE_PY_RUNTIME_DIR=str(runtime),
    )
    env.pop("REAL_CLIENT_ADDRESS", None)
    return env


def first_line(text: str) -> str:
    """The first non-empty line of ``text``, at most 200 characters."""
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


def error_line(detail: str) -> str:
    """The last ``E   ...`` line of a pytest traceback (the exception), or ""."""
    lines = [line[1:].strip() for line in detail.splitlines() if line.startswith("E ")]
    return lines[-1][:200] if lines else ""


def listed_tests(path: Path) -> list[str]:
    """The ``Class.test_method`` and ``test_function`` names a test file defines."""
    names: list[str] = []
    for node in ast.parse(path.read_text(errors="replace")).body:
        if isinstance(node, ast.ClassDef):
            names.extend(
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                and item.name.startswith("test")
            )
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            names.append(node.name)
    return names


def expand_collection_error(outcomes: list[Outcome], path: Path, rel: str) -> list[Outcome]:
    """Replace a file's collection error (an import failure) by one ``error`` outcome per
    test the file defines, each naming the exception, so that every test is counted."""
    broken = [o for o in outcomes if o.message == "collection failure"]
    if not broken:
        return outcomes
    message = error_line(broken[0].detail) or "collection failure"
    kept = [o for o in outcomes if o.message != "collection failure"]
    names = listed_tests(path) or ["<file>"]
    return kept + [Outcome(rel, name, "error", message, broken[0].detail) for name in names]


def parse_junit(path: Path, rel: str) -> list[Outcome]:
    """Read pytest's JUnit XML at ``path`` into outcomes for the file ``rel``."""
    outcomes = []
    for case in ET.parse(path).getroot().iter("testcase"):
        classname = case.get("classname", "")
        owner = classname.rsplit(".", 1)[-1] if "." in classname else ""
        name = f"{owner}.{case.get('name')}" if owner and owner[:1].isupper() else case.get("name")
        outcome = Outcome(rel, name or "?", "passed")
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is None:
                continue
            message = node.get("message", "") or ""
            detail = node.text or ""
            outcome.outcome = {"failure": "failed"}.get(tag, tag)
            if "Timeout" in message or "Timeout" in detail[:300]:
                outcome.outcome = "timeout"
            outcome.message = first_line(message) or first_line(detail)
            outcome.detail = detail
            break
        outcomes.append(outcome)
    return outcomes


@dataclass
class Variant:
    """One way of running a test file.

    Attributes:
        label: appended to the file name in the table ("" for the plain run).
        argvs: the ``sys.argv`` tails of processes that run the file at the same time (one
            empty tail: one process); upstream's two-client tests take ``--client-id``.
        env: extra environment variables.
        dummy_ports: ports to start a standalone client service on, for ``setup_dummy``.
        master_args: extra flags of the master's command line.
        disk_tier: give the test processes a fresh ``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`` and
            ``MOONCAKE_OFFLOAD_ENABLED=true``.
    """

    label: str = ""
    argvs: tuple[tuple[str, ...], ...] = ((),)
    env: tuple[tuple[str, str], ...] = ()
    dummy_ports: tuple[int, ...] = ()
    master_args: tuple[str, ...] = ()
    disk_tier: bool = False


def uses_disk_tier(source: str, name: str = "") -> bool:
    """Whether a test file named ``name`` with this source is one of upstream's SSD-offload
    tests."""
    return DISK_TIER_NAME_MARKER in name or any(marker in source for marker in DISK_TIER_MARKERS)


def disk_tier_env(directory: Path) -> dict[str, str]:
    """The variables that give a client a disk tier in ``directory`` (created, empty)."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return {
        "MOONCAKE_OFFLOAD_ENABLED": "true",
        "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": str(directory),
    }


def variants_for(source: str, name: str = "") -> list[Variant]:
    """How to run a test file with this source: the plain run, plus a dummy-client run for
    a file that switches to ``setup_dummy`` when ``REAL_CLIENT_ADDRESS`` is set; a file that
    reads ``--client-id`` runs as two clients (``client1`` and ``client2``) at once; a file
    that uses the disk tier (:func:`uses_disk_tier`; ``name`` is the file's name) runs with
    one and a master that allows it."""
    ports = tuple(dummy_ports(source))
    if "--client-id" in source:
        pair = (("--client-id", "client1"), ("--client-id", "client2"))
        return [Variant(argvs=pair, dummy_ports=ports)]
    if uses_disk_tier(source, name):
        return [Variant(dummy_ports=ports, master_args=DISK_TIER_MASTER_ARGS, disk_tier=True)]
    variants = [Variant(dummy_ports=ports)]
    if "REAL_CLIENT_ADDRESS" in source:
        address = (("REAL_CLIENT_ADDRESS", f"127.0.0.1:{DUMMY_PORT}"),)
        variants.append(Variant("[dummy]", env=address, dummy_ports=(DUMMY_PORT,)))
    return variants


def pytest_argv(
    python: str, path: Path, junit: Path, timeout_s: float, has_timeout: bool, tail: Sequence[str]
) -> list[str]:
    """The command that runs ``path`` under pytest with ``sys.argv[1:]`` set to ``tail`` while
    the module imports (upstream's multi-client tests parse it at import time)."""
    args = [
        str(path),
        "-rA",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-o",
        "junit_family=xunit1",
        "--rootdir",
        str(path.parent),
        f"--junitxml={junit}",
    ]
    if has_timeout:
        args.append(f"--timeout={int(timeout_s)}")
    bootstrap = (
        "import sys, pytest; args = sys.argv[1:]; cut = args.index('--');"
        " sys.argv = ['pytest', *args[cut + 1:]]; sys.exit(pytest.main(args[:cut]))"
    )
    return [python, "-c", bootstrap, *args, "--", *tail]


def run_file(
    path: Path,
    tests_dir: Path,
    python: str,
    shim: Path,
    work: Path,
    timeout_s: float,
    file_timeout_s: float,
    variant: Variant,
) -> list[Outcome]:
    """Run one upstream test file (one variant) against a fresh master; returns one outcome
    per test and process."""
    rel = str(path.relative_to(tests_dir)) + variant.label
    stem = re.sub(r"[^\w.-]+", "_", rel).removesuffix(".py")
    base_env = dict(os.environ)
    services: list[Service] = []
    procs: list[tuple[subprocess.Popen[bytes], IO[str], Path, Path, str]] = []
    try:
        master_log = work / f"{stem}.master.log"
        master, address = start_master(python, base_env, master_log, variant.master_args)
        services.append(master)
        env = {**test_env(base_env, shim, address, work / "runtime"), **dict(variant.env)}
        if variant.disk_tier:
            env.update(disk_tier_env(work / f"{stem}.offload"))
        for port in variant.dummy_ports:
            services.append(start_standalone(python, env, address, port, work / stem))
        has_timeout = _has_module(python, env, "pytest_timeout")
        for index, tail in enumerate(variant.argvs):
            suffix = f".{index}" if len(variant.argvs) > 1 else ""
            junit = work / f"{stem}{suffix}.xml"
            log = work / f"{stem}{suffix}.pytest.log"
            argv = pytest_argv(python, path, junit, timeout_s, has_timeout, tail)
            out: IO[str] = log.open("w")
            proc = subprocess.Popen(
                argv, cwd=path.parent, env=env, stdout=out, stderr=subprocess.STDOUT
            )
            procs.append((proc, out, junit, log, " ".join(tail)))
        outcomes: list[Outcome] = []
        deadline = time.monotonic() + file_timeout_s
        for proc, stream, junit, log, joined in procs:
            label = f"[{joined}]" if joined else ""
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                message = f"file ran over {file_timeout_s:.0f} s"
                outcomes.append(Outcome(rel, "<file>" + label, "timeout", message))
                continue
            finally:
                stream.close()
            if not junit.exists():
                message = first_line(log.read_text()[-2000:])
                outcomes.append(Outcome(rel, "<file>" + label, "error", message))
                continue
            found = expand_collection_error(parse_junit(junit, rel), path, rel)
            for outcome in found:
                outcome.test += label
            outcomes.extend(found or [Outcome(rel, "<file>" + label, "error", "no test ran")])
        return outcomes
    except RuntimeError as exc:
        return [Outcome(rel, "<file>", "error", first_line(str(exc)))]
    finally:
        for proc, stream, *_ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            stream.close()
        for service in reversed(services):
            service.stop()


def start_standalone(
    python: str, env: dict[str, str], master: str, port: int, log: Path
) -> Service:
    """Start a standalone client service (``setup_dummy``'s peer) on ``port``.

    Raises:
        RuntimeError: it did not start.
    """
    service = Service(
        [
            python,
            "-m",
            "mooncake_py.client.standalone",
            "--master_server_address",
            master,
            "--global_segment_size",
            "4gb",
            "--port",
            str(port),
        ],
        env,
        log.with_name(f"{log.name}.standalone-{port}.log"),
    )
    service.start()
    return service


def _has_module(python: str, env: dict[str, str], name: str) -> bool:
    """Whether ``python`` can import ``name``."""
    probe = [python, "-c", f"import {name}"]
    return subprocess.run(probe, env=env, capture_output=True, check=False).returncode == 0


def print_table(outcomes: Sequence[Outcome]) -> None:
    """Print one row per test (test, outcome, first error line) and the totals."""
    width = min(90, max((len(f"{Path(o.file).name}::{o.test}") for o in outcomes), default=10))
    print(f"{'test':<{width}}  {'outcome':<8}  first error line")
    print(f"{'-' * width}  {'-' * 8}  {'-' * 40}")
    for o in outcomes:
        name = f"{Path(o.file).name}::{o.test}"
        if len(name) > width:
            name = "..." + name[-(width - 3) :]
        print(f"{name:<{width}}  {o.outcome:<8}  {o.message}")
    counts = {k: sum(o.outcome == k for o in outcomes) for k in ("passed", "skipped")}
    failed = len(outcomes) - counts["passed"] - counts["skipped"]
    print()
    print(f"upstream: {counts['passed']} passed, {failed} failed, {counts['skipped']} skipped")


def iter_outcomes(args: argparse.Namespace, work: Path) -> Iterator[Outcome]:
    """Run every selected file, printing progress; yields the outcomes."""
    tests_dir = args.tests_dir.resolve()
    shim = write_shim(work / "shim")
    files = find_test_files(tests_dir, args.k)
    if not files:
        raise SystemExit(f"no test_*.py under {tests_dir}")
    for path in files:
        started = time.monotonic()
        print(f"running {path.relative_to(tests_dir)} ...", flush=True)
        for variant in variants_for(path.read_text(errors="replace"), path.name):
            results = run_file(
                path, tests_dir, args.python, shim, work, args.timeout, args.file_timeout, variant
            )
            took = time.monotonic() - started
            print(f"  {variant.label or 'plain'}: {len(results)} test(s), {took:.0f} s", flush=True)
            yield from results


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the files, print the table; returns the exit status."""
    parser = argparse.ArgumentParser(
        description=textwrap.dedent(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("--tests-dir", type=Path, default=DEFAULT_TESTS_DIR)
    parser.add_argument("--python", default=sys.executable, help="interpreter for the tests")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per test")
    parser.add_argument("--file-timeout", type=float, default=1200, help="seconds per file")
    parser.add_argument(
        "-k", action="append", default=[], help="run only files whose path contains this"
    )
    parser.add_argument("--json", type=Path, help="also write the outcomes here")
    parser.add_argument("--keep-logs", type=Path, help="keep the logs and JUnit files here")
    args = parser.parse_args(argv)
    # A SIGTERM unwinds like Ctrl-C, so the masters and services of the file being run stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    work = Path(tempfile.mkdtemp(prefix="mooncake-upstream-"))
    try:
        outcomes = list(iter_outcomes(args, work))
        print()
        print_table(outcomes)
        if args.json:
            args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
        return 0 if all(o.outcome in ("passed", "skipped") for o in outcomes) else 1
    finally:
        if args.keep_logs:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for item in work.iterdir():
                if item.is_file():
                    shutil.copy2(item, args.keep_logs / item.name)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
