"""``mooncake-py-client``: the per-host standalone client service (upstream's ``mooncake_client``).

One service process per host joins the store as an ordinary client: it contributes the
host's segment (``--global_segment_size``) and serves it over TCP like any client. Engine
processes on the host attach to it with ``MooncakeDistributedStore.setup_dummy(...)`` over a
Unix domain socket and hold no segment of their own, so an engine that exits, crashes or is
killed loses no data: every object it wrote lives in the service's segment.

Engine memory: an engine allocates its host buffers itself (``MooncakeHostMemAllocator``,
``alloc_from_mem_pool``), as anonymous shared memory (a memfd sealed against shrinking, so
no engine can pull pages from under the service's mapping). Registering such a buffer sends
its descriptor to the service, which maps the same pages; ``put_from`` / ``get_into`` and their
batch forms then copy straight between those pages and the store (one memcpy, no bytes on the
socket). The service keeps a mapping per connection, and frees it the moment the connection
drops; the kernel frees the pages once neither side maps them, so a killed engine leaks
nothing. The total mapped at once is capped by ``--max_pool_size`` (0: no cap).

Security: the socket file lives in a directory only this user can enter (mode 0700, checked)
and is itself mode 0600; every connection's peer must be the service's own uid (SO_PEERCRED),
anything else is closed before a byte is read. Addresses in a request are the engine's own:
each is translated through the mappings *that connection* registered, and a range that is
not wholly inside one of them fails its key with INVALID_PARAMS, so no engine can read or
write another process's memory, nor the service's.

Run: ``python -m mooncake_py.client.standalone --master_server_address HOST:PORT
--global_segment_size 4gb --port 50052`` (upstream's flag names; dashes work too). It prints
``mooncake-py client listening on <socket>`` once engines may attach, and leaves the store
cleanly on SIGINT / SIGTERM.

Thread-safety: :class:`StandaloneService` serves each connection on a thread of its own;
its public methods may be called from any thread.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mooncake_py.errors import ErrorCode, MooncakeError
from mooncake_py.units import parse_size

from .api import Client
from .config import ClientConfig
from .standalone_ops import ConnectionRegions, run_call
from .standalone_wire import (
    PROTOCOL_VERSION,
    ProtocolError,
    check_private_dir,
    close_fds,
    peer_credentials,
    recv_frame,
    send_frame,
    socket_path_for,
)

log = logging.getLogger(__name__)

INVALID = int(ErrorCode.INVALID_PARAMS)
NO_SPACE = int(ErrorCode.NO_AVAILABLE_HANDLE)
DEFAULT_PORT = 50052
DEFAULT_MAX_CONNECTIONS = 1024


class _PoolBudget:
    """Bytes of engine memory mapped at once, against an optional cap. Thread-safe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> bool:
        with self._lock:
            if self.limit and self.used + size > self.limit:
                return False
            self.used += size
            return True

    def give(self, size: int) -> None:
        with self._lock:
            self.used -= size


class StandaloneService:
    """Serves attached engine processes on a Unix socket, through one joined :class:`Client`.

    Args:
        client: the joined client whose segment holds every object; the service does not
            close it.
        socket_path: where to listen; its directory is created private (0700) if missing.
        max_pool_bytes: cap on the engine memory mapped at once (0: none).
        max_connections: connections served at once; one beyond is closed at accept.

    Raises:
        PermissionError: the socket's directory exists but is not private to this user.
        OSError: another live service already listens there, or the socket cannot be bound.
    """

    def __init__(
        self,
        client: Client,
        socket_path: Path,
        max_pool_bytes: int = 0,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        self.client = client
        self.socket_path = socket_path
        self.max_connections = max_connections
        self._budget = _PoolBudget(max_pool_bytes)
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, ConnectionRegions] = {}
        self._threads: set[threading.Thread] = set()
        self._closed = threading.Event()
        self._uid = os.getuid()
        check_private_dir(socket_path.parent, create=True)
        self._listener = self._bind(socket_path)
        self._acceptor = threading.Thread(
            target=self._accept_loop, name="mooncake-standalone-accept", daemon=True
        )
        self._acceptor.start()

    @staticmethod
    def _bind(path: Path) -> socket.socket:
        if path.exists() or path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # left behind by a service that died: nobody listens on it
            else:
                raise OSError(f"another standalone client already listens on {path}")
            finally:
                probe.close()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # The directory is private already; the mode keeps the file so on systems that
            # honour socket permissions, and umask cannot widen it between bind and chmod.
            old = os.umask(0o177)
            try:
                listener.bind(str(path))
            finally:
                os.umask(old)
            os.chmod(path, 0o600)
            listener.listen(128)
        except BaseException:
            listener.close()
            raise
        return listener

    # -- accepting -----------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                if self._closed.is_set():
                    return
                continue
            try:
                pid, uid, _gid = peer_credentials(conn)
            except OSError:
                conn.close()
                continue
            if uid != self._uid:
                log.warning("refused a connection from pid %d of uid %d", pid, uid)
                conn.close()
                continue
            with self._lock:
                full = len(self._connections) >= self.max_connections
                if not full:
                    self._connections[conn] = ConnectionRegions(self.client, self._budget, pid)
            if full:
                log.warning("refused pid %d: %d connections served", pid, self.max_connections)
                conn.close()
                continue
            thread = threading.Thread(
                target=self._serve, args=(conn,), name=f"mooncake-standalone-{pid}", daemon=True
            )
            with self._lock:
                self._threads.add(thread)
            thread.start()

    # -- one connection ------------------------------------------------------------------------

    def _serve(self, conn: socket.socket) -> None:
        regions = self._connections[conn]
        try:
            while not self._closed.is_set():
                try:
                    frame = recv_frame(conn)
                except (OSError, ProtocolError) as exc:
                    log.debug("connection of pid %d ended: %s", regions.pid, exc)
                    return
                if frame is None:
                    return
                message, fds = frame
                try:
                    answer = self._answer(regions, message, fds)
                finally:
                    close_fds(fds)  # a mapping keeps its pages; the descriptor is not needed
                try:
                    send_frame(conn, answer)
                except OSError:
                    return  # the engine went away mid-call: its objects are written already
        finally:
            # Drop this engine's memory the moment its connection goes, however it went.
            regions.release_all()
            with self._lock:
                self._connections.pop(conn, None)
                self._threads.discard(threading.current_thread())
            conn.close()

    def _answer(
        self, regions: ConnectionRegions, message: dict[str, Any], fds: Sequence[int]
    ) -> dict[str, Any]:
        op = message.get("op")
        try:
            if op == "register":
                if len(fds) != 1:
                    return {"err": INVALID, "msg": "a registration carries exactly one fd"}
                return {"r": regions.register(message.get("base"), message.get("size"), fds[0])}
            if fds:
                return {"err": INVALID, "msg": f"{op!r} carries no descriptors"}
            if op == "call":
                return run_call(self.client, regions, message)
            if op == "unregister":
                return {"r": regions.unregister(message.get("base"))}
            if op == "hello":
                return {"r": self._hello(regions, message)}
            if op == "health":
                return {"r": self.client.master_reachable}
            if op == "stats":
                return {"r": self.stats()}
        except MooncakeError as exc:
            return {"err": exc.code, "msg": str(exc)}
        return {"err": INVALID, "msg": f"unknown operation {op!r}"}

    def _hello(self, regions: ConnectionRegions, message: dict[str, Any]) -> dict[str, Any]:
        regions.declared_pool_bytes = int(message.get("mem_pool_size") or 0)
        return {
            "version": PROTOCOL_VERSION,
            "hostname": self.client.hostname,
            "pid": os.getpid(),
        }

    # -- introspection and shutdown ------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Connections served, and the engine memory mapped, in total and per engine pid."""
        with self._lock:
            conns = list(self._connections.values())
        per_pid: dict[str, dict[str, int]] = {}
        for regions in conns:
            entry = per_pid.setdefault(str(regions.pid), {"connections": 0, "regions": 0})
            entry["connections"] += 1
            entry["regions"] += regions.count
        return {
            "connections": len(conns),
            "regions": sum(r.count for r in conns),
            "mapped_bytes": self._budget.used,
            "max_pool_bytes": self._budget.limit,
            "engines": per_pid,
        }

    def close(self) -> None:
        """Stop accepting, end every connection (their mappings are freed), remove the
        socket file. Idempotent; the client stays joined."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with contextlib.suppress(OSError):
            self.socket_path.unlink()
        with self._lock:
            conns = list(self._connections)
            threads = list(self._threads)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout=10)
        self._acceptor.join(timeout=10)


# -- the console program -----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mooncake-py-client",
        description="Per-host standalone client: owns this host's segment and serves "
        "engine processes that attach with setup_dummy().",
    )

    def flag(name: str, **kwargs: Any) -> None:
        parser.add_argument(f"--{name}", f"--{name.replace('_', '-')}", dest=name, **kwargs)

    flag("master_server_address", default=os.environ.get("MOONCAKE_MASTER", "127.0.0.1:50051"))
    flag("global_segment_size", default=os.environ.get("MOONCAKE_GLOBAL_SEGMENT_SIZE", "4gb"))
    flag("host", default=os.environ.get("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1"))
    flag("port", type=int, default=DEFAULT_PORT, help="names the attach socket")
    flag("socket", default="", help="attach socket path (default: from --port)")
    flag("tenant_id", default=os.environ.get("MOONCAKE_TENANT_ID", "default"))
    flag("max_pool_size", default="0", help="cap on engine memory mapped at once (0: none)")
    flag("max_connections", type=int, default=DEFAULT_MAX_CONNECTIONS)
    # Upstream's flags this store has no use for: accepted so its command lines run.
    for ignored in ("metadata_server", "device_names", "protocol", "local_buffer_size"):
        flag(ignored, default="", help="accepted and ignored")
    flag("threads", type=int, default=0, help="accepted and ignored (one thread per connection)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Join the store, serve engines until SIGINT / SIGTERM, leave. Returns the exit status
    (1: joining or listening failed, 2: bad flags)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    try:
        socket_path = Path(args.socket) if args.socket else socket_path_for(f"x:{args.port}")
        max_pool = parse_size(args.max_pool_size, "max_pool_size")
        config = ClientConfig.from_mapping(
            {
                "master_server_address": args.master_server_address,
                "global_segment_size": args.global_segment_size,
                "local_hostname": args.host,
                "tenant_id": args.tenant_id,
            }
        )
    except (ValueError, MooncakeError) as exc:
        print(f"mooncake-py-client: {exc}", file=sys.stderr)
        return 2
    try:
        client = Client(config)
    except MooncakeError as exc:
        print(f"mooncake-py-client: joining the store failed: {exc}", file=sys.stderr)
        return 1
    try:
        service = StandaloneService(client, socket_path, max_pool, args.max_connections)
    except OSError as exc:
        print(f"mooncake-py-client: cannot listen on {socket_path}: {exc}", file=sys.stderr)
        client.close()
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"mooncake-py client {client.hostname} listening on {socket_path}", flush=True)
    while not stop.wait(1.0):
        pass
    service.close()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
