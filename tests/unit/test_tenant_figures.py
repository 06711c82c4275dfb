"""Per-tenant figures kept by the master's state: object counts, bytes held (overall and per
segment), session and pinned-session counts, on a :class:`MasterService` with tokens and a
FakeClock (no sockets).

Each test drives one way replicas or sessions come and go (a write from its start, upsert,
copy and move tasks, reads that retire a moved source, eviction, unmount, sessions pinned and
dropped) and compares what the views answer (``tenant_figures``, the tenant-scoped ``stats``
and ``segment_usage``) with :func:`recount`: the same figures computed by walking every object
and session, as the views did before they read counters. ``service.check()`` recounts them too,
and the last tests show it notices a counter that drifted.
"""

from __future__ import annotations

from typing import Any

import pytest

from mooncake_py.errors import ErrorCode
from mooncake_py.master.service.admin_queries import AdminQueries
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.state.store import StoreState
from mooncake_py.types import ReplicateConfig
from tests.unit.test_tenant_segments import MIB, make_service, put, seg

OK = ErrorCode.OK
KIB = 1 << 10
FIGURES = ("objects", "bytes", "sessions", "pinned_sessions")


# -- the figures, recounted the slow way -----------------------------------------------------


def recount(state: StoreState) -> dict[str, dict[str, Any]]:
    """Every tenant's figures by walking all objects and sessions (O(state)): objects, bytes
    (size x replicas on the metadata, whatever their state), (bytes, replicas) per segment,
    sessions and pinned sessions. Tenants with neither objects nor sessions are absent."""
    figures: dict[str, dict[str, Any]] = {}

    def entry(tenant: str) -> dict[str, Any]:
        blank = {"objects": 0, "bytes": 0, "sessions": 0, "pinned_sessions": 0, "segments": {}}
        return figures.setdefault(tenant, blank)

    for meta in state.objects.snapshot():
        tenant = entry(meta.tenant)
        tenant["objects"] += 1
        tenant["bytes"] += meta.size * len(meta.replicas)
        for replica in meta.replicas:
            used, count = tenant["segments"].get(replica.segment_id, (0, 0))
            tenant["segments"][replica.segment_id] = (used + replica.size, count + 1)
    for tenant_id in {t for t, _ in state.sessions._sessions}:
        for session in state.sessions.sessions_after(tenant_id, ""):
            tenant = entry(tenant_id)
            tenant["sessions"] += 1
            tenant["pinned_sessions"] += int(session.pinned)
    return figures


def expected_usage(service: MasterService, tenant: str) -> list[tuple[str, str, int, int]]:
    """What the tenant-scoped ``segment_usage`` must answer, from :func:`recount`: own
    unshared segments from their allocators, others with only ``tenant``'s replicas."""
    state = service.context.state
    shares = recount(state).get(tenant, {}).get("segments", {})
    rows = []
    for mounted in state.segments.usable_by(tenant):
        if mounted.tenant == tenant and not mounted.info.shared:
            allocator = mounted.allocator
            rows.append(
                (
                    mounted.info.id,
                    mounted.client_id,
                    allocator.used_bytes,
                    allocator.allocation_count,
                )
            )
        else:
            used, count = shares.get(mounted.info.id, (0, 0))
            owner = mounted.client_id if mounted.tenant == tenant else ""
            rows.append((mounted.info.id, owner, used, count))
    return rows


def assert_views_agree(service: MasterService) -> None:
    """Every view answers what :func:`recount` computes, for every tenant that has figures
    and one that has none; and ``check()`` passes."""
    state = service.context.state
    slow = recount(state)
    fast = service.tenant_figures()
    assert fast == {
        tenant: {key: figures[key] for key in FIGURES} for tenant, figures in slow.items()
    }
    assert state.sessions.pinned_count() == sum(f["pinned_sessions"] for f in slow.values())
    for tenant in [*slow, "tenant-nobody"]:
        usage = service.segment_usage(tenant, all_tenants=False)
        assert [(i.id, c, u, n) for i, c, u, n in usage] == expected_usage(service, tenant)
        stats = service.stats(tenant, all_tenants=False)
        assert stats["objects"] == slow.get(tenant, {}).get("objects", 0)
        assert stats["sessions"] == slow.get(tenant, {}).get("sessions", 0)
        assert stats["allocated_bytes"] == sum(row[2] for row in expected_usage(service, tenant))
        details = AdminQueries(service.context).segments(tenant)
        assert [(d.segment_id, d.client_id, d.used_bytes) for d in details] == [
            (row[0], row[1], row[2]) for row in expected_usage(service, tenant)
        ]
    service.check()


def shared_service() -> MasterService:
    """Tenant A's own segment, tenant B's own segment, and one shared segment."""
    service, _ = make_service()
    assert service.mount_segment("ca", seg("seg-a"), "tenant-a") == OK
    assert service.mount_segment("cb", seg("seg-b"), "tenant-b") == OK
    assert service.mount_segment("cs", seg("seg-s", 4 * MIB, shared=True), "ops") == OK
    return service


def on_shared(replicas: int = 1) -> ReplicateConfig:
    return ReplicateConfig(replica_num=replicas, preferred_segment="name-seg-s")


# -- writes ------------------------------------------------------------------------------------


def test_bytes_count_from_put_start_and_go_with_the_object() -> None:
    service = shared_service()
    started = service.put_start("ca", "tenant-a", "k", 10 * KIB, on_shared(2))
    assert started.code == OK and len(started.replicas) == 2
    figures = service.tenant_figures()
    assert figures == {
        "tenant-a": {"objects": 1, "bytes": 20 * KIB, "sessions": 0, "pinned_sessions": 0}
    }
    shared = {i.id: u for i, _, u, _ in service.segment_usage("tenant-b", all_tenants=False)}
    assert shared["seg-s"] == 0  # B sees none of A's bytes on the shared segment
    assert_views_agree(service)
    assert service.put_end("ca", "tenant-a", "k") == OK
    assert service.tenant_figures()["tenant-a"]["bytes"] == 20 * KIB
    assert_views_agree(service)
    assert service.remove("tenant-a", "k") == OK
    assert service.tenant_figures() == {}
    assert_views_agree(service)


def test_a_revoked_write_and_an_upsert_of_another_size() -> None:
    service = shared_service()
    started = service.put_start("ca", "tenant-a", "k", 4 * KIB, on_shared())
    assert started.code == OK
    assert service.put_revoke("ca", "tenant-a", "k", started.write_id) == OK
    assert "tenant-a" not in service.tenant_figures()
    assert put(service, "ca", "tenant-a", "k", 4 * KIB) == OK
    assert service.upsert_start("ca", "tenant-a", "k", 12 * KIB, on_shared()).code == OK
    assert service.tenant_figures()["tenant-a"]["bytes"] == 12 * KIB
    assert_views_agree(service)
    assert service.put_end("ca", "tenant-a", "k") == OK
    assert_views_agree(service)


def test_a_preempted_write_stops_counting_at_once() -> None:
    service = shared_service()
    assert service.put_start("ca", "tenant-a", "k", 4 * KIB, on_shared()).code == OK
    # An upsert of an unfinished write takes its place; the old bytes wait for their writer.
    assert service.upsert_start("ca", "tenant-a", "k", 8 * KIB, on_shared()).code == OK
    assert service.tenant_figures()["tenant-a"] == {
        "objects": 1,
        "bytes": 8 * KIB,
        "sessions": 0,
        "pinned_sessions": 0,
    }
    assert_views_agree(service)


# -- replica tasks, reads, eviction, unmount -------------------------------------------------------


def test_copy_adds_and_move_keeps_bytes_even_while_the_source_waits_for_a_reader() -> None:
    service, _ = make_service()
    assert service.mount_segment("cs", seg("seg-s", shared=True), "ops") == OK
    assert service.mount_segment("ct", seg("seg-t", shared=True), "ops") == OK
    assert service.mount_segment("cu", seg("seg-u", shared=True), "ops") == OK
    config = ReplicateConfig(preferred_segment="name-seg-s")
    assert service.put_start("ca", "tenant-a", "k", 8 * KIB, config).code == OK
    assert service.put_end("ca", "tenant-a", "k") == OK
    code, task_id = service.tasks.create_copy_task("tenant-a", "k", ["name-seg-t"])
    assert code == OK
    assert service.tasks.fetch_tasks("cs", 4) == [task_id]
    assert service.tasks.start_task("cs", task_id).code == OK
    assert service.tenant_figures()["tenant-a"]["bytes"] == 8 * KIB  # reserved, not attached
    assert service.tasks.finish_task("cs", task_id, True) == OK
    assert service.tenant_figures()["tenant-a"]["bytes"] == 16 * KIB
    assert_views_agree(service)
    reading = service.reads.get_replica_list("tenant-a", "k", "reader")
    assert reading.code == OK
    code, task_id = service.tasks.create_move_task("tenant-a", "k", "name-seg-t", "name-seg-u")
    assert code == OK
    assert service.tasks.fetch_tasks("ct", 4) == [task_id]
    assert service.tasks.start_task("ct", task_id).code == OK
    assert service.tasks.finish_task("ct", task_id, True) == OK
    # The moved source is retired for its reader: off the object, so no longer counted.
    usage = {i.id: u for i, _, u, _ in service.segment_usage("tenant-a", all_tenants=False)}
    assert usage == {"seg-s": 8 * KIB, "seg-t": 0, "seg-u": 8 * KIB}
    assert service.tenant_figures()["tenant-a"]["bytes"] == 16 * KIB
    assert_views_agree(service)
    assert service.reads.end_reads("reader", [reading.read_id]) == [OK]
    assert_views_agree(service)


def test_eviction_and_unmount_take_their_bytes_off() -> None:
    service = shared_service()
    for i in range(100):  # twice what the shared segment holds: writes evict
        assert service.put_start("cb", "tenant-b", f"b{i}", 80 * KIB, on_shared()).code == OK
        assert service.put_end("cb", "tenant-b", f"b{i}") == OK
    assert service.context.state.counters.evicted_objects > 0
    assert_views_agree(service)
    state = service.context.state
    elsewhere = [
        m for m in state.objects.snapshot() if {r.segment_id for r in m.replicas} - {"seg-s"}
    ]
    assert 0 < len(elsewhere) < service.tenant_figures()["tenant-b"]["objects"]
    assert service.unmount_segment("cs", "seg-s", "ops") == OK
    figures = service.tenant_figures()["tenant-b"]
    assert figures["objects"] == len(elsewhere)
    assert figures["bytes"] == sum(m.size for m in elsewhere)  # one replica each, on seg-b
    assert_views_agree(service)


def test_a_client_whose_segments_go_away_leaves_exact_figures() -> None:
    service = shared_service()
    for i in range(20):
        assert put(service, "ca", "tenant-a", f"a{i}", 16 * KIB) == OK
    assert service.unmount_segment("ca", "seg-a", "tenant-a") == OK
    assert_views_agree(service)


# -- sessions ----------------------------------------------------------------------------------


def test_session_counts_follow_creation_pins_and_drops() -> None:
    service = shared_service()
    for i in range(4):
        assert put(service, "ca", "tenant-a", f"a{i}", KIB) == OK
        assert put(service, "cb", "tenant-b", f"b{i}", KIB) == OK
    sessions = service.sessions
    assert sessions.attach_kv_session("tenant-a", "s1", ["a0", "a1"]) == [0, 0]
    assert sessions.attach_kv_session("tenant-a", "s2", ["a1", "a2"]) == [0, 0]
    assert sessions.attach_kv_session("tenant-b", "s1", ["b0"]) == [0]
    assert sessions.set_kv_session_pin("tenant-a", "s1", True) == OK
    assert sessions.set_kv_session_pin("tenant-a", "s1", True) == OK  # twice counts once
    assert sessions.set_kv_session_pin("tenant-b", "s1", True) == OK
    figures = service.tenant_figures()
    assert figures["tenant-a"]["sessions"] == 2 and figures["tenant-a"]["pinned_sessions"] == 1
    assert figures["tenant-b"]["sessions"] == 1 and figures["tenant-b"]["pinned_sessions"] == 1
    assert service.stats()["pinned_sessions"] == 2
    assert_views_agree(service)
    # A pinned session whose last member goes disappears with its pin.
    assert service.remove("tenant-b", "b0") == OK
    assert service.tenant_figures()["tenant-b"]["pinned_sessions"] == 0
    assert service.stats()["pinned_sessions"] == 1
    assert sessions.set_kv_session_pin("tenant-a", "s1", False) == OK
    assert sessions.close_kv_session("tenant-a", "s2") == OK
    assert service.tenant_figures()["tenant-a"]["sessions"] == 1
    assert_views_agree(service)


def test_a_tenant_with_only_sessions_is_listed_and_one_with_nothing_is_not() -> None:
    service = shared_service()
    config = ReplicateConfig(preferred_segment="name-seg-s", kv_sessions=[["held"]])
    started = service.put_start("ca", "tenant-a", "k", KIB, config)
    assert started.code == OK
    assert service.remove("tenant-a", "k") == ErrorCode.REPLICA_IS_NOT_READY
    assert service.put_revoke("ca", "tenant-a", "k", started.write_id) == OK
    assert service.tenant_figures() == {}
    assert_views_agree(service)


def test_setting_the_flag_of_a_dropped_session_counts_nowhere() -> None:
    service = shared_service()
    assert put(service, "ca", "tenant-a", "k", KIB) == OK
    assert service.sessions.attach_kv_session("tenant-a", "s", ["k"]) == [0]
    record = service.context.state.sessions.get("tenant-a", "s")
    assert record is not None
    assert service.remove("tenant-a", "k") == OK
    record.pinned = True
    assert service.context.state.sessions.pinned_count() == 0
    assert_views_agree(service)


# -- check() notices drift ---------------------------------------------------------------------


def test_check_notices_an_object_tally_that_drifted() -> None:
    service = shared_service()
    assert put(service, "ca", "tenant-a", "k", KIB) == OK
    service.check()
    tally = service.context.state.objects.tallies.get("tenant-a")
    assert tally is not None
    (share,) = tally.segments.values()
    share.bytes += 1
    with pytest.raises(AssertionError, match="per-segment"):
        service.check()
    share.bytes -= 1
    service.check()
    tally.bytes += 1
    with pytest.raises(AssertionError, match="bytes"):
        service.check()


def test_check_notices_a_session_count_that_drifted() -> None:
    service = shared_service()
    assert put(service, "ca", "tenant-a", "k", KIB) == OK
    assert service.sessions.attach_kv_session("tenant-a", "s", ["k"]) == [0]
    record = service.context.state.sessions.get("tenant-a", "s")
    assert record is not None
    record._pinned = True  # behind the registry's back
    with pytest.raises(AssertionError, match="session counts"):
        service.check()
