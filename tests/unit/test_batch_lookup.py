"""BatchGetReplicaList's run loop (:meth:`ReadService._look_up_run`) answers, key by key,
what GetReplicaList of each key in order answers: two services with the same seeded history,
one looking up in batches and the other one key at a time, agree on every answer (codes,
replicas, sizes, lease TTLs, the capabilities' ranges and modes), on the hit and miss
counters and on the read holds they keep."""

from __future__ import annotations

import random

import pytest

from mooncake_py import capability
from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.types import ReplicaListResult, ReplicateConfig, SegmentInfo

OK = ErrorCode.OK
KEY = b"s" * 32


def twin() -> MasterService:
    service = MasterService(
        MasterConfig(enable_multi_tenants=True), clock=FakeClock(1000.0), rng=random.Random(9)
    )
    segments = [
        # Two plain segments on two names, one on a name of its own without a key (no
        # capabilities), and one shared.
        SegmentInfo(
            id="a",
            name="ha",
            base=4096,
            size=8 << 20,
            te_endpoint="e:1",
            host_id="x",
            capability_key=KEY,
        ),
        SegmentInfo(
            id="b", name="hb", base=4096, size=8 << 20, te_endpoint="e:2", capability_key=KEY
        ),
        SegmentInfo(id="c", name="hc", base=4096, size=8 << 20, te_endpoint="e:3"),
        SegmentInfo(
            id="d",
            name="hd",
            base=4096,
            size=8 << 20,
            te_endpoint="e:4",
            capability_key=KEY,
            shared=True,
        ),
    ]
    for info in segments:
        assert service.mount_segment("owner", info) == OK
    return service


def answer_of(result: ReplicaListResult) -> tuple[object, ...]:
    """Everything of an answer but the read id and the capability's tag and expiry."""
    replicas = []
    for r in result.replicas:
        grant = capability.grant_of(r.capability) if r.capability else b""
        fields = capability.GRANT.unpack(grant)[:3] if grant else ()
        replicas.append(
            (
                r.id,
                r.status,
                r.segment_id,
                r.segment_name,
                r.offset,
                r.size,
                r.te_endpoint,
                r.host_id,
                r.disk,
                fields,
                len(r.capability),
            )
        )
    return (result.code, tuple(replicas), result.lease_ttl_ms, result.size)


def holds_of(
    service: MasterService,
) -> list[tuple[str, tuple[str, str], tuple[int, ...], int, float]]:
    reads = service._state.reads  # noqa: SLF001
    return sorted(
        (h.client_id, h.meta.object_id, h.replica_ids, h.count, h.deadline)
        for h in reads._holds.values()  # noqa: SLF001
    )


@pytest.mark.parametrize("seed", range(5))
def test_batch_lookups_answer_what_single_lookups_answer(seed: int) -> None:
    rng = random.Random(seed)
    batched, single = twin(), twin()
    tenants = ("t1", "t2")
    names = [f"k{i}" for i in range(80)]
    for round_ in range(20):
        tenant = rng.choice(tenants)
        # The same writes on both: one or two replicas, some left in flight.
        keys = rng.sample(names, rng.randint(1, 15))
        config = ReplicateConfig(replica_num=rng.choice((1, 1, 2)))
        for service in (batched, single):  # deterministic twins: the same ids and places
            starts = service.batch_put_start("w", tenant, keys, [100] * len(keys), config)
            started = [(k, s.write_id) for k, s in zip(keys, starts, strict=True) if s.code == OK]
            done = started[: len(started) * 4 // 5]  # the rest stays in flight
            if done:
                ends = service.batch_put_end(
                    "w", tenant, [k for k, _ in done], [w for _, w in done]
                )
                assert ends == [OK] * len(done)
        lookups = rng.sample(names, rng.randint(1, 30)) + ["", "x" * 5000, "never"]
        rng.shuffle(lookups)
        lookups.append(lookups[0])  # a repeat within one batch shares its hold
        reader = rng.choice(("r1", "r2"))
        got = batched.reads.batch_get_replica_list(tenant, lookups, reader)
        want = [single.reads.get_replica_list(tenant, key, reader) for key in lookups]
        assert [answer_of(r) for r in got] == [answer_of(r) for r in want], f"round {round_}"
        assert holds_of(batched) == holds_of(single)
        counters = (batched._state.counters, single._state.counters)  # noqa: SLF001
        assert counters[0].get_hits == counters[1].get_hits
        assert counters[0].get_misses == counters[1].get_misses
        if rng.random() < 0.5:
            ended_b = batched.reads.end_reads(reader, [r.read_id for r in got if r.code == OK])
            ended_s = single.reads.end_reads(reader, [r.read_id for r in want if r.code == OK])
            assert ended_b == ended_s
        batched.check()
        single.check()


def test_a_batch_lookup_of_plain_keys_mints_read_grants_for_their_ranges() -> None:
    """The inline answers carry a capability that verifies for READ of exactly the value's
    range (MAP added: the segment is nobody's and unshared)."""
    service = twin()
    keys = [f"p{i}" for i in range(40)]
    starts = service.batch_put_start("w", "t1", keys, [100] * 40, ReplicateConfig())
    assert service.batch_put_end("w", "t1", keys, [s.write_id for s in starts]) == [OK] * 40
    found = service.reads.batch_get_replica_list("t1", keys, "r")
    plain = [r for r in found if r.replicas[0].segment_id in ("a", "b")]
    assert plain and all(r.code == OK and r.size == 100 for r in found)
    for result in plain:
        replica = result.replicas[0]
        grant = capability.grant_of(replica.capability)
        offset, length, mode, _expires, _tag = capability.GRANT.unpack(grant)
        assert (offset, length, mode) == (replica.offset, 100, capability.READ | capability.MAP)
        assert capability.verify(
            KEY, replica.segment_id.encode(), grant, replica.offset, 100, capability.READ
        )
    service.check()
