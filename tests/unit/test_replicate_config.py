"""``ReplicateConfig`` has upstream's fields and refuses, on assignment, what their C++ types
cannot hold, converting what pybind11 converts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mooncake_py import ObjectDataType, ReplicateConfig, SoftPinAction

UPSTREAM_FIELDS = [
    "replica_num",
    "nof_replica_num",
    "dfs_replica_num",
    "soft_pin_action",
    "soft_pin_ttl_ms",
    "with_hard_pin",
    "preferred_segments",
    "preferred_segment",
    "preferred_nof_segments",
    "prefer_alloc_in_same_node",
    "data_type",
    "group_ids",
    "session_ids",
    "kv_sessions",
    "with_soft_pin",
]


@pytest.mark.parametrize("name", UPSTREAM_FIELDS)
def test_every_field_can_be_probed(name: str) -> None:
    assert hasattr(ReplicateConfig(), name)
    # Engines probe optional features on the class first (SGLang: group_ids, session_ids);
    # only the list fields with a fresh default per instance are not class attributes.
    if name not in ("preferred_segments", "preferred_nof_segments"):
        assert hasattr(ReplicateConfig, name)


def test_defaults_are_upstreams() -> None:
    config = ReplicateConfig()
    assert (config.replica_num, config.nof_replica_num, config.dfs_replica_num) == (1, 0, 0)
    assert config.soft_pin_action == SoftPinAction.PRESERVE and config.soft_pin_ttl_ms is None
    assert not config.with_hard_pin and not config.prefer_alloc_in_same_node
    assert config.preferred_segments == [] and config.preferred_nof_segments == []
    assert config.preferred_segment == "" and config.data_type == ObjectDataType.UNKNOWN
    assert config.group_ids is None and config.session_ids is None
    assert config.kv_sessions is None and not config.with_soft_pin


@pytest.mark.parametrize(
    "name", ["replica_num", "nof_replica_num", "dfs_replica_num", "soft_pin_ttl_ms"]
)
@pytest.mark.parametrize("bad", [-1, 1 << 64, 1.0, "2", [1]])
def test_unsigned_fields_refuse_what_uint64_cannot_hold(name: str, bad: Any) -> None:
    config = ReplicateConfig()
    with pytest.raises(TypeError, match=name):
        setattr(config, name, bad)
    with pytest.raises(TypeError, match=name):
        ReplicateConfig(**{name: bad})


@pytest.mark.parametrize(
    "name", ["replica_num", "nof_replica_num", "dfs_replica_num", "soft_pin_ttl_ms"]
)
def test_unsigned_fields_take_integers_as_pybind11_does(name: str) -> None:
    config = ReplicateConfig()
    for good, held in [((1 << 64) - 1, (1 << 64) - 1), (np.uint8(3), 3), (True, 1), (0, 0)]:
        setattr(config, name, good)
        value = getattr(config, name)
        assert value == held and type(value) is int
    if name != "soft_pin_ttl_ms":
        with pytest.raises(TypeError):
            setattr(config, name, None)


@pytest.mark.parametrize("name", ["with_hard_pin", "prefer_alloc_in_same_node", "with_soft_pin"])
def test_flags_convert_truth_values_and_refuse_containers(name: str) -> None:
    config = ReplicateConfig()
    for value, held in [(1, True), (0, False), (None, False), (np.bool_(True), True), (2.5, True)]:
        setattr(config, name, value)
        assert getattr(config, name) is held
    for bad in ("yes", [], {}):
        with pytest.raises(TypeError, match=name):
            setattr(config, name, bad)


def test_with_soft_pin_is_a_view_of_the_soft_pin_action() -> None:
    config = ReplicateConfig()
    config.with_soft_pin = True
    assert config.soft_pin_action == SoftPinAction.ENABLE
    config.with_soft_pin = False
    assert config.soft_pin_action == SoftPinAction.PRESERVE
    assert ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE).with_soft_pin


def test_strings_and_string_lists() -> None:
    config = ReplicateConfig(preferred_segments=("a", b"b"), group_ids=("g",))
    assert config.preferred_segments == ["a", "b"] and config.group_ids == ["g"]
    config.preferred_segment = b"seg"
    assert config.preferred_segment == "seg"
    config.session_ids = ["s1", ""]
    config.kv_sessions = [("x", "y"), []]
    assert config.kv_sessions == [["x", "y"], []]
    config.group_ids = None
    config.session_ids = None
    for name, bad in [
        ("preferred_segment", None),
        ("preferred_segment", 3),
        ("preferred_segment", "\udcff"),
        ("preferred_segment", b"\xff"),
        ("group_ids", ["ok", "\udcff"]),
        ("preferred_segments", "ab"),
        ("preferred_segments", None),
        ("preferred_segments", [1]),
        ("preferred_nof_segments", "x"),
        ("group_ids", "abc"),
        ("session_ids", "s1"),
        ("session_ids", [None]),
        ("kv_sessions", ["s"]),
        ("kv_sessions", [[1]]),
    ]:
        with pytest.raises(TypeError, match=name):
            setattr(config, name, bad)


def test_session_tags_merge_session_ids_into_kv_sessions() -> None:
    assert ReplicateConfig().session_tags(3) is None
    assert ReplicateConfig(session_ids=["", ""]).session_tags(2) is None
    assert ReplicateConfig(session_ids=["a", ""]).session_tags(2) == [["a"], []]
    both = ReplicateConfig(session_ids=["a", "b"], kv_sessions=[["a"], ["c"]])
    assert both.session_tags(2) == [["a"], ["c", "b"]]
    assert both.kv_sessions == [["a"], ["c"]]  # the config itself is left alone
    with pytest.raises(ValueError, match="session_ids"):
        ReplicateConfig(session_ids=["a"]).session_tags(2)
    with pytest.raises(ValueError, match="kv_sessions"):
        ReplicateConfig(kv_sessions=[["a"]]).session_tags(2)


def test_from_checked_equals_the_constructor_and_shares_no_lists() -> None:
    given = {"replica_num": 2, "preferred_segments": ["a"], "group_ids": ["g"], "host_id": "h"}
    checked = ReplicateConfig.from_checked(**given)
    assert checked == ReplicateConfig(**given)
    assert ReplicateConfig.from_checked() == ReplicateConfig()
    first, second = ReplicateConfig.from_checked(), ReplicateConfig.from_checked()
    first.preferred_segments.append("x")
    first.preferred_nof_segments.append("y")
    assert second.preferred_segments == [] and second.preferred_nof_segments == []
    # Later assignments are checked as on any config.
    with pytest.raises(TypeError):
        checked.replica_num = -1
    with pytest.raises(TypeError, match="no field 'replicas'"):
        ReplicateConfig.from_checked(replicas=2)
