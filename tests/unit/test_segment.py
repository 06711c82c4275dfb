"""Segment memory without a name (memfd), its handover over the local socket, peer mappings."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from mooncake_py import capability
from mooncake_py.client.local_share import (
    ANSWER,
    MAGIC,
    REFUSED,
    REQUEST,
    REQUEST_TIMEOUT_S,
    HandoverRefused,
    LocalShareServer,
    allows_map,
    request_handover,
    request_segment,
    socket_name,
)
from mooncake_py.client.peer_mappings import FAILURE_MEMORY_S, PeerMappings
from mooncake_py.client.segment import MEMFD_PREFIX, SEAL_SHRINK, LocalSegment, seals_of

SHM_DIR = Path("/dev/shm")
MAP_WRITE = capability.WRITE | capability.MAP


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _capability(key: bytes, segment_id: str, mode: int, ttl_ms: int = 60_000) -> bytes:
    segment = segment_id.encode()
    expires = capability.now_ms() + ttl_ms
    return capability.mint(key, segment, 0, 4096, mode, expires)


@pytest.fixture
def shared() -> Iterator[tuple[LocalSegment, bytes, LocalShareServer]]:
    segment = LocalSegment(1 << 20)
    key = capability.new_segment_key()
    server = LocalShareServer(segment, key)
    yield segment, key, server
    server.close()
    segment.close()


def test_local_segment_is_a_sealed_memfd_with_no_file() -> None:
    segment = LocalSegment(1 << 20)
    try:
        named = [n for n in os.listdir(SHM_DIR) if segment.segment_id in n]
        assert named == [] and f"-{os.getpid()}-" not in " ".join(os.listdir(SHM_DIR))
        target = os.readlink(f"/proc/self/fd/{segment.fd}")
        assert target.startswith(f"/memfd:{MEMFD_PREFIX}{segment.segment_id}")
        segment.view[:5] = b"hello"
        assert os.pread(segment.fd, 5, 0) == b"hello"  # the mapping is the memfd's pages
        if SEAL_SHRINK:
            assert segment.sealed
            seals = seals_of(segment.fd)
            assert seals is not None and seals & SEAL_SHRINK
            with pytest.raises(OSError) as caught:
                os.ftruncate(segment.fd, 4096)
            assert caught.value.errno == errno.EPERM
    finally:
        segment.close()
    segment.close()  # idempotent
    assert segment.fd == -1
    with pytest.raises(ValueError):
        LocalSegment(0)


def test_handover_maps_the_owners_pages(
    shared: tuple[LocalSegment, bytes, LocalShareServer],
) -> None:
    segment, key, server = shared
    cap = _capability(key, segment.segment_id, capability.READ | capability.MAP)
    assert allows_map(cap)
    handover = request_handover(segment.segment_id, cap)
    try:
        assert handover.owner_pid == os.getpid()
        assert handover.memory.size == segment.size
        handover.memory.view[100:104] = b"peer"
        assert bytes(segment.view[100:104]) == b"peer"
        segment.view[200:205] = b"owner"
        assert bytes(handover.memory.view[200:205]) == b"owner"
    finally:
        handover.memory.close()
        if handover.owner_pidfd >= 0:
            os.close(handover.owner_pidfd)
    assert server.granted == 1 and server.refused == 0


def _ask_raw(segment_id: str, grant: bytes) -> tuple[int, list[int]]:
    """Send a request by hand; the answer's status and the descriptors that came with it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(socket_name(segment_id))
        sock.sendall(REQUEST.pack(MAGIC, grant, capability.new_nonce()))
        data, fds, _, _ = socket.recv_fds(sock, ANSWER.size, 4)
        for fd in fds:
            os.close(fd)
        return ANSWER.unpack(data)[1], fds


@pytest.mark.parametrize(
    "case", ["read_only", "claimed_map", "expired", "forged", "other_segment", "other_key"]
)
def test_handover_refuses_grants_without_a_valid_map(
    shared: tuple[LocalSegment, bytes, LocalShareServer], case: str
) -> None:
    segment, key, server = shared
    mode = capability.READ | capability.MAP
    if case == "read_only":
        cap = _capability(key, segment.segment_id, capability.READ)
        assert not allows_map(cap)  # a peer does not even ask: the owner is asked by hand
        assert _ask_raw(segment.segment_id, capability.grant_of(cap)) == (REFUSED, [])
        assert server.granted == 0 and server.refused == 1
        return
    if case == "claimed_map":  # a READ grant whose mode byte was edited to claim MAP
        read = _capability(key, segment.segment_id, capability.READ)
        grant = read[:16] + bytes([read[16] | capability.MAP]) + read[17:]
        cap = grant + capability.proof_key(key, segment.segment_id.encode())
    elif case == "expired":
        cap = _capability(key, segment.segment_id, mode, ttl_ms=-1)
    elif case == "forged":
        good = _capability(key, segment.segment_id, mode)
        cap = good[:30] + bytes([good[30] ^ 1]) + good[31:]
    elif case == "other_segment":
        cap = _capability(key, "another-segment", mode)
    else:
        cap = _capability(capability.new_segment_key(), segment.segment_id, mode)
    assert allows_map(cap)
    with pytest.raises(HandoverRefused):
        request_handover(segment.segment_id, cap)
    assert _ask_raw(segment.segment_id, capability.grant_of(cap)) == (REFUSED, [])
    assert server.granted == 0 and server.refused == 2


def test_silent_and_garbage_connections_are_closed(
    shared: tuple[LocalSegment, bytes, LocalShareServer],
) -> None:
    segment, key, server = shared
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as garbage:
        garbage.settimeout(5)
        garbage.connect(socket_name(segment.segment_id))
        garbage.sendall(b"\xff" * REQUEST.size)
        data, fds, _, _ = socket.recv_fds(garbage, ANSWER.size, 4)
        assert ANSWER.unpack(data)[1] == REFUSED and fds == []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.settimeout(REQUEST_TIMEOUT_S * 5)
        silent.connect(socket_name(segment.segment_id))
        silent.sendall(b"\x00" * 10)  # never the whole request
        assert silent.recv(1) == b""  # closed by the owner after its timeout
    assert server.refused == 2
    # Still serving after both.
    cap = _capability(key, segment.segment_id, capability.READ | capability.MAP)
    handover = request_handover(segment.segment_id, cap)
    handover.memory.close()
    if handover.owner_pidfd >= 0:
        os.close(handover.owner_pidfd)
    assert server.granted == 1


def test_no_owner_here_is_an_os_error() -> None:
    cap = _capability(capability.new_segment_key(), "nobody", capability.READ | capability.MAP)
    with pytest.raises(OSError):
        request_handover("nobody", cap)


def test_peer_mappings_cache_remember_failures_and_prune(
    shared: tuple[LocalSegment, bytes, LocalShareServer],
) -> None:
    segment, key, server = shared
    clock = Clock()
    peers = PeerMappings(clock)
    cap = _capability(key, segment.segment_id, capability.WRITE | capability.MAP)
    try:
        first = peers.get(segment.segment_id, cap, 4096)
        assert first is not None and peers.get(segment.segment_id, cap, 4096) is first
        assert peers.handovers == 1 and server.granted == 1
        assert peers.owner_pid(segment.segment_id) == os.getpid()
        assert peers.get(segment.segment_id, cap, segment.size + 1) is None  # beyond the end
        assert peers.prune() == []  # the owner lives and serves

        # A segment nobody serves here: refused, remembered, asked again once the memory ends.
        other = LocalSegment(4096)
        other_key = capability.new_segment_key()
        other_cap = _capability(other_key, other.segment_id, capability.READ | capability.MAP)
        assert peers.get(other.segment_id, other_cap, 1) is None
        late_server = LocalShareServer(other, other_key)
        assert peers.get(other.segment_id, other_cap, 1) is None  # still remembered
        assert late_server.granted == 0
        clock.now += FAILURE_MEMORY_S + 0.1
        assert peers.get(other.segment_id, other_cap, 1) is not None
        assert late_server.granted == 1

        # An owner that stops serving (closed its store) is pruned: its memory is let go.
        late_server.close()
        assert peers.prune() == [other.segment_id]
        assert peers.mapped_segments() == [segment.segment_id]
        other.close()
    finally:
        peers.close()
    assert peers.mapped_segments() == []


def test_a_new_segment_of_the_same_owner_is_never_taken_for_the_old_one() -> None:
    key = capability.new_segment_key()
    peers = PeerMappings()
    old = LocalSegment(1 << 16)
    old_server = LocalShareServer(old, key)
    try:
        old.view[:3] = b"old"
        mapped_old = peers.get(old.segment_id, _capability(key, old.segment_id, MAP_WRITE), 3)
        assert mapped_old is not None and bytes(mapped_old.view[:3]) == b"old"
        old_server.close()  # the owner unmounts ...
        old.close()
        new = LocalSegment(1 << 16)  # ... and mounts a new segment (a fresh id)
        new_server = LocalShareServer(new, key)
        try:
            new.view[:3] = b"new"
            assert new.segment_id != old.segment_id
            mapped_new = peers.get(new.segment_id, _capability(key, new.segment_id, MAP_WRITE), 3)
            assert mapped_new is not None and mapped_new is not mapped_old
            assert bytes(mapped_new.view[:3]) == b"new" and peers.handovers == 2
            assert peers.prune() == [old.segment_id]  # the old name is unbound
            assert peers.mapped_segments() == [new.segment_id]
        finally:
            new_server.close()
            new.close()
    finally:
        peers.close()
        old_server.close()
        old.close()


def test_a_bare_grant_gets_a_descriptor_only_when_it_allows_map(
    shared: tuple[LocalSegment, bytes, LocalShareServer],
) -> None:
    segment, key, server = shared
    read = capability.grant_of(_capability(key, segment.segment_id, capability.READ))
    assert request_segment(segment.segment_id, read) is None
    assert request_segment(segment.segment_id, b"") is None
    assert request_segment("nobody-here", read) is None
    granted = capability.grant_of(_capability(key, segment.segment_id, MAP_WRITE))
    fd = request_segment(segment.segment_id, granted)
    assert fd is not None
    try:
        segment.view[:4] = b"mine"
        assert os.pread(fd, 4, 0) == b"mine"
    finally:
        os.close(fd)
    assert (server.granted, server.refused) == (1, 2)
