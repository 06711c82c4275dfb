"""The many-clients benchmark's arithmetic (tests/bench/many_clients_stats.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.bench import many_clients_stats as stats


def _answer(elapsed_s: float, **types: tuple[int, int, int, list[float]]) -> dict[str, object]:
    return {
        "elapsed_s": elapsed_s,
        "types": {
            name: {"calls": calls, "keys": keys, "failures": failures, "times": times}
            for name, (calls, keys, failures, times) in types.items()
        },
    }


def test_round_figures_sum_each_clients_rates_and_pool_the_latencies() -> None:
    answers = [
        _answer(2.0, put_big=(4, 64, 0, [0.001, 0.002, 0.003, 0.004])),
        _answer(4.0, put_big=(2, 32, 1, [0.010, 0.020]), exist=(8, 1024, 0, [0.0005] * 8)),
    ]
    figures = stats.round_figures(answers)
    # client 0: 4 calls / 2 s; client 1: (2 + 8) calls / 4 s
    assert figures["ops_per_s"] == pytest.approx(2.0 + 2.5)
    assert figures["keys_per_s"] == pytest.approx(64 / 2 + (32 + 1024) / 4)
    assert figures["calls"] == 14
    assert figures["failures"] == 1
    put = figures["types"]["put_big"]
    assert put["calls"] == 6
    assert put["calls_per_s"] == pytest.approx(2.0 + 0.5)
    assert put["failures"] == 1
    # pooled over both clients: 1, 2, 3, 4, 10, 20 ms
    assert put["p50_us"] == pytest.approx(3500.0)
    assert put["p99_us"] == pytest.approx(10_000 + 0.95 * 10_000)
    assert figures["types"]["exist"]["p50_us"] == pytest.approx(500.0)


def test_round_figures_of_a_type_without_calls_have_no_percentiles() -> None:
    figures = stats.round_figures([_answer(1.0, remove=(0, 0, 0, []))])
    assert figures["types"]["remove"]["p50_us"] is None
    assert figures["types"]["remove"]["p99_us"] is None
    assert figures["ops_per_s"] == 0.0


def test_medians_take_each_figure_over_the_rounds_that_have_it() -> None:
    rounds: list[dict[str, Any]] = [
        {"figures": {"ops_per_s": 10.0, "types": {"exist": {"p50_us": None}}}, "busy": 0.5},
        {"figures": {"ops_per_s": 30.0, "types": {"exist": {"p50_us": 7.0}}}, "busy": 0.7},
        {"figures": {"ops_per_s": 20.0, "types": {"exist": {"p50_us": 9.0}}}, "busy": None},
    ]
    result = stats.medians(rounds)
    assert result["figures.ops_per_s"] == 20.0
    assert result["figures.types.exist.p50_us"] == 8.0
    assert result["busy"] == pytest.approx(0.6)
    assert stats.medians([{"busy": None}]) == {"busy": None}


def test_ratio_is_missing_without_both_figures_or_with_a_zero_base() -> None:
    assert stats.ratio(3.0, 2.0) == 1.5
    assert stats.ratio(None, 2.0) is None
    assert stats.ratio(3.0, None) is None
    assert stats.ratio(3.0, 0.0) is None


def test_proc_stat_ticks_are_counted_from_the_last_parenthesis() -> None:
    # A process name with a space and a parenthesis, as the kernel writes it.
    text = "4242 (odd) name) S 1 4242 4242 0 -1 4194560 1000 0 0 0 1234 567 0 0 20 0 3 0 99"
    assert stats.proc_stat_cpu_ticks(text) == (1234, 567)
    with pytest.raises(ValueError):
        stats.proc_stat_cpu_ticks("4242 no name")
    with pytest.raises(ValueError):
        stats.proc_stat_cpu_ticks("4242 (short) S 1 2")


def test_cpu_share_is_a_fraction_of_one_core() -> None:
    share = stats.cpu_share((100, 10), (250, 60), wall_s=2.0, ticks_per_s=100.0)
    assert share == pytest.approx({"user": 0.75, "system": 0.25, "total": 1.0})
    assert stats.cpu_share((0, 0), (1, 1), wall_s=0.0, ticks_per_s=100.0)["total"] is None


def test_cpu_per_call_is_cores_over_calls_per_second() -> None:
    assert stats.cpu_us_per_call(0.5, 250.0) == pytest.approx(2000.0)
    assert stats.cpu_us_per_call(None, 250.0) is None
    assert stats.cpu_us_per_call(0.5, 0.0) is None


RAW = """\
main (app.py:10);loop (app.py:20);handle (srv.py:5);encode (codec.py:7) 6
main (app.py:10);loop (app.py:20);handle (srv.py:6);encode (codec.py:9) 2
main (app.py:10);loop (app.py:20);handle (srv.py:8) 1
main (app.py:10);loop (app.py:21);poll (io.py:3);poll (io.py:4) 1
not a line
"""


def test_pyspy_summary_ranks_self_and_inclusive_frames_without_line_numbers() -> None:
    summary = stats.pyspy_summary(RAW, top=3)
    assert summary["samples"] == 10
    assert summary["self"] == [
        {"frame": "encode (codec.py)", "samples": 8, "share": 0.8},
        {"frame": "handle (srv.py)", "samples": 1, "share": 0.1},
        {"frame": "poll (io.py)", "samples": 1, "share": 0.1},
    ]
    # main and loop are in every sample: left out; a recursive frame counts once per sample.
    assert summary["in_every_sample"] == ["loop (app.py)", "main (app.py)"]
    assert [(e["frame"], e["samples"]) for e in summary["inclusive"]] == [
        ("handle (srv.py)", 9),
        ("encode (codec.py)", 8),
        ("poll (io.py)", 1),
    ]


def test_pyspy_summary_of_no_samples_is_empty() -> None:
    assert stats.pyspy_summary("") == {
        "samples": 0,
        "self": [],
        "inclusive": [],
        "in_every_sample": [],
    }
