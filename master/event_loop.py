"""The master's event loop: uvloop's when it is installed, else asyncio's own.

The master spends a large part of every small call in the event loop itself (waiting for
sockets, running the protocol callbacks, writing answers). uvloop runs the same asyncio
programs on libuv, with those parts compiled: a call costs the master's process about a third
of the loop's CPU time that the standard loop takes. Nothing in the master depends on which
loop runs it; ``MOONCAKE_PY_EVENT_LOOP=asyncio`` selects the standard loop (to compare the two,
or where uvloop misbehaves), ``uvloop`` requires uvloop (an error when it is missing).

Thread-safety: the functions only create loops; each loop is then used as asyncio's rules say.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

LOOP_ENV = "MOONCAKE_PY_EVENT_LOOP"
"""Environment variable choosing the loop: ``uvloop``, ``asyncio`` or unset (uvloop if
installed)."""


def loop_kind() -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop :func:`new_event_loop` makes.

    Raises:
        ValueError: ``MOONCAKE_PY_EVENT_LOOP`` names another loop, or asks for uvloop where it
            is not installed.
    """
    wanted = os.environ.get(LOOP_ENV, "").strip().lower()
    if wanted not in ("", "uvloop", "asyncio"):
        raise ValueError(f"{LOOP_ENV}={wanted!r}: expected 'uvloop' or 'asyncio'")
    if wanted == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if wanted == "uvloop":
            raise ValueError(f"{LOOP_ENV}=uvloop but uvloop is not installed") from None
        return "asyncio"
    return "uvloop"


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop of the kind :func:`loop_kind` names (not set as the current loop).

    Raises:
        ValueError: as :func:`loop_kind`.
    """
    if loop_kind() == "uvloop":
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        return loop
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """:func:`asyncio.run` of ``main`` on a loop from :func:`new_event_loop`.

    Raises:
        ValueError: as :func:`loop_kind`; whatever ``main`` raises.
    """
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(main)
    # Python 3.10: asyncio.run (with its clean-up of tasks and generators) under a policy.
    if loop_kind() == "uvloop":  # pragma: no cover - Python 3.10
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return asyncio.run(main)  # pragma: no cover - Python 3.10
