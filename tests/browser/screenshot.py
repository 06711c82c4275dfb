"""Make ``docs/dashboard.png``: the dashboard at 1280 x 900 over a store with history.

Starts its own master (in this process, occupancy sampled every quarter second) and two client
processes, writes a few minutes' worth of conversations in a few seconds (some sharing a
prompt prefix, one pinned, one released on the way so the chart falls as well as rises), then
photographs the page in headless Chromium sorted by bytes.

Run: ``.venv/bin/python -m tests.browser.screenshot [--out PATH]`` from the repository root.
Exits 2 when Playwright or Chromium is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

from tests.browser.chromium import CHROMIUM_ARGS, chromium_path, missing_browser_reason
from tests.browser.world import MIB, REPO_ROOT, World, running_world

# (session, its private pages in MiB); "system-prompt" is shared by every chat-* session.
CONVERSATIONS = (
    ("chat-0e41", 6),
    ("chat-2b7c", 3),
    ("chat-5d19", 9),
    ("chat-8a02", 2),
    ("agent-run-17", 12),
    ("chat-c3f6", 4),
    ("batch-eval-3", 7),
)
PINNED = ("agent-run-17",)
RELEASED_ON_THE_WAY = "batch-eval-3"


def post(world: World, path: str, body: dict[str, object]) -> object:
    """POST ``body`` as JSON to a memory API path; returns the parsed answer."""
    request = urllib.request.Request(
        world.base_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def fill(world: World) -> None:
    """Write the conversations page by page, pausing so the master samples the climb."""
    writers = world.clients
    writers[0].put("system-prompt", 2 * MIB, *(name for name, _ in CONVERSATIONS[:4]))
    for index, (session, mib) in enumerate(CONVERSATIONS):
        writer = writers[index % len(writers)]
        for page in range(mib):
            writer.put(f"{session}/page-{page}", MIB, session)
        time.sleep(0.4)
        if session == RELEASED_ON_THE_WAY:
            post(world, "/v1/memory/release_session", {"session_id": session})
            time.sleep(0.6)
    for session in PINNED:
        writers[0].call("pin", session_id=session)
    # A late turn of an old conversation: its idle time resets, the others keep ageing.
    writers[1].put("chat-2b7c/page-3", MIB, "chat-2b7c")
    time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "dashboard.png")
    args = parser.parse_args(argv)
    reason = missing_browser_reason()
    if reason:
        print(f"cannot take the screenshot: {reason}", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    with running_world(segment_bytes=40 * MIB, occupancy_sample_sec=0.25) as world:
        fill(world)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=chromium_path(), args=CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(world.base_url + "/")
            page.wait_for_function("() => Number(document.body.dataset.refreshes || 0) >= 1")
            page.click("[data-testid=sort-bytes]")
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out))
            browser.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
