"""Seeded randomized stress of segment ownership: tenants mount, withdraw, write, remove and
expire on a :class:`MasterService` that requires tokens, with a shared segment beside their own.

After every operation ``service.check()`` runs (every replica lies in a segment its object's
tenant may use, client bindings are consistent) and the test checks what a write may do to
others: an object of another tenant disappears on a write only when every replica it had was in
a segment the writer may use (shared ones here), and a write fails with NO_AVAILABLE_HANDLE only
when no object it could have evicted existed (every object is evictable here: no reads, pins
or unfinished writes are left behind).
"""

from __future__ import annotations

import random

import pytest

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.types import ReplicateConfig
from tests.unit.test_tenant_segments import seg

OPS = 2500
TENANTS = ("tenant-a", "tenant-b", "tenant-c")
KIB = 1 << 10


class Run:
    """One seeded run and the facts it checks after each operation."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.clock = FakeClock()
        config = MasterConfig(auth_tokens_file="tokens.yaml", client_ttl=30)
        self.service = MasterService(config, clock=self.clock, rng=random.Random(seed))
        self.state = self.service.context.state
        self.mounted: dict[str, list[str]] = {t: [] for t in TENANTS}  # tenant -> segment ids
        self.next_id = 0
        self.failures = 0
        self.writes = 0
        assert self.service.mount_segment("admin", seg("shared", 256 * KIB, True), "ops") == 0

    def client(self, tenant: str) -> str:
        return f"client-{tenant}"

    def mount(self, tenant: str) -> None:
        self.next_id += 1
        seg_id = f"{tenant}-{self.next_id}"
        size = self.rng.choice((64, 128, 256)) * KIB
        assert self.service.mount_segment(self.client(tenant), seg(seg_id, size), tenant) == 0
        self.mounted[tenant].append(seg_id)

    def unmount(self, tenant: str) -> None:
        if self.mounted[tenant]:
            seg_id = self.mounted[tenant].pop(self.rng.randrange(len(self.mounted[tenant])))
            assert self.service.unmount_segment(self.client(tenant), seg_id, tenant) == 0

    def foreign_unmount(self, tenant: str) -> None:
        others = [(t, s) for t in TENANTS if t != tenant for s in self.mounted[t]]
        if others:
            owner, seg_id = self.rng.choice(others)
            code = self.service.unmount_segment(self.client(owner), seg_id, tenant)
            assert code == ErrorCode.INVALID_PARAMS
            assert self.service.segment_of(seg_id) is not None

    def _usable(self, tenant: str) -> set[str]:
        return {m.info.id for m in self.state.segments.usable_by(tenant)}

    def _evictable_for(self, tenant: str, size: int) -> int:
        usable = self.state.segments.usable_by(tenant)
        ids = {m.info.id for m in usable}
        useful = {m.info.id for m in usable if m.allocator.usable_capacity >= size}
        return sum(
            1
            for meta in self.state.objects
            if meta.replicas
            and all(r.segment_id in ids for r in meta.replicas)
            and any(r.segment_id in useful for r in meta.replicas)
        )

    def write(self, tenant: str) -> None:
        size = self.rng.choice((1, 4, 16, 48)) * KIB
        key = f"k{self.rng.randrange(400)}"
        usable = self._usable(tenant)
        before = {
            meta.object_id: {r.segment_id for r in meta.replicas}
            for meta in self.state.objects
            if meta.tenant != tenant
        }
        candidates = self._evictable_for(tenant, size)
        replicas = self.rng.choice((1, 1, 2))
        config = ReplicateConfig(replica_num=replicas)
        client = self.client(tenant)
        self.writes += 1
        result = self.service.upsert_start(client, tenant, key, size, config)
        if result.code == 0:
            assert self.service.put_end(client, tenant, key) == 0
        elif result.code == ErrorCode.NO_AVAILABLE_HANDLE:
            self.failures += 1
            assert candidates == 0 or not any(
                m.allocator.usable_capacity >= size for m in self.state.segments.usable_by(tenant)
            ), (tenant, size, candidates)
        else:
            raise AssertionError(ErrorCode.name_of(result.code))
        for object_id, segments in before.items():
            if self.state.objects.get(object_id) is None:
                assert segments <= usable, (object_id, segments, tenant)

    def remove(self, tenant: str) -> None:
        key = f"k{self.rng.randrange(400)}"
        code = self.service.remove(tenant, key)
        assert code in (0, ErrorCode.OBJECT_NOT_FOUND)

    def expire(self, tenant: str) -> None:
        self.clock.advance(20)
        for other in TENANTS:
            if other != tenant:
                self.service.ping(self.client(other))
        self.service.ping("admin")
        self.clock.advance(20)
        expired = self.service.reap_expired_clients(self.clock())
        assert set(expired) <= {self.client(tenant)}
        assert expired or not self.mounted[tenant]
        self.mounted[tenant] = []
        assert self.state.clients.tenant_of(self.client(tenant)) is None

    def step(self) -> None:
        tenant = self.rng.choice(TENANTS)
        bound = self.service.bind_client(self.client(tenant), tenant)
        assert bound
        for other in TENANTS:
            if other != tenant:
                assert not self.service.bind_client(self.client(tenant), other) or (
                    self.state.clients.tenant_of(self.client(tenant)) == other
                )
        op = self.rng.choices(
            (self.mount, self.unmount, self.foreign_unmount, self.write, self.remove, self.expire),
            weights=(4, 2, 1, 30, 5, 1),
        )[0]
        if op == self.mount and len(self.mounted[tenant]) >= 3:
            op = self.write
        op(tenant)
        if self.rng.random() < 0.02:
            self.service.evict_once(self.clock())
        self.service.check()


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_random_tenant_ops_keep_ownership(seed: int) -> None:
    run = Run(seed)
    for _ in range(OPS):
        run.step()
    assert run.writes > OPS // 2
    # Space runs short often enough for eviction on behalf of writes to matter.
    assert run.state.counters.sync_evictions > 0
