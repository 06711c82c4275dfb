"""Snapshots: a row image as Parquet tables, and back.

A snapshot is seven Parquet files (one table each, zstd-compressed): ``objects`` (one row per
object, its replicas as a list of structs), ``memberships`` (tenant, key, session id: which
sessions hold which objects), ``sessions``, ``segments``, ``clients``, ``ranges`` (every
allocator range held) and ``meta`` (one row: the sequence number, the id counters, the format
version). The columns are the fields of the
rows in ``proto/ha.proto``, so a snapshot can be read with any Parquet tool (pyarrow, DuckDB,
pandas) to see what the master held.

The leader takes a snapshot without stopping: :func:`capture_sliced` walks the live state in
slices (other calls run in between), so the tables may mix images from just before and just
after some records; replaying every record after the sequence number the walk started at
makes them exact, because a record carries whole row images (last image wins).

Thread-safety: capture under the service lock (slice by slice); encoding and decoding touch no
shared state.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mooncake_py._wire import ha_records

from ..state.store import StoreState
from .rows import RowCapture, RowImage, TimeBase

FORMAT_VERSION = 2
ROWS_PER_SLICE = 2048

_REPLICA = pa.struct(
    [
        ("id", pa.uint64()),
        ("segment_id", pa.string()),
        ("offset", pa.uint64()),
        ("size", pa.uint64()),
        ("status", pa.int32()),
    ]
)
_SCALARS = {
    ha_records.ObjectRow: [
        ("tenant", pa.string()),
        ("key", pa.string()),
        ("size", pa.uint64()),
        ("client_id", pa.string()),
        ("put_start_ms", pa.int64()),
        ("data_type", pa.int32()),
        ("write_id", pa.uint64()),
        ("hard_pinned", pa.bool_()),
        ("soft_pin_deadline_ms", pa.int64()),
        ("has_pending_pin", pa.bool_()),
        ("pending_pin_action", pa.int32()),
        ("pending_pin_ttl_ms", pa.int64()),
        ("group_id", pa.string()),
        # A snapshot taken before the column existed decodes with 0 (no attempt id).
        ("attempt_id", pa.uint64()),
    ],
    ha_records.SessionRow: [
        ("tenant", pa.string()),
        ("session_id", pa.string()),
        ("pinned", pa.bool_()),
        ("created_ms", pa.int64()),
        ("last_active_ms", pa.int64()),
    ],
    ha_records.SegmentRow: [
        ("id", pa.string()),
        ("name", pa.string()),
        ("base", pa.uint64()),
        ("size", pa.uint64()),
        ("te_endpoint", pa.string()),
        ("protocol", pa.string()),
        ("host_id", pa.string()),
        ("shared", pa.bool_()),
        ("capability_key", pa.binary()),
        ("client_id", pa.string()),
        ("tenant", pa.string()),
        ("disk", pa.bool_()),
        ("next_offset", pa.uint64()),
    ],
    ha_records.ClientRow: [
        ("client_id", pa.string()),
        ("bound", pa.bool_()),
        ("tenant", pa.string()),
        ("ok", pa.bool_()),
    ],
}


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def _table_of(kind: Any, rows: list[Any]) -> pa.Table:
    columns = {
        name: pa.array([getattr(r, name) for r in rows], typ) for name, typ in _SCALARS[kind]
    }
    if kind is ha_records.ObjectRow:
        columns["replicas"] = pa.array(
            [
                [
                    {
                        "id": p.id,
                        "segment_id": p.segment_id,
                        "offset": p.offset,
                        "size": p.size,
                        "status": p.status,
                    }
                    for p in r.replicas
                ]
                for r in rows
            ],
            pa.list_(_REPLICA),
        )
    return pa.table(columns)


def encode_image(image: RowImage) -> dict[str, bytes]:
    """The Parquet tables of ``image`` (see the module docstring). O(rows)."""
    ranges = [(s, o, n) for s, held in image.ranges.items() for o, n in held.items()]
    meta = pa.table(
        {
            "format_version": pa.array([FORMAT_VERSION], pa.int32()),
            "seq": pa.array([image.seq], pa.uint64()),
            "next_write_id": pa.array([image.next_write_id], pa.uint64()),
            "next_replica_id": pa.array([image.next_replica_id], pa.uint64()),
            "kv_cache_released_tenants": pa.array(
                [sorted(image.kv_cache_released_tenants)], pa.list_(pa.string())
            ),
            "segments_with_ranges": pa.array([sorted(image.ranges)], pa.list_(pa.string())),
        }
    )
    members = [(t, k, s) for (t, k), ids in image.memberships.items() for s in sorted(ids)]
    return {
        "objects": _parquet(_table_of(ha_records.ObjectRow, list(image.objects.values()))),
        "memberships": _parquet(
            pa.table(
                {
                    "tenant": pa.array([m[0] for m in members], pa.string()),
                    "key": pa.array([m[1] for m in members], pa.string()),
                    "session_id": pa.array([m[2] for m in members], pa.string()),
                }
            )
        ),
        "sessions": _parquet(_table_of(ha_records.SessionRow, list(image.sessions.values()))),
        "segments": _parquet(_table_of(ha_records.SegmentRow, list(image.segments.values()))),
        "clients": _parquet(_table_of(ha_records.ClientRow, list(image.clients.values()))),
        "ranges": _parquet(
            pa.table(
                {
                    "segment_id": pa.array([r[0] for r in ranges], pa.string()),
                    "offset": pa.array([r[1] for r in ranges], pa.uint64()),
                    "size": pa.array([r[2] for r in ranges], pa.uint64()),
                }
            )
        ),
        "meta": _parquet(meta),
    }


def decode_image(tables: Mapping[str, bytes]) -> RowImage:
    """The row image a snapshot holds.

    Raises:
        ValueError: a table is missing, unreadable, or of another format version.

    Complexity: O(rows).
    """
    try:
        read = {name: pq.read_table(io.BytesIO(tables[name])) for name in _TABLES}
    except (KeyError, pa.ArrowException, OSError) as exc:
        raise ValueError(f"unreadable snapshot: {exc}") from exc
    meta = read["meta"].to_pylist()[0]
    if meta["format_version"] != FORMAT_VERSION:
        raise ValueError(f"snapshot format {meta['format_version']} is not {FORMAT_VERSION}")
    image = RowImage()
    image.seq = meta["seq"]
    image.next_write_id = meta["next_write_id"]
    image.next_replica_id = meta["next_replica_id"]
    image.kv_cache_released_tenants = set(meta["kv_cache_released_tenants"])
    for row in read["objects"].to_pylist():
        replicas = row.pop("replicas")
        obj = ha_records.ObjectRow(**row)
        for replica in replicas:
            obj.replicas.add(**replica)
        image.objects[(obj.tenant, obj.key)] = obj
    for row in read["memberships"].to_pylist():
        image.memberships.setdefault((row["tenant"], row["key"]), set()).add(row["session_id"])
    for row in read["sessions"].to_pylist():
        image.sessions[(row["tenant"], row["session_id"])] = ha_records.SessionRow(**row)
    for row in read["segments"].to_pylist():
        image.segments[row["id"]] = ha_records.SegmentRow(**row)
    for row in read["clients"].to_pylist():
        image.clients[row["client_id"]] = ha_records.ClientRow(**row)
    for segment_id in meta["segments_with_ranges"]:
        image.ranges[segment_id] = {}
    for row in read["ranges"].to_pylist():
        image.ranges.setdefault(row["segment_id"], {})[row["offset"]] = row["size"]
    return image


_TABLES = ("objects", "memberships", "sessions", "segments", "clients", "ranges", "meta")


def capture_sliced(
    state: StoreState,
    lock: Any,
    times: Callable[[], TimeBase],
    seq_now: Callable[[], int],
) -> Iterator[RowImage | None]:
    """Walk the live state into a :class:`RowImage`, one slice per step.

    A generator: each ``next()`` takes ``lock`` and captures up to :data:`ROWS_PER_SLICE`
    rows, yielding None between slices; the last step yields the image, whose ``seq`` is
    the last record captured before the walk began (``seq_now()`` then): replaying every
    record after it makes the image exact.
    """
    capture = RowCapture(state, times)
    with lock:
        image = RowImage()
        image.seq = seq_now()
        # References only: the ids (tuples built per record) are made in the later slices.
        records = state.objects.snapshot()
        image.next_write_id, image.next_replica_id = state.peek_next_ids()
        image.kv_cache_released_tenants = set(state.kv_cache_released_tenants)
        for mounted in state.segments.all_segments():
            segment_row = capture.segment_row(mounted.info.id)
            if segment_row is not None:
                image.segments[mounted.info.id] = segment_row
                image.ranges[mounted.info.id] = dict(mounted.allocator.allocations())
        client_ids = list(state.clients.known())
        session_keys = state.sessions.session_keys()
    for start in range(0, len(client_ids), ROWS_PER_SLICE):
        yield None
        with lock:
            for client_id in client_ids[start : start + ROWS_PER_SLICE]:
                client_row = capture.client_row(client_id)
                if client_row is not None:
                    image.clients[client_id] = client_row
    for start in range(0, len(session_keys), ROWS_PER_SLICE):
        yield None
        with lock:
            base = times()
            for tenant, session_id in session_keys[start : start + ROWS_PER_SLICE]:
                session_row = capture.session_row(tenant, session_id, base)
                if session_row is not None:
                    image.sessions[(tenant, session_id)] = session_row
    for start in range(0, len(records), ROWS_PER_SLICE):
        yield None
        with lock:
            base = times()
            for record in records[start : start + ROWS_PER_SLICE]:
                # Whatever is stored under the record's id now (it may have been replaced).
                object_id = (record.tenant, record.key)
                meta = state.objects.get(object_id)
                if meta is not None:
                    image.objects[object_id] = capture.object_row(meta, base)
                    if meta.sessions:
                        image.memberships[object_id] = {s.session_id for s in meta.sessions}
    yield image
