"""The transfer server's per-connection grant check (:mod:`mooncake_py.client.transfer_grants`):
a remembered grant still allows only its range, modes and lifetime, and the memory is bounded."""

from __future__ import annotations

import uuid

from mooncake_py import capability
from mooncake_py.capability import READ, WRITE
from mooncake_py.client.transfer_grants import VERIFIED_GRANTS_PER_CONNECTION, VerifiedGrants
from mooncake_py.testing import wait_until

KEY = capability.new_segment_key()
SEGMENT = uuid.uuid4()
SEGMENT_TEXT = str(SEGMENT).encode()


def grant(offset: int = 0, length: int = 4096, mode: int = READ, ttl_ms: int = 60_000) -> bytes:
    return capability.mint(KEY, SEGMENT_TEXT, offset, length, mode, capability.now_ms() + ttl_ms)


def test_a_remembered_grant_still_checks_range_and_mode() -> None:
    grants = VerifiedGrants()
    read = grant(4096, 4096)
    assert grants.allows(KEY, SEGMENT.bytes, read, 4096, 4096, READ)
    assert len(grants) == 1
    assert grants.allows(KEY, SEGMENT.bytes, read, 5000, 100, READ)  # a part of it
    assert not grants.allows(KEY, SEGMENT.bytes, read, 4095, 1, READ)
    assert not grants.allows(KEY, SEGMENT.bytes, read, 8191, 2, READ)
    assert not grants.allows(KEY, SEGMENT.bytes, read, 4096, 4096, WRITE)
    assert not grants.allows(KEY, SEGMENT.bytes, read, 4096, 4096, READ | WRITE)
    assert len(grants) == 1


def test_a_remembered_grant_expires() -> None:
    grants = VerifiedGrants()
    short = grant(ttl_ms=300)
    expires = capability.GRANT.unpack(short)[3]
    assert grants.allows(KEY, SEGMENT.bytes, short, 0, 16, READ)
    wait_until(lambda: capability.now_ms() > expires, 5.0, what="the grant expired")
    assert not grants.allows(KEY, SEGMENT.bytes, short, 0, 16, READ)


def test_a_remembered_grant_is_bound_to_its_segment_and_key() -> None:
    grants = VerifiedGrants()
    read = grant()
    assert grants.allows(KEY, SEGMENT.bytes, read, 0, 16, READ)
    assert not grants.allows(KEY, uuid.uuid4().bytes, read, 0, 16, READ)
    assert not grants.allows(capability.new_segment_key(), SEGMENT.bytes, read, 0, 16, READ)
    assert grants.allows(KEY, SEGMENT.bytes, read, 0, 16, READ)


def test_forged_grants_and_empty_keys_allow_nothing_and_are_not_remembered() -> None:
    grants = VerifiedGrants()
    forged = bytearray(grant())
    forged[-1] ^= 0x80
    for _ in range(3):
        assert not grants.allows(KEY, SEGMENT.bytes, bytes(forged), 0, 16, READ)
    assert not grants.allows(KEY, SEGMENT.bytes, bytes(capability.GRANT_BYTES), 0, 0, READ)
    unkeyed = capability.mint(b"", SEGMENT_TEXT, 0, 4096, READ, capability.now_ms() + 60_000)
    assert not grants.allows(b"", SEGMENT.bytes, unkeyed, 0, 16, READ)
    # Genuine, but not for this request: checked, not remembered.
    assert not grants.allows(KEY, SEGMENT.bytes, grant(mode=READ), 0, 16, WRITE)
    assert len(grants) == 0


def test_the_memory_is_bounded_and_dropped_grants_are_verified_again() -> None:
    grants = VerifiedGrants()
    many = [grant(i * 16, 16) for i in range(VERIFIED_GRANTS_PER_CONNECTION * 3)]
    for i, each in enumerate(many):
        assert grants.allows(KEY, SEGMENT.bytes, each, i * 16, 16, READ)
        assert len(grants) <= VERIFIED_GRANTS_PER_CONNECTION
    assert len(grants) == VERIFIED_GRANTS_PER_CONNECTION
    assert grants.allows(KEY, SEGMENT.bytes, many[0], 0, 16, READ)  # dropped: verified again
    assert not grants.allows(KEY, SEGMENT.bytes, many[0], 16, 16, READ)
