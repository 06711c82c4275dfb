"""Which Chromium to drive and how: Debian's binary, with the flags an offline machine needs.

Shared by the browser tests (``conftest.py``) and ``python -m tests.browser.screenshot``.
"""

from __future__ import annotations

import os
import shutil

# The machine (and CI) has no network: without these flags Chromium keeps dialling out for
# updates, sync and QUIC probes, and fills the log with refused connections.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    """The Chromium binary to drive: ``$MOONCAKE_PY_CHROMIUM``, /usr/bin/chromium, or the one on
    PATH ("" when none is found)."""
    named = os.environ.get("MOONCAKE_PY_CHROMIUM", "")
    if named:
        return named if os.access(named, os.X_OK) else ""
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    return shutil.which("chromium") or shutil.which("chromium-browser") or ""


def missing_browser_reason() -> str:
    """Why the browser cannot be driven here ("" when it can)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright)"
    if not chromium_path():
        return "no Chromium binary (apt-get install chromium, or set MOONCAKE_PY_CHROMIUM)"
    return ""
