"""Seeded random operations on an :class:`ObjectTable` whose keys several tenants share,
against a plain dict model keyed by (tenant, key): lookups, the iteration order within a
tenant, the processing index and ``check()`` after every step."""

from __future__ import annotations

import random

import pytest

from mooncake_py.master.state.objects import ObjectMetadata, ObjectTable, Replica
from mooncake_py.types import ReplicaStatus

TENANTS = ("", "ta", "tb")
KEYS = 12
STEPS = 3_000


@pytest.mark.parametrize("seed", range(6))
def test_a_table_of_shared_keys_follows_the_model(seed: int) -> None:
    rng = random.Random(seed)
    table = ObjectTable()
    model: dict[tuple[str, str], ObjectMetadata] = {}
    writing: dict[tuple[str, str], float] = {}  # in flight, in put order
    shared_seen = 0
    for step in range(STEPS):
        object_id = (rng.choice(TENANTS), f"k{rng.randrange(KEYS)}")
        action = rng.random()
        if action < 0.45:
            meta = ObjectMetadata(
                *object_id,
                64,
                "c",
                float(step),
                (Replica(step, "s0", 0, 64, ReplicaStatus.PROCESSING),),
            )
            if object_id in model:
                with pytest.raises(KeyError):
                    table.insert(meta)
            else:
                table.insert(meta)
                model[object_id] = meta
                writing[object_id] = float(step)
        elif action < 0.75:
            gone = table.erase(object_id)
            assert gone is model.pop(object_id, None)
            writing.pop(object_id, None)
        elif action < 0.9:
            meta_or_none = table.get(object_id)
            if meta_or_none is not None:
                table.mark_complete(meta_or_none)
                writing.pop(object_id, None)
        for probe in ((t, object_id[1]) for t in TENANTS):
            assert table.get(probe) is model.get(probe)
        shared_seen += any(isinstance(h, dict) for h in table._objects.values())  # noqa: SLF001
        assert len(table) == len(model)
        assert list(table.oldest_processing()) == list(writing.items())
        for tenant in TENANTS:
            mine = [m for (t, _), m in model.items() if t == tenant]
            assert sorted(map(id, table.items_of_tenant(tenant))) == sorted(map(id, mine))
        table.check()
    assert sorted(map(id, table.snapshot())) == sorted(map(id, model.values()))
    assert shared_seen > STEPS // 4  # the shared representation was exercised
