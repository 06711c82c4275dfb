"""Same-host shared memory handed over a local socket, only on a valid capability.

Real client processes on this host, a real master in this process. The test process plays
the raw local processes (no capability, a READ-only grant, forged, expired, another
segment's), the impostor bound on a segment's socket name, and the observer of /dev/shm
and of the processes' /proc/<pid>/maps, fds and resident shared memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mooncake_py import capability
from mooncake_py.client.local_share import ANSWER, GRANTED, MAGIC, REFUSED, REQUEST, socket_name
from mooncake_py.client.segment import host_id
from mooncake_py.testing import InProcessMaster, wait_until
from mooncake_py.types import SegmentInfo
from tests.conftest import ClientProcess, client_config
from tests.integration.client_worker import value_for
from tests.integration.tcp_worker import TcpWorkerProcess, shared_memory_maps

SEGMENT = 64 << 20
SHM_DIR = Path("/dev/shm")


def _segment_files(*pids: int) -> list[str]:
    """What /dev/shm holds of these processes: files they have open or mapped, or named after
    them (as segments once were). There must never be any. (Other programs on this host may
    keep files of their own there.)"""
    found = {name for name in os.listdir(SHM_DIR) if any(f"-{pid}-" in name for pid in pids)}
    for pid in pids:
        with contextlib.suppress(OSError):  # a process that is gone holds nothing
            found.update(m for m in shared_memory_maps(pid) if m.startswith("dev/shm/"))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith(str(SHM_DIR) + "/"):
                        found.add(target)
    return sorted(found)


def _holders(segment_id: str) -> list[int]:
    """Every process that maps the segment's memory or holds its memfd (the kernel frees the
    memory once there is none)."""
    name = f"memfd:mooncake_py/{segment_id}"
    holders = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            held = name in shared_memory_maps(pid) or any(
                os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/" + name)
                for fd in os.listdir(f"/proc/{pid}/fd")
            )
        except OSError:  # gone meanwhile, or not ours to look at
            continue
        if held:
            holders.append(pid)
    return holders


def _rss_shmem(pid: int) -> int:
    """Shared memory resident in ``pid``'s mappings (``RssShmem`` of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssShmem line in /proc/<pid>/status")


def _segment_of(master: InProcessMaster, hostname: str) -> SegmentInfo:
    (info,) = [info for info, _, _, _ in master.service.segment_usage() if info.name == hostname]
    return info


def _grant(info: SegmentInfo, mode: int, ttl_ms: int = 60_000, key: bytes = b"") -> bytes:
    """A grant for the first 4 KiB of ``info``, as the master would mint it."""
    expires = capability.now_ms() + ttl_ms
    return capability.mint(key or info.capability_key, info.id.encode(), 0, 4096, mode, expires)[
        : capability.GRANT_BYTES
    ]


def _ask(segment_id: str, grant: bytes, nonce: bytes) -> tuple[int, bytes, list[int]]:
    """A raw request on the owner's socket: the answer's status, proof and descriptors (the
    caller closes them)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(socket_name(segment_id))
        sock.sendall(REQUEST.pack(MAGIC, grant, nonce))
        data, fds, _, _ = socket.recv_fds(sock, ANSWER.size, 4)
    _, status, _, proof = ANSWER.unpack(data)
    return status, proof, fds


@pytest.fixture
def owner_and_reader() -> Iterator[tuple[InProcessMaster, TcpWorkerProcess, TcpWorkerProcess]]:
    with InProcessMaster() as master:
        owner, reader = TcpWorkerProcess(), TcpWorkerProcess()
        try:
            assert owner.call("setup", config=client_config(master.address, SEGMENT)) == 0
            assert reader.call("setup", config=client_config(master.address, 0)) == 0
            yield master, owner, reader
        finally:
            owner.stop()
            reader.stop()
        master.service.check()


def test_same_host_reads_and_writes_go_through_the_handover_not_tcp(
    owner_and_reader: tuple[InProcessMaster, TcpWorkerProcess, TcpWorkerProcess],
) -> None:
    master, owner, reader = owner_and_reader
    sizes = {"small": 1, "page": 4096 + 3, "mib": 1 << 20, "big": 5 << 20}
    for name, size in sizes.items():
        assert owner.call("put", key=name, size=size) == 0
    served_before = owner.call("transfer_view")["served"]
    for name, size in sizes.items():
        assert reader.call("get_digest", key=name) == owner.call(
            "expected_digest", key=name, size=size
        ), name
    keys = [f"w-{i}" for i in range(8)]
    assert reader.call("put_from", keys=keys, size=256 << 10) == [0] * 8  # into A's memory
    expected = [reader.call("expected_digest", key=k, size=256 << 10) for k in keys]
    assert owner.call("get_into_digests", keys=keys, size=256 << 10) == expected
    assert reader.call("get_into_digests", keys=keys, size=256 << 10) == expected

    owner_view = owner.call("transfer_view")
    assert owner_view["served"] == served_before == [0, 0]  # the TCP service served nothing
    segment = _segment_of(master, owner.call("hostname"))
    assert reader.call("transfer_view")["shm_maps"] == [f"memfd:mooncake_py/{segment.id}"]
    assert owner_view["shm_maps"] == [f"memfd:mooncake_py/{segment.id}"]
    assert _segment_files(owner.pid, reader.pid) == []


def test_a_shared_segment_gets_no_map_and_is_read_over_tcp() -> None:
    with InProcessMaster() as master:
        owner = TcpWorkerProcess({"MOONCAKE_PY_SHARED_SEGMENT": "1"})
        reader = TcpWorkerProcess()
        try:
            assert owner.call("setup", config=client_config(master.address, SEGMENT)) == 0
            assert reader.call("setup", config=client_config(master.address, 0)) == 0
            assert _segment_of(master, owner.call("hostname")).shared
            assert owner.call("put", key="k", size=70_000) == 0
            expected = owner.call("expected_digest", key="k", size=70_000)
            assert reader.call("get_digest", key="k") == expected
            assert owner.call("transfer_view")["served"] == [1, 70_000]
            assert reader.call("transfer_view")["shm_maps"] == []
        finally:
            owner.stop()
            reader.stop()


def test_raw_local_processes_get_no_memory_without_a_valid_map_grant(
    owner_and_reader: tuple[InProcessMaster, TcpWorkerProcess, TcpWorkerProcess],
) -> None:
    master, owner, reader = owner_and_reader
    assert owner.call("put", key="secret", size=4096) == 0  # while A's is the only segment
    other = TcpWorkerProcess()
    try:
        assert other.call("setup", config=client_config(master.address, 8 << 20)) == 0
        mine = _segment_of(master, owner.call("hostname"))
        theirs = _segment_of(master, other.call("hostname"))
        valid = _grant(mine, capability.READ | capability.MAP)
        forged = bytearray(valid)
        forged[-1] ^= 1
        refused = {
            "no capability": bytes(capability.GRANT_BYTES),
            "READ only": _grant(mine, capability.READ),
            "WRITE only": _grant(mine, capability.WRITE),
            "forged": bytes(forged),
            "expired": _grant(mine, capability.READ | capability.MAP, ttl_ms=-1),
            "another key": _grant(mine, capability.MAP, key=capability.new_segment_key()),
            "another segment": _grant(theirs, capability.READ | capability.MAP),
        }
        for case, grant in refused.items():
            status, proof, fds = _ask(mine.id, grant, capability.new_nonce())
            for fd in fds:
                os.close(fd)
            assert (status, proof, fds) == (REFUSED, bytes(16), []), case

        # The same raw request with a valid MAP grant gets the memory, and the owner's proof.
        nonce = capability.new_nonce()
        status, proof, fds = _ask(mine.id, valid, nonce)
        try:
            assert status == GRANTED and len(fds) == 1
            expected = capability.prove(
                capability.proof_key(mine.capability_key, mine.id.encode()), nonce
            )
            assert proof == expected
            assert os.fstat(fds[0]).st_size == mine.size
            located = master.service.object_of("default", "secret")
            assert located is not None
            offset = located.replicas[0].offset
            assert os.pread(fds[0], 4096, offset) == value_for("secret", 4096)
        finally:
            for fd in fds:
                os.close(fd)
    finally:
        other.stop()


class FakeOwner:
    """Bound on a segment's socket name: answers one handover with its own memory (sealed
    as a real segment is) and a proof made with ``proof_key`` (the segment's real one, or
    not)."""

    def __init__(self, segment_id: str, size: int, proof_key: bytes) -> None:
        self.fd = os.memfd_create("fake-owner", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        self._size = size
        self._proof_key = proof_key
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(socket_name(segment_id))
        self._listener.listen(4)
        self._listener.settimeout(30)
        self.asked = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(5)
            request = b""
            while len(request) < REQUEST.size:
                chunk = conn.recv(REQUEST.size - len(request))
                if not chunk:
                    return
                request += chunk
            self.asked += 1
            _, _, nonce = REQUEST.unpack(request)
            proof = capability.prove(self._proof_key, nonce)
            socket.send_fds(conn, [ANSWER.pack(MAGIC, GRANTED, self._size, proof)], [self.fd])

    def content_digest(self) -> str:
        return hashlib.sha256(os.pread(self.fd, self._size, 0)).hexdigest()

    def close(self) -> None:
        self._listener.close()
        self._thread.join(timeout=10)
        os.close(self.fd)


@pytest.mark.parametrize("honest", [False, True], ids=["impostor", "key_holder"])
def test_an_impostor_on_the_socket_name_never_gets_a_writers_bytes(honest: bool) -> None:
    size = 1 << 20
    key = capability.new_segment_key()
    segment_id = str(uuid.uuid4())
    real_proof_key = capability.proof_key(key, segment_id.encode())
    with InProcessMaster() as master:
        writer = ClientProcess()
        # Nothing listens on the advertised transfer endpoint: TCP cannot rescue the write.
        dead_end = socket.create_server(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{dead_end.getsockname()[1]}"
        dead_end.close()
        info = SegmentInfo(
            id=segment_id,
            name="fake-owner:1",
            base=1 << 30,
            size=size,
            te_endpoint=endpoint,
            host_id=host_id(),
            capability_key=key,
        )
        fake = FakeOwner(segment_id, size, real_proof_key if honest else os.urandom(16))
        try:
            assert int(master.service.mount_segment("fake-owner-client", info)) == 0
            assert writer.call("setup", config=client_config(master.address, 0)) == 0
            empty = fake.content_digest()
            codes = writer.call("put_from", keys=["precious"], size=64 << 10)
            assert fake.asked == 1  # the writer did ask whoever holds the name
            if honest:
                # The control: a peer that holds the key gets the bytes through its memory.
                assert codes == [0]
                replica = master.service.object_of("default", "precious").replicas[0]  # type: ignore[union-attr]
                data = os.pread(fake.fd, 64 << 10, replica.offset)
                assert data == value_for("precious", 64 << 10)
            else:
                assert codes[0] != 0  # no proof, no mapping; TCP failed: the put failed
                assert fake.content_digest() == empty  # not one byte reached the impostor
        finally:
            writer.stop()
            fake.close()


def test_kill_9_of_a_segment_host_leaves_no_file_and_frees_its_memory() -> None:
    segment_size = 256 << 20
    batch, value = 32, 1 << 20
    with InProcessMaster() as master:
        owner, reader = TcpWorkerProcess(), TcpWorkerProcess()
        try:
            assert owner.call("setup", config=client_config(master.address, segment_size)) == 0
            assert reader.call("setup", config=client_config(master.address, 0)) == 0
            segment = _segment_of(master, owner.call("hostname"))
            mapping = f"memfd:mooncake_py/{segment.id}"
            resident_before = _rss_shmem(reader.pid)
            # The reader fills 192 MiB of the owner's segment through its own mapping.
            for round_ in range(6):
                keys = [f"fill-{round_}-{i}" for i in range(batch)]
                assert reader.call("put_from", keys=keys, size=value) == [0] * batch
            expected = reader.call("expected_digest", key="fill-5-31", size=value)
            assert owner.call("get_into_digests", keys=["fill-5-31"], size=value) == [expected]
            assert owner.call("transfer_view")["served"] == [0, 0]
            assert mapping in shared_memory_maps(reader.pid)
            resident_full = _rss_shmem(reader.pid)
            assert resident_full - resident_before >= 128 << 20  # the pages are really there
            assert sorted(_holders(segment.id)) == sorted([owner.pid, reader.pid])
            assert _segment_files(owner.pid, reader.pid) == []

            owner.kill()
            # The reader's heartbeat notices the owner's death and lets go of its memory.
            wait_until(
                lambda: mapping not in shared_memory_maps(reader.pid),
                timeout_s=15,
                what="the reader unmapped the dead owner's segment",
            )
            # (The mapping leaves /proc/<pid>/maps before its pages are released.)
            wait_until(
                lambda: _rss_shmem(reader.pid) <= resident_full - (128 << 20),
                timeout_s=15,
                what="the reader's resident shared memory shrank by the segment's pages",
            )
            # Nobody holds the memfd or a mapping of it any more: the kernel has freed it.
            assert _holders(segment.id) == []
            assert _segment_files(owner.pid, reader.pid) == []
            assert reader.call("health") == 0  # the reader lives on
        finally:
            owner.stop()
            reader.stop()
