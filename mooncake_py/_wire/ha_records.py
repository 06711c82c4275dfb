"""The replicated metadata log's messages (``proto/ha.proto``), for the master's HA code.

The generated module is reached only through the wire package; the master's rows
(:mod:`mooncake_py.master.ha.rows`) build and read these messages, and this module turns
records into bytes and back.
"""

from __future__ import annotations

from mooncake_py._proto import ha_pb2

ObjectRow = ha_pb2.ObjectRow
ReplicaRow = ha_pb2.ReplicaRow
SessionRow = ha_pb2.SessionRow
SegmentRow = ha_pb2.SegmentRow
ClientRow = ha_pb2.ClientRow
RangeRow = ha_pb2.RangeRow
RowKey = ha_pb2.RowKey
MembershipRow = ha_pb2.MembershipRow
LogRecord = ha_pb2.LogRecord


def encode_record(record: ha_pb2.LogRecord) -> bytes:
    """A record's stored bytes. O(record)."""
    return record.SerializeToString()


def decode_record(blob: bytes) -> ha_pb2.LogRecord:
    """A stored record.

    Raises:
        ValueError: the bytes are not a record (a corrupt store).
    """
    try:
        return ha_pb2.LogRecord.FromString(blob)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise ValueError(f"a log record does not decode: {exc}") from None
