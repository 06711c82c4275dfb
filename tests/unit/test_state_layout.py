"""The compact layouts of the master's per-object state: allocations tagged with the records
that hold them (the segment index), eviction stamps kept on the records, and a record holding
its single replica itself. The service-level suites and stress tests run the same layouts
through ``check()``; these pin down each part's contract on its own.
"""

from __future__ import annotations

import pytest

from mooncake_py.master.state.allocator import OffsetAllocator
from mooncake_py.master.state.disk_space import DiskSpace
from mooncake_py.master.state.lru import NOT_A_CANDIDATE, LeaseOrderedLRU, Verdict
from mooncake_py.master.state.objects import ObjectMetadata, ObjectTable, Replica
from mooncake_py.master.state.session_registry import SessionLimits, SessionRegistry
from mooncake_py.types import ReplicaStatus


class Holder:
    """A record with what a tag and the eviction policy read: ``size``, ``object_id``,
    ``lru_stamp``."""

    __slots__ = ("size", "object_id", "lru_stamp")

    def __init__(self, size: int, object_id: str = "") -> None:
        self.size = size
        self.object_id = object_id
        self.lru_stamp = NOT_A_CANDIDATE


def test_a_tag_takes_the_place_of_the_size_and_untag_gives_it_back() -> None:
    allocator = OffsetAllocator(1 << 20, alignment=64)
    first, second = allocator.allocate(100), allocator.allocate(64)
    assert first is not None and second is not None
    owner = Holder(100)
    assert allocator.tag(first, owner)
    assert allocator.owner_of(first) is owner and allocator.owner_of(second) is None
    assert allocator.size_of(first) == 128 and sorted(allocator.allocations())[0] == (first, 128)
    assert allocator.owners() == [owner]
    assert not allocator.tag(second, Holder(200))  # 200 does not round to 64
    assert not allocator.tag(1 << 19, Holder(64))  # no allocation there
    allocator.untag(first, Holder(100))  # another record: no change
    assert allocator.owner_of(first) is owner
    allocator.check()
    allocator.untag(first, owner)
    assert allocator.owner_of(first) is None and allocator.size_of(first) == 128
    assert allocator.tag(first, owner)
    assert allocator.free(first) == 128 and allocator.owners() == []
    assert allocator.used_bytes == 64
    allocator.check()


def test_a_disk_space_tags_exact_sizes() -> None:
    space = DiskSpace(1 << 20)
    offset = space.allocate(100)
    assert offset is not None
    assert not space.tag(offset, Holder(128))
    owner = Holder(100)
    assert space.tag(offset, owner) and space.owners() == [owner]
    assert space.size_of(offset) == 100 and space.allocations() == [(offset, 100)]
    space.check()
    assert space.doom(offset) == 100 and space.used_bytes == 0
    assert space.free(offset) == 100 and space.owners() == []
    space.check()


def test_the_policy_orders_the_records_it_is_given() -> None:
    records = {name: Holder(0, name) for name in "abcd"}
    lru = LeaseOrderedLRU(records.get)
    for name in "abcd":
        lru.on_created(name)
    lru.on_touched("a")
    lru.on_removed("c")
    lru.on_touched("c")  # no candidate: ignored
    assert records["c"].lru_stamp == NOT_A_CANDIDATE and "c" not in lru and "a" in lru
    lru.check({"a", "b", "d"})
    everything = lru.select(lambda _: Verdict.EVICT, 10, 10)
    assert everything.victims == ["b", "d", "a"] and everything.exhausted
    first = lru.select(lambda _: Verdict.EVICT, 1, 10)
    rest = lru.select(lambda _: Verdict.EVICT, 10, 10, after=first.cursor)
    assert first.victims + rest.victims == ["b", "d", "a"]
    with pytest.raises(KeyError):
        lru.on_created("zzz")  # the lookup knows no such record
    records["b"] = Holder(0, "b")  # the table replaced the record behind the policy's back
    with pytest.raises(AssertionError, match="stale record"):
        lru.check({"a", "b", "d"})


def test_a_record_holds_one_replica_itself_and_others_in_a_tuple() -> None:
    one = Replica(1, "s0", 0, 64, ReplicaStatus.PROCESSING)
    two = Replica(2, "s1", 0, 64, ReplicaStatus.PROCESSING)
    meta = ObjectMetadata("", "k", 64, "c", 0.0, (one,))
    assert meta.replicas == (one,) and meta.replica_count == 1 and meta.is_writing()
    assert meta.processing_replicas() == [one] and meta.complete_replicas() == []
    meta.replicas = (one, two)
    assert meta.replicas == (one, two) and meta.replica_count == 2
    meta.replicas = ()
    assert meta.replicas == () and meta.replica_count == 0 and not meta.is_writing()


def test_a_table_without_allocators_finds_objects_on_a_segment_by_scanning() -> None:
    table = ObjectTable()
    for i, segment in enumerate(("s0", "s1", "s0")):
        replica = Replica(i, segment, 0, 64, ReplicaStatus.COMPLETE)
        table.insert(ObjectMetadata("", f"k{i}", 64, "c", 0.0, (replica,)))
    assert table.objects_on_segment("s0") == [("", "k0"), ("", "k2")]
    assert table.objects_on_segment("gone") == []
    table.check()


def test_the_table_check_sees_a_lost_tag() -> None:
    allocator = OffsetAllocator(1 << 20)
    table = ObjectTable(allocator_of={"s0": allocator}.get)
    offset = allocator.allocate(64)
    assert offset is not None
    meta = ObjectMetadata("", "k", 64, "c", 0.0, (Replica(1, "s0", offset, 64, _COMPLETE),))
    table.insert(meta)
    assert allocator.owner_of(offset) is meta and table.objects_on_segment("s0") == [("", "k")]
    table.check({"s0": allocator})
    allocator.untag(offset, meta)
    with pytest.raises(AssertionError, match="segment index of s0"):
        table.check({"s0": allocator})
    assert allocator.tag(offset, meta)
    table.erase(("", "k"))
    assert allocator.owner_of(offset) is None and allocator.size_of(offset) == 64
    table.check({"s0": allocator})


_COMPLETE = ReplicaStatus.COMPLETE


def test_a_record_keeps_its_rare_fields_apart_only_while_one_is_set() -> None:
    replica = Replica(1, "s0", 0, 64, _COMPLETE)
    meta = ObjectMetadata("", "k", 64, "c", 0.0, (replica,))
    assert meta.rare_fields is None
    assert (meta.hard_pinned, meta.soft_pin_deadline, meta.group_id) == (False, 0.0, "")
    assert (meta.sessions, meta.session_weight) == (None, 0)
    meta.soft_pin_deadline = 0.0  # a default: still no side record
    meta.sessions = None
    assert meta.rare_fields is None
    meta.hard_pinned = True
    meta.soft_pin_deadline = 12.5
    meta.group_id = "g"
    meta.sessions = {"session"}
    meta.session_weight = 64
    assert meta.rare_fields is not None
    assert (meta.hard_pinned, meta.soft_pin_deadline, meta.group_id) == (True, 12.5, "g")
    assert (meta.sessions, meta.session_weight) == ({"session"}, 64)
    meta.hard_pinned = False
    meta.soft_pin_deadline = 0.0
    meta.group_id = ""
    meta.sessions = None
    assert meta.rare_fields is not None and meta.session_weight == 64  # one field still set
    meta.session_weight = 0
    assert meta.rare_fields is None
    built = ObjectMetadata("", "k2", 64, "c", 0.0, (replica,), group_id="g", hard_pinned=True)
    assert built.rare_fields is not None and built.group_id == "g" and built.hard_pinned
    assert ObjectMetadata("", "k3", 64, "c", 0.0, (replica,), group_id="").rare_fields is None


@pytest.mark.parametrize("field", ["hard_pinned", "soft_pin_deadline", "group_id", "sessions"])
def test_each_rare_field_alone_keeps_the_side_record(field: str) -> None:
    meta = ObjectMetadata("", "k", 64, "c", 0.0, (Replica(1, "s0", 0, 64, _COMPLETE),))
    default = getattr(meta, field)
    setattr(
        meta,
        field,
        {"hard_pinned": True, "soft_pin_deadline": 3.0, "group_id": "g"}.get(field, {"session"}),
    )
    assert meta.rare_fields is not None and not meta.rare_fields.is_default()
    setattr(meta, field, default)
    assert meta.rare_fields is None


def test_the_table_check_sees_a_side_record_of_defaults() -> None:
    table = ObjectTable()
    meta = ObjectMetadata("", "k", 64, "c", 0.0, (Replica(1, "s0", 0, 64, _COMPLETE),))
    meta.group_id = "g"
    table.insert(meta)
    table.check()
    assert meta.rare_fields is not None
    meta.rare_fields.group_id = ""  # behind the setters' back: the record should have gone
    with pytest.raises(AssertionError, match="side record of defaults"):
        table.check()


def test_leaving_the_last_session_drops_the_side_record() -> None:
    registry = SessionRegistry(SessionLimits())
    meta = ObjectMetadata("", "k", 64, "c", 0.0, (Replica(1, "s0", 0, 64, _COMPLETE),))
    table = ObjectTable(on_reweigh=registry.reweigh)
    table.insert(meta)
    registry.add(meta, ["a", "b"], 0.0)
    assert meta.rare_fields is not None and meta.session_weight == 64
    registry.check(table)
    registry.on_object_removed(meta)
    assert meta.sessions is None and meta.rare_fields is None
    registry.check(table)
    table.check()


def _record(tenant: str, key: str, replica_id: int = 1) -> ObjectMetadata:
    replica = Replica(replica_id, "s0", 0, 64, ReplicaStatus.PROCESSING)
    return ObjectMetadata(tenant, key, 64, "c", float(replica_id), (replica,))


def test_the_table_files_records_by_key_and_shares_a_key_among_tenants() -> None:
    table = ObjectTable()
    a, b, c = _record("ta", "k", 1), _record("tb", "k", 2), _record("ta", "other", 3)
    for meta in (a, c, b):
        table.insert(meta)
    assert table.get(("ta", "k")) is a and table.get(("tb", "k")) is b
    assert table.get(("tc", "k")) is None and table.get(("tb", "other")) is None
    assert table._objects["k"] == {"ta": a, "tb": b}  # noqa: SLF001
    assert table._objects["other"] is c and a.object_id == ("ta", "k")  # noqa: SLF001
    assert len(table) == 3 and table.snapshot() == [a, b, c]
    assert table.items_of_tenant("ta") == [a, c]
    with pytest.raises(KeyError):
        table.insert(_record("tb", "k", 4))
    table.check()
    assert table.erase(("tc", "k")) is None and table.erase(("ta", "k")) is a
    assert table._objects["k"] is b and table.get(("ta", "k")) is None  # noqa: SLF001
    assert table.snapshot() == [b, c] and len(table) == 2
    table.check()
    assert table.erase(("tb", "k")) is b and "k" not in table._objects  # noqa: SLF001
    assert table.erase(("tb", "k")) is None and len(table) == 1
    table.check()


def test_the_processing_index_holds_records_and_answers_ids_in_put_order() -> None:
    table = ObjectTable()
    first, second = _record("ta", "k", 1), _record("tb", "k", 2)
    table.insert(first)
    table.insert(second)
    assert list(table.oldest_processing()) == [(("ta", "k"), 1.0), (("tb", "k"), 2.0)]
    table.set_attempt(first, 7)
    assert table.attempt_of(("ta", "k")) == 7 and table.attempt_of(("tb", "k")) == 0
    table.mark_complete(first)
    assert list(table.oldest_processing()) == [(("tb", "k"), 2.0)]
    assert table.attempt_of(("ta", "k")) == 0
    table.check()
    table.erase(("tb", "k"))
    assert list(table.oldest_processing()) == []
    table.check()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("lone tenant", "neither a record nor tenants"),
        ("shared count", "keys shared by tenants"),
        ("count", "objects filed, counted"),
        ("wrong key", "stored under"),
    ],
)
def test_the_table_check_sees_a_broken_key_filing(damage: str, message: str) -> None:
    table = ObjectTable()
    table.insert(_record("ta", "k", 1))
    table.insert(_record("tb", "k", 2))
    table.insert(_record("ta", "j", 3))
    table.check()
    objects = table._objects  # noqa: SLF001
    if damage == "lone tenant":
        objects["j"] = {"ta": objects["j"]}  # type: ignore[dict-item]
        table._shared_keys += 1  # noqa: SLF001
    elif damage == "shared count":
        table._shared_keys = 0  # noqa: SLF001
    elif damage == "count":
        table._count += 1  # noqa: SLF001
    else:
        objects["x"] = objects.pop("j")
    with pytest.raises(AssertionError, match=message):
        table.check()
