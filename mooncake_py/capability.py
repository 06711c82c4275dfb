"""Data-plane capabilities: proof that the master let a caller touch a range of a segment.

Every segment has a secret key that its owner makes at mount and sends to the master
(``Segment.capability_key``; the master never sends it back). With every replica it hands out
(replica lists, write reservations, task starts) the master mints a capability for exactly
that replica's range and access mode, valid for a short time. The owner's data plane (the TCP
transfer service, and the local socket that hands out its shared memory) serves a request
only when it carries a capability that

- was made with the segment's key (a keyed BLAKE2s tag of 16 bytes: BLAKE2's keyed mode is a
  MAC, three times cheaper here than HMAC-SHA256),
- covers the requested range and allows the requested access,
- has not expired (wall-clock milliseconds; hosts need clocks synchronised well within the
  capability TTL).

So a process that never talked to the master, or a tenant that was never given one of the
segment's replicas, cannot read or write a byte of it, token or no token.

Layout of a capability as the master hands it out (:data:`CAPABILITY_BYTES`)::

    grant = offset u64 | length u64 | mode u8 | expires_ms u64 | tag 16 bytes   (41 bytes)
    proof key 16 bytes

Only the grant goes to the owner. The proof key (one per segment, derived from its key; empty
in a grant without :data:`MAP`) lets the holder check that the peer it asks for shared memory
really holds the segment's key (:func:`prove`), so no impostor on the local socket can hand it
memory that a writer would then fill with its values.

Thread-safety: pure functions over immutable bytes.
Complexity: one keyed BLAKE2s over 41 bytes per :func:`mint` or :func:`verify` (under a
microsecond).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import time

READ = 1
"""The grant allows reading the range."""
WRITE = 2
"""The grant allows writing the range."""
MAP = 4
"""The grant allows mapping the whole segment's memory (same host, an unshared segment: every
object in it belongs to the holder's tenant)."""

KEY_BYTES = 32
TAG_BYTES = 16
PROOF_KEY_BYTES = 16
NONCE_BYTES = 16
GRANT = struct.Struct("<QQBQ16s")
"""offset, length, mode, expires_ms, tag."""
GRANT_BYTES = GRANT.size
CAPABILITY_BYTES = GRANT_BYTES + PROOF_KEY_BYTES
"""The longest capability: a grant with :data:`MAP` and its proof key."""

_SIGNED = struct.Struct("<QQBQ")
_PROOF_LABEL = b"mooncake-py proof key\x00"
_PROVE_LABEL = b"mooncake-py owner proof\x00"


def new_segment_key() -> bytes:
    """A fresh random segment key (:data:`KEY_BYTES` bytes)."""
    return secrets.token_bytes(KEY_BYTES)


def now_ms() -> int:
    """The wall clock in milliseconds, as capabilities count expiry."""
    return time.time_ns() // 1_000_000


class SegmentSigner:
    """Mints and checks one segment's grants, with the keyed hash of its id prepared once
    (a copy of the prepared state per grant costs about 60 % of hashing from scratch).

    Args:
        key: the segment's key (empty: a segment mounted without one; nothing it signs
            verifies).
        segment: the segment id's UTF-8 bytes.
        with_proof: derive the proof key (what :data:`MAP` grants carry); a signer that only
            verifies needs none.

    Attributes:
        proof: the segment's :func:`proof_key` (empty without a key or ``with_proof``).

    Thread-safety: immutable after construction; every method may run in several threads.
    """

    __slots__ = ("_prefix", "_keyed", "proof")

    def __init__(self, key: bytes, segment: bytes, with_proof: bool = True) -> None:
        self._keyed = bool(key)
        self._prefix = hashlib.blake2s(segment, key=key, digest_size=TAG_BYTES)
        self.proof = proof_key(key, segment) if key and with_proof else b""

    def tag(self, offset: int, length: int, mode: int, expires_ms: int) -> bytes:
        """The tag of one grant's fields (the segment id comes first, the fixed-size fields
        last, so no two inputs read alike). O(1)."""
        state = self._prefix.copy()
        state.update(_SIGNED.pack(offset, length, mode, expires_ms))
        return state.digest()

    def mint(self, offset: int, length: int, mode: int, expires_ms: int) -> bytes:
        """A capability for ``length`` bytes at ``offset`` allowing ``mode`` (a union of
        :data:`READ`, :data:`WRITE`, :data:`MAP`) until ``expires_ms``; the proof key is
        appended when ``mode`` has :data:`MAP`."""
        tag = self.tag(offset, length, mode, expires_ms)
        grant = GRANT.pack(offset, length, mode, expires_ms, tag)
        return grant + self.proof if mode & MAP else grant

    def verify(
        self, grant: bytes, offset: int, length: int, mode: int, now: int | None = None
    ) -> bool:
        """See :func:`verify`."""
        if len(grant) != GRANT_BYTES or not self._keyed:
            return False
        g_offset, g_length, g_mode, expires, tag = GRANT.unpack(grant)
        if mode & ~g_mode or offset < g_offset or offset + length > g_offset + g_length:
            return False
        if expires <= (now_ms() if now is None else now):
            return False
        return hmac.compare_digest(tag, self.tag(g_offset, g_length, g_mode, expires))


def mint(
    key: bytes,
    segment: bytes,
    offset: int,
    length: int,
    mode: int,
    expires_ms: int,
) -> bytes:
    """A capability for ``length`` bytes at ``offset`` of the segment whose id is ``segment``
    (its UTF-8 bytes), allowing ``mode`` (a union of :data:`READ`, :data:`WRITE`,
    :data:`MAP`) until ``expires_ms``, with the segment's proof key appended when ``mode``
    has :data:`MAP`. Callers that mint often keep a :class:`SegmentSigner`."""
    return SegmentSigner(key, segment).mint(offset, length, mode, expires_ms)


def grant_of(capability: bytes) -> bytes:
    """The part of a capability its holder sends to the segment's owner (its first
    :data:`GRANT_BYTES`; empty for an empty capability)."""
    return capability[:GRANT_BYTES]


def proof_key_of(capability: bytes) -> bytes:
    """The part of a capability its holder keeps, to check the owner's :func:`prove` (empty
    without :data:`MAP`)."""
    return capability[GRANT_BYTES:CAPABILITY_BYTES]


def verify(
    key: bytes,
    segment: bytes,
    grant: bytes,
    offset: int,
    length: int,
    mode: int,
    now: int | None = None,
) -> bool:
    """Whether ``grant`` lets its holder access ``length`` bytes at ``offset`` of the
    segment with ``mode`` (every bit of it allowed) at wall-clock ``now`` (ms; default now).

    Malformed grants (wrong length) are simply invalid, and so is every grant for an empty
    ``key`` (a segment mounted without one: keyed with nothing, BLAKE2s is a plain hash that
    anybody could compute). Constant time in the tag.
    """
    signer = SegmentSigner(key, segment, with_proof=False)
    return signer.verify(grant, offset, length, mode, now)


def proof_key(key: bytes, segment: bytes) -> bytes:
    """The segment's proof key: what the master appends to its :data:`MAP` grants and what the
    owner derives from its key. It shows knowledge of the key without revealing it."""
    return hmac.digest(key, _PROOF_LABEL + segment, hashlib.sha256)[:PROOF_KEY_BYTES]


def prove(proof: bytes, nonce: bytes) -> bytes:
    """The owner's answer to a holder's ``nonce`` (compare with :func:`hmac.compare_digest`)."""
    return hmac.digest(proof, _PROVE_LABEL + nonce, hashlib.sha256)[:TAG_BYTES]


def new_nonce() -> bytes:
    """A fresh random nonce for :func:`prove`."""
    return secrets.token_bytes(NONCE_BYTES)
