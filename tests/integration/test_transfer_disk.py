"""The TCP transfer service serves a disk tier: a real TransferServer over 127.0.0.1 serving a
memory segment and a DiskStore on real files, read by a real TransferClient under grants minted
as the master mints them (each segment with its own key).

Whole and partial disk reads are byte-exact; no grant or a forged one gets ILLEGAL_CLIENT; a
range spanning two files and a WRITE get INVALID_PARAMS; a deleted object FILE_NOT_FOUND; a
corrupted file FILE_READ_FAIL (and is quarantined); and memory reads on the same connection,
before and after each of these, still work.
"""

from __future__ import annotations

import random
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mooncake_py import capability
from mooncake_py.client.disk_format import FIXED, file_name
from mooncake_py.client.disk_store import DiskStore, DiskWrite
from mooncake_py.client.transfer import (
    OP_READ,
    OP_WRITE,
    REQUEST,
    REQUEST_MAGIC,
    RESPONSE,
    RESPONSE_MAGIC,
    TransferClient,
    TransferOp,
    TransferServer,
)
from mooncake_py.errors import ErrorCode

ILLEGAL = int(ErrorCode.ILLEGAL_CLIENT)
INVALID = int(ErrorCode.INVALID_PARAMS)
NOT_FOUND = int(ErrorCode.FILE_NOT_FOUND)
READ_FAIL = int(ErrorCode.FILE_READ_FAIL)
TRANSFER_FAIL = int(ErrorCode.TRANSFER_FAIL)
HOUR_MS = 3_600_000
MEMORY_BYTES = 1 << 20
# Disk objects: offset -> size. 200_000 and 300_000 are adjacent (a range can span both).
OBJECTS = {0: 4096, 200_000: 100_000, 300_000: 50_000, 1 << 40: 3_000_000}


def content(offset: int, size: int) -> bytes:
    return random.Random(offset).randbytes(size)


@dataclass
class Rig:
    memory_id: str
    memory: memoryview
    memory_key: bytes
    disk_id: str
    disk: DiskStore
    disk_key: bytes
    server: TransferServer
    client: TransferClient

    def disk_grant(self, offset: int, length: int, mode: int = capability.READ) -> bytes:
        return capability.grant_of(
            capability.mint(
                self.disk_key,
                self.disk_id.encode(),
                offset,
                length,
                mode,
                capability.now_ms() + HOUR_MS,
            )
        )

    def memory_read(self, offset: int, length: int) -> tuple[TransferOp, bytes]:
        """A READ of the memory segment under a genuine grant, and the bytes it must get."""
        grant = capability.grant_of(
            capability.mint(
                self.memory_key,
                self.memory_id.encode(),
                offset,
                length,
                capability.READ,
                capability.now_ms() + HOUR_MS,
            )
        )
        buffer = memoryview(bytearray(length))
        op = TransferOp(OP_READ, self.memory_id, offset, buffer, grant)
        return op, bytes(self.memory[offset : offset + length])

    def disk_read(
        self, offset: int, length: int, grant: bytes | None = None
    ) -> tuple[TransferOp, memoryview]:
        buffer = memoryview(bytearray(length))
        if grant is None:
            grant = self.disk_grant(offset, length)
        return TransferOp(OP_READ, self.disk_id, offset, buffer, grant), buffer

    def object_path(self, offset: int) -> Path:
        return Path(self.disk.directory) / "objects" / file_name(offset)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    memory = memoryview(bytearray(random.Random(99).randbytes(MEMORY_BYTES)))
    memory_id, disk_id = str(uuid.uuid4()), str(uuid.uuid4())
    memory_key, disk_key = capability.new_segment_key(), capability.new_segment_key()
    disk = DiskStore(str(tmp_path / "disk"))
    writes = [DiskWrite(o, "t", f"k{o}", content(o, n)) for o, n in OBJECTS.items()]
    assert disk.write_batch(writes) == [0] * len(writes)
    segments = {
        uuid.UUID(memory_id).bytes: (memory, memory_key),
        uuid.UUID(disk_id).bytes: (disk, disk_key),
    }
    server = TransferServer("127.0.0.1", segments.get)
    client = TransferClient()
    try:
        yield Rig(memory_id, memory, memory_key, disk_id, disk, disk_key, server, client)
    finally:
        client.close()
        server.close()
        disk.close()


def test_whole_and_partial_disk_reads_interleaved_with_memory_reads(rig: Rig) -> None:
    ops: list[TransferOp] = []
    checks: list[tuple[memoryview, bytes]] = []
    for offset, size in OBJECTS.items():
        op, buffer = rig.disk_read(offset, size)
        ops.append(op)
        checks.append((buffer, content(offset, size)))
        memory_op, expected = rig.memory_read(offset % MEMORY_BYTES, 1000)
        ops.append(memory_op)
        checks.append((memory_op.buffer, expected))
    # Partial reads under the whole object's grant (replica offset + k), as readers send them.
    big = 1 << 40
    grant = rig.disk_grant(big, OBJECTS[big])
    for skip, length in [(0, 1), (1, 4096), (1_000_000, 1_500_000), (OBJECTS[big] - 7, 7)]:
        op, buffer = rig.disk_read(big + skip, length, grant)
        ops.append(op)
        checks.append((buffer, content(big, OBJECTS[big])[skip : skip + length]))
    assert rig.client.run(rig.server.endpoint, ops) == [0] * len(ops)
    for buffer, expected in checks:
        assert bytes(buffer) == expected
    served_ops, _ = rig.server.served
    assert served_ops == len(ops)


def test_disk_refusals_come_back_as_statuses_on_a_live_connection(rig: Rig) -> None:
    genuine = rig.disk_grant(0, OBJECTS[0])
    flipped = bytearray(genuine)
    flipped[-1] ^= 1
    memory_op, memory_bytes = rig.memory_read(4096, 5000)
    both = rig.disk_grant(200_000, 150_000)  # genuine, for both adjacent objects
    attempts = [
        rig.disk_read(0, OBJECTS[0], b"")[0],  # no grant
        rig.disk_read(0, OBJECTS[0], bytes(flipped))[0],  # forged
        rig.disk_read(0, OBJECTS[0] + 1, genuine)[0],  # beyond the grant
        rig.disk_read(0, 10, rig.disk_grant(0, 10, capability.WRITE))[0],  # WRITE-only grant
        rig.disk_read(250_000, 100_000, both)[0],  # spans two files
        rig.disk_read(150_000, 10, rig.disk_grant(150_000, 10))[0],  # no object there
        memory_op,
    ]
    results = rig.client.run(rig.server.endpoint, attempts)
    assert results == [ILLEGAL, ILLEGAL, ILLEGAL, ILLEGAL, INVALID, NOT_FOUND, 0]
    for refused in attempts[:-1]:
        assert bytes(refused.buffer) == bytes(len(refused.buffer))  # not a byte sent
    assert bytes(memory_op.buffer) == memory_bytes
    assert rig.disk.file_count == len(OBJECTS)  # refusals harmed nothing


def test_a_write_to_the_disk_segment_is_refused(rig: Rig) -> None:
    grant = rig.disk_grant(0, OBJECTS[0], capability.READ | capability.WRITE)
    memory_op, memory_bytes = rig.memory_read(0, 100)
    write = TransferOp(OP_WRITE, rig.disk_id, 0, memoryview(b"\xaa" * 100), grant)
    after, _ = rig.disk_read(0, OBJECTS[0])
    results = rig.client.run(rig.server.endpoint, [memory_op, write, after])
    assert results == [0, INVALID, TRANSFER_FAIL]  # the server closes after a refused WRITE
    assert bytes(memory_op.buffer) == memory_bytes
    # The object is intact, and a new connection reads it.
    again, buffer = rig.disk_read(0, OBJECTS[0])
    assert rig.client.run(rig.server.endpoint, [again]) == [0]
    assert bytes(buffer) == content(0, OBJECTS[0])


def test_a_write_with_a_read_grant_is_refused_before_the_disk_is_looked_at(rig: Rig) -> None:
    """The capability check comes first for disk segments too: raw bytes on a socket."""
    grant = rig.disk_grant(0, 10)
    header = REQUEST.pack(REQUEST_MAGIC, OP_WRITE, 0, 10, uuid.UUID(rig.disk_id).bytes, grant)
    with socket.create_connection(("127.0.0.1", rig.server.port), timeout=10) as sock:
        sock.sendall(header + b"\xbb" * 10)
        answer = sock.recv(RESPONSE.size)
    assert RESPONSE.unpack(answer) == (RESPONSE_MAGIC, OP_WRITE, ILLEGAL, 0)


def test_a_corrupted_file_is_never_served(rig: Rig) -> None:
    offset, size = 200_000, OBJECTS[200_000]
    path = rig.object_path(offset)
    data = bytearray(path.read_bytes())
    header_size = FIXED.unpack_from(data)[3]
    data[header_size + size // 2] ^= 0x01
    path.write_bytes(bytes(data))
    whole, whole_buffer = rig.disk_read(offset, size)
    memory_op, memory_bytes = rig.memory_read(1000, 2000)
    later, _ = rig.disk_read(offset, size)
    neighbour, neighbour_buffer = rig.disk_read(300_000, OBJECTS[300_000])
    results = rig.client.run(rig.server.endpoint, [whole, memory_op, later, neighbour])
    assert results == [READ_FAIL, 0, NOT_FOUND, 0]  # quarantined by the first read
    assert bytes(whole_buffer) == bytes(size)
    assert bytes(memory_op.buffer) == memory_bytes
    assert bytes(neighbour_buffer) == content(300_000, OBJECTS[300_000])
    assert not path.exists()
    assert [e.offset for e in rig.disk.take_quarantined()] == [offset]


def test_a_partial_read_of_a_torn_file_fails(rig: Rig) -> None:
    offset = 1 << 40
    path = rig.object_path(offset)
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size - 1)
    grant = rig.disk_grant(offset, OBJECTS[offset])
    part, buffer = rig.disk_read(offset + 10, 100, grant)
    memory_op, memory_bytes = rig.memory_read(0, 10)
    assert rig.client.run(rig.server.endpoint, [part, memory_op]) == [READ_FAIL, 0]
    assert bytes(buffer) == bytes(100)
    assert bytes(memory_op.buffer) == memory_bytes


def test_a_deleted_object_is_not_found(rig: Rig) -> None:
    assert rig.disk.delete([0]) == 1
    op, _ = rig.disk_read(0, OBJECTS[0])
    assert rig.client.run(rig.server.endpoint, [op]) == [NOT_FOUND]
