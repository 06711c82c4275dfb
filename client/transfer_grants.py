"""The TCP transfer server's capability check, with the grants a connection has verified.

A request names a segment and carries a grant (:mod:`mooncake_py.capability`); the server
serves it only when the grant was made with the segment's key for the segment's id (its
canonical text, ``str(uuid.UUID(bytes=segment_uuid))``, as the master signs it), covers the
requested range, allows the requested access and has not expired.

The tag is what costs (one keyed BLAKE2s), and a client sends the same grant with every part of
a multi-part op and with every op on a replica it reads again. So each connection keeps the
grants it has verified (:class:`VerifiedGrants`): a request under one of them checks only
range, mode and expiry. The cache is bounded (:data:`VERIFIED_GRANTS_PER_CONNECTION`, oldest
dropped first), so a peer sending endless distinct grants costs one tag check per request and a
fixed amount of memory, nothing more.
"""

from __future__ import annotations

import uuid
from time import time_ns

from mooncake_py import capability

VERIFIED_GRANTS_PER_CONNECTION = 64
"""Verified grants one connection remembers (about 20 KiB at most)."""

_Entry = tuple[bytes, int, int, int, int]
"""The segment key it was verified with, grant offset, grant end, mode, and expiry in wall-clock
nanoseconds (``expires_ms * 10**6``: comparing with :func:`time.time_ns` is the same test as
:func:`~mooncake_py.capability.verify`'s, without a division per request)."""


class VerifiedGrants:
    """The grants one connection has shown and the server has verified.

    Thread-safety: none; one per connection, used by that connection's thread only.
    """

    __slots__ = ("_entries", "_limit", "_segment_uuid", "_signer", "_last", "_last_entry")

    def __init__(self, limit: int = VERIFIED_GRANTS_PER_CONNECTION) -> None:
        self._entries: dict[tuple[bytes, bytes], _Entry] = {}
        self._limit = limit
        # The last segment's signer (its id as text and key prepared): formatting a uuid costs
        # as much as the tag check, and a connection's requests almost always name the same
        # segment under the same key.
        self._segment_uuid = b""
        self._signer: tuple[bytes, capability.SegmentSigner] | None = None
        # The grant used last: consecutive requests (the parts of an op, a batch of reads of
        # one replica) carry the same one, and comparing it is cheaper than hashing it.
        self._last = (b"", b"")
        self._last_entry: _Entry | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def allows(
        self,
        key: bytes,
        segment_uuid: bytes,
        grant: bytes,
        offset: int,
        length: int,
        mode: int,
    ) -> bool:
        """Whether ``grant`` lets the connection access ``length`` bytes at ``offset`` of the
        segment whose uuid is ``segment_uuid`` (16 bytes) and key is ``key`` with ``mode``
        (:data:`~mooncake_py.capability.READ` or :data:`~mooncake_py.capability.WRITE`).

        A segment with an empty key allows nothing. A grant seen before on this connection
        (same segment, same key, same 41 bytes) is not verified again: only its range, mode and
        expiry are checked. A grant whose tag checks out but that does not cover this request
        is not remembered.

        Complexity: O(1); one keyed BLAKE2s for a grant not seen before, none otherwise.
        """
        last_uuid, last_grant = self._last
        if grant == last_grant and segment_uuid == last_uuid:
            entry = self._last_entry
        else:
            entry = self._entries.get((segment_uuid, grant))
            if entry is not None:
                self._last, self._last_entry = (segment_uuid, grant), entry
        if entry is not None and entry[0] == key:
            _, start, end, allowed, expires_ns = entry
            return (
                not mode & ~allowed
                and start <= offset
                and offset + length <= end
                and time_ns() < expires_ns
            )
        signer = self._signer
        if segment_uuid != self._segment_uuid or signer is None or signer[0] != key:
            text = str(uuid.UUID(bytes=segment_uuid)).encode()
            signer = (key, capability.SegmentSigner(key, text, with_proof=False))
            self._segment_uuid, self._signer = segment_uuid, signer
        if not signer[1].verify(grant, offset, length, mode):
            return False
        start, size, allowed, expires, _ = capability.GRANT.unpack(grant)
        if len(self._entries) >= self._limit:
            del self._entries[next(iter(self._entries))]  # the oldest
        entry = (key, start, start + size, allowed, expires * 1_000_000)
        self._entries[(segment_uuid, grant)] = entry
        self._last, self._last_entry = (segment_uuid, grant), entry
        return True
