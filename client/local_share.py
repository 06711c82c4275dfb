"""Same-host shared memory: an owner hands its segment's memfd to peers holding a capability.

The owner of a segment listens on a Unix stream socket in the abstract namespace named
``\\0mooncake_py/<segment id>`` (:func:`socket_name`): nothing in the file system, nothing the
master has to be told; a peer that knows the segment id (from a replica descriptor) and runs
in the same network namespace can reach it. The id is random and the owner binds the name
before it mounts the segment, so nobody can hold the name first.

Protocol, one exchange per connection::

    peer  -> owner  request (73 bytes):  magic u32 | grant 41 bytes | nonce 16 bytes
    owner -> peer   answer  (29 bytes):  magic u32 | status u8 | size u64 | proof 16 bytes
                    with status GRANTED, exactly one file descriptor (SCM_RIGHTS): the memfd

(little-endian; ``magic`` is :data:`MAGIC`). The peer sends the grant of a capability it
holds for the segment (:func:`~mooncake_py.capability.grant_of`) and a fresh nonce
(:func:`~mooncake_py.capability.new_nonce`). The owner answers GRANTED only when
:func:`~mooncake_py.capability.verify` accepts the grant for its own range with
:data:`~mooncake_py.capability.MAP` (granted by the master for segments not marked shared);
then ``size`` is the segment's size and ``proof`` is
``prove(proof_key(key, segment id), nonce)``. Anything else (a bad magic, a grant that is
forged, expired, READ/WRITE only, or for another segment) is answered REFUSED with no
descriptor and the connection is closed; refusals are logged at debug.

Before it maps or writes anything the peer checks the proof against the proof key of its
capability (:func:`~mooncake_py.capability.proof_key_of`, constant-time compare): only the
holder of the segment's key can answer a fresh nonce, so an impostor bound on some name can
never take a writer's bytes or feed a reader its own. It also checks that exactly one
descriptor came, that it is at least ``size`` bytes and, where seals exist, that it is
sealed against shrinking (a truncation under the mapping would raise SIGBUS).

Bounds. The owner serves every handover on one thread (a selector loop): at most
:data:`MAX_PENDING` connections at once (further ones wait in the listen backlog), each closed
when it has not delivered its fixed-size request within :data:`REQUEST_TIMEOUT_S`. The peer
gives up after :data:`HANDOVER_TIMEOUT_S`.

The peers' cache of mappings and its crash recovery: :mod:`.peer_mappings`.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import selectors
import socket
import stat
import struct
import threading
import time
from dataclasses import dataclass

from mooncake_py import capability

from .segment import SEAL_SHRINK, LocalSegment, MappedMemory, seals_of

log = logging.getLogger(__name__)

SOCKET_PREFIX = b"\0mooncake_py/"
MAGIC = 0x4D435348
"""``b"HSCM"`` read little-endian: the first four bytes of every request and answer."""
REQUEST = struct.Struct(f"<I{capability.GRANT_BYTES}s{capability.NONCE_BYTES}s")
ANSWER = struct.Struct(f"<IBQ{capability.TAG_BYTES}s")
GRANTED = 0
REFUSED = 1

MAX_PENDING = 16
"""Handovers an owner serves at once."""
REQUEST_TIMEOUT_S = 1.0
"""An owner closes a connection whose request has not arrived this long after its accept."""
HANDOVER_TIMEOUT_S = 2.0
"""A peer gives up on a handover (connect, request, answer) after this long."""

_MODE_AT = 16  # the grant's mode byte follows offset u64 and length u64
_NO_PROOF = bytes(capability.TAG_BYTES)


class HandoverRefused(Exception):
    """The owner refused, answered badly, or failed to prove it holds the segment's key."""


def socket_name(segment_id: str) -> bytes:
    """The abstract socket address of the owner of ``segment_id``."""
    return SOCKET_PREFIX + segment_id.encode()


def allows_map(cap: bytes) -> bool:
    """Whether capability ``cap`` carries :data:`~mooncake_py.capability.MAP` and the proof
    key that goes with it (only such a holder asks for a handover). O(1), no crypto."""
    return len(cap) == capability.CAPABILITY_BYTES and bool(cap[_MODE_AT] & capability.MAP)


class LocalShareServer:
    """Hands ``segment``'s memfd to same-host peers that present a valid MAP grant.

    Args:
        segment: the segment to share (it must outlive this server).
        key: the segment's capability key (as mounted).

    Raises:
        OSError: the name could not be bound (in use, or no abstract sockets here).

    Thread-safety: :meth:`close` may be called from any thread; everything else runs on the
    server's own thread.
    """

    def __init__(self, segment: LocalSegment, key: bytes) -> None:
        self._segment = segment
        # Checks grants and makes proofs with the key prepared once.
        self._signer = capability.SegmentSigner(key, segment.segment_id.encode())
        self.name = socket_name(segment.segment_id)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(self.name)
            self._listener.listen(64)
            self._listener.setblocking(False)
            self._wake_r, self._wake_w = socket.socketpair()
        except BaseException:
            self._listener.close()
            raise
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._listening = True
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._pending: dict[socket.socket, _Pending] = {}
        self._closed = threading.Event()
        self.granted = 0
        """Handovers granted so far (read without a lock: a counter for tests and stats)."""
        self.refused = 0
        """Requests refused so far."""
        self._thread = threading.Thread(target=self._run, name="mooncake-local-share", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._closed.is_set():
                for key, _ in self._selector.select(self._wait_s()):
                    if key.fileobj is self._wake_r:
                        return
                    if key.fileobj is self._listener:
                        self._accept()
                    else:
                        self._receive(key.fileobj)  # type: ignore[arg-type]
                self._expire()
        except Exception:
            log.exception("the local share of segment %s stopped", self._segment.segment_id)
        finally:
            for conn in list(self._pending):
                self._drop(conn)
            self._selector.close()
            self._listener.close()
            self._wake_r.close()

    def _wait_s(self) -> float | None:
        if not self._pending:
            return None
        first = min(p.deadline for p in self._pending.values())
        return max(0.0, first - time.monotonic())

    def _accept(self) -> None:
        while len(self._pending) < MAX_PENDING:
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: try again on the next event
                log.debug("local share accept failed: %s", exc)
                return
            conn.setblocking(False)
            self._pending[conn] = _Pending(time.monotonic() + REQUEST_TIMEOUT_S)
            self._selector.register(conn, selectors.EVENT_READ)
        # Full: leave newcomers in the backlog until a slot frees up (see _drop).
        self._selector.unregister(self._listener)
        self._listening = False

    def _receive(self, conn: socket.socket) -> None:
        pending = self._pending[conn]
        try:
            data = conn.recv(REQUEST.size - len(pending.request))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.debug("local share connection failed: %s", exc)
            self._drop(conn)
            return
        if not data:  # closed before a full request (a liveness probe, or a quitter)
            self._drop(conn)
            return
        pending.request += data
        if len(pending.request) == REQUEST.size:
            self._answer(conn, pending.request)
            self._drop(conn)

    def _answer(self, conn: socket.socket, request: bytes) -> None:
        magic, grant, nonce = REQUEST.unpack(request)
        offset, length, _, _, _ = capability.GRANT.unpack(grant)
        allowed = magic == MAGIC and self._signer.verify(grant, offset, length, capability.MAP)
        try:
            if not allowed:
                self.refused += 1
                log.debug(
                    "refused a handover of %s to pid %d", self._segment.segment_id, _pid(conn)
                )
                conn.send(ANSWER.pack(MAGIC, REFUSED, 0, _NO_PROOF))
                return
            answer = ANSWER.pack(
                MAGIC, GRANTED, self._segment.size, capability.prove(self._signer.proof, nonce)
            )
            self.granted += 1  # counted first: the peer may look as soon as it has the answer
            # 29 bytes into an empty socket buffer: a non-blocking send completes at once.
            socket.send_fds(conn, [answer], [self._segment.fd])
        except OSError as exc:  # the peer left; it falls back to TCP
            log.debug("local share answer failed: %s", exc)

    def _expire(self) -> None:
        now = time.monotonic()
        for conn, pending in list(self._pending.items()):
            if pending.deadline <= now:
                self.refused += 1
                log.debug("closed a silent local share connection from pid %d", _pid(conn))
                self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        if self._pending.pop(conn, None) is not None:
            self._selector.unregister(conn)
        conn.close()
        if not self._listening and len(self._pending) < MAX_PENDING:
            self._selector.register(self._listener, selectors.EVENT_READ)
            self._listening = True

    def close(self) -> None:
        """Stop serving and unbind the name (a peer's existing mappings stay valid). Waits
        for the server thread; idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._wake_w.close()


@dataclass(slots=True)
class _Pending:
    deadline: float
    request: bytes = b""


def _pid(sock: socket.socket) -> int:
    """The pid of the process at the other end of a Unix socket (0 when unknown)."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return 0
    pid, _, _ = struct.unpack("3i", creds)
    return int(pid)


@dataclass(slots=True)
class Handover:
    """A peer's segment mapped here, and how to tell whether its owner still lives.

    Attributes:
        memory: the mapping (the caller closes it).
        owner_pid: the owner's pid (SO_PEERCRED at handover; 0 when it is in another pid
            namespace).
        owner_pidfd: a pidfd of the owner (-1 where pidfds are not available), so that a
            reused pid cannot pass for the owner; the caller closes it.
    """

    memory: MappedMemory
    owner_pid: int
    owner_pidfd: int


def request_handover(
    segment_id: str, cap: bytes, timeout_s: float = HANDOVER_TIMEOUT_S
) -> Handover:
    """Ask the owner of ``segment_id`` on this host for its memory, presenting ``cap``.

    Args:
        segment_id: the segment, as in the replica descriptor.
        cap: a capability for it with MAP (:func:`allows_map`).
        timeout_s: the whole exchange's bound.

    Returns:
        The mapping, after the owner proved it holds the segment's key.

    Raises:
        OSError: no owner listens under that name here (another host, or it is gone), or the
            exchange failed or timed out.
        HandoverRefused: refused, malformed answer, bad proof, or a descriptor that is not a
            sealed memory file of the announced size. Nothing was mapped.
    """
    if not allows_map(cap):
        raise HandoverRefused("the capability does not allow mapping")
    nonce = capability.new_nonce()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(socket_name(segment_id))
        pid = _pid(sock)
        # While the owner waits for our request it is alive: this pidfd is the owner's.
        pidfd = _open_pidfd(pid)
        try:
            sock.sendall(REQUEST.pack(MAGIC, capability.grant_of(cap), nonce))
            answer, fds = _receive_answer(sock)
            try:
                memory = _checked_mapping(answer, fds, capability.proof_key_of(cap), nonce)
            finally:
                for fd in fds:
                    os.close(fd)
        except BaseException:
            if pidfd >= 0:
                os.close(pidfd)
            raise
    return Handover(memory, pid, pidfd)


def request_segment(
    segment_id: str, grant: bytes, timeout_s: float = HANDOVER_TIMEOUT_S
) -> int | None:
    """Present a bare ``grant`` to the owner of ``segment_id`` on this host, as any local
    process can, and return the descriptor the owner hands over, or None (refused, no owner
    here, or a failed exchange).

    A grant alone carries no proof key, so the answer's proof is not checked and nothing is
    mapped or written: this shows what an owner hands to whoever presents a grant (access
    checks, diagnostics). Peers use :func:`request_handover`. The caller closes a returned
    descriptor. Never raises.
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(socket_name(segment_id))
            sock.sendall(REQUEST.pack(MAGIC, grant, capability.new_nonce()))
            answer, fds = _receive_answer(sock)
    except (OSError, HandoverRefused):
        return None
    _, status, _, _ = ANSWER.unpack(answer)
    if status == GRANTED and len(fds) == 1:
        return fds[0]
    for fd in fds:
        os.close(fd)
    return None


def _receive_answer(sock: socket.socket) -> tuple[bytes, list[int]]:
    """The answer's bytes and whatever descriptors came with them (the caller closes them)."""
    data, fds, flags, _ = socket.recv_fds(sock, ANSWER.size, 1, socket.MSG_CMSG_CLOEXEC)
    try:
        if flags & socket.MSG_CTRUNC:
            raise HandoverRefused("more descriptors than asked for")
        while data and len(data) < ANSWER.size:
            more = sock.recv(ANSWER.size - len(data))
            if not more:
                break
            data += more
        if len(data) != ANSWER.size:
            raise HandoverRefused("the owner closed without a full answer")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return data, fds


def _checked_mapping(answer: bytes, fds: list[int], proof_key: bytes, nonce: bytes) -> MappedMemory:
    magic, status, size, proof = ANSWER.unpack(answer)
    if magic != MAGIC or status != GRANTED:
        raise HandoverRefused(f"refused (status {status})")
    if not hmac.compare_digest(proof, capability.prove(proof_key, nonce)):
        raise HandoverRefused("the owner could not prove it holds the segment's key")
    if len(fds) != 1 or size <= 0:
        raise HandoverRefused("no memory came with the answer")
    info = os.fstat(fds[0])
    if not stat.S_ISREG(info.st_mode) or info.st_size < size:
        raise HandoverRefused("the descriptor is not memory of the announced size")
    seals = seals_of(fds[0])
    if seals is not None and SEAL_SHRINK and not seals & SEAL_SHRINK:
        raise HandoverRefused("the memory is not sealed against shrinking")
    try:
        return MappedMemory(fds[0], size)
    except (OSError, ValueError) as exc:
        raise HandoverRefused(f"the memory cannot be mapped: {exc}") from exc


def _open_pidfd(pid: int) -> int:
    pidfd_open = getattr(os, "pidfd_open", None)
    if pid <= 0 or pidfd_open is None:
        return -1
    try:
        return int(pidfd_open(pid))
    except OSError:  # an old kernel, or the process is already gone
        return -1
