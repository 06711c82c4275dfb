"""The dashboard of a store whose client has a disk tier (``enable_ssd_offload``), in headless
Chromium: the page's disk figures and segment tiers are the memory API's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import DashboardPage
from tests.browser.test_dashboard import assert_no_problems, open_dashboard, wait_for_fresh_poll
from tests.browser.world import DISK_QUOTA, MIB, World, running_world

STILL_TRIES = 20
WRITES = 12
"""1 MiB objects written into a 4 MiB segment: most of them spill to the disk tier."""


def settle(world: World) -> dict[str, int]:
    """Wait until no disk task is in flight (at most 30 s); the master's stats then."""
    deadline = time.monotonic() + 30
    while True:
        stats = world.master.service.stats()
        if stats["disk_tasks"] == 0 and stats["disk_deletes_pending"] == 0:
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.02)


@pytest.fixture
def disk_world(tmp_path: Path) -> Iterator[World]:
    """One client process with a 4 MiB segment and a disk tier, after spills."""
    with running_world(segment_bytes=4 * MIB, clients=1, disk_root=str(tmp_path)) as running:
        for index in range(WRITES):
            running.clients[0].put(f"page-{index}", MIB, f"conv-{index % 3}")
            settle(running)
        assert settle(running)["spilled_objects"] >= 1
        yield running
        running.master.service.check()


def test_the_disk_tier_is_shown_with_the_apis_figures(
    dashboard: DashboardPage, disk_world: World
) -> None:
    page = open_dashboard(dashboard, disk_world)
    # The master's background eviction may still spill after the writes: compare a poll drawn
    # while the store stood still.
    for _ in range(STILL_TRIES):
        before = settle(disk_world)
        wait_for_fresh_poll(page)
        stats = disk_world.get("/v1/memory/stats")
        segments = disk_world.get("/v1/memory/segments")["segments"]
        if disk_world.master.service.stats() == before:
            break
    else:
        raise AssertionError("the store never stood still for one poll")
    dashboard.screenshot("disk-tier")
    disk = stats["disk"]
    assert disk["segments"] == 1 and disk["capacity_bytes"] == DISK_QUOTA
    assert disk["used_bytes"] >= MIB and disk["spilled_objects"] >= 1

    def data(test_id: str, attribute: str) -> str:
        return page.get_attribute(f"[data-testid={test_id}]", f"data-{attribute}")

    assert data("stat-disk", "used") == str(disk["used_bytes"])
    assert data("stat-disk", "capacity") == str(disk["capacity_bytes"])
    used_mib = disk["used_bytes"] / MIB
    expected = f"{used_mib:.{2 if used_mib < 10 else 1}f} MiB / 256 MiB"
    assert page.text_content("[data-testid=stat-disk]") == expected
    detail = page.text_content("[data-testid=stat-disk-detail]") or ""
    assert f"{disk['spilled_objects']} spill" in detail
    # Memory stays memory: the headline's memory figure is the memory tier alone.
    assert data("stat-allocated", "capacity") == str(stats["memory"]["capacity_bytes"])
    assert stats["memory"]["capacity_bytes"] == 4 * MIB

    shown: list[dict[str, Any]] = page.eval_on_selector_all(
        "[data-testid=segment-row]", "rows => rows.map(r => ({...r.dataset}))"
    )
    assert [(s["tier"], int(s["usedBytes"]), int(s["capacityBytes"])) for s in shown] == [
        (s["tier"], s["used_bytes"], s["capacity_bytes"]) for s in segments
    ]
    assert sorted(s["tier"] for s in shown) == ["disk", "memory"]
    tags = page.eval_on_selector_all("[data-testid=segment-tier]", "t => t.map(n => n.textContent)")
    assert sorted(tags) == ["disk", "memory"]
    assert_no_problems(dashboard)


def test_a_store_without_a_disk_tier_says_so(dashboard: DashboardPage) -> None:
    with running_world(segment_bytes=4 * MIB, clients=1) as world:
        page = open_dashboard(dashboard, world)
        assert world.get("/v1/memory/stats")["disk"]["segments"] == 0
        assert page.text_content("[data-testid=stat-disk]") == "–"
        assert page.text_content("[data-testid=stat-disk-detail]") == "no disk tier"
        tags = page.eval_on_selector_all(
            "[data-testid=segment-tier]", "t => t.map(n => n.textContent)"
        )
        assert tags == ["memory"]
        assert_no_problems(dashboard)
