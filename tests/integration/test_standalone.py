"""Standalone mode: a per-host client service process owns the segment, engine processes
attach with ``setup_dummy`` and move data zero copy through pool memory.

Everything is real: a master in this process, the service (``python -m
mooncake_py.client.standalone``) and every engine as child processes on 127.0.0.1. Contents
are checked by hash against ``value_for(key, size)``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mooncake_py import MooncakeDistributedStore, MooncakeError
from mooncake_py.client.compat_standalone import MooncakeHostMemAllocator, StandaloneCalls
from mooncake_py.client.standalone_attach import exchange
from mooncake_py.client.standalone_wire import recv_frame, send_frame
from mooncake_py.testing import InProcessMaster, wait_until
from tests.conftest import REPO_ROOT
from tests.line_worker import call_worker

WORKER = Path(__file__).resolve().parent / "standalone_worker.py"
PORT = 50052
SIZE = 64 * 1024


if hasattr(MooncakeDistributedStore, "setup_dummy"):
    Store = MooncakeDistributedStore
else:  # the drop-in class does not list the mixin among its bases: add it

    class Store(StandaloneCalls, MooncakeDistributedStore):  # type: ignore[no-redef]
        """The drop-in store with the standalone calls."""


class Service:
    """``mooncake-py-client`` as a child process, its socket in a private runtime dir."""

    def __init__(self, master: str, runtime: Path, *extra: str) -> None:
        self.runtime = runtime
        self.env = {**os.environ, "MOONCAKE_PY_RUNTIME_DIR": str(runtime)}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mooncake_py.client.standalone",
                "--master_server_address",
                master,
                "--global_segment_size",
                "64mb",
                "--port",
                str(PORT),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if "listening on" not in line:
            self.process.kill()
            raise RuntimeError(f"service did not start: {line!r} {self.process.stderr.read()}")
        self.socket = Path(line.rsplit(" ", 1)[1].strip())

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


class Engine:
    """An engine process (``standalone_worker.py``) attached to the service."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO_ROOT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def call(self, op: str, **kwargs: Any) -> Any:
        return call_worker(self.process, op, **kwargs)

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()  # SGLang never calls close(): just let it exit
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def service(master: InProcessMaster) -> Iterator[Service]:
    runtime = Path(tempfile.mkdtemp(prefix="mcsa-", dir="/tmp"))
    running = Service(master.address, runtime)
    yield running
    status = running.stop()
    shutil.rmtree(runtime, ignore_errors=True)
    assert status == 0


@pytest.fixture
def engines(service: Service) -> Iterator[list[Engine]]:
    started: list[Engine] = []

    def start() -> Engine:
        engine = Engine(service.env)
        started.append(engine)
        assert engine.call("setup", address=f"127.0.0.1:{PORT}") == 0
        return engine

    yield start  # type: ignore[misc]
    for engine in started:
        engine.stop()


def test_engines_share_objects_through_the_service(service: Service, engines: Any) -> None:
    writer, reader = engines(), engines()
    keys = [f"page-{i}" for i in range(16)]
    assert writer.call("put_from", keys=keys, size=SIZE) == [0] * len(keys)
    # A second round writes nothing new (every key exists) and still answers 0 per key.
    assert writer.call("put_from", keys=keys, size=SIZE) == [0] * len(keys)
    want = writer.call("value_digests", keys=keys, size=SIZE)
    assert reader.call("get_into_digests", keys=keys, size=SIZE) == want
    assert writer.call("get_into_digests", keys=keys, size=SIZE) == want
    assert reader.call("get_into_digests", keys=["absent"], size=SIZE) == [-704]

    multi = [f"layered-{i}" for i in range(4)]
    assert writer.call("put_multi", keys=multi, size=SIZE) == [0] * len(multi)
    want_multi = writer.call("value_digests", keys=multi, size=SIZE)
    assert reader.call("get_multi_digests", keys=multi, size=SIZE) == want_multi

    assert writer.call("put", key="inline", size=1000) == 0
    assert reader.call("get_digest", key="inline") == writer.call(
        "value_digest", key="inline", size=1000
    )


def test_killed_engine_loses_no_data_and_its_pool_is_freed(service: Service, engines: Any) -> None:
    victim, survivor = engines(), engines()
    keys = [f"victim-{i}" for i in range(32)]
    assert victim.call("put_from", keys=keys, size=SIZE) == [0] * len(keys)
    victim_pid = str(victim.call("pid"))
    before = survivor.call("stats")
    assert before["engines"][victim_pid]["regions"] >= 1
    mapped_before = before["mapped_bytes"]

    victim.kill()  # SIGKILL: no close(), no cleanup in the engine

    def victim_forgotten() -> bool:
        stats = survivor.call("stats")
        return victim_pid not in stats["engines"] and stats["mapped_bytes"] < mapped_before

    wait_until(victim_forgotten, timeout_s=10, what="the service frees the killed engine's pool")
    want = survivor.call("value_digests", keys=keys, size=SIZE)
    assert survivor.call("get_into_digests", keys=keys, size=SIZE) == want
    # A new engine attaches after the kill and reads the same bytes.
    assert engines().call("get_into_digests", keys=keys, size=SIZE) == want


def test_engine_killed_mid_write_leaves_only_whole_objects(service: Service, engines: Any) -> None:
    victim, survivor = engines(), engines()
    size, batch, window = 16 * 1024, 8, 1024
    assert victim.call("start_streaming", prefix="stream", size=size, batch=batch) == 0
    probe = [f"stream-{i}" for i in range(2 * batch)]
    wait_until(
        lambda: survivor.call("exists", keys=probe) == [1] * len(probe),
        timeout_s=30,
        what="the victim has written two batches",
    )
    victim_pid = str(victim.call("pid"))
    victim.kill()  # most likely in the middle of a batch_put_from
    wait_until(
        lambda: victim_pid not in survivor.call("stats")["engines"],
        timeout_s=10,
        what="the service drops the killed engine's connections",
    )
    keys = [f"stream-{i}" for i in range(window)]
    found = 0
    for start in range(0, window, 128):
        chunk = keys[start : start + 128]
        got = survivor.call("get_into_digests", keys=chunk, size=size)
        want = survivor.call("value_digests", keys=chunk, size=size)
        for value, exact in zip(got, want, strict=True):
            # Every key is either absent (never written, revoked or evicted) or whole.
            assert value in (-704, exact)
            found += value != -704
    assert found >= 2 * batch


def test_an_engine_reaches_only_memory_it_registered(service: Service, engines: Any) -> None:
    owner, other = engines(), engines()
    assert owner.call("put_from", keys=["shared-0"], size=SIZE) == [0]
    result = other.call("foreign", address=owner.call("pool_address"), size=SIZE)
    assert result == {
        "get_other": -600,
        "put_other": -600,
        "register_private": -600,
        "get_private": -600,
        "get_unregistered": -600,
        "past_pool_end": -600,
    }
    assert other.call("exists", keys=["stolen", "past-end"]) == [0, 0]


def test_many_threads_of_one_engine(service: Service, engines: Any) -> None:
    engine = engines()
    keys = [f"threaded-{i}" for i in range(64)]
    assert engine.call("put_from_threads", keys=keys, size=4096, threads=8) == [0] * len(keys)
    want = engine.call("value_digests", keys=keys, size=4096)
    assert engines().call("get_into_digests", keys=keys, size=4096) == want


def test_an_engine_reattaches_after_the_service_restarts(
    master: InProcessMaster, service: Service, engines: Any
) -> None:
    engine = engines()
    assert engine.call("put_from", keys=["before"], size=SIZE) == [0]
    service.process.kill()  # SIGKILL: its socket file stays behind, its segment goes
    service.process.wait(timeout=10)
    assert engine.call("put_from", keys=["during"], size=SIZE) == [-900]
    # The master would expire the dead service after --client_ttl; do it now (nothing else
    # is a client of this master: engines talk to the service only).
    assert len(master.service.reap_expired_clients(master.clock() + 3600)) == 1
    restarted = Service(master.address, service.runtime)  # takes over the stale socket file
    try:
        assert engine.call("put_from", keys=["after"], size=SIZE) == [0]
        want = [engine.call("value_digest", key="after", size=SIZE)]
        assert engines().call("get_into_digests", keys=["after"], size=SIZE) == want
    finally:
        assert restarted.stop() == 0
    service.process = restarted.process


def test_the_service_caps_mapped_engine_memory(master: InProcessMaster) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="mcsa-", dir="/tmp"))
    capped = Service(master.address, runtime, "--max_pool_size", "1mb")
    engine = Engine(capped.env)
    try:
        # SGLang's register_buffer of an 8 MiB pool: refused with NO_AVAILABLE_HANDLE.
        assert engine.call("setup", address=f"127.0.0.1:{PORT}", pool_bytes=8 << 20) == -200
        assert engine.call("pool_alloc", size=512 << 10) != 0
        assert engine.call("pool_alloc", size=768 << 10) == 0  # over the cap: 0, as a failure
        assert engine.call("stats")["mapped_bytes"] == 512 << 10
    finally:
        engine.stop()
        status = capped.stop()
        shutil.rmtree(runtime, ignore_errors=True)
    assert status == 0


def test_the_service_refuses_memory_it_cannot_trust(service: Service) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(service.socket))
    unsealed = os.memfd_create("unsealed")
    sealed = os.memfd_create("sealed", os.MFD_ALLOW_SEALING)
    plain = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
    try:
        for fd in (unsealed, sealed, plain.fileno()):
            os.ftruncate(fd, 1 << 20)
        fcntl.fcntl(sealed, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        assert exchange(sock, {"op": "hello", "mem_pool_size": 0, "pid": os.getpid()})
        register = {"op": "register", "base": 1 << 40, "size": 1 << 20}
        assert exchange(sock, register, [unsealed]) == -600  # could be shrunk under the mapping
        assert exchange(sock, register, [plain.fileno()]) == -600  # not a memfd
        assert exchange(sock, {**register, "size": 2 << 20}, [sealed]) == -600  # too short
        assert exchange(sock, register, [sealed]) == 0
        assert exchange(sock, {**register, "base": (1 << 40) + 4096}, [sealed]) == -600  # overlap
        with pytest.raises(MooncakeError) as refused:
            exchange(sock, {"op": "call", "m": "close", "a": []})  # not a whitelisted call
        assert refused.value.code == -600
        assert exchange(sock, {"op": "unregister", "base": 1 << 40}) == 0
    finally:
        sock.close()
        os.close(unsealed)
        os.close(sealed)
        plain.close()


def test_the_socket_is_private(service: Service) -> None:
    info = service.socket.lstat()
    assert stat.S_ISSOCK(info.st_mode) and info.st_mode & 0o777 == 0o600
    assert service.socket.parent.stat().st_mode & 0o777 == 0o700
    assert service.socket.name == f"client-{PORT}.sock"


def _connect_as_nobody(path: Path) -> str:
    """What a process of another user gets from the socket: "refused" (no access), "closed"
    (connected, then closed without an answer) or "answered"."""
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 3
        try:
            os.setgid(65534)
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(path))
            except PermissionError:
                code = 0
            else:
                try:
                    send_frame(sock, {"op": "hello", "mem_pool_size": 0, "pid": os.getpid()})
                    code = 1 if recv_frame(sock) is None else 2
                except OSError:
                    code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    return {0: "refused", 1: "closed", 2: "answered"}.get(os.waitstatus_to_exitcode(status), "?")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_another_user_cannot_attach(service: Service) -> None:
    assert _connect_as_nobody(service.socket) == "refused"  # the private directory
    # Even with the file system opened up, the service closes a stranger's connection
    # (SO_PEERCRED) before reading a byte of it.
    service.socket.parent.chmod(0o711)
    service.socket.chmod(0o666)
    try:
        assert _connect_as_nobody(service.socket) == "closed"
    finally:
        service.socket.chmod(0o600)
        service.socket.parent.chmod(0o700)


def test_setup_dummy_failures(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOONCAKE_PY_RUNTIME_DIR", str(service.runtime))
    store = Store()
    assert store.setup_dummy(0, 0, "127.0.0.1:1") == -900  # no service on that port
    assert store.setup_dummy(0, 0, "no-port") == -600
    with pytest.raises(TypeError):
        store.setup_dummy(-1, 0, f"127.0.0.1:{PORT}")
    assert store.alloc_from_mem_pool(4096) == 0  # not attached: upstream's real client answers 0
    assert store.setup_dummy(1 << 20, 16 << 20, f"127.0.0.1:{PORT}") == 0
    assert store.setup_dummy(1 << 20, 16 << 20, f"127.0.0.1:{PORT}") == -600
    assert store.setup_dummy(1 << 20, 16 << 20, f"unix:{service.socket}") == -600
    ptr = store.alloc_from_mem_pool(4096)
    assert ptr != 0 and store.register_buffer(ptr, 4096) == 0
    assert store.health_check() == 0 and store.get_hostname()
    observer = Store()
    assert observer.setup_dummy(0, 0, f"unix:{service.socket}") == 0
    assert observer.client.service_stats()["mapped_bytes"] == 4096
    assert MooncakeHostMemAllocator().free(ptr) == 0
    # Freed memory is unmapped by the service at once, not at the owner's next call.
    assert observer.client.service_stats()["mapped_bytes"] == 0
    assert store.close() == 0 and observer.close() == 0
    assert store.health_check() == 1


def test_host_allocator_contract() -> None:
    allocator = MooncakeHostMemAllocator()
    ptr = allocator.alloc(1 << 20)
    assert ptr > 0 and ptr % 4096 == 0
    assert allocator.free(ptr) == 0
    assert allocator.free(ptr) == -1
    with pytest.raises(RuntimeError):
        allocator.alloc(0)
    with pytest.raises(TypeError):
        allocator.alloc(-1)
