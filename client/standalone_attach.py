"""The engine side of standalone mode: host memory the service can map, and the connection to
the per-host service (:mod:`mooncake_py.client.standalone`) that does the engine's store calls.

:class:`HostMemory` is the process-wide allocator behind ``MooncakeHostMemAllocator`` and
``alloc_from_mem_pool``: each allocation is anonymous shared memory of its own (a memfd
whose size is sealed, mapped here), so the service can map the same pages from the
descriptor and copy between them and the store without the bytes crossing a socket. It
works before any service is attached: engines allocate their host KV pool first and attach
afterwards.

:class:`Attachment` is one engine's link to the service: a small pool of Unix socket
connections (one per concurrent caller, up to ``max_connections``), each carrying the engine's
registered memory (a connection registers, lazily before its next call, what was registered
or freed since its last one), so the service can drop a connection's mappings the moment the
connection ends. Connections are checked with SO_PEERCRED: memory descriptors only go to a
service of this user.

Thread-safety: both classes may be used from several threads at once.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import fcntl
import itertools
import mmap
import os
import select
import socket
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mooncake_py.errors import ErrorCode, MooncakeError, UnavailableError, error_for

from .standalone_wire import (
    PROTOCOL_VERSION,
    ProtocolError,
    peer_credentials,
    recv_frame,
    send_frame,
)

DEFAULT_MAX_CONNECTIONS = 16
_ids = itertools.count(1)


@dataclass(eq=False)
class HostRegion:
    """One allocation: ``size`` bytes at ``address``, backed by memfd ``fd``."""

    address: int
    size: int
    fd: int
    mapping: mmap.mmap
    anchor: Any  # the ctypes view that pins ``address``
    region_id: int = field(default_factory=lambda: next(_ids))


class HostMemory:
    """Process-wide registry of shareable host allocations (upstream's ``ShmHelper``).

    Use :func:`host_memory` for the one instance. Lookups are O(log n) in the allocations.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._regions: dict[int, HostRegion] = {}
        self._listeners: weakref.WeakSet[Attachment] = weakref.WeakSet()

    def allocate(self, size: int) -> HostRegion:
        """A new zero-filled allocation of ``size`` bytes.

        Raises:
            TypeError: ``size`` is not a non-negative int (upstream's ``size_t``).
            RuntimeError: ``size`` is 0, or the memory cannot be created or mapped (as
                upstream, whose allocator throws ``std::runtime_error``).
        """
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise TypeError(f"size must be a non-negative int: {size!r}")
        if size == 0:
            raise RuntimeError("cannot allocate 0 bytes of shared memory")
        try:
            fd = os.memfd_create("mooncake_py-host", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as exc:
            raise RuntimeError(f"cannot create shared memory: {exc}") from exc
        try:
            os.ftruncate(fd, size)
            # The service maps these pages; a file shrunk under its mapping would kill it with
            # SIGBUS, so the size is sealed (the service refuses memory without the seal).
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError, OverflowError) as exc:
            os.close(fd)
            raise RuntimeError(f"cannot map {size} bytes of shared memory: {exc}") from exc
        anchor = (ctypes.c_char * size).from_buffer(mapping)
        region = HostRegion(ctypes.addressof(anchor), size, fd, mapping, anchor)
        with self._lock:
            bisect.insort(self._starts, region.address)
            self._regions[region.address] = region
        return region

    def free(self, address: int) -> bool:
        """Release the allocation starting at ``address``: attached stores forget it (their
        service unmaps it), then it is unmapped here. False when no allocation starts there.
        Views of the memory must not be used afterwards (as with upstream's ``munmap``)."""
        with self._lock:
            region = self._regions.pop(address, None)
            if region is None:
                return False
            self._starts.remove(address)
            listeners = list(self._listeners)
        for attachment in listeners:
            attachment.forget(region)
        region.anchor = None
        with contextlib.suppress(BufferError):
            region.mapping.close()
        os.close(region.fd)
        return True

    def find(self, ptr: int, size: int) -> HostRegion | None:
        """The allocation holding all of ``[ptr, ptr + size)`` (size > 0), or None."""
        if size <= 0 or ptr <= 0:
            return None
        with self._lock:
            index = bisect.bisect_right(self._starts, ptr) - 1
            if index < 0:
                return None
            region = self._regions[self._starts[index]]
        return region if ptr + size <= region.address + region.size else None

    def listen(self, attachment: Attachment) -> None:
        """Tell ``attachment`` about every later :meth:`free` (held weakly)."""
        with self._lock:
            self._listeners.add(attachment)


_host_memory = HostMemory()


def host_memory() -> HostMemory:
    """The process-wide :class:`HostMemory`."""
    return _host_memory


class _Conn:
    """One connection to the service and the regions it has registered (by engine base)."""

    def __init__(self, path: Path, hello: dict[str, Any]) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(str(path))
            _pid, uid, _gid = peer_credentials(self.sock)
            if uid != os.getuid():
                # Never hand memory to a process of another user that took the socket's name.
                raise PermissionError(f"{path} is served by uid {uid}, not {os.getuid()}")
            self.info = exchange(self.sock, hello)
            if not isinstance(self.info, dict) or self.info.get("version") != PROTOCOL_VERSION:
                raise ProtocolError(f"{path} speaks another protocol version: {self.info!r}")
        except BaseException:
            self.sock.close()
            raise
        self.synced: dict[int, int] = {}  # engine base -> region id registered on this conn

    def alive(self) -> bool:
        """False when the service closed this idle connection (readable at EOF)."""
        readable, _, _ = select.select([self.sock], [], [], 0)
        return not readable

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def exchange(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> Any:
    """Send one request and return its answer's value.

    Raises:
        MooncakeError: the service answered with a code (its family's class).
        TypeError, ValueError: the service refused an argument as the in-process call would.
        ConnectionError, OSError: the connection failed.
    """
    send_frame(sock, message, fds)
    frame = recv_frame(sock)
    if frame is None:
        raise ConnectionResetError("the standalone client closed the connection")
    answer, extra = frame
    for fd in extra:
        os.close(fd)
    if "err" in answer:
        raise error_for(int(answer["err"]), str(answer.get("msg") or ""), answer.get("key"))
    if "exc" in answer:
        kind = TypeError if answer["exc"] == "TypeError" else ValueError
        raise kind(str(answer.get("msg") or ""))
    return answer.get("r")


class Attachment:
    """An engine process's link to its host's standalone client service.

    Args:
        path: the service's socket.
        mem_pool_size: bytes of host memory the engine means to register (told to the
            service, as upstream's ``setup_dummy`` argument).
        local_buffer_size: accepted for upstream's sake (no staging buffer is needed).
        max_connections: connections open at once; callers beyond wait for a free one.

    Raises:
        UnavailableError: the first connection failed (no service, wrong user, ...).
    """

    def __init__(
        self,
        path: Path,
        mem_pool_size: int = 0,
        local_buffer_size: int = 0,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        self.path = path
        self._hello = {
            "op": "hello",
            "mem_pool_size": mem_pool_size,
            "local_buffer_size": local_buffer_size,
            "pid": os.getpid(),
        }
        self._max = max_connections
        self._cond = threading.Condition()
        self._idle: list[_Conn] = []
        self._open = 0
        self._closed = False
        self._wanted: dict[int, HostRegion] = {}  # allocation base -> allocation
        self._starts: dict[int, int] = {}  # registered start -> allocation base
        first = self._connect()
        self.hostname = str(first.info.get("hostname", ""))
        with self._cond:
            self._open += 1
            self._idle.append(first)
        host_memory().listen(self)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def _connect(self) -> _Conn:
        try:
            return _Conn(self.path, self._hello)
        except (OSError, ProtocolError) as exc:
            raise UnavailableError(
                ErrorCode.RPC_FAIL, f"standalone client at {self.path} unreachable: {exc}"
            ) from exc

    # -- registered memory -------------------------------------------------------------------

    def register(self, ptr: int, size: int) -> None:
        """Allow zero-copy calls on ``[ptr, ptr + size)``, which must lie inside one
        :class:`HostMemory` allocation (the whole allocation is shared with the service, at
        once, so that a refusal is reported here). Registering a start again replaces it.

        Raises:
            InvalidParamsError: the range is not inside one allocation.
            NoSpaceError: the service's cap on mapped memory (``--max_pool_size``) refused it.
            UnavailableError: the service cannot be reached.
        """
        region = host_memory().find(ptr, size)
        if region is None:
            raise error_for(
                ErrorCode.INVALID_PARAMS,
                f"{size} bytes at {ptr:#x} are not inside memory from MooncakeHostMemAllocator"
                " or alloc_from_mem_pool (a standalone service can only map that memory)",
            )
        with self._cond:
            shared = self._wanted.get(region.address) is region
            self._starts[ptr] = region.address
            self._wanted[region.address] = region
        if shared:
            return
        try:
            conn = self._acquire()
        except MooncakeError:
            self.unregister(ptr)
            raise
        broken = True
        try:
            refused = self._sync(conn)
            broken = False
        except (OSError, ProtocolError) as exc:
            self.unregister(ptr)
            raise UnavailableError(ErrorCode.RPC_FAIL, f"registering failed: {exc}") from exc
        finally:
            self._release(conn, broken)
        code = refused.get(region.address)
        if code is not None:
            self.unregister(ptr)
            raise error_for(code, f"the standalone client refused {region.size} bytes")

    def unregister(self, ptr: int) -> bool:
        """Forget the registration starting at ``ptr``; the service unmaps the allocation
        once no registration uses it. False when nothing was registered there."""
        with self._cond:
            base = self._starts.pop(ptr, None)
            if base is None:
                return False
            if base not in self._starts.values():
                self._wanted.pop(base, None)
        return True

    def shares(self, ptr: int, size: int) -> bool:
        """Whether ``[ptr, ptr + size)`` (size > 0) lies inside one allocation this
        attachment shares with the service (one with a registration in it): exactly the
        memory the service's zero-copy calls may reach. O(log n) in live allocations."""
        region = host_memory().find(ptr, size)
        if region is None:
            return False
        with self._cond:
            return self._wanted.get(region.address) is region

    def forget(self, region: HostRegion) -> None:
        """``region`` was freed: drop every registration inside it, and have the service
        unmap it now on the idle connections (busy ones do before their next call)."""
        with self._cond:
            if self._wanted.get(region.address) is not region:
                return
            del self._wanted[region.address]
            for start in [s for s, b in self._starts.items() if b == region.address]:
                del self._starts[start]
            idle, self._idle = self._idle, []
        for conn in idle:
            broken = True
            try:
                self._sync(conn)
                broken = False
            except (OSError, ProtocolError, MooncakeError):
                pass  # a broken connection is dropped; the service then unmaps everything
            finally:
                self._release(conn, broken)

    def _sync(self, conn: _Conn) -> dict[int, int]:
        """Bring ``conn``'s registrations up to date (before each of its calls), so a freed
        allocation is unmapped before a new one at the same address is used.

        Returns:
            The allocations the service refused (base to code): they stay unshared on this
            connection, and calls on them fail per key with INVALID_PARAMS.
        """
        with self._cond:
            wanted = dict(self._wanted)
        for base, region_id in list(conn.synced.items()):
            current = wanted.get(base)
            if current is None or current.region_id != region_id:
                exchange(conn.sock, {"op": "unregister", "base": base})
                del conn.synced[base]
        refused: dict[int, int] = {}
        for base, region in wanted.items():
            if base in conn.synced:
                continue
            code = exchange(
                conn.sock, {"op": "register", "base": base, "size": region.size}, [region.fd]
            )
            if code == 0:
                conn.synced[base] = region.region_id
            else:
                refused[base] = int(code)
        return refused

    # -- calls -------------------------------------------------------------------------------

    def _acquire(self) -> _Conn:
        with self._cond:
            while True:
                if self._closed:
                    raise error_for(ErrorCode.INVALID_PARAMS, "the store is closed")
                while self._idle:
                    conn = self._idle.pop()
                    if conn.alive():
                        return conn
                    conn.close()
                    self._open -= 1
                if self._open < self._max:
                    self._open += 1
                    break
                self._cond.wait()
        try:
            return self._connect()
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise

    def _release(self, conn: _Conn, broken: bool) -> None:
        with self._cond:
            if broken or self._closed:
                conn.close()
                self._open -= 1
            else:
                self._idle.append(conn)
            self._cond.notify()

    def request(self, message: dict[str, Any]) -> Any:
        """Run one request on a free connection (registrations synced first).

        Raises:
            UnavailableError: RPC_FAIL when the service cannot be reached or the connection
                broke during the call (its outcome is then unknown).
            MooncakeError, TypeError, ValueError: as :func:`exchange`.
        """
        conn = self._acquire()
        broken = True
        try:
            self._sync(conn)
            result = exchange(conn.sock, message)
            broken = False
            return result
        except (OSError, ProtocolError) as exc:
            raise UnavailableError(
                ErrorCode.RPC_FAIL, f"standalone client connection failed: {exc}"
            ) from exc
        except BaseException as exc:
            # The service answered (with a code or a refusal): the connection is fine.
            broken = not isinstance(exc, (TypeError, ValueError, MooncakeError))
            raise
        finally:
            self._release(conn, broken)

    def call(self, method: str, *args: Any) -> Any:
        """Run the service's typed-client ``method`` with ``args`` (engine addresses)."""
        return self.request({"op": "call", "m": method, "a": list(args)})

    def close(self) -> None:
        """Close every connection: the service unmaps this engine's memory (objects stay in
        the service's segment). Idempotent."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            conn.close()
