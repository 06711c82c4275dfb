"""Batch answers in columns: BatchPutStart and BatchGetReplicaList, compact.

A batch answer of one message per key repeats, for every replica, the fields of its segment
(name, endpoint, host) and pays protobuf's per-message cost on both ends: encoding it was a
sixth of the master's work on a batch of small values, and decoding it half of the client's.
A request that sets ``compact`` gets the same answer as columns instead (``PutStartColumns``,
``ReplicaListColumns``, with the replicas in ``ReplicaColumns``; see the proto): one repeated
field per attribute, filled and read in C, and a segment's fields once per answer.

Both ends keep their typed values: the master encodes the same lists of
:class:`~mooncake_py.types.PutStartResult` / :class:`~mooncake_py.types.ReplicaListResult`
and the client decodes the same ones, from either form (a master that predates the field, or
an INTERNAL_ERROR answer, sends one message per key). ``decode(encode(x)) == x`` for every
answer whose descriptors of one segment id agree on its other fields (:func:`agree`); the
master answers any other one message per key.

Every column has one entry per key (or per replica), so an answer encoded in parts and
concatenated (protobuf merges the parts' columns, in order) decodes as the whole answer.

Every function is pure, thread-safe and O(keys + replicas), a few C-level passes per column.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from mooncake_py._proto import master_pb2 as pb
from mooncake_py._wire import codec
from mooncake_py._wire.builders import frozen_builder
from mooncake_py.types import (
    PutStartResult,
    ReplicaDescriptor,
    ReplicaListResult,
    ReplicaStatus,
)

_build_replica = frozen_builder(ReplicaDescriptor)
_build_put_start = frozen_builder(PutStartResult)
_build_replica_list = frozen_builder(ReplicaListResult)
_STATUSES = {int(status): status for status in ReplicaStatus}


def agree(results: Sequence[Any], seen: dict[str, tuple[Any, ...]]) -> bool:
    """Whether every replica descriptor of ``results`` (each with ``replicas``) describes its
    segment id alike (name, endpoint, host, disk), and as the descriptions in ``seen`` (which
    it adds to: an answer checked in parts passes the same dict), so that the columns form,
    which describes each segment once, carries the answer exactly. A sliced batch that spans
    an unmount and remount of a segment id under another endpoint does not: the master then
    answers it one message per key. O(replicas)."""
    places = {
        (r.segment_id, r.segment_name, r.te_endpoint, r.host_id, r.disk)
        for result in results
        for r in result.replicas
    }
    return all(seen.setdefault(place[0], place) == place for place in places)


def _fill_replicas(columns: Any, groups: Sequence[Sequence[ReplicaDescriptor]]) -> None:
    """Put the replicas of each key (``groups``, in key order) into the ReplicaColumns
    ``columns``."""
    counts = [len(group) for group in groups]
    columns.counts.extend(counts)
    if counts.count(1) == len(counts):  # one replica per key (the common answer): no flattening
        flat: Sequence[ReplicaDescriptor] = [group[0] for group in groups]
    else:
        flat = [replica for group in groups for replica in group]
    if not flat:
        return
    segment_ids = [r.segment_id for r in flat]
    columns.ids.extend([r.id for r in flat])
    columns.statuses.extend([r.status for r in flat])  # IntEnum members are ints
    columns.segment_ids.extend(segment_ids)
    columns.offsets.extend([r.offset for r in flat])
    columns.sizes.extend([r.size for r in flat])
    columns.capabilities.extend([r.capability for r in flat])
    # The first descriptor of each segment id (a dict keeps the last value: walk backwards).
    first = dict(zip(reversed(segment_ids), reversed(flat), strict=True))
    add = columns.segments.add
    for segment_id in dict.fromkeys(segment_ids):  # in order of first appearance
        r = first[segment_id]
        add(
            id=segment_id,
            name=r.segment_name,
            te_endpoint=r.te_endpoint,
            host_id=r.host_id,
            disk=r.disk,
        )


def _read_replicas(columns: Any) -> list[tuple[ReplicaDescriptor, ...]]:
    """The replicas of each key from the ReplicaColumns ``columns``, one tuple per key.

    Raises:
        ValueError: a status is not a :class:`ReplicaStatus`, a replica's segment has no
            entry, or the columns disagree in length.
    """
    counts = list(columns.counts)
    segment_ids = list(columns.segment_ids)
    total = sum(counts)
    if not (
        len(segment_ids)
        == len(columns.ids)
        == len(columns.statuses)
        == len(columns.offsets)
        == len(columns.sizes)
        == len(columns.capabilities)
        == total
    ):
        raise ValueError("replica columns disagree in length")
    places: dict[str, tuple[str, str, str, bool]] = {}
    for s in columns.segments:
        places.setdefault(s.id, (s.name, s.te_endpoint, s.host_id, s.disk))
    try:
        statuses = [_STATUSES[s] for s in columns.statuses]
        rows = [places[segment_id] for segment_id in segment_ids]
    except KeyError as exc:
        raise ValueError(f"replica columns: unknown status or segment {exc}") from None
    replicas = [
        _build_replica(
            id=replica_id,
            status=status,
            segment_id=segment_id,
            segment_name=row[0],
            offset=offset,
            size=size,
            te_endpoint=row[1],
            host_id=row[2],
            capability=capability,
            disk=row[3],
        )
        for replica_id, status, segment_id, row, offset, size, capability in zip(
            columns.ids,
            statuses,
            segment_ids,
            rows,
            columns.offsets,
            columns.sizes,
            columns.capabilities,
            strict=True,
        )
    ]
    if counts.count(1) == len(counts):  # one replica per key: no slicing
        return [(replica,) for replica in replicas]
    ends = list(accumulate(counts))
    return [tuple(replicas[end - count : end]) for count, end in zip(counts, ends, strict=True)]


# -- BatchPutStart -----------------------------------------------------------------------------


def encode_put_starts(results: Sequence[PutStartResult]) -> pb.BatchPutStartResponse:
    """One :class:`PutStartResult` per key to a BatchPutStartResponse in columns."""
    message = pb.BatchPutStartResponse()
    columns = message.columns
    columns.codes.extend([r.code for r in results])
    columns.write_ids.extend([r.write_id for r in results])
    columns.retry_after_ms.extend([r.retry_after_ms for r in results])
    _fill_replicas(columns.replicas, [r.replicas for r in results])
    return message


def decode_put_starts(message: pb.BatchPutStartResponse) -> list[PutStartResult]:
    """A BatchPutStartResponse, in columns or one message per key, to one
    :class:`PutStartResult` per key.

    Raises:
        ValueError: a replica's status is not a :class:`ReplicaStatus`, or the columns
            disagree.
    """
    if not message.HasField("columns"):
        return codec.decode_put_starts(message)
    columns = message.columns
    codes = columns.codes
    if not len(codes) == len(columns.write_ids) == len(columns.retry_after_ms):
        raise ValueError("put start columns disagree in length")
    groups = _read_replicas(columns.replicas)
    if len(groups) != len(codes):
        raise ValueError("put start columns disagree in length")
    return [
        _build_put_start(code=code, replicas=group, write_id=write_id, retry_after_ms=retry)
        for code, group, write_id, retry in zip(
            codes, groups, columns.write_ids, columns.retry_after_ms, strict=True
        )
    ]


# -- BatchGetReplicaList -----------------------------------------------------------------------


def encode_replica_lists(results: Sequence[ReplicaListResult]) -> pb.BatchGetReplicaListResponse:
    """One :class:`ReplicaListResult` per key to a BatchGetReplicaListResponse in columns."""
    message = pb.BatchGetReplicaListResponse()
    columns = message.columns
    columns.codes.extend([r.code for r in results])
    columns.lease_ttl_ms.extend([r.lease_ttl_ms for r in results])
    columns.sizes.extend([r.size for r in results])
    columns.read_ids.extend([r.read_id for r in results])
    _fill_replicas(columns.replicas, [r.replicas for r in results])
    return message


def decode_replica_lists(message: pb.BatchGetReplicaListResponse) -> list[ReplicaListResult]:
    """A BatchGetReplicaListResponse, in columns or one message per key, to one
    :class:`ReplicaListResult` per key.

    Raises:
        ValueError: as :func:`decode_put_starts`.
    """
    if not message.HasField("columns"):
        return codec.decode_replica_lists(message)
    columns = message.columns
    codes = columns.codes
    if not len(codes) == len(columns.lease_ttl_ms) == len(columns.sizes) == len(columns.read_ids):
        raise ValueError("replica list columns disagree in length")
    groups = _read_replicas(columns.replicas)
    if len(groups) != len(codes):
        raise ValueError("replica list columns disagree in length")
    return [
        _build_replica_list(code=code, replicas=group, lease_ttl_ms=ttl, size=size, read_id=read)
        for code, group, ttl, size, read in zip(
            codes, groups, columns.lease_ttl_ms, columns.sizes, columns.read_ids, strict=True
        )
    ]
