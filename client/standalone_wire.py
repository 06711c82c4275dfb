"""The attach protocol between engine processes and the per-host standalone client service.

Both ends (:mod:`mooncake_py.client.standalone` and
:mod:`mooncake_py.client.standalone_attach`) speak it over one Unix domain stream socket per
connection, strictly request then answer. A frame is a 12-byte prefix (``<IQ``: the length of
a UTF-8 JSON header, then the total length of the binary blobs after it), the header, and the
blobs. The header is plain JSON in which a ``bytes`` value is replaced by ``{"$b": i}`` (the
``i``-th blob, lengths listed under ``"$n"``) and a :class:`~mooncake_py.ReplicateConfig` by
``{"$rc": {...}}``, so values travel without base64 and the receiver gets them as views of
one receive buffer.

A memory registration carries the region's file descriptor as ``SCM_RIGHTS`` ancillary data
on the first byte of its frame. The receiver reads every frame start with ``recvmsg``, so the
descriptor is never dropped, and accepts at most one per frame.

Socket names: ``host:port`` (upstream's ``server_address``) names the socket file
``client-<port>.sock`` in :func:`runtime_dir`; ``unix:/path`` or ``/path`` names a socket file
directly. Only the port matters: the service shares memory with its engines, so it is always
on the engine's host.

Thread-safety: the functions are stateless; a socket must be used by one thread at a time.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import enum
import json
import os
import socket
import stat
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mooncake_py.types import ReplicateConfig

PREFIX = struct.Struct("<IQ")
UCRED = struct.Struct("3i")
MAX_HEADER_BYTES = 256 << 20  # 100k-key batches take about 10 MiB of JSON
DEFAULT_MAX_BLOB_BYTES = 4 << 30
MAX_FDS_PER_FRAME = 1
PROTOCOL_VERSION = 1


class ProtocolError(ConnectionError):
    """The peer sent something that is not a frame of this protocol (or too large a one)."""


# -- socket names and the runtime directory ----------------------------------------------------


def runtime_dir() -> Path:
    """The directory holding this user's service sockets.

    ``MOONCAKE_PY_RUNTIME_DIR`` if set, else ``$XDG_RUNTIME_DIR/mooncake_py`` when
    ``XDG_RUNTIME_DIR`` is set, else ``/tmp/mooncake_py-<uid>``.
    """
    explicit = os.environ.get("MOONCAKE_PY_RUNTIME_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "mooncake_py"
    return Path("/tmp") / f"mooncake_py-{os.getuid()}"


def socket_path_for(server_address: str) -> Path:
    """The socket file that ``server_address`` names (see the module docstring).

    Raises:
        ValueError: neither a path nor ``host:port`` with a numeric port.
    """
    if server_address.startswith("unix:"):
        return Path(server_address[len("unix:") :])
    if server_address.startswith("/"):
        return Path(server_address)
    _, sep, port = server_address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"server address must be host:port or a socket path: {server_address!r}")
    return runtime_dir() / f"client-{int(port)}.sock"


def check_private_dir(path: Path, create: bool) -> None:
    """Make sure ``path`` is a directory owned by this user that nobody else can enter.

    A socket file's own mode is not enough on every system, and a directory another user
    created first could hold a socket of theirs under our name: so the directory is created
    with mode 0700 and refused when it is not ours or is open to others.

    Raises:
        PermissionError: it exists but is not a private directory of this user.
        OSError: it cannot be created (``create``) or does not exist.
    """
    if create:
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700, parents=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(f"{path} is not a directory owned by uid {os.getuid()}")
    if info.st_mode & 0o077:
        raise PermissionError(f"{path} is open to other users (mode {info.st_mode & 0o777:o})")


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a Unix socket (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size)
    pid, uid, gid = UCRED.unpack(raw)
    return pid, uid, gid


# -- values ------------------------------------------------------------------------------------


def _config_fields(config: ReplicateConfig) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        fields[field.name] = value.value if isinstance(value, enum.Enum) else value
    return fields


def _encode(value: Any, blobs: list[memoryview]) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        view = memoryview(value)
        blobs.append(view if view.format == "B" and view.ndim == 1 else view.cast("B"))
        return {"$b": len(blobs) - 1}
    if isinstance(value, ReplicateConfig):
        return {"$rc": _config_fields(value)}
    if isinstance(value, (list, tuple)):
        return [_encode(v, blobs) for v in value]
    if isinstance(value, dict):
        return {str(k): _encode(v, blobs) for k, v in value.items()}
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _decode(value: Any, blobs: Sequence[memoryview]) -> Any:
    if isinstance(value, list):
        return [_decode(v, blobs) for v in value]
    if isinstance(value, dict):
        if "$b" in value and len(value) == 1:
            index = value["$b"]
            if not isinstance(index, int) or not 0 <= index < len(blobs):
                raise ProtocolError(f"blob reference out of range: {index!r}")
            return blobs[index]
        if "$rc" in value and len(value) == 1:
            fields = value["$rc"]
            if not isinstance(fields, dict):
                raise ProtocolError("a ReplicateConfig must be an object")
            names = {f.name for f in dataclasses.fields(ReplicateConfig)}
            # Unknown fields are refused, not ignored: a config field nobody applies would
            # silently store an object differently from what was asked.
            if not set(fields) <= names:
                raise ProtocolError(f"unknown ReplicateConfig fields: {set(fields) - names}")
            return ReplicateConfig(**fields)
        return {k: _decode(v, blobs) for k, v in value.items()}
    return value


# -- frames ------------------------------------------------------------------------------------


def encode_frame(message: dict[str, Any]) -> list[memoryview | bytes]:
    """The pieces of one frame holding ``message`` (bytes values become blobs, not copied)."""
    blobs: list[memoryview] = []
    header = _encode(message, blobs)
    if blobs:
        header["$n"] = [len(b) for b in blobs]
    text = json.dumps(header, separators=(",", ":")).encode()
    total = sum(len(b) for b in blobs)
    return [PREFIX.pack(len(text), total) + text, *blobs]


def send_frame(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    """Send ``message`` as one frame, with ``fds`` on its first byte.

    Raises:
        OSError: the connection failed.
    """
    pieces = encode_frame(message)
    if fds:
        first = bytes(pieces[0])
        sent = socket.send_fds(sock, [first], list(fds))
        if sent < len(first):
            sock.sendall(first[sent:])
        pieces = pieces[1:]
    for piece in pieces:
        sock.sendall(piece)


def _recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    while len(view):
        got = sock.recv_into(view)
        if got == 0:
            raise ConnectionResetError("the peer closed the connection mid-frame")
        view = view[got:]


def _recv_prefix(sock: socket.socket) -> tuple[bytes, list[int]] | None:
    """The 12-byte frame prefix and any descriptors that came with it; None at a clean EOF."""
    data = b""
    fds: list[int] = []
    space = socket.CMSG_SPACE(MAX_FDS_PER_FRAME * array.array("i").itemsize)
    while len(data) < PREFIX.size:
        chunk, ancillary, _flags, _addr = sock.recvmsg(PREFIX.size - len(data), space)
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received = array.array("i")
                received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
                fds.extend(received)
        if not chunk:
            close_fds(fds)
            if data:
                raise ConnectionResetError("the peer closed the connection mid-frame")
            return None
        data += chunk
    return data, fds


def recv_frame(
    sock: socket.socket, max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES
) -> tuple[dict[str, Any], list[int]] | None:
    """Receive one frame: its message (blobs as views of one buffer) and its descriptors.

    Returns:
        None when the peer closed the connection between frames. The caller owns the
        descriptors and must close them.

    Raises:
        ProtocolError: a malformed or oversized frame (the connection is then unusable).
        OSError: the connection failed.
    """
    got = _recv_prefix(sock)
    if got is None:
        return None
    prefix, fds = got
    try:
        header_len, blob_total = PREFIX.unpack(prefix)
        if header_len > MAX_HEADER_BYTES or blob_total > max_blob_bytes:
            raise ProtocolError(f"frame too large: {header_len} + {blob_total} bytes")
        header_bytes = bytearray(header_len)
        _recv_exact_into(sock, memoryview(header_bytes))
        payload = bytearray(blob_total)
        _recv_exact_into(sock, memoryview(payload))
        try:
            header = json.loads(header_bytes)
        except ValueError as exc:
            raise ProtocolError(f"bad frame header: {exc}") from exc
        if not isinstance(header, dict):
            raise ProtocolError("a frame header must be an object")
        lengths = header.pop("$n", [])
        if not isinstance(lengths, list) or not all(isinstance(n, int) and n >= 0 for n in lengths):
            raise ProtocolError("bad blob lengths")
        if sum(lengths) != blob_total:
            raise ProtocolError("blob lengths do not add up to the frame's payload")
        blobs: list[memoryview] = []
        offset = 0
        whole = memoryview(payload)
        for n in lengths:
            blobs.append(whole[offset : offset + n])
            offset += n
        return _decode(header, blobs), fds
    except BaseException:
        close_fds(fds)
        raise


def close_fds(fds: Sequence[int]) -> None:
    """Close every descriptor in ``fds``, ignoring ones already closed."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
