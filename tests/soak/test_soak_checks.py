"""The soak's own checks: a wrong read is always detected, and the verdict fails on it and on
RSS growth after warm-up (the soak itself runs with ``make soak``)."""

from __future__ import annotations

import random

from tests.soak.run import MIB, rss_summary, verdict
from tests.soak.worker import check_value, make_value


def test_a_value_passes_only_for_its_own_key_and_whole() -> None:
    rng = random.Random(5)
    value = make_value("w0/1", rng)
    assert check_value("w0/1", value) is None
    assert check_value("w0/2", value) is not None  # another key's complete value
    flipped = bytearray(value)
    flipped[len(value) // 2] ^= 1
    assert check_value("w0/1", bytes(flipped)) is not None  # torn or overwritten
    assert check_value("w0/1", value[:-1]) is not None
    assert check_value("w0/1", b"") is not None


def test_the_verdict_fails_on_wrong_reads_and_on_rss_growth() -> None:
    flat = [(float(t), 100 * MIB) for t in range(0, 120, 2)]
    growing = [(float(t), (100 + t) * MIB) for t in range(0, 120, 2)]
    assert rss_summary(flat, 30.0)["growth_mib"] == 0
    assert rss_summary(growing, 30.0)["growth_mib"] > 64
    report = {
        "wrong_reads": 0,
        "crashed_clients": [],
        "exceptions": {},
        "master_error_lines": 0,
        "master_alive_at_end": True,
        "master_rss": rss_summary(flat, 30.0),
        "rss_bound_mib": 64.0,
    }
    assert verdict(report) == []
    assert verdict({**report, "wrong_reads": 1}) == ["1 wrong reads"]
    assert "grew" in verdict({**report, "master_rss": rss_summary(growing, 30.0)})[0]
