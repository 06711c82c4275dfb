"""Minimal reproducers of the bugs the fuzz found.

Open bugs (:data:`tests.fuzz.common.KNOWN_BUGS`): each test states the documented behaviour and
is ``xfail(strict=True)`` with the exception the bug raises today, so it turns red (XPASS) once
the bug is fixed, which is the cue to drop its mark and the matching ``KNOWN_BUGS`` entry.
Fixed bugs keep their reproducer as a plain regression test.
"""

from __future__ import annotations

import uuid

import pytest

from mooncake_py import ErrorCode, InvalidParamsError, MooncakeError, ReplicateConfig
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.testing import InProcessMaster
from mooncake_py.types import SegmentInfo


def test_a_config_of_the_wrong_type_raises_type_error(master: InProcessMaster, make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store(master.address, 4 << 20)
    with pytest.raises(TypeError):
        store.put("k", b"value", 3)


def test_a_session_id_with_a_lone_surrogate_is_invalid_params(
    master: InProcessMaster,
    make_store,  # type: ignore[no-untyped-def]
) -> None:
    store = make_store(master.address, 4 << 20)
    with pytest.raises(InvalidParamsError):
        store.client.pin_kv_session("\udcff")


def test_an_idle_bound_beyond_64_bits_is_refused_as_documented(
    master: InProcessMaster,
    make_store,  # type: ignore[no-untyped-def]
) -> None:
    store = make_store(master.address, 4 << 20)
    with pytest.raises((MooncakeError, TypeError)):
        store.client.release_stale_kv_sessions(2**64)


def test_a_segment_with_a_malformed_endpoint_fails_writes_with_a_code(
    master: InProcessMaster,
    make_store,  # type: ignore[no-untyped-def]
) -> None:
    intruder = MasterClient(master.address)
    segment = SegmentInfo(
        id=str(uuid.uuid4()), name="n:1", base=4096, size=64 << 20, te_endpoint="127.0.0.1:\x9d"
    )
    mounted = intruder.mount_segment(str(uuid.uuid4()), segment)
    store = make_store(master.address, 0)  # no segment of its own: the write goes there
    try:
        # Either the master refuses the segment, or the write answers a negative code.
        assert mounted != 0 or store.put("k", b"value") < 0
    finally:
        intruder.close()


def test_stats_beyond_int64_saturate_instead_of_failing(master: InProcessMaster) -> None:
    """Two segments of 2**62 + 2**61 bytes add up past int64: GetStats answered
    INTERNAL_ERROR (the codec raised on the int64 map) until the values saturated."""
    announcer = MasterClient(master.address)
    try:
        for _ in range(2):
            segment = SegmentInfo(
                id=str(uuid.uuid4()),
                name="n:1",
                base=4096,
                size=2**62 + 2**61,
                te_endpoint="127.0.0.1:1",
            )
            assert announcer.mount_segment(str(uuid.uuid4()), segment) == 0
        assert announcer.get_stats()["capacity_bytes"] == 2**63 - 1
    finally:
        announcer.close()


def test_a_config_field_beyond_32_bits_is_invalid_params(
    master: InProcessMaster,
    make_store,  # type: ignore[no-untyped-def]
) -> None:
    """``data_type`` / ``soft_pin_action`` beyond int32 raised protobuf's bare ValueError out
    of ``put`` until the codec refused them as INVALID_PARAMS."""
    store = make_store(master.address, 4 << 20)
    wide_type, wide_action = ReplicateConfig(), ReplicateConfig()
    wide_type.data_type = 2**31  # type: ignore[assignment]  # as untyped callers pass it
    wide_action.soft_pin_action = -(2**40)  # type: ignore[assignment]
    assert store.put("k", b"value", wide_type) == ErrorCode.INVALID_PARAMS
    with pytest.raises(InvalidParamsError):
        store.client.put("k", b"value", wide_action)
    assert store.get("k") == b""
