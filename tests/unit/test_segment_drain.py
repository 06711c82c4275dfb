"""Withdrawing a segment in slices: nothing is placed on it or read from it once withdrawn, its
objects go slice by slice, a remount of its id finishes the drain first, and an expired
client's segments drain in the background step. Pure logic on a FakeClock."""

from __future__ import annotations

from mooncake_py.errors import ErrorCode
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.service.slices import drive
from mooncake_py.master.state import store
from mooncake_py.types import ReplicateConfig
from tests.unit.test_service import make_service, mount, put

OK = ErrorCode.OK
N = 3 * store.DRAIN_CHECK_EVERY + 5


def _filled(**overrides: object) -> MasterService:
    service, _ = make_service(**overrides)
    mount(service, "owner", "s1", size=64 << 20)
    mount(service, "other", "s2", size=64 << 20)
    for i in range(N):
        put(service, "w", f"k{i}", 10, preferred_segment="name-s1")
    put(service, "w", "elsewhere", 10, preferred_segment="name-s2")
    return service


def _always_spent(monkeypatch: object) -> None:
    # One look at the clock per DRAIN_CHECK_EVERY objects, and every look ends the slice.
    monkeypatch.setattr(  # type: ignore[attr-defined]
        "mooncake_py.master.service.slices.SliceTimer.spent", lambda self: True
    )


def test_a_withdrawn_segment_is_never_read_and_drains_in_slices(monkeypatch: object) -> None:
    service = _filled()
    _always_spent(monkeypatch)
    steps = service.unmount_segment_sliced("owner", "s1")
    next(steps)  # withdrawn, first slice dropped
    assert service.segment_of("s1") is None
    # Not yet dropped objects are already unreadable: no reader is sent to the segment.
    last = f"k{N - 1}"
    assert service.object_of("", last) is not None
    assert service.reads.get_replica_list("", last, "r").code == ErrorCode.OBJECT_NOT_FOUND
    assert service.reads.batch_exist_key("", [last, "elsewhere"], "r") == [0, 1]
    assert service.reads.probe_key("", last) == 0
    service.check()
    slices = 2 + sum(1 for _ in steps)  # the first, those after each yield
    assert slices == N // store.DRAIN_CHECK_EVERY + 1
    assert [service.object_of("", f"k{i}") for i in range(N)] == [None] * N
    assert service.reads.get_replica_list("", "elsewhere", "r").code == OK
    service.check()


def test_a_remount_mid_drain_finishes_it_first(monkeypatch: object) -> None:
    service = _filled()
    _always_spent(monkeypatch)
    steps = service.unmount_segment_sliced("owner", "s1")
    next(steps)
    mount(service, "owner", "s1", size=64 << 20)  # the owner comes back
    assert [service.object_of("", f"k{i}") for i in range(N)] == [None] * N
    # A key written again lands on the new segment; the old drain's last slices spare it.
    put(service, "w", f"k{N - 1}", 10, preferred_segment="name-s1")
    assert drive(steps) == OK
    assert service.reads.get_replica_list("", f"k{N - 1}", "r").code == OK
    service.check()


def test_unmount_answers_and_refusals() -> None:
    service = _filled()
    assert service.unmount_segment("other", "s1") == ErrorCode.INVALID_PARAMS
    assert service.unmount_segment("owner", "s1") == OK
    assert service.unmount_segment("owner", "s1") == OK  # idempotent
    assert service.stats()["objects"] == 1
    assert service.put_start("w", "", "new", 10, ReplicateConfig()).code == OK  # on s2
    service.check()


def test_expired_clients_drain_in_the_background_step(monkeypatch: object) -> None:
    service, clock = make_service()
    mount(service, "owner", "s1", size=64 << 20)
    mount(service, "other", "s2", size=64 << 20)
    for i in range(N):
        put(service, "w", f"k{i}", 10, preferred_segment="name-s1")
    clock.advance(service.config.client_ttl / 2)
    assert service.ping("other").code == OK
    clock.advance(service.config.client_ttl / 2 + 1)
    _always_spent(monkeypatch)
    assert service.reap_expired_clients(clock(), drain=False) == ["owner"]
    assert service.reads.batch_exist_key("", ["k0", f"k{N - 1}"], "r") == [0, 0]
    service.check()
    rounds = 1
    while service.continue_drains():
        rounds += 1
        service.check()
    assert rounds == N // store.DRAIN_CHECK_EVERY + 1
    assert service.stats()["objects"] == 0
    assert not service.continue_drains()
    service.check()
