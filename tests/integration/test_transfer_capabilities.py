"""The TCP transfer service serves only capability holders.

A real store: a master in this process (port 0, capabilities living ``TTL_S``), the victim B as
a client process holding a value in its segment, and a second client C (in this process) with
a segment of its own. An attacker that found B's transfer port and segment id talks the wire
protocol to it directly, with no capability, an expired one, a forged one, C's, a READ grant
for a WRITE and a grant for a range used beyond it. Every request is refused with
ILLEGAL_CLIENT, no byte of B's segment reaches the attacker, a refused WRITE ends its
connection unread, and B's value reads back byte-exact afterwards.

The attacker's genuine grants come from the master (GetReplicaList), as any tenant's do.
"""

from __future__ import annotations

import contextlib
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from mooncake_py import ErrorCode, MooncakeDistributedStore, ReplicateConfig, capability
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.client.transfer import (
    OP_READ,
    OP_WRITE,
    REQUEST,
    REQUEST_MAGIC,
    RESPONSE,
    RESPONSE_MAGIC,
    TransferClient,
    TransferOp,
)
from mooncake_py.testing import InProcessMaster, wait_until
from mooncake_py.types import ReplicaDescriptor
from tests.conftest import ClientProcess, client_config
from tests.integration.client_worker import digest, value_for

TTL_S = 3.0
VALUE_BYTES = 64 << 10
ILLEGAL = int(ErrorCode.ILLEGAL_CLIENT)


@dataclass
class Store:
    master: InProcessMaster
    victim: ClientProcess  # B: owns the segment under attack
    other: MooncakeDistributedStore  # C: a segment of its own
    rpc: MasterClient  # the attacker's (or any tenant's) line to the master

    def replica(self, key: str) -> ReplicaDescriptor:
        """The first replica of ``key``, with a fresh READ capability from the master."""
        located = self.rpc.get_replica_list("default", key, "attacker")
        assert located.code == 0, located
        self.rpc.end_reads("attacker", [located.read_id])
        return located.replicas[0]


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    with InProcessMaster(capability_ttl_sec=TTL_S, default_kv_lease_ttl=1000) as master:
        victim = ClientProcess()
        other = MooncakeDistributedStore()
        rpc = MasterClient(master.address)
        try:
            assert victim.call("setup", config=client_config(master.address, 16 << 20)) == 0
            assert victim.call("put", key="victim", size=VALUE_BYTES) == 0
            assert other.setup(client_config(master.address, 16 << 20)) == 0
            placed = ReplicateConfig(preferred_segment=other.get_hostname())
            assert other.put("other", value_for("other", VALUE_BYTES), placed) == 0
            running = Store(master, victim, other, rpc)
            assert running.replica("victim").segment_id != running.replica("other").segment_id
            yield running
        finally:
            rpc.close()
            other.close()
            victim.stop()


@pytest.fixture(autouse=True)
def victim_intact(store: Store) -> Iterator[None]:
    """After every test, B's value reads back byte-exact, from B itself and across processes."""
    yield
    expected = digest(value_for("victim", VALUE_BYTES))
    assert store.victim.call("get_digest", key="victim") == expected
    assert digest(store.other.get("victim")) == expected


def _header(op: int, segment_id: str, offset: int, length: int, grant: bytes) -> bytes:
    return REQUEST.pack(REQUEST_MAGIC, op, offset, length, uuid.UUID(segment_id).bytes, grant)


def _exchange(endpoint: str, requests: bytes) -> bytes:
    """Send ``requests`` on a fresh connection, half-close it, and return every byte the
    server sent until it closed (an RST after its answers counts as closing)."""
    host, _, port = endpoint.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(requests)
        # The server may have refused and closed first: its answer may still be queued.
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        received = bytearray()
        while True:
            try:
                chunk = sock.recv(1 << 20)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    return bytes(received)


def _statuses(answer: bytes) -> list[tuple[int, int, int]]:
    """(op, status, length) of each answer; the answer must hold nothing but headers."""
    assert len(answer) % RESPONSE.size == 0, f"{len(answer)} bytes: not only answer headers"
    out = []
    for at in range(0, len(answer), RESPONSE.size):
        magic, op, status, length = RESPONSE.unpack_from(answer, at)
        assert magic == RESPONSE_MAGIC
        out.append((op, status, length))
    return out


def _assert_no_value_bytes(answer: bytes) -> None:
    value = value_for("victim", VALUE_BYTES)
    for at in range(0, VALUE_BYTES, 4096):
        assert value[at : at + 32] not in answer


def _forged_variants(genuine: bytes) -> list[bytes]:
    """The genuine grant with its range widened, its mode raised, its life extended (each with
    the tag kept), or one bit of its tag flipped."""
    offset, length, mode, expires, tag = capability.GRANT.unpack(genuine)
    flipped = bytearray(genuine)
    flipped[-1] ^= 0x01
    return [
        capability.GRANT.pack(0, 1 << 40, mode, expires, tag),
        capability.GRANT.pack(offset, length, mode | capability.WRITE, expires, tag),
        capability.GRANT.pack(offset, length, mode, expires + 3_600_000, tag),
        bytes(flipped),
    ]


def test_a_genuine_grant_reads_the_value(store: Store) -> None:
    """The control: the raw protocol this file speaks does read B's bytes under a genuine
    grant, so the refusals below are the capability check's doing."""
    replica = store.replica("victim")
    grant = capability.grant_of(replica.capability)
    answer = _exchange(
        replica.te_endpoint,
        _header(OP_READ, replica.segment_id, replica.offset, VALUE_BYTES, grant),
    )
    assert _statuses(answer[: RESPONSE.size]) == [(OP_READ, 0, VALUE_BYTES)]
    assert answer[RESPONSE.size :] == value_for("victim", VALUE_BYTES)


def test_reads_without_a_valid_capability_are_refused(store: Store) -> None:
    victim, other = store.replica("victim"), store.replica("other")
    genuine = capability.grant_of(victim.capability)
    segment, offset = victim.segment_id, victim.offset
    attempts = [
        (offset, VALUE_BYTES, bytes(capability.GRANT_BYTES)),  # no capability
        (0, 16 << 20, bytes(capability.GRANT_BYTES)),
        *[(offset, VALUE_BYTES, forged) for forged in _forged_variants(genuine)],
        (0, 16 << 20, _forged_variants(genuine)[0]),
        # C's genuine grant, for C's range and for B's.
        (other.offset, VALUE_BYTES, capability.grant_of(other.capability)),
        (offset, VALUE_BYTES, capability.grant_of(other.capability)),
        # B's genuine grant beyond its range: one byte more, before, just after, all of it.
        (offset, VALUE_BYTES + 1, genuine),
        (offset - 1, 2, genuine) if offset else (offset + VALUE_BYTES, 1, genuine),
        (offset + VALUE_BYTES, 4096, genuine),
        (0, 16 << 20, genuine),
    ]
    requests = b"".join(_header(OP_READ, segment, o, n, g) for o, n, g in attempts)
    answer = _exchange(victim.te_endpoint, requests)
    _assert_no_value_bytes(answer)
    assert _statuses(answer) == [(OP_READ, ILLEGAL, 0)] * len(attempts)


def test_a_verified_grant_does_not_stretch_on_the_same_connection(store: Store) -> None:
    """Served once (and remembered by the connection), the grant still allows only its own
    range and mode on that connection."""
    replica = store.replica("victim")
    grant = capability.grant_of(replica.capability)
    segment, offset = replica.segment_id, replica.offset
    requests = (
        _header(OP_READ, segment, offset, 16, grant)
        + _header(OP_READ, segment, offset, VALUE_BYTES + 1, grant)
        + _header(OP_READ, segment, offset + VALUE_BYTES, 16, grant)
        + _header(OP_WRITE, segment, offset, 16, grant)
        + b"\xaa" * 16
    )
    answer = _exchange(replica.te_endpoint, requests)
    value = value_for("victim", VALUE_BYTES)
    assert _statuses(answer[: RESPONSE.size]) == [(OP_READ, 0, 16)]
    assert answer[RESPONSE.size : RESPONSE.size + 16] == value[:16]
    rest = answer[RESPONSE.size + 16 :]
    _assert_no_value_bytes(rest)
    assert _statuses(rest) == [(OP_READ, ILLEGAL, 0)] * 2 + [(OP_WRITE, ILLEGAL, 0)]


def test_writes_without_a_valid_capability_are_refused_and_end_the_connection(
    store: Store,
) -> None:
    victim, other = store.replica("victim"), store.replica("other")
    genuine = capability.grant_of(victim.capability)  # READ (and MAP): not WRITE
    segment, offset = victim.segment_id, victim.offset
    attempts = [
        (offset, bytes(capability.GRANT_BYTES)),
        (offset, genuine),  # a READ grant used for a WRITE
        *[(offset, forged) for forged in _forged_variants(genuine)],
        (offset, capability.grant_of(other.capability)),
    ]
    # A write reservation in C's segment: a genuine WRITE grant, for another segment.
    started = store.rpc.put_start(
        "attacker",
        "default",
        "attacker-key",
        VALUE_BYTES,
        ReplicateConfig(preferred_segment=store.other.get_hostname()),
    )
    assert started.code == 0
    assert started.replicas[0].segment_id != segment
    attempts.append((offset, capability.grant_of(started.replicas[0].capability)))
    payload = b"\x66" * VALUE_BYTES
    for target, grant in attempts:
        # A second request after the refused one: the server must close before reading it.
        requests = (
            _header(OP_WRITE, segment, target, VALUE_BYTES, grant)
            + payload
            + _header(OP_READ, segment, offset, VALUE_BYTES, genuine)
        )
        answer = _exchange(victim.te_endpoint, requests)
        assert _statuses(answer) == [(OP_WRITE, ILLEGAL, 0)]
    store.rpc.put_revoke("attacker", "default", "attacker-key", started.write_id)


def test_an_expired_grant_is_refused(store: Store) -> None:
    replica = store.replica("victim")
    grant = capability.grant_of(replica.capability)
    expires = capability.GRANT.unpack(grant)[3]
    header = _header(OP_READ, replica.segment_id, replica.offset, VALUE_BYTES, grant)
    host, _, port = replica.te_endpoint.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as held:
        held.sendall(header)  # served while valid, and remembered by this connection
        answer = b""
        while len(answer) < RESPONSE.size + VALUE_BYTES:
            chunk = held.recv(1 << 20)
            assert chunk
            answer += chunk
        assert _statuses(answer[: RESPONSE.size]) == [(OP_READ, 0, VALUE_BYTES)]
        wait_until(lambda: capability.now_ms() > expires, TTL_S + 5, what="the grant expired")
        held.sendall(header)
        late = held.recv(1 << 20)
        assert _statuses(late) == [(OP_READ, ILLEGAL, 0)]
    answer = _exchange(replica.te_endpoint, header)  # and on a fresh connection
    _assert_no_value_bytes(answer)
    assert _statuses(answer) == [(OP_READ, ILLEGAL, 0)]


def test_the_client_maps_a_refusal_to_its_op(store: Store) -> None:
    """Through :class:`TransferClient`: an op without a grant gets ILLEGAL_CLIENT (a refused
    WRITE also fails the ops after it), and a genuine one still succeeds."""
    replica = store.replica("victim")
    grant = capability.grant_of(replica.capability)
    tcp = TransferClient()
    try:
        buffer = memoryview(bytearray(VALUE_BYTES))
        segment, offset = replica.segment_id, replica.offset
        ungranted = TransferOp(OP_READ, segment, offset, buffer)
        granted = TransferOp(OP_READ, segment, offset, buffer, grant)
        assert tcp.run(replica.te_endpoint, [ungranted, granted]) == [ILLEGAL, 0]
        assert bytes(buffer) == value_for("victim", VALUE_BYTES)
        too_long = TransferOp(OP_READ, segment, offset, buffer, grant + b"\x00")
        assert tcp.run(replica.te_endpoint, [too_long]) == [ILLEGAL]
        write = TransferOp(OP_WRITE, segment, offset, memoryview(b"\x66" * 64), grant)
        assert tcp.run(replica.te_endpoint, [write, granted]) == [
            ILLEGAL,
            int(ErrorCode.TRANSFER_FAIL),
        ]
    finally:
        tcp.close()


def test_distinct_grants_per_op_in_one_large_batch(store: Store) -> None:
    """Many keys read in one batch, each under its own grant (more than a connection
    remembers): every value arrives byte-exact."""
    keys = [f"many-{i}" for i in range(300)]
    values = [value_for(key, 256) for key in keys]
    in_victim = ReplicateConfig(preferred_segment=store.victim.call("hostname"))
    assert store.other.put_batch(keys, values, in_victim) == 0  # over TCP, WRITE grants
    assert {store.replica(key).segment_id for key in keys} == {store.replica("victim").segment_id}
    assert store.other.get_batch(keys) == values
    assert store.other.batch_remove(keys, force=True) == [0] * len(keys)
