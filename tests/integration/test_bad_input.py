"""Bad input gets its documented code, loses nothing, and the master keeps serving."""

from __future__ import annotations

import uuid
from typing import Any

import grpc
import numpy as np
import pytest

from mooncake_py import ErrorCode, capability
from mooncake_py._wire.rpcs import RPCS
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.client.transfer import OP_READ, OP_WRITE, TransferClient, TransferOp
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.metrics import RpcCounters
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.transport.pipeline import CallPipeline
from mooncake_py.testing import InProcessMaster, MasterProcess
from mooncake_py.types import ReplicateConfig, SegmentInfo

INVALID = ErrorCode.INVALID_PARAMS
ILLEGAL = ErrorCode.ILLEGAL_CLIENT


def _still_serving(address: str) -> None:
    client = MasterClient(address)
    assert client.service_ready().startswith("mooncake-py")
    client.close()


def test_bad_keys_and_sizes(master: InProcessMaster, make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store(master.address, 8 << 20)
    raw = MasterClient(master.address)
    assert store.put("", b"x") == INVALID
    assert store.put("\udcff-not-utf8", b"x") == INVALID
    assert store.get("") == b""
    assert store.is_exist("") == INVALID
    assert store.batch_is_exist(["ok", ""]) == [INVALID, INVALID]
    assert raw.put_start("c", "default", "", 10, ReplicateConfig()).code == INVALID
    assert raw.put_start("c", "default", "k", 0, ReplicateConfig()).code == INVALID
    assert raw.put_start("c", "default", "k", 2**63, ReplicateConfig()).code == INVALID
    assert raw.put_start("c", "default", "k" * 5000, 10, ReplicateConfig()).code == INVALID
    assert raw.put_start("c", "default", "k", 10, ReplicateConfig(replica_num=0)).code == INVALID
    assert (
        raw.put_start("c", "default", "k", 10, ReplicateConfig(group_ids=["a", "b"])).code
        == INVALID
    )
    buffer = np.zeros(1 << 20, np.uint8)
    store.register_buffer(buffer.ctypes.data, buffer.nbytes)
    assert store.put_from("neg", buffer.ctypes.data, -5) == INVALID
    assert store.put_from("zero", buffer.ctypes.data, 0) == INVALID
    assert store.put_from("overrun", buffer.ctypes.data, buffer.nbytes + 1) == INVALID
    # Larger than every segment: no space anywhere, and nothing half-visible afterwards.
    assert store.put("too-big", np.zeros(9 << 20, np.uint8)) == ErrorCode.NO_AVAILABLE_HANDLE
    assert store.is_exist("too-big") == 0
    assert master.service.stats()["allocated_bytes"] == 0
    raw.close()
    _still_serving(master.address)


def test_unmatched_batches_and_huge_batches(master: InProcessMaster, make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store(master.address, 16 << 20)
    raw = MasterClient(master.address)
    results = raw.batch_put_start("c", "default", ["a", "b"], [10], ReplicateConfig())
    assert [r.code for r in results] == [INVALID, INVALID]
    buffer = np.zeros(4096, np.uint8)
    store.register_buffer(buffer.ctypes.data, buffer.nbytes)
    assert store.batch_put_from(["a", "b"], [buffer.ctypes.data], [8, 8]) == [INVALID, INVALID]
    assert store.batch_get_into(["a"], [buffer.ctypes.data] * 2, [8]) == [INVALID]
    assert store.put_batch(["a"], [b"1", b"2"]) == INVALID
    assert master.service.stats()["objects"] == 0

    keys = [f"many-{i}" for i in range(10_000)]
    values = [i.to_bytes(4, "little") * 16 for i in range(10_000)]
    assert store.put_batch(keys, values) == 0
    assert store.batch_is_exist(keys) == [1] * 10_000
    got = store.get_batch(keys)
    assert got == values
    assert store.batch_remove(keys, force=True) == [0] * 10_000
    raw.close()
    _still_serving(master.address)


def test_bad_segments(master: InProcessMaster, make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store(master.address, 4 << 20)
    raw = MasterClient(master.address)
    segment = SegmentInfo(
        id=str(uuid.uuid4()), name="n:1", base=0, size=100, te_endpoint="127.0.0.1:1"
    )
    assert raw.mount_segment("c", segment) == INVALID
    assert (
        raw.mount_segment("c", SegmentInfo(**{**segment.__dict__, "base": 4096, "size": 0}))
        == INVALID
    )
    assert raw.unmount_segment("c", str(uuid.uuid4())) == 0  # idempotent
    own_segment = store.client._core.segments()[0]  # noqa: SLF001 - the test needs the real id
    assert raw.unmount_segment("someone-else", own_segment.id) == INVALID
    assert raw.mount_segment("someone-else", own_segment) == INVALID

    # The transfer service refuses unknown segments, requests without a valid capability and
    # out-of-range requests (under a grant, made with the segment's real key, that covers them).
    tcp = TransferClient()
    scratch = memoryview(bytearray(64))
    key, segment_text = own_segment.capability_key, own_segment.id.encode()
    expires = capability.now_ms() + 60_000
    both = capability.READ | capability.WRITE
    past_the_end = capability.mint(key, segment_text, own_segment.size - 10, 64, both, expires)
    unknown = TransferOp(OP_READ, str(uuid.uuid4()), 0, scratch, past_the_end)
    assert tcp.run(own_segment.te_endpoint, [unknown]) == [INVALID]
    ungranted = TransferOp(OP_READ, own_segment.id, 0, scratch)
    assert tcp.run(own_segment.te_endpoint, [ungranted]) == [ILLEGAL]
    beyond = TransferOp(OP_READ, own_segment.id, own_segment.size - 10, scratch, past_the_end)
    assert tcp.run(own_segment.te_endpoint, [beyond]) == [INVALID]
    at_end = capability.mint(key, segment_text, own_segment.size, 64, both, expires)
    bad_write = TransferOp(OP_WRITE, own_segment.id, own_segment.size, scratch, at_end)
    assert tcp.run(own_segment.te_endpoint, [bad_write]) == [INVALID]
    ungranted_write = TransferOp(OP_WRITE, own_segment.id, 0, scratch)
    assert tcp.run(own_segment.te_endpoint, [ungranted_write, ungranted_write]) == [
        ILLEGAL,
        ErrorCode.TRANSFER_FAIL,  # the server closed the connection at the refused write
    ]
    tcp.close()
    assert store.put("still-works", b"yes") == 0 and store.get("still-works") == b"yes"
    raw.close()


def test_undecodable_bytes_do_not_hurt_the_master(master_process: MasterProcess) -> None:
    channel = grpc.insecure_channel(master_process.address)
    for method in ("PutStart", "BatchExistKey", "MountSegment", "GetReplicaList"):
        call = channel.unary_unary(
            f"/mooncake_py.v1.MasterService/{method}",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        for garbage in (b"\xff\xfe\xfd\x00garbage", b"\x12\x03\xff\xfe\xfd"):  # 2nd: bad UTF-8
            with pytest.raises(grpc.RpcError) as caught:
                call(garbage, timeout=5)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "undecodable request" in (caught.value.details() or "")
    channel.close()
    _still_serving(master_process.address)
    assert master_process.process is not None and master_process.process.poll() is None


def test_a_failing_call_is_answered_internal_error_and_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("broken target")

    service = MasterService(MasterConfig())
    monkeypatch.setattr(service.reads, "exist_key", broken)
    monkeypatch.setattr(service.sessions, "attach_kv_session", broken)
    counters = RpcCounters()
    pipeline = CallPipeline(service, None, counters)  # binds the broken targets

    def run(name: str, *args: object) -> Any:
        rpc = RPCS[name]
        payload = rpc.args.encode(*args).SerializeToString()
        rejection, body = pipeline.call(pipeline.calls[name], payload, "")
        assert rejection is None
        return rpc.result.decode(rpc.response_type.FromString(body))

    internal = int(ErrorCode.INTERNAL_ERROR)
    assert run("ExistKey", "t", "k", "c") == internal
    assert run("AttachKvSession", "t", "s", ["a", "b", "c"]) == [internal] * 3
    assert "ExistKey failed" in caplog.text and "broken target" in caplog.text
    # The pipeline keeps serving, and counts answers that carry a non-zero code as failed.
    assert run("BatchExistKey", "t", ["k"], "c") == [0]
    assert run("Remove", "t", "k", False) == ErrorCode.OBJECT_NOT_FOUND
    assert run("GetStats")["objects"] == 0
    assert counters.requests == {
        "ExistKey": 1,
        "AttachKvSession": 1,
        "BatchExistKey": 1,
        "Remove": 1,
        "GetStats": 1,
    }
    assert counters.failures == {"ExistKey": 1, "AttachKvSession": 1, "Remove": 1}
