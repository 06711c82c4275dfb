"""The wire package: every codec, every RPC entry and the stream framing survive a round trip
through real protobuf bytes, and malformed tables or frames are refused."""

from __future__ import annotations

import dataclasses
import socket
import threading
from typing import Any

import pytest

from mooncake_py._wire import codec, frames
from mooncake_py._wire.rpcs import (
    RPCS,
    STATUS,
    Const,
    Field,
    Fields,
    Rpc,
)
from mooncake_py.errors import ErrorCode
from mooncake_py.master.service.facade import PingResult
from mooncake_py.types import (
    ClientStatus,
    DiskReplicaEntry,
    KvSessionInfo,
    KvSessionPage,
    ObjectDataType,
    PutStartResult,
    ReleaseResult,
    ReplicaDescriptor,
    ReplicaListResult,
    ReplicaStatus,
    ReplicateConfig,
    SegmentInfo,
    SoftPinAction,
)

INTERNAL = int(ErrorCode.INTERNAL_ERROR)
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)

SEGMENT = SegmentInfo(
    id="seg-1",
    name="host:1",
    base=4096,
    size=1 << 20,
    te_endpoint="10.0.0.1:7000",
    protocol="tcp",
    host_id="host-a",
    shared=True,
    capability_key=b"k" * 32,
)
OTHER_SEGMENT = SegmentInfo("seg-2", "host:2", 8192, 2 << 20, "10.0.0.2:7000")
REPLICAS = tuple(
    ReplicaDescriptor(
        id=i + 1,
        status=status,
        segment_id=f"seg-{i}",
        segment_name=f"host:{i}",
        offset=64 * i,
        size=100 + i,
        te_endpoint=f"10.0.0.{i}:7000",
        host_id=f"host-{i}",
        capability=bytes([i]) * 41,
    )
    for i, status in enumerate(ReplicaStatus)
)
INFO = KvSessionInfo(
    session_id="conv",
    pinned=True,
    member_count=3,
    created_at=1.5,
    last_active_at=2.25,
    bytes=300,
    exclusive_bytes=200,
    idle_ms=40,
)
RELEASED = ReleaseResult(
    sessions=1,
    released_objects=2,
    freed_bytes=3,
    pending_bytes=4,
    kept_shared=5,
    kept_hard_pinned=6,
    kept_leased=7,
    kept_writing=8,
    kept_pinned=9,
    message="session 'x' did not exist",
)
FULL_CONFIG = ReplicateConfig(
    replica_num=3,
    with_hard_pin=True,
    preferred_segments=["a", "b"],
    preferred_segment="a",
    prefer_alloc_in_same_node=True,
    data_type=ObjectDataType.KVCACHE,
    host_id="host-a",
    group_ids=["g1"],
    soft_pin_action=SoftPinAction.ENABLE,
    soft_pin_ttl_ms=0,  # set to zero is not unset
)


def wire(message: Any) -> Any:
    """``message`` after a trip through its serialized bytes."""
    return type(message).FromString(message.SerializeToString())


# -- codecs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [ReplicateConfig(), FULL_CONFIG, ReplicateConfig(soft_pin_action=SoftPinAction.DISABLE)],
)
def test_config_round_trip(config: ReplicateConfig) -> None:
    assert codec.decode_config(wire(codec.encode_config(config))) == config


def test_config_edges() -> None:
    # No group ids decode as None; the tags of tagged writes never travel in the config.
    tagged = ReplicateConfig(group_ids=[], kv_sessions=[["s"]])
    assert codec.decode_config(wire(codec.encode_config(tagged))) == ReplicateConfig()
    # Unknown enum values: an unknown data type is UNKNOWN, an unknown action stays a number.
    odd = codec.encode_config(ReplicateConfig())
    odd.data_type, odd.soft_pin_action = 99, 7
    decoded = codec.decode_config(wire(odd))
    assert decoded.data_type is ObjectDataType.UNKNOWN
    assert decoded.soft_pin_action == 7 and not isinstance(decoded.soft_pin_action, SoftPinAction)


def test_segment_and_replica_round_trips() -> None:
    assert codec.decode_segment(wire(codec.encode_segment(SEGMENT))) == SEGMENT
    assert codec.decode_segments(codec.encode_segments([SEGMENT, OTHER_SEGMENT])) == [
        SEGMENT,
        OTHER_SEGMENT,
    ]
    assert codec.decode_segments(codec.encode_segments([])) == []
    for replica in REPLICAS:
        decoded = codec.decode_replica(wire(codec.encode_replica(replica)))
        assert decoded == replica and type(decoded.status) is ReplicaStatus
    bad = codec.encode_replica(REPLICAS[0])
    bad.status = 42
    with pytest.raises(ValueError):
        codec.decode_replica(bad)


# (encode, decode, value the master returns, value the client gets)
ANSWERS: list[tuple[Any, Any, Any, Any]] = [
    (codec.encode_status, codec.decode_status, ErrorCode.OK, 0),
    (codec.encode_status, codec.decode_status, ErrorCode.OBJECT_NOT_FOUND, NOT_FOUND),
    (codec.encode_codes, codec.decode_codes, [ErrorCode.OK, ErrorCode.INVALID_PARAMS], [0, -600]),
    (codec.encode_codes, codec.decode_codes, [], []),
    (
        codec.encode_ping,
        codec.decode_ping,
        PingResult(0, ClientStatus.NEED_REMOUNT, 1234),
        (0, ClientStatus.NEED_REMOUNT, 1234),
    ),
    (codec.encode_ready, codec.decode_ready, ("mooncake-py/9", 5123), ("mooncake-py/9", 5123)),
    (codec.encode_ready, codec.decode_ready, ("v", 0), ("v", 0)),
    (codec.encode_count, codec.decode_count, 7, 7),
    (codec.encode_count, codec.decode_count, 0, 0),
    (codec.encode_code_and_count, codec.decode_count, (ErrorCode.OK, 3), 3),
    (codec.encode_code_and_count, codec.decode_count, (ErrorCode.INVALID_PARAMS, 0), -600),
    (codec.encode_exists, codec.decode_exists, 1, 1),
    (codec.encode_exists, codec.decode_exists, 0, 0),
    (codec.encode_exists, codec.decode_exists, NOT_FOUND, NOT_FOUND),
    (codec.encode_exist_results, codec.decode_exist_results, [1, 0, -600], [1, 0, -600]),
    (codec.encode_exist_results, codec.decode_exist_results, [], []),
    (codec.encode_stats, codec.decode_stats, {"objects": 2, "bytes": 1 << 40}, None),
    (codec.encode_stats, codec.decode_stats, {}, None),
    (codec.encode_segment_usage, codec.decode_segment_usage, [], None),
    (
        codec.encode_segment_usage,
        codec.decode_segment_usage,
        [(SEGMENT, "client-1", 4096, 2), (OTHER_SEGMENT, "client-2", 0, 0)],
        # A segment's capability key never leaves the master.
        [
            (dataclasses.replace(SEGMENT, capability_key=b""), "client-1", 4096, 2),
            (OTHER_SEGMENT, "client-2", 0, 0),
        ],
    ),
]
SAME = [
    (codec.encode_put_start, codec.decode_put_start, PutStartResult(0, REPLICAS[:2], 1 << 50)),
    (codec.encode_put_start, codec.decode_put_start, PutStartResult(-200)),
    (
        codec.encode_put_starts,
        codec.decode_put_starts,
        [PutStartResult(0, REPLICAS[2:3]), PutStartResult(-705)],
    ),
    (codec.encode_put_starts, codec.decode_put_starts, []),
    (
        codec.encode_replica_list,
        codec.decode_replica_list,
        ReplicaListResult(0, REPLICAS, 50, 9, 77),
    ),
    (codec.encode_replica_list, codec.decode_replica_list, ReplicaListResult(NOT_FOUND)),
    (
        codec.encode_replica_lists,
        codec.decode_replica_lists,
        [ReplicaListResult(0, REPLICAS[:1], 1, 2), ReplicaListResult(NOT_FOUND)],
    ),
    (codec.encode_replica_lists, codec.decode_replica_lists, []),
    (codec.encode_session_answer, codec.decode_session_answer, (0, INFO)),
    (codec.encode_session_answer, codec.decode_session_answer, (-1200, None)),
    (codec.encode_session_page, codec.decode_session_page, (0, KvSessionPage(["a", "b"], "b"))),
    (codec.encode_session_page, codec.decode_session_page, (0, KvSessionPage([], ""))),
    (codec.encode_session_page, codec.decode_session_page, (-1200, None)),
    (codec.encode_session_list, codec.decode_session_list, (0, [INFO, INFO], "conv")),
    (codec.encode_session_list, codec.decode_session_list, (0, [], "")),
    (codec.encode_release, codec.decode_release, (0, RELEASED)),
    (codec.encode_release, codec.decode_release, (-600, ReleaseResult())),
]


@pytest.mark.parametrize(("encode", "decode", "value", "expected"), ANSWERS)
def test_answers_decode_to_what_the_client_returns(
    encode: Any, decode: Any, value: Any, expected: Any
) -> None:
    assert decode(wire(encode(value))) == (value if expected is None else expected)


@pytest.mark.parametrize(("encode", "decode", "value"), SAME)
def test_results_round_trip(encode: Any, decode: Any, value: Any) -> None:
    assert decode(wire(encode(value))) == value


def test_session_info_round_trip() -> None:
    assert codec.decode_session_info(wire(codec.encode_session_info(INFO))) == INFO
    bare = KvSessionInfo("s", False, 0)
    assert codec.decode_session_info(wire(codec.encode_session_info(bare))) == bare


# -- the RPC table ---------------------------------------------------------------------------

TAGGED = ReplicateConfig(replica_num=2, kv_sessions=[["s1", "s2"]])
TAGGED_BATCH = ReplicateConfig(kv_sessions=[["s1"], []])

# Per RPC: the target's arguments (what the master decodes, and the client passes).
ARGS: dict[str, tuple[Any, ...]] = {
    "MountSegment": ("client-1", SEGMENT, "tenant-a"),
    "ReMountSegment": ("client-1", [SEGMENT, OTHER_SEGMENT], "tenant-a"),
    "UnmountSegment": ("client-1", "seg-1", "tenant-a"),
    "Ping": ("client-1",),
    "ServiceReady": (),
    "PutStart": ("client-1", "tenant", "k", 10, FULL_CONFIG, 77),
    "BatchPutStart": ("client-1", "tenant", ["a", "b"], [1, 2], ReplicateConfig(), 2**63 - 1),
    "PutEnd": ("client-1", "tenant", "k", 17),
    "BatchPutEnd": ("client-1", "tenant", ["a", "b"], [3, 4]),
    "PutRevoke": ("client-1", "tenant", "k", 0),
    "BatchPutRevoke": ("client-1", "tenant", [], []),
    "UpsertStart": ("client-1", "", "k", 1, ReplicateConfig(), 0),
    "BatchUpsertStart": ("client-1", "tenant", [], [], ReplicateConfig(), 5),
    "PutStartWithKvSessions": ("client-1", "tenant", "k", 10, TAGGED, 9),
    "BatchPutStartWithKvSessions": ("client-1", "tenant", ["a", "b"], [1, 2], TAGGED_BATCH, 3),
    "UpsertStartWithKvSessions": ("client-1", "tenant", "k", 10, TAGGED, 4),
    "BatchUpsertStartWithKvSessions": ("client-1", "t", ["a", "b"], [1, 2], TAGGED_BATCH, 6),
    "AttachKvSession": ("tenant", "conv", ["a"]),
    "PinKvSession": ("tenant", "conv", True),
    "UnpinKvSession": ("tenant", "conv", False),
    "UpdateKvSession": ("tenant", "conv", []),
    "CloseKvSession": ("tenant", "conv"),
    "GetKvSession": ("tenant", "conv"),
    "ListKvSessionKeys": ("tenant", "conv", "cursor", 100),
    "ListKvSessions": ("tenant", "", 10, None, 0),
    "ReleaseKvSession": ("tenant", "conv", True),
    "ReleaseStaleKvSessions": ("tenant", 60_000, True),
    "ReleaseAllKvSessions": ("tenant", True),
    "ReleaseKvCache": ("tenant", False),
    "GetReplicaList": ("tenant", "k", "client-1"),
    "BatchGetReplicaList": ("tenant", ["a", "b"], "client-1"),
    "EndReads": ("client-1", [5, 1 << 40]),
    "ExistKey": ("tenant", "k", "client-1"),
    "BatchExistKey": ("tenant", ["a", "b", "c"], "client-2"),
    "ProbeKey": ("tenant", "k"),
    "BatchProbeKey": ("tenant", ["a", "b"], "client-1", 1, 2),
    "GetStats": ("tenant-a", True),
    "ListSegments": ("tenant-a", False),
    "Remove": ("tenant", "k", True),
    "BatchRemove": ("tenant", ["a"], False),
    "RemoveByRegex": ("tenant", "^a", True),
    "RemoveAll": ("tenant", False),
    "BatchReplicaClear": ("c", "tenant", ["a", "b"], "seg"),
    "CreateCopyTask": ("tenant", "k", ["seg-a", "seg-b"]),
    "CreateMoveTask": ("tenant", "k", "seg-a", "seg-b"),
    "QueryTask": ("tenant", "7d0b6f5e-0000-4000-8000-000000000001"),
    "FetchTasks": ("c", 16),
    "StartTask": ("c", "7d0b6f5e-0000-4000-8000-000000000001"),
    "FinishTask": ("c", "7d0b6f5e-0000-4000-8000-000000000001", True, "done"),
    "FetchDiskTasks": ("c", 32),
    "FinishDiskTasks": ("c", [1, 2], [0, -1103]),
    "DemoteObjects": ("t", ["a", "b"]),
    "DropDiskReplicas": ("c", "disk-1", [DiskReplicaEntry("t", "k", 0, 4096)]),
    "RegisterDiskReplicas": (
        "c",
        "disk-1",
        [DiskReplicaEntry("t", "k", 0, 4096), DiskReplicaEntry("t", "k2", 4096, 10)],
    ),
}


def test_every_rpc_has_sample_arguments() -> None:
    assert sorted(ARGS) == sorted(RPCS)


@pytest.mark.parametrize("name", list(RPCS))
def test_arguments_round_trip(name: str) -> None:
    rpc = RPCS[name]
    request = wire(rpc.args.encode(*ARGS[name]))
    assert type(request) is rpc.request_type
    assert list(rpc.args.decode(request)) == list(ARGS[name])


@pytest.mark.parametrize("pinned", [None, True, False])
def test_optional_fields_stay_unset_for_none(pinned: bool | None) -> None:
    rpc = RPCS["ListKvSessions"]
    request = wire(rpc.args.encode("t", "c", 5, pinned, 7))
    assert request.HasField("pinned") == (pinned is not None)
    assert list(rpc.args.decode(request)) == ["t", "c", 5, pinned, 7]


def test_implied_arguments_never_travel() -> None:
    pin, unpin = RPCS["PinKvSession"], RPCS["UnpinKvSession"]
    assert pin.args.encode("t", "s", "ignored") == unpin.args.encode("t", "s", None)
    assert list(pin.args.decode(pin.args.encode("t", "s", False))) == ["t", "s", True]
    assert list(unpin.args.decode(unpin.args.encode("t", "s", True))) == ["t", "s", False]


def test_wrong_argument_counts_are_refused() -> None:
    with pytest.raises(TypeError):
        RPCS["ExistKey"].args.encode("t")
    with pytest.raises(ValueError):
        RPCS["MountSegment"].args.encode("client-1", SEGMENT, "t", "extra")


@pytest.mark.parametrize(
    ("name", "request_args", "expected"),
    [
        ("ExistKey", ("t", "k", "c"), INTERNAL),
        ("GetStats", ("t", False), {}),
        ("GetKvSession", ("t", "s"), (INTERNAL, None)),
        ("ReleaseKvCache", ("t", True), (INTERNAL, ReleaseResult())),
        ("RemoveAll", ("t", True), INTERNAL),
        ("BatchReplicaClear", ("c", "t", ["a"], ""), (INTERNAL, [])),
        ("BatchExistKey", ("t", ["a", "b", "c"], "c"), [INTERNAL] * 3),
        ("BatchRemove", ("t", [], True), []),
        ("AttachKvSession", ("t", "s", ["a", "b"]), [INTERNAL] * 2),
        (
            "BatchPutStartWithKvSessions",
            ("c", "t", ["a", "b"], [1, 2], TAGGED_BATCH),
            [PutStartResult(INTERNAL)] * 2,
        ),
        ("BatchGetReplicaList", ("t", ["a"], "c"), [ReplicaListResult(INTERNAL)]),
    ],
)
def test_failure_answers_carry_internal_error_per_key(
    name: str, request_args: tuple[Any, ...], expected: Any
) -> None:
    rpc = RPCS[name]
    failure = wire(rpc.failure(rpc.args.encode(*request_args)))
    assert type(failure) is rpc.response_type
    if rpc.answers_code:
        assert failure.code == INTERNAL
    assert rpc.result.decode(failure) == expected


def test_the_table_refuses_entries_that_disagree_with_the_proto() -> None:
    with pytest.raises(KeyError):
        Rpc("NoSuchRpc", "service.x", Fields(), STATUS)
    with pytest.raises(TypeError, match="result"):
        Rpc("ExistKey", "service.exist_key", Fields("tenant_id", "key"), STATUS)
    with pytest.raises(TypeError, match="per_key"):
        Rpc("Remove", "service.remove", Fields("tenant_id", "key", "force"), STATUS, "keys")
    with pytest.raises(TypeError, match="per_key"):
        Rpc("BatchPutEnd", "service.batch_put_end", Fields("keys"), RPCS["BatchPutEnd"].result)
    with pytest.raises(TypeError, match="Field codec"):
        Rpc("MountSegment", "service.mount_segment", Fields("client_id", "segment"), STATUS)
    with pytest.raises(KeyError):
        Rpc("PutEnd", "service.put_end", Fields("client_id", "no_such_field"), STATUS)
    codec_field = Field("segment", codec.decode_segment, codec.encode_segment)
    entry = Rpc("MountSegment", "m", Fields(codec_field, Const(1)), STATUS)
    assert list(entry.args.decode(entry.args.encode(SEGMENT, 2))) == [SEGMENT, 1]


# -- stream framing --------------------------------------------------------------------------


def test_request_frames_are_read_back_whole_and_only_whole() -> None:
    first = frames.request_frame(7, b"ExistKey", b"\x01\x02")
    second = frames.authenticate_frame("tok")
    buffer = bytearray(first + second)
    frame = frames.next_request(buffer, 0, 1 << 20)
    assert frame == (len(first), 7, b"ExistKey", b"\x01\x02")
    end = frame[0]
    assert frames.next_request(buffer, end, 1 << 20) == (
        len(buffer),
        frames.AUTHENTICATE_CALL_ID,
        frames.AUTHENTICATE,
        b"tok",
    )
    assert frames.next_request(buffer, len(buffer), 1 << 20) is None
    for cut in (1, frames.HEADER.size, len(first) - 1):
        assert frames.next_request(bytearray(first[:cut]), 0, 1 << 20) is None
    empty = frames.request_frame(1, b"GetStats", b"")
    assert frames.next_request(bytearray(empty), 0, 1 << 20) == (len(empty), 1, b"GetStats", b"")


def test_bad_headers_are_refused_before_the_body_arrives() -> None:
    too_long = frames.HEADER.pack(1 << 20, 1, 3)
    with pytest.raises(frames.FrameError):
        frames.next_request(bytearray(too_long), 0, (1 << 20) - 1)
    name_past_frame = frames.HEADER.pack(2, 1, 3) + b"ab"
    with pytest.raises(frames.FrameError):
        frames.next_request(bytearray(name_past_frame), 0, 1 << 20)


@pytest.mark.parametrize("size", [0, 10, frames.FIRST_READ_BYTES + 12345])
def test_responses_are_read_whole_from_a_socket(size: int) -> None:
    body = bytes(i % 251 for i in range(size))
    frame = frames.response_frame(9, frames.STATUS_OK, body)
    left, right = socket.socketpair()
    try:
        # Dribbled out in pieces: the reader must stitch the header and body together.
        def send() -> None:
            for start in range(0, len(frame), 4096):
                left.sendall(frame[start : start + 4096])

        sender = threading.Thread(target=send)
        sender.start()
        assert frames.read_response(right) == (9, frames.STATUS_OK, body)
        sender.join()
        left.sendall(frames.response_frame(10, frames.STATUS_UNDECODABLE, b"why")[:5])
        left.close()
        with pytest.raises(ConnectionError):
            frames.read_response(right)
    finally:
        left.close()
        right.close()


def test_trailing_fields_added_later_have_defaults() -> None:
    stats = RPCS["GetStats"].args
    assert stats.encode() == stats.encode("", False)
    assert list(stats.decode(stats.encode("t"))) == ["t", False]
    unmount = RPCS["UnmountSegment"].args
    assert list(unmount.decode(unmount.encode("c", "s"))) == ["c", "s", ""]
    mount = RPCS["MountSegment"].args
    assert list(mount.decode(mount.encode("client-1", SEGMENT)))[2] == ""
    with pytest.raises(TypeError):
        stats.encode("t", True, "extra")
    with pytest.raises(TypeError, match="more defaults"):
        Fields("a", defaults=("x", "y"))


def test_kept_config_encodings_are_by_value_and_bounded() -> None:
    configs = [
        ReplicateConfig(),
        ReplicateConfig(replica_num=2),
        ReplicateConfig(preferred_segments=["a"]),
        ReplicateConfig(preferred_segment="a"),
        ReplicateConfig(preferred_segments=["a", ""]),
        ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=5),
        ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE),
        ReplicateConfig(host_id="h", with_hard_pin=True),
        ReplicateConfig(group_ids=["g"]),
        FULL_CONFIG,
    ]
    for _ in range(2):  # the second pass answers from what the first kept
        for config in configs:
            kept = codec.encode_config_kept(config)
            assert kept == codec.encode_config(config)
            untagged = dataclasses.replace(config, kv_sessions=None)
            assert codec.decode_config(wire(kept)) == codec.decode_config(
                wire(codec.encode_config(untagged))
            )
    # A request holds a copy: changing it leaves the kept message alone.
    request = RPCS["PutStart"].request_type(config=codec.encode_config_kept(ReplicateConfig()))
    request.config.replica_num = 9
    assert codec.encode_config_kept(ReplicateConfig()).replica_num == 1
    for n in range(codec.ENCODED_CONFIGS_KEPT * 2):
        codec.encode_config_kept(ReplicateConfig(host_id=f"h{n}"))
    assert len(codec._encoded_configs) <= codec.ENCODED_CONFIGS_KEPT  # noqa: SLF001
