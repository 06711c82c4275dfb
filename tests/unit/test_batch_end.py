"""BatchPutEnd's run loop (:meth:`WritePath.end_run`) answers, key by key, what PutEnd of each
key in order answers: two services with the same seeded history, one ending in batches and
the other one key at a time, agree on every code and end in the same state."""

from __future__ import annotations

import random

import pytest

from mooncake_py.errors import ErrorCode
from mooncake_py.master.clock import FakeClock
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.service.facade import MasterService
from mooncake_py.types import ReplicateConfig, SegmentInfo

OK = ErrorCode.OK


def twin() -> tuple[MasterService, FakeClock]:
    clock = FakeClock(1000.0)
    service = MasterService(
        MasterConfig(put_start_discard_timeout_sec=5), clock=clock, rng=random.Random(3)
    )
    info = SegmentInfo(id="seg", name="h", base=4096, size=64 << 20, te_endpoint="e:1")
    assert service.mount_segment("owner", info) == OK
    return service, clock


def state_of(service: MasterService) -> list[tuple[str, int, bool, int]]:
    return sorted(
        (m.key, m.write_id, m.readable, len(m.processing_replicas()))
        for m in service._state.objects.snapshot()  # noqa: SLF001
    )


@pytest.mark.parametrize("seed", range(5))
def test_batch_end_answers_what_single_ends_answer(seed: int) -> None:
    rng = random.Random(seed)
    batched, batched_clock = twin()
    single, single_clock = twin()
    names = [f"k{i}" for i in range(60)]
    started: dict[str, int] = {}
    for round_ in range(25):
        # The same starts on both (same seeds, same ids), some of them upserts that preempt.
        keys = rng.sample(names, rng.randint(1, 20))
        upsert = rng.random() < 0.3
        client = rng.choice(("w1", "w2"))
        for service in (batched, single):
            start = service.batch_upsert_start if upsert else service.batch_put_start
            results = start(client, "", keys, [4096] * len(keys), ReplicateConfig())
        for key, result in zip(keys, results, strict=True):
            if result.code == OK:
                started[key] = result.write_id
        # Ends naming the right write, a stale one, another client's, an unknown key, an
        # invalid key, a repeat within the batch, or a write id of 0.
        ends = rng.sample(names, rng.randint(1, 30)) + ["", "x" * 5000, "unknown"]
        rng.shuffle(ends)
        ends.append(ends[0])
        ids = [
            rng.choice((started.get(key, 0), started.get(key, 0), 0, 999_999, 1)) for key in ends
        ]
        ender = rng.choice(("w1", "w1", "w2"))
        got = batched.batch_put_end(ender, "", ends, ids)
        want = [
            single.put_end(ender, "", key, write_id)
            for key, write_id in zip(ends, ids, strict=True)
        ]
        assert got == want, f"round {round_}"
        assert state_of(batched) == state_of(single)
        batched.check()
        if rng.random() < 0.3:  # let some writes go stale (the next put preempts them)
            batched_clock.advance(6.0)
            single_clock.advance(6.0)
    assert any(code == OK for code in got) or started


def test_an_end_of_a_preempted_write_frees_its_memory_in_a_batch() -> None:
    """The loop's shortcut is never taken for a preempted write's id: the general end gives
    its memory back and answers INVALID_WRITE."""
    service, clock = twin()
    first = service.batch_put_start("w", "", ["a", "b"], [4096, 4096], ReplicateConfig())
    clock.advance(6.0)
    second = service.batch_put_start("w", "", ["a"], [4096], ReplicateConfig())
    assert second[0].code == OK
    assert service._state.preempted_count() == 1  # noqa: SLF001
    codes = service.batch_put_end(
        "w", "", ["a", "b", "a"], [first[0].write_id, first[1].write_id, second[0].write_id]
    )
    assert codes == [ErrorCode.INVALID_WRITE, OK, OK]
    assert service._state.preempted_count() == 0  # noqa: SLF001
    service.check()
