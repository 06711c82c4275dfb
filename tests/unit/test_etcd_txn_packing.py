"""How the etcd log store packs writes into txns: within etcd's request size and op limits."""

from __future__ import annotations

from mooncake_py.master.ha.etcd_fence import OP_OVERHEAD_BYTES, TXN_MAX_OPS, pack


def test_runs_keep_order_and_stay_within_the_budget() -> None:
    sizes = [300, 500, 100, 700, 50, 50, 900]
    runs = list(pack(sizes, lambda size: size, budget=1000 + 2 * OP_OVERHEAD_BYTES))
    assert [size for run in runs for size in run] == sizes
    assert runs == [[300, 500, 100], [700, 50, 50], [900]]


def test_an_item_over_the_budget_gets_a_run_of_its_own() -> None:
    runs = list(pack([10, 5000, 10], lambda size: size, budget=1000))
    assert runs == [[10], [5000], [10]]


def test_runs_stay_within_the_op_limit() -> None:
    runs = list(pack([1] * (2 * TXN_MAX_OPS + 1), lambda size: size))
    assert [len(run) for run in runs] == [TXN_MAX_OPS, TXN_MAX_OPS, 1]
    assert list(pack([], len)) == []
