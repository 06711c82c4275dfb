"""Prints the fuzz tally (generated calls, findings) at the end of every run that fuzzed, and
keeps hypothesis's caches out of the repository."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from hypothesis import configuration

from tests.fuzz.common import TALLY

# Hypothesis caches (unicode tables, constants) under ./.hypothesis by default; nothing of it
# is worth keeping between runs (there is no example database: see common.fuzz_settings).
configuration.set_hypothesis_home_dir(
    os.path.join(tempfile.gettempdir(), f"mooncake-py-hypothesis-{os.getuid()}")
)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TALLY.total_calls():
        for line in TALLY.report():
            terminalreporter.write_line(line)
