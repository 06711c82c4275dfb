"""Capabilities against range reuse and task workers: a freed range of a shared segment waits
for its grants to expire before anyone's object may land there, grants for replica-task workers
never map a whole segment, and a task's worker stays anonymous to other tenants (service level,
wall clock injected)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from mooncake_py import capability
from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.state.grant_holds import GrantHolds
from mooncake_py.types import ReplicateConfig, SegmentInfo
from tests.unit.test_tenant_segments import seg as tenant_segment

MIB = 1 << 20
OK = ErrorCode.OK
KEY = b"k" * capability.KEY_BYTES


class WallClock:
    """A hand-driven wall clock in ms."""

    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def make_service(**overrides: Any) -> tuple[MasterService, WallClock]:
    config = MasterConfig(auth_tokens_file="tokens.yaml", capability_ttl_sec=5, **overrides)
    service = MasterService(config, clock=FakeClock(), rng=random.Random(3))
    wall = WallClock()
    service.context.state.wall_ms = wall
    return service, wall


def seg(seg_id: str, size: int = 4096, shared: bool = False) -> SegmentInfo:
    return dataclasses.replace(tenant_segment(seg_id, size, shared), capability_key=KEY)


def mode_of(cap: bytes) -> int:
    return int(capability.GRANT.unpack(capability.grant_of(cap))[2])


def test_a_freed_shared_range_waits_for_its_grants_before_anyone_reuses_it() -> None:
    service, wall = make_service()
    assert service.mount_segment("ops-client", seg("shared", shared=True), "ops") == OK
    start = service.put_start("a-client", "tenant-a", "a-key", 4096, ReplicateConfig())
    assert start.code == OK
    grant = start.replicas[0].capability
    assert mode_of(grant) == capability.WRITE  # a shared segment is never mapped whole
    assert service.put_revoke("a-client", "tenant-a", "a-key", start.write_id) == OK
    service.check()

    # The only range is held: B's write finds no room, so A's stale grant reaches nothing.
    blocked = service.put_start("b-client", "tenant-b", "b-key", 4096, ReplicateConfig())
    assert blocked.code == ErrorCode.NO_AVAILABLE_HANDLE
    wall.now += 4_000
    service.sweep_expired_puts(0.0)
    assert service.context.state.segments.grant_holds.held_on("shared") == 1
    service.check()

    wall.now += 1_001  # every grant minted for the range has expired
    service.sweep_expired_puts(0.0)
    assert service.context.state.segments.grant_holds.held_on("shared") == 0
    service.check()
    reused = service.put_start("b-client", "tenant-b", "b-key", 4096, ReplicateConfig())
    assert reused.code == OK and reused.replicas[0].offset == start.replicas[0].offset


def test_unshared_ranges_go_back_at_once_and_their_grants_map() -> None:
    service, _ = make_service()
    assert service.mount_segment("a-client", seg("own-a"), "tenant-a") == OK
    start = service.put_start("a-client", "tenant-a", "k", 4096, ReplicateConfig())
    assert mode_of(start.replicas[0].capability) == capability.WRITE | capability.MAP
    assert service.put_revoke("a-client", "tenant-a", "k", start.write_id) == OK
    again = service.put_start("a-client", "tenant-a", "k", 4096, ReplicateConfig())
    assert again.code == OK  # nothing held: memory goes back at once
    service.check()


def test_task_workers_get_exact_ranges_and_stay_anonymous_to_other_tenants() -> None:
    service, _ = make_service()
    assert service.bind_client("ops-client", "ops") and service.bind_client("a-client", "tenant-a")
    assert service.mount_segment("ops-client", seg("shared", 1 * MIB, shared=True), "ops") == OK
    start = service.put_start("a-client", "tenant-a", "k", 4096, ReplicateConfig())
    assert start.code == OK and start.replicas[0].segment_id == "shared"
    assert service.put_end("a-client", "tenant-a", "k", start.write_id) == OK
    assert service.mount_segment("a-client", seg("own-a", 1 * MIB), "tenant-a") == OK

    code, task_id = service.tasks.create_copy_task("tenant-a", "k", ["name-own-a"])
    assert code == OK
    code, state = service.tasks.query_task("tenant-a", task_id)
    assert code == OK and state is not None and state.assigned_client == ""
    assert service.tasks.fetch_tasks("ops-client", 8) == [task_id]
    started = service.tasks.start_task("ops-client", task_id)
    assert started.code == OK
    assert mode_of(started.source.capability) == capability.READ
    assert [mode_of(t.capability) for t in started.targets] == [capability.WRITE]
    service.check()


def test_grant_holds_count_per_segment_and_forget_unmounted_segments() -> None:
    holds = GrantHolds()
    holds.granted("s1", 0, 100)
    holds.granted("s1", 0, 50)  # an earlier expiry never shortens the hold
    holds.granted("s2", 64, 80)
    assert holds.hold_on_free("s1", 0, now_ms=60) and holds.hold_on_free("s2", 64, now_ms=60)
    assert not holds.hold_on_free("s1", 128, now_ms=60)  # never granted: free now
    assert holds.held_on("s1") == 1 and holds.held_count() == 2
    holds.drop_segment("s2")
    holds.check()
    assert holds.due(99) == [] and holds.due(100) == [("s1", 0)]
    assert holds.held_count() == 0
    holds.check()
