"""What every engine worker script shares: its one JSON answer, its lifetime, page digests.

A worker is started by a test with one JSON argument, does its engine work, prints exactly
one line ``RESULT_PREFIX + json`` on stdout (engines log to stdout too, so the prefix tells
the answer apart), and then keeps its store, and so the segment it contributes, alive until
its stdin closes: a value written by one process lives in that process's segment, so a saver
must outlive the loads of another process.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

RESULT_PREFIX = "@@ENGINE-RESULT@@ "


def emit(result: dict[str, Any]) -> None:
    """Print the worker's one answer line."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()


def digest(ptrs: Sequence[int], sizes: Sequence[int]) -> str:
    """SHA-256 of the bytes at each (pointer, size), in order: one page of KV or a value."""
    hasher = hashlib.sha256()
    for ptr, size in zip(ptrs, sizes, strict=True):
        hasher.update(ctypes.string_at(ptr, size))
    return hasher.hexdigest()


def run(main: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Run ``main(args)`` with the JSON of ``argv[1]``, emit its answer (or the traceback of
    what it raised), then hold everything it built until stdin closes."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = json.loads(sys.argv[1])
    keep: dict[str, Any] = {}
    try:
        result = main({**args, "_keep": keep})
        emit({"ok": True, **result})
    except BaseException as exc:  # the test reports any failure, with its traceback
        emit({"ok": False, "error": repr(exc), "traceback": traceback.format_exc()})
    # Block until the test is done with this process's segment.
    sys.stdin.read()
    for closer in keep.get("closers", []):
        closer()
