"""What the fuzz suites share: run size, hypothesis settings, the tally of calls and findings,
and a watcher of exceptions escaping the master's RPC handlers.

Run size: ``MOONCAKE_PY_FUZZ_EXAMPLES`` (unset or 0: the small default of each test, run with
``derandomize=True`` so every run generates the same inputs) gives each fuzz test that many
hypothesis examples; ``MOONCAKE_PY_FUZZ_SEED`` then picks the random stream (default 0), so a
large run is reproducible from the seed it prints.

Findings are recorded, not raised, so one run counts every distinct failure instead of
stopping at the first: each has a *signature* (where it happened and what escaped), the first
example that produced it and its traceback. A test ends by asserting that no finding outside
:data:`KNOWN_BUGS` was recorded; a known bug gets its own ``xfail(strict=True)`` reproducer, so
the suite goes red both when a new bug appears and when a known one is fixed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, seed, settings

EXAMPLES = int(os.environ.get("MOONCAKE_PY_FUZZ_EXAMPLES", "0") or 0)
SEED = int(os.environ.get("MOONCAKE_PY_FUZZ_SEED", "0") or 0)
LARGE = EXAMPLES > 0

# Signature fragment -> the bug it names. Findings whose signature contains one of these are
# expected (their reproducers are xfail(strict=True) tests) and do not fail the suite.
KNOWN_BUGS: dict[str, str] = {}

F = TypeVar("F", bound=Callable[..., Any])


def fuzz_settings(default_examples: int) -> Callable[[F], F]:
    """Decorator: hypothesis settings for one fuzz test.

    ``default_examples`` examples, derandomized, in the default run; ``EXAMPLES`` examples
    from seed ``SEED`` in a large run. No deadline (a call's time depends on the machine), no
    example database (runs leave no files behind), no shrinking (findings are recorded, not
    raised, so there is nothing to shrink).
    """
    chosen = settings(
        max_examples=EXAMPLES if LARGE else default_examples,
        derandomize=not LARGE,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )

    def apply(test: F) -> F:
        wrapped: F = chosen(test)
        if LARGE:
            wrapped = seed(SEED)(wrapped)
        return wrapped

    return apply


@dataclasses.dataclass
class Finding:
    """One distinct failure: its signature, how often it happened, the first example."""

    signature: str
    example: str
    detail: str
    count: int = 1


class Tally:
    """Generated calls and findings of every suite in this process. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: dict[str, int] = {}
        self.findings: dict[str, Finding] = {}

    def count(self, suite: str, calls: int = 1) -> None:
        """Add ``calls`` generated calls to ``suite``."""
        with self._lock:
            self.calls[suite] = self.calls.get(suite, 0) + calls

    def record(self, signature: str, example: str, detail: str) -> None:
        """Record one failure; the first example of a signature is kept."""
        with self._lock:
            found = self.findings.get(signature)
            if found is None:
                self.findings[signature] = Finding(signature, example[:2000], detail[-4000:])
            else:
                found.count += 1

    def unexpected(self, prefix: str = "") -> list[Finding]:
        """Findings whose signature starts with ``prefix`` and names no known bug."""
        with self._lock:
            return [
                f
                for s, f in self.findings.items()
                if s.startswith(prefix) and not any(k in s for k in KNOWN_BUGS)
            ]

    def total_calls(self) -> int:
        with self._lock:
            return sum(self.calls.values())

    def report(self) -> list[str]:
        """Lines for the end of a run: calls per suite, then every finding."""
        new = len(self.unexpected())
        run = f"seed {SEED}, {EXAMPLES} examples per test" if LARGE else "default run"
        lines = [
            f"fuzz ({run}): {self.total_calls()} generated calls, "
            f"{len(self.findings)} findings ({new} not known)"
        ]
        lines += [f"  {suite}: {n} calls" for suite, n in sorted(self.calls.items())]
        for f in self.findings.values():
            known = next((r for k, r in KNOWN_BUGS.items() if k in f.signature), None)
            lines.append(
                f"  finding x{f.count}: {f.signature}" + (f" (known: {known})" * bool(known))
            )
            lines.append(f"    first example: {f.example}")
        return lines


TALLY = Tally()


def assert_no_unexpected(prefix: str) -> None:
    """Fail with every unexpected finding of ``prefix``: signature, example and traceback."""
    found = TALLY.unexpected(prefix)
    if found:
        text = "\n\n".join(
            f"{f.signature} (x{f.count})\nexample: {f.example}\n{f.detail}" for f in found
        )
        raise AssertionError(f"{len(found)} finding(s):\n{text}")


def describe_exception(exc: BaseException) -> tuple[str, str]:
    """``(type and innermost frame, formatted traceback)`` of ``exc``: the frame makes two
    exceptions of one type raised in different places different findings."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].name}" if frames else "?"
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{type(exc).__name__}@{where}", text


class HandlerExceptions(logging.Handler):
    """Collects the exceptions the master's call pipeline logs when a handler raised (each
    one is an RPC answered INTERNAL_ERROR). Attach with :func:`watch_master_exceptions`."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self._lock_records = threading.Lock()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            with self._lock_records:
                self.records.append(record)

    def take(self) -> list[tuple[str, str]]:
        """``(signature, traceback)`` of each exception since the last call, and forget them."""
        with self._lock_records:
            records, self.records = self.records, []
        taken = []
        for record in records:
            assert record.exc_info is not None and record.exc_info[1] is not None
            where, text = describe_exception(record.exc_info[1])
            taken.append((f"{record.getMessage()}: {where}", text))
        return taken


PIPELINE_LOGGER = "mooncake_py.master.transport.pipeline"


@contextlib.contextmanager
def watch_master_exceptions() -> Iterator[HandlerExceptions]:
    """Attach a :class:`HandlerExceptions` to the call pipeline's logger (that of every master
    in this process) for the duration of the ``with`` block, then detach it."""
    handler = HandlerExceptions()
    logger = logging.getLogger(PIPELINE_LOGGER)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
