"""Data-plane capabilities (:mod:`mooncake_py.capability`): what a grant allows, and that no
byte of it can be changed without the segment's key."""

from __future__ import annotations

import uuid

import pytest

from mooncake_py import capability
from mooncake_py.capability import GRANT, GRANT_BYTES, MAP, READ, WRITE

KEY = bytes(range(32))
SEGMENT = str(uuid.UUID(int=0x1234)).encode()
OFFSET, LENGTH = 4096, 8192
NOW = 1_700_000_000_000
EXPIRES = NOW + 60_000


def grant(mode: int = READ, key: bytes = KEY, expires: int = EXPIRES) -> bytes:
    return capability.grant_of(capability.mint(key, SEGMENT, OFFSET, LENGTH, mode, expires))


def allows(granted: bytes, offset: int = OFFSET, length: int = LENGTH, mode: int = READ) -> bool:
    return capability.verify(KEY, SEGMENT, granted, offset, length, mode, now=NOW)


def test_a_minted_grant_allows_its_range_and_mode() -> None:
    assert len(grant()) == GRANT_BYTES == 41
    assert allows(grant())
    assert GRANT.unpack(grant(READ | WRITE))[:4] == (OFFSET, LENGTH, READ | WRITE, EXPIRES)


@pytest.mark.parametrize(
    ("field", "value"),
    [(0, OFFSET - 4096), (0, OFFSET + 1), (1, LENGTH * 2), (1, LENGTH - 1), (2, READ | WRITE)]
    + [(2, READ | MAP), (3, EXPIRES + 3_600_000), (3, EXPIRES - 1)],
)
def test_every_field_is_covered_by_the_tag(field: int, value: int) -> None:
    """Re-packing a grant with one field changed (tag kept) makes it worthless, even when the
    changed grant would allow the very request."""
    fields = list(GRANT.unpack(grant()))
    fields[field] = value
    forged = GRANT.pack(*fields)
    assert not capability.verify(KEY, SEGMENT, forged, OFFSET + 1, 1, READ, now=NOW)


@pytest.mark.parametrize("index", range(GRANT_BYTES - capability.TAG_BYTES, GRANT_BYTES))
def test_every_tag_byte_counts(index: int) -> None:
    forged = bytearray(grant())
    forged[index] ^= 0x01
    assert not allows(bytes(forged))


def test_the_tag_binds_the_segment_and_the_key() -> None:
    other_segment = str(uuid.UUID(int=0x1235)).encode()
    assert not capability.verify(KEY, other_segment, grant(), OFFSET, LENGTH, READ, now=NOW)
    assert not capability.verify(bytes(32), SEGMENT, grant(), OFFSET, LENGTH, READ, now=NOW)
    # Minted with another key: a valid-looking grant that the segment's key does not sign.
    assert not allows(grant(key=bytes(reversed(KEY))))


def test_a_segment_without_a_key_allows_nothing() -> None:
    """Keyed with nothing, BLAKE2s is a public hash: a grant 'minted' with an empty key must
    never verify, or anybody could make one."""
    unkeyed = grant(key=b"")
    assert not capability.verify(b"", SEGMENT, unkeyed, OFFSET, LENGTH, READ, now=NOW)


def test_expiry_is_exclusive_and_defaults_to_the_wall_clock() -> None:
    assert capability.verify(KEY, SEGMENT, grant(), OFFSET, LENGTH, READ, now=EXPIRES - 1)
    assert not capability.verify(KEY, SEGMENT, grant(), OFFSET, LENGTH, READ, now=EXPIRES)
    assert not capability.verify(KEY, SEGMENT, grant(), OFFSET, LENGTH, READ, now=EXPIRES + 1)
    fresh = grant(expires=capability.now_ms() + 60_000)
    stale = grant(expires=capability.now_ms() - 1)
    assert capability.verify(KEY, SEGMENT, fresh, OFFSET, LENGTH, READ)
    assert not capability.verify(KEY, SEGMENT, stale, OFFSET, LENGTH, READ)


@pytest.mark.parametrize(
    ("offset", "length", "allowed"),
    [
        (OFFSET, LENGTH, True),
        (OFFSET, 0, True),
        (OFFSET + LENGTH, 0, True),  # an empty range at the very end
        (OFFSET + 100, 100, True),
        (OFFSET + LENGTH - 1, 1, True),
        (OFFSET - 1, 1, False),
        (OFFSET - 1, LENGTH + 1, False),
        (OFFSET, LENGTH + 1, False),
        (OFFSET + LENGTH, 1, False),
        (OFFSET + LENGTH - 1, 2, False),
        (0, 1 << 40, False),
    ],
)
def test_only_the_granted_range_is_allowed(offset: int, length: int, allowed: bool) -> None:
    assert allows(grant(), offset, length) is allowed


@pytest.mark.parametrize(
    ("granted", "asked", "allowed"),
    [
        (READ, READ, True),
        (READ, WRITE, False),
        (READ, READ | WRITE, False),
        (WRITE, WRITE, True),
        (WRITE, READ, False),
        (READ | WRITE, READ, True),
        (READ | WRITE, WRITE, True),
        (READ | MAP, READ, True),
        (READ | MAP, WRITE, False),
        (WRITE | MAP, MAP, True),
        (READ, MAP, False),
    ],
)
def test_modes(granted: int, asked: int, allowed: bool) -> None:
    assert allows(grant(granted), mode=asked) is allowed


@pytest.mark.parametrize(
    "size", [0, 1, GRANT_BYTES - 1, GRANT_BYTES + 1, capability.CAPABILITY_BYTES]
)
def test_malformed_grants_are_invalid(size: int) -> None:
    whole = capability.mint(KEY, SEGMENT, OFFSET, LENGTH, READ | MAP, EXPIRES)
    malformed = (whole + bytes(64))[:size]
    assert not allows(malformed)


def test_zero_bytes_are_no_grant() -> None:
    assert not allows(bytes(GRANT_BYTES), 0, 0)


def test_grant_and_proof_key_parts() -> None:
    proof = capability.proof_key(KEY, SEGMENT)
    mapped = capability.mint(KEY, SEGMENT, OFFSET, LENGTH, READ | MAP, EXPIRES)
    assert len(mapped) == capability.CAPABILITY_BYTES
    assert capability.proof_key_of(mapped) == proof
    assert allows(capability.grant_of(mapped))
    # Without MAP no proof key is attached.
    unmapped = capability.mint(KEY, SEGMENT, OFFSET, LENGTH, READ, EXPIRES)
    assert len(unmapped) == GRANT_BYTES and capability.proof_key_of(unmapped) == b""
    assert capability.grant_of(b"") == b"" and capability.proof_key_of(b"") == b""


def test_proofs_show_the_key_without_revealing_it() -> None:
    proof = capability.proof_key(KEY, SEGMENT)
    assert len(proof) == capability.PROOF_KEY_BYTES and KEY[:16] not in proof
    assert proof == capability.proof_key(KEY, SEGMENT)
    assert proof != capability.proof_key(bytes(reversed(KEY)), SEGMENT)
    assert proof != capability.proof_key(KEY, str(uuid.UUID(int=0x1235)).encode())
    nonce = capability.new_nonce()
    assert len(nonce) == capability.NONCE_BYTES and nonce != capability.new_nonce()
    answer = capability.prove(proof, nonce)
    assert answer == capability.prove(proof, nonce)
    assert answer != capability.prove(proof, capability.new_nonce())
    assert answer != capability.prove(capability.proof_key(bytes(32), SEGMENT), nonce)


def test_segment_keys_are_fresh() -> None:
    keys = {capability.new_segment_key() for _ in range(16)}
    assert len(keys) == 16 and all(len(k) == capability.KEY_BYTES for k in keys)


def test_a_prepared_signer_agrees_with_the_functions() -> None:
    signer = capability.SegmentSigner(KEY, SEGMENT)
    minted = signer.mint(OFFSET, LENGTH, READ | MAP, EXPIRES)
    assert minted == capability.mint(KEY, SEGMENT, OFFSET, LENGTH, READ | MAP, EXPIRES)
    grant = capability.grant_of(minted)
    assert signer.verify(grant, OFFSET, LENGTH, READ, now=EXPIRES - 1)
    assert not signer.verify(grant, OFFSET, LENGTH, READ, now=EXPIRES)
    other = capability.SegmentSigner(KEY, SEGMENT + b"x", with_proof=False)
    assert other.proof == b"" and not other.verify(grant, OFFSET, LENGTH, READ, now=0)
    assert not capability.SegmentSigner(b"", SEGMENT).verify(grant, OFFSET, LENGTH, READ, now=0)
