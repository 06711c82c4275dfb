"""A client process for the TCP transfer tests: ``client_worker``'s operations plus large
generated batches and a view of this process's transfer sockets.

Run it as ``python -m tests.integration.tcp_worker`` from the repository root
(:class:`TcpWorkerProcess` does). Values are derived from their keys, so the writer, the reader
and the test agree on every byte without shipping values through the test.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from typing import Any

from tests.conftest import REPO_ROOT, ClientProcess
from tests.integration.client_worker import Worker

SMALL = (64, 256)
"""Default value sizes of a generated batch, in bytes (inclusive)."""


def batch_keys(prefix: str, count: int) -> list[str]:
    """The keys of a generated batch."""
    return [f"{prefix}-{i:06d}" for i in range(count)]


def batch_value(key: str, index: int, sizes: tuple[int, int] = SMALL) -> bytes:
    """Distinct content for the ``index``-th key of a batch: the SHA-256 of ``key`` repeated,
    between ``sizes[0]`` and ``sizes[1]`` bytes long (spread over the range by ``index``)."""
    low, high = sizes
    size = low + (index * 7919) % (high - low + 1)
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def batch_digest(prefix: str, count: int, sizes: tuple[int, int] = SMALL) -> tuple[str, int]:
    """(SHA-256 of every value of the batch in key order, their total size)."""
    whole = hashlib.sha256()
    total = 0
    for index, key in enumerate(batch_keys(prefix, count)):
        value = batch_value(key, index, sizes)
        whole.update(value)
        total += len(value)
    return whole.hexdigest(), total


class TcpWorker(Worker):
    """Adds generated batches and transfer-socket introspection to :class:`Worker`."""

    def op_put_generated(
        self, prefix: str, count: int, sizes: tuple[int, int] = SMALL
    ) -> dict[str, Any]:
        """One ``put_batch`` of a generated batch; the failed keys' count and first codes."""
        keys = batch_keys(prefix, count)
        span = (sizes[0], sizes[1])  # JSON brings a list
        values = [batch_value(key, i, span) for i, key in enumerate(keys)]
        client = self.store.client
        assert client is not None
        result = client.put_batch(keys, values)
        failed = [code for code in result.codes if code != 0]
        return {"failed": len(failed), "first_codes": sorted(set(failed))[:5]}

    def op_get_generated(
        self, prefix: str, count: int, sizes: tuple[int, int] = SMALL
    ) -> dict[str, Any]:
        """One ``get_batch`` of a generated batch: how many values differ from what was put,
        the codes of failed keys, and the digest and size of everything read."""
        keys = batch_keys(prefix, count)
        span = (sizes[0], sizes[1])  # JSON brings a list
        client = self.store.client
        assert client is not None
        result = client.get_batch(keys)
        whole = hashlib.sha256()
        wrong: list[str] = []
        total = 0
        for index, (key, value) in enumerate(zip(keys, result.values, strict=True)):
            data = value if value is not None else b""
            if data != batch_value(key, index, span):
                wrong.append(key)
            whole.update(data)
            total += len(data)
        codes = sorted({code for code in result.codes if code != 0})
        return {
            "wrong": len(wrong),
            "first_wrong": wrong[:5],
            "codes": codes[:5],
            "digest": whole.hexdigest(),
            "bytes": total,
        }

    def op_transfer_view(self) -> dict[str, Any]:
        """What this process's transfer sockets look like now (see :func:`_socket_view`)."""
        client = self.store.client
        assert client is not None
        core = client._core  # noqa: SLF001 - the test inspects the real sockets
        assert core is not None
        server = core._server  # noqa: SLF001
        tcp = core.data._tcp  # noqa: SLF001
        with tcp._lock:  # noqa: SLF001
            pooled = [sock for idle in tcp._idle.values() for sock, _ in idle]  # noqa: SLF001
        view: dict[str, Any] = {
            "client_sockets": [_socket_view(sock) for sock in pooled],
            "server_sockets": [],
            "served": [0, 0],
            "shm_maps": _mapped_shm_files(),
        }
        if server is not None:
            with server._lock:  # noqa: SLF001
                conns = [conn.sock for conn in server._connections]  # noqa: SLF001
            view["server_sockets"] = [_socket_view(sock) for sock in conns]
            view["served"] = list(server.served)
            view["port"] = server.port
        return view


def _socket_view(sock: socket.socket) -> list[int]:
    """``[SO_SNDBUF, SO_RCVBUF]`` as the kernel reports them (Linux doubles the request)."""
    return [
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
    ]


def _mapped_shm_files() -> list[str]:
    """The shared memory this process has mapped: segment memfds (its own segment included,
    as ``memfd:mooncake_py/<segment id>``) and any file under /dev/shm (segments never
    create one, so an entry of that kind is a leftover of some other program)."""
    return shared_memory_maps(os.getpid())


def shared_memory_maps(pid: int) -> list[str]:
    """What :func:`_mapped_shm_files` reports, for process ``pid`` (same user)."""
    names: set[str] = set()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
            if len(fields) == 6:
                names.add(fields[5].strip().removeprefix("/").removesuffix(" (deleted)"))
    return sorted(n for n in names if n.startswith(("memfd:mooncake_py/", "dev/shm/")))


class TcpWorkerProcess(ClientProcess):
    """A :class:`TcpWorker` in a child process (same protocol as :class:`ClientProcess`)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.tcp_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=REPO_ROOT,
        )


def main() -> None:
    """Serve requests from stdin until ``close`` (the protocol of ``client_worker``)."""
    worker = TcpWorker()
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            answer = {"ok": True, "result": getattr(worker, f"op_{op}")(**request)}
        except Exception as exc:  # reported to the test, which fails with it
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
        if op == "close":
            break


if __name__ == "__main__":
    main()
