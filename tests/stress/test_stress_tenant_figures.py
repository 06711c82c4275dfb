"""Seeded randomized stress of the per-tenant figures: three tenants write (finished, left in
flight, revoked, upserted at another size, tagged with sessions), remove, read, copy and move
replicas, attach, pin, unpin and close sessions, mount and withdraw segments, and are evicted
and swept, on a :class:`MasterService` with tokens, a FakeClock and two shared segments beside
the tenants' own.

After every operation ``service.check()`` runs, which recounts every tenant's objects, bytes
(overall and per segment), sessions and pinned sessions from scratch; and the views
(``tenant_figures``, the tenant-scoped ``stats`` and ``segment_usage``, the admin segment
listing) are compared with the walk of every object and session in
:func:`tests.unit.test_tenant_figures.recount`.
"""

from __future__ import annotations

import random

import pytest

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.state.objects import ObjectMetadata
from mooncake_py.types import ReplicateConfig
from tests.unit.test_tenant_figures import assert_views_agree
from tests.unit.test_tenant_segments import seg

OPS = 1200
TENANTS = ("tenant-a", "tenant-b", "tenant-c")
KEYS = 120
KIB = 1 << 10
OK = ErrorCode.OK


class Run:
    """One seeded run; :meth:`step` does one random operation and checks the figures."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.clock = FakeClock()
        config = MasterConfig(auth_tokens_file="tokens.yaml", client_ttl=30)
        self.service = MasterService(config, clock=self.clock, rng=random.Random(seed))
        self.state = self.service.context.state
        self.mounted: dict[str, list[str]] = {t: [] for t in TENANTS}
        self.in_flight: dict[tuple[str, str], int] = {}  # (tenant, key) -> write id
        self.reads: list[tuple[str, int]] = []  # (reader, read id)
        self.next_id = 0
        self.seen = {"copied": 0, "moved": 0, "pinned": 0, "retired": 0, "in_flight": 0}
        for shared in ("shared-1", "shared-2"):
            assert self.service.mount_segment("ops", seg(shared, 256 * KIB, True), "ops") == OK
        for tenant in TENANTS:
            self.mount(tenant)

    def client(self, tenant: str) -> str:
        return f"client-{tenant}"

    def key(self) -> str:
        return f"k{self.rng.randrange(KEYS)}"

    def config(self) -> ReplicateConfig:
        config = ReplicateConfig(replica_num=self.rng.choice((1, 1, 2)))
        if self.rng.random() < 0.3:
            config.kv_sessions = [[f"s{self.rng.randrange(6)}"]]
        return config

    # -- segments ----------------------------------------------------------------------------

    def mount(self, tenant: str) -> None:
        if len(self.mounted[tenant]) >= 2:
            return
        self.next_id += 1
        seg_id = f"{tenant}-{self.next_id}"
        size = self.rng.choice((64, 128)) * KIB
        assert self.service.mount_segment(self.client(tenant), seg(seg_id, size), tenant) == OK
        self.mounted[tenant].append(seg_id)

    def unmount(self, tenant: str) -> None:
        if self.mounted[tenant]:
            seg_id = self.mounted[tenant].pop(self.rng.randrange(len(self.mounted[tenant])))
            assert self.service.unmount_segment(self.client(tenant), seg_id, tenant) == OK

    # -- writes ------------------------------------------------------------------------------

    def start(self, tenant: str, upsert: bool) -> int | None:
        key, size = self.key(), self.rng.choice((1, 4, 16, 40)) * KIB
        begin = self.service.upsert_start if upsert else self.service.put_start
        result = begin(self.client(tenant), tenant, key, size, self.config())
        assert result.code in (
            OK,
            ErrorCode.NO_AVAILABLE_HANDLE,
            ErrorCode.OBJECT_ALREADY_EXISTS,
            ErrorCode.OBJECT_HAS_LEASE,
            ErrorCode.SESSION_LIMIT_EXCEEDED,
        ), ErrorCode.name_of(result.code)
        if result.code != OK:
            return None
        self.in_flight[(tenant, key)] = result.write_id
        return result.write_id

    def write(self, tenant: str) -> None:
        if self.start(tenant, upsert=self.rng.random() < 0.4) is not None:
            self.finish(tenant, revoke=self.rng.random() < 0.1)

    def write_unfinished(self, tenant: str) -> None:
        self.start(tenant, upsert=self.rng.random() < 0.5)

    def finish(self, tenant: str, revoke: bool = False) -> None:
        mine = [k for k in self.in_flight if k[0] == tenant]
        if not mine:
            return
        pending = mine[-1] if not revoke else self.rng.choice(mine)
        write_id = self.in_flight.pop(pending)
        end = self.service.put_revoke if revoke else self.service.put_end
        code = end(self.client(tenant), tenant, pending[1], write_id)
        # Preempted, swept, evicted or removed meanwhile: any of these answers is fine.
        assert code in (
            OK,
            ErrorCode.INVALID_WRITE,
            ErrorCode.OBJECT_NOT_FOUND,
            ErrorCode.ILLEGAL_CLIENT,
        ), ErrorCode.name_of(code)

    def remove(self, tenant: str) -> None:
        code = self.service.remove(tenant, self.key(), force=self.rng.random() < 0.3)
        assert code in (
            OK,
            ErrorCode.OBJECT_NOT_FOUND,
            ErrorCode.OBJECT_HAS_LEASE,
            ErrorCode.REPLICA_IS_NOT_READY,
        )

    # -- reads and replica tasks ---------------------------------------------------------------

    def readable_of(self, tenant: str) -> list[ObjectMetadata]:
        return [m for m in self.state.objects.snapshot() if m.tenant == tenant and m.is_readable()]

    def read(self, tenant: str) -> None:
        readable = self.readable_of(tenant)
        if not readable:
            return
        reader = f"reader-{tenant}"
        key = self.rng.choice(readable).key
        result = self.service.reads.get_replica_list(tenant, key, reader)
        if result.code == OK:
            self.reads.append((reader, result.read_id))

    def end_read(self, tenant: str) -> None:
        if self.reads:
            reader, read_id = self.reads.pop(self.rng.randrange(len(self.reads)))
            self.service.reads.end_reads(reader, [read_id])

    def replica_task(self, tenant: str) -> None:
        readable = self.readable_of(tenant)
        if not readable:
            return
        meta = self.rng.choice(readable)
        key = meta.key
        usable = [m.info.name for m in self.state.segments.usable_by(tenant)]
        held = [self.state.segments.get(r.segment_id) for r in meta.replicas]
        names = {m.info.name for m in held if m is not None}
        targets = [n for n in usable if n not in names]
        if not targets or not names:
            return
        target = self.rng.choice(targets)
        move = self.rng.random() < 0.5
        if move:
            code, task_id = self.service.tasks.create_move_task(
                tenant, key, self.rng.choice(sorted(names)), target
            )
        else:
            code, task_id = self.service.tasks.create_copy_task(tenant, key, [target])
        if code != OK:
            return
        owners = {self.client(t) for t in TENANTS} | {"ops"}
        worker = next(o for o in owners if task_id in self.service.tasks.fetch_tasks(o, 64))
        if self.service.tasks.start_task(worker, task_id).code != OK:
            return
        success = self.rng.random() < 0.85
        if self.service.tasks.finish_task(worker, task_id, success) == OK and success:
            self.seen["moved" if move else "copied"] += 1

    # -- sessions ------------------------------------------------------------------------------

    def attach(self, tenant: str) -> None:
        keys = [self.key() for _ in range(self.rng.randint(1, 4))]
        self.service.sessions.attach_kv_session(tenant, f"s{self.rng.randrange(6)}", keys)

    def pin(self, tenant: str) -> None:
        pinned = self.rng.random() < 0.6
        session = f"s{self.rng.randrange(6)}"
        if self.service.sessions.set_kv_session_pin(tenant, session, pinned) == OK and pinned:
            self.seen["pinned"] += 1

    def close(self, tenant: str) -> None:
        session = f"s{self.rng.randrange(6)}"
        if self.rng.random() < 0.5:
            self.service.sessions.close_kv_session(tenant, session)
        else:
            keep = [self.key() for _ in range(3)]
            self.service.sessions.update_kv_session(tenant, session, keep)

    # -- time --------------------------------------------------------------------------------

    def pass_time(self, tenant: str) -> None:
        self.clock.advance(self.rng.choice((1, 5, 15)))
        for client in [self.client(t) for t in TENANTS] + ["ops"]:
            self.service.ping(client)
        self.service.sweep_expired_puts(self.clock())
        self.service.evict_once(self.clock())

    def step(self) -> None:
        tenant = self.rng.choice(TENANTS)
        ops = (
            (self.write, 30),
            (self.write_unfinished, 6),
            (self.finish, 6),
            (self.remove, 8),
            (self.read, 6),
            (self.end_read, 6),
            (self.replica_task, 8),
            (self.attach, 6),
            (self.pin, 5),
            (self.close, 3),
            (self.mount, 2),
            (self.unmount, 1),
            (self.pass_time, 3),
        )
        op = self.rng.choices([o for o, _ in ops], weights=[w for _, w in ops])[0]
        op(tenant)
        # Note the states worth having been through: buffers kept for readers, writes open.
        self.seen["retired"] += self.state.reads.retired_bytes() > 0
        self.seen["in_flight"] += any(m.is_writing() for m in self.state.objects.snapshot())
        assert_views_agree(self.service)


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_random_ops_keep_tenant_figures_exact(seed: int) -> None:
    run = Run(seed)
    for _ in range(OPS):
        run.step()
    counters = run.state.counters
    # Every kind of change happened in this run, so each was checked.
    assert counters.evicted_objects + counters.sync_evictions > 0
    assert all(run.seen.values()), run.seen
    assert len(run.service.tenant_figures()) >= 2
