"""Batch answers in columns (:mod:`mooncake_py._wire.columns`): every answer survives a round
trip through real protobuf bytes, whole or encoded in parts; the one-message-per-key form
still decodes; malformed columns are refused; the client asks for columns only where the
master may answer in them, and a real master answers in the form it was asked for."""

from __future__ import annotations

import random

import grpc
import pytest

from mooncake_py._wire import codec, columns
from mooncake_py._wire.rpcs import RPCS, new_stub
from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.metrics import RpcCounters
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.service.slices import SliceTimer, drive
from mooncake_py.master.transport.pipeline import CallPipeline
from mooncake_py.testing import InProcessMaster
from mooncake_py.types import (
    PutStartResult,
    ReplicaDescriptor,
    ReplicaListResult,
    ReplicaStatus,
    ReplicateConfig,
    SegmentInfo,
)

OK = int(ErrorCode.OK)
PLACES = [  # (segment id, name, endpoint, host, disk)
    ("seg-a", "host:a", "10.0.0.1:7000", "host-a", False),
    ("seg-b", "host:b", "10.0.0.2:7000", "host-b", False),
    ("tier-a", "host:a", "10.0.0.1:7000", "host-a", True),
    ("", "", "", "", False),  # a replica whose segment is gone
]


def replica(rng: random.Random, number: int) -> ReplicaDescriptor:
    segment_id, name, endpoint, host, disk = rng.choice(PLACES)
    return ReplicaDescriptor(
        id=number,
        status=rng.choice(list(ReplicaStatus)),
        segment_id=segment_id,
        segment_name=name,
        offset=rng.randrange(1 << 40),
        size=rng.randrange(1, 1 << 30),
        te_endpoint=endpoint,
        host_id=host,
        capability=rng.randbytes(rng.choice((0, 41, 73))),
        disk=disk,
    )


def put_starts(seed: int, keys: int) -> list[PutStartResult]:
    rng = random.Random(seed)
    return [
        PutStartResult(
            code=rng.choice((OK, OK, OK, int(ErrorCode.OBJECT_ALREADY_EXISTS), -200)),
            replicas=tuple(replica(rng, i * 8 + j) for j in range(rng.choice((0, 1, 1, 2, 3)))),
            write_id=rng.randrange(1 << 63),
            retry_after_ms=rng.choice((0, 0, 10)),
        )
        for i in range(keys)
    ]


def replica_lists(seed: int, keys: int) -> list[ReplicaListResult]:
    rng = random.Random(seed)
    return [
        ReplicaListResult(
            code=rng.choice((OK, OK, int(ErrorCode.OBJECT_NOT_FOUND))),
            replicas=tuple(replica(rng, i * 8 + j) for j in range(rng.choice((0, 1, 1, 2)))),
            lease_ttl_ms=rng.randrange(1 << 20),
            size=rng.randrange(1 << 40),
            read_id=rng.randrange(1 << 63),
        )
        for i in range(keys)
    ]


def through_bytes(message: object) -> object:
    return type(message).FromString(message.SerializeToString())  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", range(6))
def test_put_starts_round_trip_in_columns(seed: int) -> None:
    """Codes, write ids, waits and every replica field come back as they went, key by key."""
    results = put_starts(seed, 1 + seed * 40)
    message = through_bytes(columns.encode_put_starts(results))
    assert not message.results and message.HasField("columns")  # type: ignore[attr-defined]
    assert columns.decode_put_starts(message) == results  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(6))
def test_replica_lists_round_trip_in_columns(seed: int) -> None:
    results = replica_lists(seed, 1 + seed * 40)
    message = through_bytes(columns.encode_replica_lists(results))
    assert columns.decode_replica_lists(message) == results  # type: ignore[arg-type]


def test_an_answer_encoded_in_parts_decodes_as_the_whole() -> None:
    """The master encodes a large answer in parts and sends their concatenation: the merged
    columns are the whole answer, even where parts repeat a segment's entry."""
    results = put_starts(11, 300)
    lists = replica_lists(12, 300)
    for encode, decode, values, kind in (
        (columns.encode_put_starts, columns.decode_put_starts, results, "BatchPutStartResponse"),
        (
            columns.encode_replica_lists,
            columns.decode_replica_lists,
            lists,
            "BatchGetReplicaListResponse",
        ),
    ):
        joined = b"".join(
            encode(values[start : start + 64]).SerializeToString()  # type: ignore[arg-type]
            for start in range(0, len(values), 64)
        )
        response_type = type(encode(values[:1]))  # type: ignore[arg-type]
        assert response_type.__name__ == kind
        assert decode(response_type.FromString(joined)) == values  # type: ignore[arg-type]


def test_the_per_key_form_still_decodes() -> None:
    """A master that predates columns (or an INTERNAL_ERROR answer) sends one message per key."""
    results = put_starts(3, 50)
    lists = replica_lists(4, 50)
    assert columns.decode_put_starts(through_bytes(codec.encode_put_starts(results))) == results  # type: ignore[arg-type]
    assert (
        columns.decode_replica_lists(through_bytes(codec.encode_replica_lists(lists))) == lists  # type: ignore[arg-type]
    )
    failure = RPCS["BatchPutStart"].failure(RPCS["BatchPutStart"].request_type(keys=["a", "b"]))
    decoded = RPCS["BatchPutStart"].result.decode(through_bytes(failure))
    assert [r.code for r in decoded] == [int(ErrorCode.INTERNAL_ERROR)] * 2


def test_segment_fields_travel_once_per_answer() -> None:
    """1024 one-replica answers on two segments carry two segment entries, and the answer is
    smaller than the per-key form."""
    rng = random.Random(5)
    results = [PutStartResult(OK, (replica(rng, i),), write_id=i + 1) for i in range(1024)]
    compact = columns.encode_put_starts(results)
    ids = {r.replicas[0].segment_id for r in results}
    assert len(compact.columns.replicas.segments) == len(ids)
    assert compact.ByteSize() < codec.encode_put_starts(results).ByteSize()


def test_malformed_columns_are_refused() -> None:
    base = columns.encode_put_starts(put_starts(7, 20))
    short = type(base).FromString(base.SerializeToString())
    del short.columns.replicas.offsets[-1]
    with pytest.raises(ValueError, match="length"):
        columns.decode_put_starts(short)
    unknown = type(base).FromString(base.SerializeToString())
    del unknown.columns.replicas.segments[:]
    if unknown.columns.replicas.ids:
        with pytest.raises(ValueError, match="segment"):
            columns.decode_put_starts(unknown)
    bad_status = type(base).FromString(base.SerializeToString())
    bad_status.columns.replicas.statuses[0] = 99
    with pytest.raises(ValueError, match="status"):
        columns.decode_put_starts(bad_status)
    missing_code = type(base).FromString(base.SerializeToString())
    del missing_code.columns.codes[-1]
    with pytest.raises(ValueError, match="length"):
        columns.decode_put_starts(missing_code)


def test_the_client_asks_for_columns_only_where_they_exist() -> None:
    """BatchPutStart, BatchUpsertStart and BatchGetReplicaList requests ask for columns; the
    tagged forms (whose requests have no such flag) and other batch calls do not."""
    config = ReplicateConfig()
    put = RPCS["BatchPutStart"].args.encode("c", "", ["k"], [1], config, 0)
    upsert = RPCS["BatchUpsertStart"].args.encode("c", "", ["k"], [1], config, 0)
    lookup = RPCS["BatchGetReplicaList"].args.encode("", ["k"], "c")
    assert put.compact and upsert.compact and lookup.compact
    assert not RPCS["BatchExistKey"].args.encode("", ["k"], "c").compact
    tagged = RPCS["BatchPutStartWithKvSessions"].args.encode(
        "c", "", ["k"], [1], ReplicateConfig(kv_sessions=[["s"]]), 0
    )
    assert not tagged.put.compact
    assert RPCS["BatchPutStartWithKvSessions"].result.compact is None


def test_a_real_master_answers_in_the_form_asked_for() -> None:
    """Over gRPC, a request without ``compact`` (an older client) gets one message per key, one
    with it gets columns; both decode to the same starts and lookups."""
    with InProcessMaster() as master:
        assert (
            master.service.mount_segment(
                "owner",
                SegmentInfo(id="seg", name="h", base=4096, size=1 << 20, te_endpoint="e:1"),
            )
            == OK
        )
        channel = grpc.insecure_channel(master.address)
        stub = new_stub(channel)
        rpc = RPCS["BatchPutStart"]
        keys = [f"key-{i}" for i in range(40)]
        config = codec.encode_config(ReplicateConfig())
        plain = rpc.request_type(
            client_id="w", keys=keys[:20], value_lengths=[64] * 20, config=config
        )
        asked = rpc.request_type(
            client_id="w", keys=keys[20:], value_lengths=[64] * 20, config=config, compact=True
        )
        old = stub.BatchPutStart(plain, timeout=10)
        new = stub.BatchPutStart(asked, timeout=10)
        assert len(old.results) == 20 and not old.HasField("columns")
        assert not new.results and len(new.columns.codes) == 20
        starts = rpc.result.decode(old) + rpc.result.decode(new)
        assert [s.code for s in starts] == [OK] * 40
        assert all(len(s.replicas) == 1 and s.replicas[0].segment_id == "seg" for s in starts)
        end = RPCS["BatchPutEnd"].request_type(
            client_id="w", keys=keys, write_ids=[s.write_id for s in starts]
        )
        assert list(stub.BatchPutEnd(end, timeout=10).codes) == [OK] * 40
        lookup = RPCS["BatchGetReplicaList"]
        lists = []
        for compact in (False, True):
            request = lookup.request_type(client_id="r", keys=keys, compact=compact)
            answer = stub.BatchGetReplicaList(request, timeout=10)
            assert answer.HasField("columns") is compact
            lists.append(lookup.result.decode(answer))
        for first, second in zip(*lists, strict=True):
            assert first.code == second.code == OK
            assert [r.offset for r in first.replicas] == [r.offset for r in second.replicas]
        channel.close()
        master.service.check()


# --- regressions -------------------------------------------------------------------------------


def mixed(counts: list[int]) -> list[ReplicaListResult]:
    """Answers with ``counts[i]`` replicas for key i (0: a miss)."""
    rng = random.Random(sum(counts) * 7 + len(counts))
    return [
        ReplicaListResult(
            code=OK if n else int(ErrorCode.OBJECT_NOT_FOUND),
            replicas=tuple(replica(rng, i * 8 + j) for j in range(n)),
            lease_ttl_ms=5000 if n else 0,
            size=100 if n else 0,
            read_id=i + 1 if n else 0,
        )
        for i, n in enumerate(counts)
    ]


@pytest.mark.parametrize("counts", [[0, 2], [2, 1, 0], [2, 0], [0, 0, 3, 0], [1, 2, 0, 1]])
def test_answers_whose_replica_counts_sum_to_the_keys_round_trip(counts: list[int]) -> None:
    """Counts that sum to the number of keys without every key having one replica (a miss
    and a two-replica object) are encoded and decoded key by key, not as one each."""
    results = mixed(counts)
    message = through_bytes(columns.encode_replica_lists(results))
    assert columns.decode_replica_lists(message) == results  # type: ignore[arg-type]
    starts = [PutStartResult(r.code, r.replicas, write_id=r.read_id) for r in results]
    assert columns.decode_put_starts(through_bytes(columns.encode_put_starts(starts))) == starts  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(4))
def test_parts_cut_anywhere_decode_as_the_whole(seed: int) -> None:
    """Parts of 0, 1 and 2 replicas per key joined at uneven cuts: where one part alone has as
    many replicas as keys and the whole does too, the keys still get their own replicas."""
    rng = random.Random(seed)
    results = mixed([rng.choice((0, 1, 1, 2)) for _ in range(300)])
    cuts = sorted(rng.sample(range(1, 300), 5))
    bounds = [0, *cuts, 300]
    joined = b"".join(
        columns.encode_replica_lists(results[a:b]).SerializeToString()
        for a, b in zip(bounds, bounds[1:], strict=False)
    )
    decoded = columns.decode_replica_lists(
        type(columns.encode_replica_lists(results[:1])).FromString(joined)
    )
    assert decoded == results


def test_descriptions_that_disagree_on_a_segment_are_not_sent_in_columns() -> None:
    """``agree`` refuses an answer (or a part, against the parts before it) that describes one
    segment id two ways (a sliced batch spanning an unmount and a remount of the id under
    another endpoint); the master then answers one message per key."""
    rng = random.Random(3)
    first = replica(rng, 1)
    other = ReplicaDescriptor(
        id=2,
        status=first.status,
        segment_id=first.segment_id,
        segment_name=first.segment_name,
        offset=4096,
        size=64,
        te_endpoint="elsewhere:9",
        host_id=first.host_id,
    )
    same = ReplicaListResult(OK, (first,), 5000, 64, 1)
    moved = ReplicaListResult(OK, (other,), 5000, 64, 2)
    assert columns.agree([same, same], {})
    assert not columns.agree([same, moved], {})
    seen: dict[str, object] = {}
    assert columns.agree([same], seen) and not columns.agree([moved], seen)  # type: ignore[arg-type]


def test_a_real_master_answers_mixed_counts_and_large_batches_right() -> None:
    """Over gRPC, compact lookups of a miss next to a two-replica object, and of more keys than
    one encoded part holds, give each key its own replicas (what the per-key form gives)."""
    with InProcessMaster() as master:
        for i in range(2):
            info = SegmentInfo(
                id=f"seg{i}", name=f"h{i}", base=4096, size=8 << 20, te_endpoint=f"e:{i + 1}"
            )
            assert master.service.mount_segment(f"owner{i}", info) == OK
        service = master.service
        two = service.put_start("w", "", "two", 64, ReplicateConfig(replica_num=2))
        assert len(two.replicas) == 2 and service.put_end("w", "", "two", two.write_id) == OK
        keys = [f"k{i}" for i in range(2050)]
        starts = service.batch_put_start("w", "", keys, [64] * len(keys), ReplicateConfig())
        assert service.batch_put_end("w", "", keys, [s.write_id for s in starts]) == [OK] * 2050
        channel = grpc.insecure_channel(master.address)
        stub = new_stub(channel)
        lookup = RPCS["BatchGetReplicaList"]
        for batch in (["missing", "two"], ["two", "missing", *keys]):
            answers = []
            for compact in (False, True):
                request = lookup.request_type(client_id="r", keys=batch, compact=compact)
                answers.append(lookup.result.decode(stub.BatchGetReplicaList(request, timeout=30)))
            plain, columnar = answers
            assert [(r.code, [(d.segment_id, d.offset) for d in r.replicas]) for r in plain] == [
                (r.code, [(d.segment_id, d.offset) for d in r.replicas]) for r in columnar
            ]
            assert [len(r.replicas) for r in columnar[:2]] in ([0, 2], [2, 0])
        channel.close()
        service.check()


def test_the_pipeline_answers_per_key_when_a_segment_moved_mid_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sliced batch put start spanning an unmount and a remount of its segment id under
    another endpoint: the master answers one message per key (each key the endpoint its
    slice saw), not columns that would give every key the first slice's endpoint."""
    monkeypatch.setattr(SliceTimer, "spent", lambda self: True)  # one run of keys per slice
    service = MasterService(MasterConfig(), clock=FakeClock(1000.0), rng=random.Random(0))
    key = bytes(range(32))
    old = SegmentInfo("seg-0", "n0", 4096, 1 << 20, "old-host:1", capability_key=key)
    assert service.mount_segment("owner", old) == OK
    pipeline = CallPipeline(service, None, RpcCounters())
    rpc = RPCS["BatchPutStart"]
    bound = pipeline.calls.get(rpc.wire_name) or pipeline.calls[rpc.name]  # type: ignore[call-overload]
    keys = [f"k{i}" for i in range(128)]
    payload = rpc.args.encode("w", "", keys, [1024] * 128, ReplicateConfig(), 0)
    assert payload.compact
    steps = pipeline.call_sliced(bound, payload.SerializeToString(), "")
    next(steps)  # the first run of keys is placed on old-host
    assert service.unmount_segment("owner", "seg-0") == OK
    new = SegmentInfo("seg-0", "n0", 4096, 1 << 20, "new-host:1", capability_key=key)
    assert service.mount_segment("owner2", new) == OK
    _, body = drive(steps)
    response = rpc.response_type.FromString(body)
    assert not response.HasField("columns") and len(response.results) == 128
    endpoints = [r.replicas[0].te_endpoint for r in rpc.result.decode(response)]
    assert set(endpoints[:64]) == {"old-host:1"} and set(endpoints[64:]) == {"new-host:1"}
