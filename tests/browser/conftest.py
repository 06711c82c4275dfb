"""Headless Chromium for the dashboard tests, through Playwright.

The module skips (with the reason) when Playwright or Chromium is missing, unless
``MOONCAKE_PY_REQUIRE_BROWSER=1`` (set by CI, which installs both): then it fails instead.
``MOONCAKE_PY_CHROMIUM`` names another Chromium binary (default ``/usr/bin/chromium``).
Screenshots of each step go to ``tests/browser/artifacts/``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.browser.chromium import CHROMIUM_ARGS, chromium_path, missing_browser_reason

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def require_browser() -> None:
    """Skip the calling test, or fail it when ``MOONCAKE_PY_REQUIRE_BROWSER=1``, if the browser
    tests cannot run here."""
    reason = missing_browser_reason()
    if not reason:
        return
    if os.environ.get("MOONCAKE_PY_REQUIRE_BROWSER") == "1":
        pytest.fail(f"MOONCAKE_PY_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per test module.

    Not per session: while Playwright's sync API is open, its event loop counts as running in
    this thread, and tests elsewhere that run an asyncio loop of their own would fail."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@dataclass
class PageProblems:
    """What went wrong in a page: console errors, uncaught exceptions, failed requests."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)


@dataclass
class DashboardPage:
    """A fresh browser context and page, with its problems collected and a screenshot helper.

    Attributes:
        page: the Playwright page (1280 x 900).
        problems: what the page reported so far.
        name: the test's name, prefixing its screenshots.
    """

    page: Any
    problems: PageProblems
    name: str
    shots: int = 0

    def screenshot(self, step: str) -> Path:
        """Save the page as ``artifacts/<test>-<n>-<step>.png``; returns the path."""
        self.shots += 1
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{self.name}-{self.shots:02d}-{step}.png"
        self.page.screenshot(path=str(path))
        return path


@pytest.fixture
def dashboard(browser: Any, request: pytest.FixtureRequest) -> Iterator[DashboardPage]:
    """A page in its own context (its own sessionStorage), closed after the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    problems = PageProblems()

    def on_console(message: Any) -> None:
        if message.type == "error":
            problems.console_errors.append(message.text)

    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.page_errors.append(str(error)))
    page.on(
        "requestfailed",
        lambda failed: problems.failed_requests.append(f"{failed.url}: {failed.failure}"),
    )
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    try:
        yield DashboardPage(page, problems, name)
    finally:
        context.close()
