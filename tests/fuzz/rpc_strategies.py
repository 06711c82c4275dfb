"""Hypothesis strategies for master RPC requests: whole messages built from the proto's
descriptors, and raw bytes (random, or a serialized message mutated).

Generated messages always serialize, so the master must decode and answer them; their field
values are random but biased towards what exists (keys, sessions, client and segment ids of a
real client), so that the fuzz reaches the paths behind validation. Raw bytes may or may not
decode; the master either answers or refuses them as undecodable.

Runtime identifiers (a real client's id, its segment's id) are known only once a master runs:
the test appends them to :data:`RUNTIME_IDS` before generating.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

from tests.fuzz.api_strategies import KEY_POOL, SESSION_POOL

FORBIDDEN_TENANT = "canary"
"""The tenant holding the value every example checks; no generated request names it."""

RUNTIME_IDS: list[str] = []
FIXED_IDS = [f"00000000-0000-4000-8000-00000000000{i}" for i in range(4)]

_text = st.text(max_size=16)
_edge_text = st.sampled_from(["", "\x00", "x" * 5000, "é😀", "default", "k0\x00", " "])


def _from_pool(pool: list[str]) -> st.SearchStrategy[str]:
    return st.sampled_from(pool)


def _runtime_id() -> st.SearchStrategy[str]:
    # Read when drawn, not when built: the test fills RUNTIME_IDS after import.
    return st.integers(0, 7).map(
        lambda i: RUNTIME_IDS[i % len(RUNTIME_IDS)] if RUNTIME_IDS else FIXED_IDS[i % 4]
    )


_ids = st.one_of(_runtime_id(), _from_pool(FIXED_IDS), _text, _edge_text)
STRINGS: dict[str, st.SearchStrategy[str]] = {
    "tenant_id": st.one_of(_from_pool(["default", "", "t1", "fuzz"]), _text, _edge_text).filter(
        lambda t: t != FORBIDDEN_TENANT
    ),
    "key": st.one_of(_from_pool(KEY_POOL), _text, _edge_text),
    "session_id": st.one_of(_from_pool(SESSION_POOL), _text, _edge_text),
    "pattern": st.one_of(
        _from_pool(["^k", "k[0-3]", ".*", "(", "(a)\\1", "(?=x)", "a{1001}", "\\C", ""]), _text
    ),
    "client_id": _ids,
    "segment_id": _ids,
    "id": _ids,
    "cursor": st.one_of(_from_pool(KEY_POOL + SESSION_POOL), _text, _edge_text),
}
for _plural, _single in (("keys", "key"), ("keep_keys", "key"), ("session_ids", "session_id")):
    STRINGS[_plural] = STRINGS[_single]

_SMALL = st.integers(0, 20)
INTS: dict[str, st.SearchStrategy[int]] = {
    "write_id": _SMALL,
    "write_ids": _SMALL,
    "read_ids": _SMALL,
    "value_length": st.one_of(st.integers(0, 1 << 16), st.just(1 << 40)),
    "value_lengths": st.one_of(st.integers(0, 1 << 16), st.just(1 << 40)),
    "limit": st.one_of(st.integers(0, 2000), st.just(2**32 - 1)),
    "replica_num": st.integers(0, 4),
    "candidate_size": st.integers(0, 8),
    "lease_mode": st.integers(-1, 3),
    "soft_pin_action": st.integers(-1, 3),
    "data_type": st.integers(-1, 10),
    "base": st.sampled_from([0, 1, 4096, 2**63]),
    "size": st.sampled_from([0, 1, 4096, 1 << 20, 2**40, 2**63]),
}

_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _integers(field: FieldDescriptor) -> st.SearchStrategy[int]:
    low, high = _RANGES[field.type]
    edges = st.sampled_from(sorted({low, high, 0, 1, max(low, -1), min(high, 2**31)}))
    whole = st.one_of(st.integers(0, 16), edges, st.integers(low, high))
    biased = INTS.get(field.name)
    if biased is None:
        return whole
    # Biased values reach past validation; the whole range still appears one time in three.
    fitted = biased.map(lambda v: min(max(v, low), high))
    return st.one_of(fitted, fitted, whole)


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return st.one_of(STRINGS.get(field.name, st.one_of(_text, _edge_text)), _text)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=32)
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, width=32)
    return _integers(field)


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    """Messages of ``descriptor``'s type with random (often absent) field values."""
    cls = message_factory.GetMessageClass(descriptor)
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.message_type is not None:
            if depth >= 3:
                continue
            value = messages(field.message_type, depth + 1)
        else:
            value = _scalar(field)
        if field.is_repeated:
            value = st.one_of(st.lists(value, max_size=4), st.lists(value, min_size=5, max_size=40))
        optional[field.name] = value
    return st.fixed_dictionaries({}, optional=optional).map(lambda fields: cls(**fields))


def _bad_utf8_field(number: int) -> bytes:
    """A length-delimited field ``number`` whose bytes are not UTF-8."""
    return bytes([(number << 3) | 2]) + b"\x03\xff\xfe\xfd" if number < 16 else b""


def raw_payloads(descriptor: Descriptor) -> st.SearchStrategy[tuple[str, bytes]]:
    """``(how it was made, bytes)``: random bytes, and serialized messages of
    ``descriptor``'s type truncated, bit-flipped, or with a field of invalid UTF-8 added."""
    serialized = messages(descriptor).map(lambda m: m.SerializeToString())
    string_numbers = [
        f.number
        for f in descriptor.fields
        if f.type == FieldDescriptor.TYPE_STRING or f.message_type is not None
    ] or [1]

    def flip(data: bytes, at: int, bit: int) -> bytes:
        if not data:
            return bytes([1 << bit])
        at %= len(data)
        return data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1 :]

    return st.one_of(
        st.binary(max_size=64).map(lambda b: ("random", b)),
        st.tuples(serialized, st.integers(0, 64)).map(lambda t: ("truncated", t[0][: t[1]])),
        st.tuples(serialized, st.integers(0, 1 << 16), st.integers(0, 7)).map(
            lambda t: ("bit-flipped", flip(*t))
        ),
        st.tuples(serialized, st.sampled_from(string_numbers)).map(
            lambda t: ("bad-utf8", t[0] + _bad_utf8_field(t[1]))
        ),
    )
