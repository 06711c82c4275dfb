"""The disk-tier benchmark's plumbing: its read order, and one tiny run with real processes
(a master, a writer and a reader per mode) whose record holds every figure per mode."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.bench.disk_tier_bench import ROWS, main, markdown_table, zipf_order
from tests.bench.disk_tier_run import Mode


def test_zipf_order_is_seeded_and_skewed() -> None:
    order = zipf_order(200, 4000, 0.99, seed=3)
    assert order == zipf_order(200, 4000, 0.99, seed=3)
    assert order != zipf_order(200, 4000, 0.99, seed=4)
    assert all(0 <= key < 200 for key in order) and len(order) == 4000
    counts = Counter(order).most_common()
    # The hottest key is read far more than an even spread would (20 reads per key), and the
    # hottest keys are spread over the write order, not the first ones written.
    assert counts[0][1] > 5 * 20 and len(counts) > 100
    assert {key for key, _ in counts[:10]} != set(range(10))


def test_table_has_a_ratio_column_per_implementation_with_both_modes() -> None:
    figures: dict[str, float | None] = {name: 2.0 for name, _, _ in ROWS}
    table = markdown_table({Mode("py", False): figures, Mode("py", True): dict(figures)})
    assert "| py: tier / memory |" in table.splitlines()[0]
    assert "| hit rate (right value / reads) | 200.0% | 200.0% | x1.00 |" in table


def test_a_tiny_run_without_and_with_the_tier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record_path = tmp_path / "disk.json"
    args = ["--objects", "64", "--value-kib", "256", "--read-passes", "2", "--rounds", "1"]
    args += ["--no-upstream", "--work-dir", str(tmp_path / "work"), "--json", str(record_path)]
    assert main(args) == 0
    record = json.loads(record_path.read_text())
    assert record["upstream"].startswith("skipped")
    memory, tier = record["medians"]["py-memory"], record["medians"]["py-disk"]
    assert set(memory) == set(tier) >= {name for name, _, _ in ROWS}
    assert memory["wrong_values"] == tier["wrong_values"] == 0
    # A quarter of the working set in memory: without the tier most objects are lost...
    assert memory["evicted_objects"] > 0 and memory["spilled_objects"] == 0
    assert memory["hit_rate"] < 0.9 and memory["disk_hits_read"] == 0
    # ...with it they are spilled and read back from disk, every read right.
    assert tier["spilled_objects"] > 0 and tier["disk_hits_read"] > 0
    assert tier["disk_hits"] == tier["disk_hits_read"]  # every disk hit was one of our gets
    assert tier["hit_rate"] == 1.0 and tier["put_failures"] == 0
    assert tier["memory_hits"] + tier["disk_hits_read"] == 128
    assert tier["tier_file_mib"] > 0
    printed = capsys.readouterr().out
    assert "| py, memory only | py, disk tier | py: tier / memory |" in printed
