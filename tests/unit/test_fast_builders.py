"""The shortcuts of the hot paths build exactly what the slow ways build: frozen dataclasses
made without their ``__init__``, batch answers encoded entry by entry, and batches of views of
registered memory."""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any

import pytest

from mooncake_py._proto import master_pb2 as pb
from mooncake_py._wire import codec
from mooncake_py._wire.builders import frozen_builder
from mooncake_py.client.buffers import RegisteredBuffers, bytes_view
from mooncake_py.types import (
    PutStartResult,
    ReplicaDescriptor,
    ReplicaListResult,
    ReplicaStatus,
)

REPLICA_FIELDS: dict[str, Any] = {
    "id": 7,
    "status": ReplicaStatus.COMPLETE,
    "segment_id": "seg",
    "segment_name": "127.0.0.1:1",
    "offset": 4096,
    "size": 64,
    "te_endpoint": "127.0.0.1:2",
    "host_id": "host",
    "capability": b"cap",
}


def test_a_built_descriptor_equals_the_constructed_one_and_stays_frozen() -> None:
    built = frozen_builder(ReplicaDescriptor)(**REPLICA_FIELDS)
    made = ReplicaDescriptor(**REPLICA_FIELDS)
    assert type(built) is ReplicaDescriptor
    assert built == made and hash(built) == hash(made) and repr(built) == repr(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.offset = 0  # type: ignore[misc]
    # Each instance owns its fields: building another one changes nothing in the first.
    other = frozen_builder(ReplicaDescriptor)(**{**REPLICA_FIELDS, "offset": 1})
    assert built.offset == 4096 and other.offset == 1


def test_classes_the_shortcut_would_not_build_exactly_get_their_own_constructor() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        value: int

    @dataclasses.dataclass(frozen=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:
            if self.value < 0:
                raise ValueError("negative")

    @dataclasses.dataclass(frozen=True)
    class Defaulted:
        values: list[int] = dataclasses.field(default_factory=list)

    for cls in (Slotted, Checked, Defaulted):
        assert frozen_builder(cls) is cls
    with pytest.raises(ValueError, match="negative"):
        frozen_builder(Checked)(value=-1)


def _replicas(count: int) -> tuple[ReplicaDescriptor, ...]:
    return tuple(
        ReplicaDescriptor(**{**REPLICA_FIELDS, "id": i, "offset": i * 64}) for i in range(count)
    )


def test_batch_answers_encode_as_entries_constructed_one_by_one() -> None:
    starts = [PutStartResult(0, _replicas(2), 11), PutStartResult(-704), PutStartResult(0, (), 3)]
    slow = pb.BatchPutStartResponse(results=[codec.encode_put_start(s) for s in starts])
    fast = codec.encode_put_starts(starts)
    assert fast.SerializeToString() == slow.SerializeToString()
    reference = pb.PutStartResponse(
        code=0,
        write_id=11,
        replicas=[
            pb.ReplicaDescriptor(**{**REPLICA_FIELDS, "id": i, "offset": i * 64, "status": 3})
            for i in range(2)
        ],
    )
    assert codec.encode_put_start(starts[0]) == reference
    lists = [ReplicaListResult(0, _replicas(3), 100, 64, 9), ReplicaListResult(-704)]
    fast_lists = codec.encode_replica_lists(lists)
    wire = pb.BatchGetReplicaListResponse.FromString(fast_lists.SerializeToString())
    assert codec.decode_replica_lists(wire) == lists
    assert codec.decode_put_starts(
        pb.BatchPutStartResponse.FromString(fast.SerializeToString())
    ) == [PutStartResult(0, _replicas(2), 11), PutStartResult(-704), PutStartResult(0, (), 3)]


def test_a_replica_status_outside_the_enum_still_fails_decoding() -> None:
    bad = codec.encode_replica(_replicas(1)[0])
    bad.status = 99
    with pytest.raises(ValueError, match="99"):
        codec.decode_replica(bad)


def test_views_of_a_batch_match_views_one_by_one() -> None:
    memory = (ctypes.c_char * 8192)()
    other = (ctypes.c_char * 1024)()
    base, second = ctypes.addressof(memory), ctypes.addressof(other)
    buffers = RegisteredBuffers()
    assert buffers.register(base, 8192) and buffers.register(second, 1024)
    ranges = [
        (base, 64),
        (base + 8128, 64),
        (second + 10, 100),  # another buffer
        (base + 8190, 4),  # runs past the end
        (base - 1, 8),  # before the start
        (base + 64, 0),  # empty
        (base + 128, -1),  # negative
        (0, 8),
        (base + 4096, 4096),  # back in the first buffer, up to its end
    ]
    ptrs, sizes = [p for p, _ in ranges], [s for _, s in ranges]
    batch = buffers.view_each(ptrs, sizes)
    single = [buffers.view(p, s) for p, s in ranges]
    assert [v is None for v in batch] == [v is None for v in single]
    assert [v is None for v in batch] == [False, False, False, True, True, True, True, True, False]
    for fast, slow, (ptr, size) in zip(batch, single, ranges, strict=True):
        if fast is None or slow is None:
            continue
        assert len(fast) == size and not fast.readonly
        fast[:] = bytes([ptr % 251]) * size  # written through the batch view ...
        assert bytes(slow) == bytes([ptr % 251]) * size  # ... seen through the single one
    # Registering a buffer again with another size changes what its views may cover.
    assert buffers.register(base, 128)
    inside, beyond = buffers.view_each([base + 64, base + 4096], [64, 64])
    assert inside is not None and len(inside) == 64 and beyond is None
    with pytest.raises(ValueError):
        buffers.view_each([base], [])


def test_a_bytes_value_is_viewed_as_it_is() -> None:
    value = b"abc"
    view = bytes_view(value)
    assert view.obj is value and view.format == "B" and bytes(view) == value
    assert bytes_view(bytearray(b"xy")).tolist() == [120, 121]
    with pytest.raises(TypeError):
        bytes_view("text")
