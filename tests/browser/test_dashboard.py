"""The operator's dashboard at ``/`` in headless Chromium, against a real master in this process
and real client processes that write session-tagged objects into two segments.

Every figure the page shows is compared with what the memory API answers the test directly
(urllib), and every release made by clicking is checked against the store's allocated bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import DashboardPage
from tests.browser.world import MIB, PINNED, World, running_world, write_sessions

TOKEN_KEY = "mooncake-py.dashboard.token"
ROWS = "[data-testid=session-row]"
# Short polls keep the tests quick.
PAGE = "/?refresh=400"


@pytest.fixture
def world() -> Iterator[World]:
    """Two client processes, two 32 MiB segments, five sessions (one pinned, two sharing)."""
    with running_world() as running:
        write_sessions(running)
        yield running


def refreshes(page: Any) -> int:
    """How many polls the page has drawn."""
    return int(page.evaluate("() => Number(document.body.dataset.refreshes || 0)"))


def wait_for_fresh_poll(page: Any) -> None:
    """Return once the page has drawn a poll that started after this call."""
    # The poll under way may have read the API before the caller's change: wait for two.
    seen = refreshes(page)
    page.wait_for_function("n => Number(document.body.dataset.refreshes || 0) >= n", arg=seen + 2)


def open_dashboard(dashboard: DashboardPage, world: World, path: str = PAGE) -> Any:
    """Load the dashboard of ``world`` and return its page once a first poll is drawn."""
    page = dashboard.page
    page.goto(world.base_url + path)
    page.wait_for_function("() => Number(document.body.dataset.refreshes || 0) >= 1")
    return page


def table_rows(page: Any) -> list[dict[str, str]]:
    """The sessions table's rows in display order, as their data attributes (one read, so a
    poll cannot interleave)."""
    return page.eval_on_selector_all(ROWS, "rows => rows.map(r => ({...r.dataset}))")


def assert_no_problems(dashboard: DashboardPage) -> None:
    """No console error, uncaught exception or failed request so far."""
    problems = dashboard.problems
    assert problems.console_errors == []
    assert problems.page_errors == []
    assert problems.failed_requests == []


def test_page_loads_clean_and_shows_the_apis_figures(
    dashboard: DashboardPage, world: World
) -> None:
    page = open_dashboard(dashboard, world)
    dashboard.screenshot("loaded")
    stats = world.get("/v1/memory/stats")
    assert stats["sessions"] == 5 and stats["pinned_sessions"] == 1  # the world as written

    def value(test_id: str, attribute: str = "value") -> str:
        return page.get_attribute(f"[data-testid={test_id}]", f"data-{attribute}")

    assert value("stat-objects") == str(stats["objects"])
    assert value("stat-sessions") == str(stats["sessions"])
    assert value("stat-pinned") == str(stats["pinned_sessions"])
    assert value("stat-kv-state") == stats["kv_cache_state"] == "awake"
    assert value("stat-allocated", "allocated") == str(stats["allocated_bytes"])
    assert value("stat-allocated", "capacity") == str(stats["capacity_bytes"]) == str(64 * MIB)
    assert page.text_content("[data-testid=stat-allocated]") == "13.8 MiB / 64.0 MiB"
    assert page.text_content("[data-testid=view-label]") == "global view"
    assert "every 0.4 s" in (page.text_content("[data-testid=updated-at]") or "")  # ?refresh=400

    segments = world.get("/v1/memory/segments")["segments"]
    shown_segments = page.eval_on_selector_all(
        "[data-testid=segment-row]", "rows => rows.map(r => ({...r.dataset}))"
    )
    assert len(shown_segments) == 2
    assert [
        (s["segmentName"], int(s["usedBytes"]), int(s["capacityBytes"])) for s in shown_segments
    ] == [(s["name"], s["used_bytes"], s["capacity_bytes"]) for s in segments]

    api_sessions = world.all_sessions()
    assert [
        (r["sessionId"], r["pinned"], int(r["bytes"]), int(r["exclusiveBytes"]))
        for r in table_rows(page)
    ] == [
        (s["session_id"], json.dumps(s["pinned"]), s["pages_bytes"], s["exclusive_bytes"])
        for s in api_sessions
    ]
    alpha = page.locator('tr[data-session-id="conv-alpha"] [data-testid=cell-bytes]')
    assert alpha.text_content() == "4.00 MiB"
    assert alpha.get_attribute("title") == f"{4 * MIB:,} bytes"
    exclusive = page.locator('tr[data-session-id="conv-alpha"] [data-testid=cell-exclusive]')
    assert exclusive.text_content() == "3.00 MiB"

    chart = page.locator("[data-testid=occupancy-chart]")
    assert int(chart.get_attribute("data-samples") or 0) >= 1
    assert page.locator("[data-testid=line-allocated]").count() == 1
    wait_for_fresh_poll(page)  # a few polls in, still nothing went wrong
    assert_no_problems(dashboard)


@pytest.mark.parametrize(
    ("header", "attribute", "api_field"),
    [
        ("sort-bytes", "bytes", "pages_bytes"),
        ("sort-exclusive", "exclusiveBytes", "exclusive_bytes"),
        ("sort-idle", "idleMs", "idle_ms"),
    ],
)
def test_sessions_sort_by_clicked_column_both_ways(
    dashboard: DashboardPage, world: World, header: str, attribute: str, api_field: str
) -> None:
    page = open_dashboard(dashboard, world)
    api_sessions = world.all_sessions()
    # Idle times all grow at the same pace, so their order now is their order at any poll.
    descending = [
        s["session_id"]
        for s in sorted(api_sessions, key=lambda s: (-s[api_field], s["session_id"]))
    ]
    assert len(set(s[api_field] for s in api_sessions)) == 5  # no ties: the order is the test
    heading = page.locator(f"[data-testid={header}]")

    heading.click()
    rows = table_rows(page)
    assert [r["sessionId"] for r in rows] == descending
    values = [int(r[attribute]) for r in rows]
    assert values == sorted(values, reverse=True)
    assert heading.locator(".arrow").text_content() == "▼"
    assert heading.get_attribute("aria-sort") == "descending"
    dashboard.screenshot("descending")

    heading.click()
    rows = table_rows(page)
    assert [r["sessionId"] for r in rows] == descending[::-1]
    assert heading.locator(".arrow").text_content() == "▲"
    wait_for_fresh_poll(page)  # a poll redraws in the chosen order
    assert [r["sessionId"] for r in table_rows(page)] == descending[::-1]
    dashboard.screenshot("ascending")
    assert_no_problems(dashboard)


def test_a_short_table_shows_the_masters_top_sessions_of_all(
    dashboard: DashboardPage, world: World
) -> None:
    # Two rows for five sessions: sorted, they are the two largest of all five, ranked by
    # the master (not the two the page happened to load), and the totals count all five.
    page = open_dashboard(dashboard, world, "/?refresh=400&page_size=2")
    api_sessions = world.all_sessions()
    largest = [
        s["session_id"]
        for s in sorted(api_sessions, key=lambda s: (-s["exclusive_bytes"], s["session_id"]))
    ][:2]
    page.locator("[data-testid=sort-exclusive]").click()
    wait_for_fresh_poll(page)
    assert [r["sessionId"] for r in table_rows(page)] == largest
    assert (page.text_content("#sessions-count") or "").startswith("2 shown of 5")
    page.click("[data-testid=filter-pinned]")
    wait_for_fresh_poll(page)
    assert [r["sessionId"] for r in table_rows(page)] == [PINNED]
    assert_no_problems(dashboard)


def test_filters_show_pinned_and_unpinned_sessions(dashboard: DashboardPage, world: World) -> None:
    # The filter goes to the master (its ranking covers every session): each change shows
    # once the poll it starts is drawn.
    page = open_dashboard(dashboard, world)
    page.click("[data-testid=filter-pinned]")
    wait_for_fresh_poll(page)
    assert [r["sessionId"] for r in table_rows(page)] == [PINNED]
    dashboard.screenshot("pinned")
    page.click("[data-testid=filter-unpinned]")
    wait_for_fresh_poll(page)
    unpinned = [r["sessionId"] for r in table_rows(page)]
    assert unpinned == ["conv-alpha", "conv-beta", "conv-delta", "conv-epsilon"]
    assert all(r["pinned"] == "false" for r in table_rows(page))
    # Filters and sorting compose; the keyboard sorts too (the header holds a button).
    page.focus("[data-testid=sort-exclusive] button")
    page.keyboard.press("Enter")
    assert [r["sessionId"] for r in table_rows(page)] == [
        "conv-delta",
        "conv-alpha",
        "conv-beta",
        "conv-epsilon",
    ]
    page.click("[data-testid=filter-all]")
    wait_for_fresh_poll(page)
    assert len(table_rows(page)) == 5
    assert table_rows(page)[0]["sessionId"] == "conv-delta"
    assert_no_problems(dashboard)


def test_session_ids_are_shown_as_text_never_as_markup(dashboard: DashboardPage) -> None:
    hostile = '<img src="/nowhere" onerror="document.title=\'owned\'">&amp;'
    with running_world(clients=1) as world:
        world.clients[0].put("page-0", MIB, hostile)
        page = open_dashboard(dashboard, world)
        row = page.locator("[data-testid=session-row]")
        assert row.get_attribute("data-session-id") == hostile
        assert row.locator("td.session-id").text_content() == hostile
        assert page.locator("[data-testid=sessions-table] img").count() == 0
        page.click("[data-testid=release-button]")
        assert page.text_content("[data-testid=confirm-session-id]") == hostile
        page.click("[data-testid=confirm-cancel]")
        assert page.title() == "mooncake-py store"
        dashboard.screenshot("hostile-id")
        assert_no_problems(dashboard)


def allocated(world: World) -> int:
    """The store's allocated bytes, as the memory API reports them now."""
    return int(world.get("/v1/memory/stats")["allocated_bytes"])


def test_release_from_the_dashboard_frees_exactly_the_sessions_exclusive_bytes(
    dashboard: DashboardPage, world: World
) -> None:
    page = open_dashboard(dashboard, world)
    alpha = {s["session_id"]: s for s in world.all_sessions()}["conv-alpha"]
    assert (alpha["pages_bytes"], alpha["exclusive_bytes"]) == (4 * MIB, 3 * MIB)  # shares 1 MiB
    before = allocated(world)

    # Cancelling the dialog releases nothing.
    page.click('tr[data-session-id="conv-delta"] [data-testid=release-button]')
    page.wait_for_selector("#confirm-dialog[open]")
    page.click("[data-testid=confirm-cancel]")
    page.wait_for_selector("#confirm-dialog", state="hidden")
    assert allocated(world) == before

    page.click('tr[data-session-id="conv-alpha"] [data-testid=release-button]')
    page.wait_for_selector("#confirm-dialog[open]")
    shown = page.locator("[data-testid=confirm-exclusive-bytes]")
    assert shown.get_attribute("data-bytes") == str(3 * MIB)
    assert shown.text_content() == "3.00 MiB"
    assert page.text_content("[data-testid=confirm-session-id]") == "conv-alpha"
    dashboard.screenshot("confirm")
    page.click("[data-testid=confirm-ok]")

    page.wait_for_selector("[data-testid=status-line][data-freed-bytes]")
    freed = int(page.get_attribute("[data-testid=status-line]", "data-freed-bytes") or -1)
    page.wait_for_selector('tr[data-session-id="conv-alpha"]', state="detached")
    after = allocated(world)
    assert before - after == freed == alpha["exclusive_bytes"]
    assert "freed 3.00 MiB" in (page.text_content("[data-testid=status-line]") or "")
    # The prefix alpha shared now belongs to beta alone.
    beta = page.locator('tr[data-session-id="conv-beta"]')
    page.wait_for_function(
        "() => document.querySelector('tr[data-session-id=\"conv-beta\"]')"
        f".dataset.exclusiveBytes === '{3 * MIB}'"
    )
    assert beta.get_attribute("data-bytes") == str(3 * MIB)
    assert page.get_attribute("[data-testid=stat-sessions]", "data-value") == "4"
    dashboard.screenshot("released")
    assert_no_problems(dashboard)


def test_release_stale_all_and_kv_cache_from_the_dashboard(
    dashboard: DashboardPage, world: World
) -> None:
    page = open_dashboard(dashboard, world)
    before = allocated(world)

    # Stale after 0 minutes is every session; the pinned one stays unless included.
    page.click("[data-testid=release-stale]")
    page.wait_for_selector("#confirm-dialog[open]")
    page.fill("[data-testid=confirm-number]", "0")
    dashboard.screenshot("stale-dialog")
    page.click("[data-testid=confirm-ok]")
    page.wait_for_selector("[data-testid=status-line][data-freed-bytes]")
    freed = int(page.get_attribute("[data-testid=status-line]", "data-freed-bytes") or -1)
    assert freed == before - allocated(world) == 11 * MIB + MIB // 4
    page.wait_for_function(f"() => document.querySelectorAll('{ROWS}').length === 1")
    assert [r["sessionId"] for r in table_rows(page)] == [PINNED]

    # Release all needs its box ticked before it can run.
    page.click("[data-testid=release-all]")
    page.wait_for_selector("#confirm-dialog[open]")
    assert page.is_disabled("[data-testid=confirm-ok]")
    page.check("[data-testid=confirm-check]")
    assert page.is_enabled("[data-testid=confirm-ok]")
    page.click("[data-testid=confirm-ok]")
    page.wait_for_function(f"() => document.querySelectorAll('{ROWS}').length === 0")
    page.wait_for_selector("[data-testid=status-line][data-freed-bytes='2621440']")
    assert allocated(world) == before - freed - 2621440 == 0  # the pinned 2.5 MiB went too
    assert page.is_visible("[data-testid=sessions-empty]")

    # Objects outside any session are KV cache too; releasing it sends the tenant to sleep.
    world.clients[0].put("loose-0", MIB, *())
    page.click("[data-testid=release-kv]")
    page.wait_for_selector("#confirm-dialog[open]")
    page.click("[data-testid=confirm-ok]")
    page.wait_for_selector(f"[data-testid=status-line][data-freed-bytes='{MIB}']")
    assert allocated(world) == 0
    page.wait_for_function(
        "() => document.querySelector('[data-testid=stat-kv-state]').dataset.value"
        " === 'kv_cache_released'"
    )
    assert world.get("/v1/memory/stats")["kv_cache_state"] == "kv_cache_released"
    dashboard.screenshot("all-released")
    assert_no_problems(dashboard)


def test_with_tokens_the_page_asks_for_one_and_then_shows_its_tenant(
    dashboard: DashboardPage, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"token-a": "tenant-a", "token-b": "tenant-b"}))
    with running_world(tokens_file=str(tokens), token="token-a") as world:
        write_sessions(world)
        page = dashboard.page
        page.goto(world.base_url + PAGE)
        page.wait_for_selector("#token-dialog[open]")
        dashboard.screenshot("asked")
        assert page.locator(ROWS).count() == 0  # nothing shown without a token

        page.fill("[data-testid=token-input]", "not-a-token")
        page.click("[data-testid=token-submit]")
        page.wait_for_function(
            "() => document.querySelector('#token-dialog').open && document.querySelector("
            "'[data-testid=token-message]').textContent.includes('not accept')"
        )
        page.fill("[data-testid=token-input]", "token-a")
        page.click("[data-testid=token-submit]")
        page.wait_for_function("() => Number(document.body.dataset.refreshes || 0) >= 1")
        assert not page.is_visible("#token-dialog")
        assert page.evaluate("key => sessionStorage.getItem(key)", TOKEN_KEY) == "token-a"

        stats = world.get("/v1/memory/stats")
        assert stats["view"] == "tenant"
        assert page.text_content("[data-testid=view-label]") == "tenant view"
        assert page.get_attribute("[data-testid=stat-sessions]", "data-value") == "5"
        assert page.get_attribute("[data-testid=stat-pinned]", "data-value") == str(
            stats["pinned_sessions"]
        )
        assert page.get_attribute("[data-testid=stat-objects]", "data-value") == str(
            stats["objects"]
        )
        assert [r["sessionId"] for r in table_rows(page)] == [
            s["session_id"] for s in world.all_sessions()
        ]
        # A tenant has no server history: the page draws the samples it polled itself.
        page.wait_for_function(
            "() => Number(document.querySelector('#occupancy-chart').dataset.samples) >= 2"
        )
        dashboard.screenshot("tenant-view")

        # The token lasts for the tab: a reload goes straight to the figures.
        page.reload()
        page.wait_for_function("() => Number(document.body.dataset.refreshes || 0) >= 1")
        assert not page.is_visible("#token-dialog")
        assert page.locator(ROWS).count() == 5

        problems = dashboard.problems
        # The two unauthenticated rounds log their 401s; nothing else may go wrong.
        assert problems.console_errors
        assert all("401" in text for text in problems.console_errors), problems.console_errors
        assert problems.page_errors == [] and problems.failed_requests == []
