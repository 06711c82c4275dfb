"""Replica copy and move tasks in the master, on a FakeClock: assignment to the source's owner,
reservations that readers never see, the outcome rules of FinishTask, and every way a task
can end early (timeout, client expiry, a target segment going away, the object changing),
each leaving exact accounting (``check()``)."""

from __future__ import annotations

from mooncake_py.errors import ErrorCode
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.state.tasks import TASK_TIMEOUT_S
from mooncake_py.types import TaskStatus, TaskType
from tests.unit.test_service import allocated, make_service, mount, put

OK = ErrorCode.OK
SIZE = 4096


def _service() -> tuple[MasterService, object]:
    service, clock = make_service()
    mount(service, "owner", "s1", size=1 << 20)
    mount(service, "other", "s2", size=1 << 20)
    put(service, "w", "k", SIZE, preferred_segment="name-s1")
    return service, clock


def _status(service: MasterService, task_id: str) -> TaskStatus:
    code, info = service.tasks.query_task("", task_id)
    assert code == OK and info is not None
    return info.status


def test_a_copy_goes_to_the_sources_owner_and_attaches_on_success() -> None:
    service, _ = _service()
    code, task_id = service.tasks.create_copy_task("", "k", ["name-s2"])
    assert code == OK
    assert service.tasks.fetch_tasks("other", 8) == []  # not the owner of the source
    assert service.tasks.fetch_tasks("owner", 8) == [task_id]
    assert _status(service, task_id) == TaskStatus.PROCESSING
    started = service.tasks.start_task("owner", task_id)
    assert started.code == OK and started.source is not None
    assert [t.segment_name for t in started.targets] == ["name-s2"]
    assert allocated(service) == 2 * SIZE  # reserved ...
    meta = service.object_of("", "k")
    assert meta is not None and len(meta.replicas) == 1  # ... but not part of the object yet
    assert service.tasks.start_task("owner", task_id).code == ErrorCode.OBJECT_HAS_REPLICATION_TASK
    service.check()
    assert service.tasks.finish_task("owner", task_id, True) == OK
    assert _status(service, task_id) == TaskStatus.SUCCESS
    assert len(meta.replicas) == 2
    assert service.reads.get_replica_list("", "k", "r").code == OK
    assert service.tasks.finish_task("owner", task_id, True) == ErrorCode.TASK_NOT_FOUND
    service.check()


def test_a_move_retires_its_source_even_under_a_reader() -> None:
    service, _ = _service()
    reading = service.reads.get_replica_list("", "k", "reader")
    assert reading.code == OK
    code, task_id = service.tasks.create_move_task("", "k", "name-s1", "name-s2")
    assert code == OK
    _, info = service.tasks.query_task("", task_id)
    assert info is not None and info.type == TaskType.REPLICA_MOVE
    assert service.tasks.fetch_tasks("owner", 1) == [task_id]
    assert service.tasks.start_task("owner", task_id).code == OK
    assert service.tasks.finish_task("owner", task_id, True) == OK
    meta = service.object_of("", "k")
    assert meta is not None and [r.segment_id for r in meta.replicas] == ["s2"]
    assert allocated(service) == 2 * SIZE  # the source waits for its reader
    service.check()
    assert service.reads.end_reads("reader", [reading.read_id]) == [OK]
    assert allocated(service) == SIZE
    service.check()


def test_a_failed_copy_frees_its_reservation() -> None:
    service, _ = _service()
    _, task_id = service.tasks.create_copy_task("", "k", ["name-s2"])
    service.tasks.fetch_tasks("owner", 1)
    service.tasks.start_task("owner", task_id)
    assert service.tasks.finish_task("owner", task_id, False, "disk on fire") == OK
    _, info = service.tasks.query_task("", task_id)
    assert info is not None and info.status == TaskStatus.FAILED and info.message == "disk on fire"
    assert allocated(service) == SIZE
    service.check()


def test_the_object_changing_during_the_copy_fails_it() -> None:
    service, _ = _service()
    _, task_id = service.tasks.create_copy_task("", "k", ["name-s2"])
    service.tasks.fetch_tasks("owner", 1)
    service.tasks.start_task("owner", task_id)
    assert service.remove("", "k", True) == OK
    put(service, "w", "k", SIZE, preferred_segment="name-s1")
    assert service.tasks.finish_task("owner", task_id, True) == OK
    assert _status(service, task_id) == TaskStatus.FAILED
    meta = service.object_of("", "k")
    assert meta is not None and len(meta.replicas) == 1
    assert allocated(service) == SIZE
    service.check()


def test_a_target_segment_going_away_fails_the_copy() -> None:
    service, _ = _service()
    _, task_id = service.tasks.create_copy_task("", "k", ["name-s2"])
    service.tasks.fetch_tasks("owner", 1)
    service.tasks.start_task("owner", task_id)
    assert service.unmount_segment("other", "s2") == OK
    service.check()
    mount(service, "other", "s2", size=1 << 20)  # a new allocator: the old range is not in it
    assert service.tasks.finish_task("owner", task_id, True) == OK
    assert _status(service, task_id) == TaskStatus.FAILED
    assert allocated(service) == SIZE
    service.check()


def test_overdue_tasks_fail_and_free_what_they_reserved() -> None:
    service, clock = _service()
    _, queued = service.tasks.create_copy_task("", "k", ["name-s2"])
    put(service, "w", "k2", SIZE, preferred_segment="name-s1")
    _, started = service.tasks.create_copy_task("", "k2", ["name-s2"])
    assert service.tasks.fetch_tasks("owner", 1) == [queued]
    service.tasks.start_task("owner", queued)
    assert allocated(service) == 3 * SIZE
    clock.advance(TASK_TIMEOUT_S + 1)  # type: ignore[attr-defined]
    service.sweep_expired_puts(clock())  # type: ignore[operator]
    assert _status(service, queued) == TaskStatus.FAILED
    assert _status(service, started) == TaskStatus.FAILED  # pending for too long too
    assert allocated(service) == 2 * SIZE
    assert service.tasks.fetch_tasks("owner", 8) == []
    service.check()


def test_an_expired_owner_fails_its_tasks() -> None:
    service, clock = _service()
    _, task_id = service.tasks.create_copy_task("", "k", ["name-s2"])
    service.tasks.fetch_tasks("owner", 1)
    service.tasks.start_task("owner", task_id)
    clock.advance(service.config.client_ttl / 2)  # type: ignore[attr-defined]
    assert service.ping("other").code == OK
    clock.advance(service.config.client_ttl / 2 + 1)  # type: ignore[attr-defined]
    assert service.reap_expired_clients(clock()) == ["owner"]  # type: ignore[operator]
    assert _status(service, task_id) == TaskStatus.FAILED
    assert allocated(service) == 0  # its object went with its segment, the copy with it
    service.check()


def test_refusals_and_tenants() -> None:
    service, _ = _service()
    bad = ErrorCode.INVALID_PARAMS
    assert service.tasks.create_copy_task("", "k", []) == (bad, "")
    assert service.tasks.create_copy_task("", "k", ["nowhere"]) == (bad, "")
    assert service.tasks.create_copy_task("", "", ["name-s2"]) == (bad, "")
    assert service.tasks.create_copy_task("", "nope", ["name-s2"])[0] == ErrorCode.OBJECT_NOT_FOUND
    assert service.tasks.create_move_task("", "k", "name-s1", "name-s1") == (bad, "")
    assert service.tasks.create_move_task("", "k", "name-s2", "name-s1") == (bad, "")  # no replica
    code, task_id = service.tasks.create_copy_task("", "k", ["name-s2"])
    assert code == OK
    assert service.tasks.create_copy_task("", "k", ["name-s2"])[0] == (
        ErrorCode.OBJECT_HAS_REPLICATION_TASK
    )
    assert service.tasks.query_task("", "unknown")[0] == ErrorCode.TASK_NOT_FOUND
    assert service.tasks.start_task("other", task_id).code == ErrorCode.TASK_NOT_FOUND
    assert service.tasks.finish_task("other", task_id, True) == ErrorCode.TASK_NOT_FOUND
    assert service.tasks.fetch_tasks("", 8) == [] and service.tasks.fetch_tasks("owner", 0) == []
    service.check()
