"""Bulk removal of the master: remove by key pattern, remove everything of a tenant.

:class:`RemovalService` backs ``MasterService.remove_by_regex`` and
``MasterService.remove_all``; it depends only on the shared
:class:`~mooncake_py.master.service.context.ServiceContext`.

**Patterns** are RE2 syntax (the ``google-re2`` package), matched with *search* semantics as
upstream's ``std::regex_search``: a key is removed when the pattern matches anywhere in it
(anchor with ``^`` and ``$`` for whole keys). RE2 runs in time linear in the key's length
whatever the pattern, so no pattern can hold the master for long (Python's ``re`` backtracks:
``(a+)+$`` against a few dozen ``a`` and a ``!`` takes seconds). A pattern is refused
(INVALID_PARAMS) when it is longer than :data:`MAX_PATTERN_BYTES` UTF-8 bytes, does not
compile, needs features RE2 leaves out (backreferences such as ``\\1``, lookahead ``(?=``,
``(?!``, lookbehind ``(?<=``, ``(?<!``, possessive quantifiers), or would compile to a program
larger than :data:`PATTERN_MAX_MEM` (large counted repetitions; RE2 also refuses counts above
1000). Keys are matched as UTF-8; ``\\w``, ``\\d``, ``\\s`` and ``\\b`` are ASCII-only, as in
ECMAScript, and ``$`` matches only at the very end of the key.

**Slices.** Both calls walk a snapshot of the object table taken once (a copy of references,
with the lock held just for that copy), then handle it :data:`REMOVAL_SLICE` objects at a time:
keys are matched outside the lock (keys never change), and each slice's removals run under one
hold of the service lock, with expired read leases ended first (as every data-path call does).
Between slices the lock is free, so calls from other threads (gRPC calls dispatched off the
event loop, the metrics thread, tools) run in between; a bulk removal is therefore not one
transaction. The count returned is the number of objects removed: those that matched and were
removable when their slice ran. An object is judged by what is stored under its key when its
slice runs (removed meanwhile: skipped; re-put meanwhile: the new object is considered); keys
first written after the call took its snapshot are not seen. Objects being written (even with
``force``) and objects under a live read lease (without ``force``) are skipped silently.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

import re2

from mooncake_py.errors import ErrorCode

from ..state.objects import ObjectMetadata
from .context import ServiceContext

REMOVAL_SLICE = 1024
"""Objects handled per hold of the service lock by the bulk removals."""

MAX_PATTERN_BYTES = 4096
"""Longest accepted pattern, in UTF-8 bytes (the longest key is as long)."""

PATTERN_MAX_MEM = 8 << 20
"""RE2's memory budget per compiled pattern (program and DFA cache); a pattern whose program
does not fit is refused, a search whose DFA cache fills falls back to RE2's (still linear) NFA."""

KeyMatcher = Callable[[str], bool]


def compile_key_pattern(pattern: object) -> KeyMatcher | None:
    """The search predicate of ``pattern``, or None when it is refused (see the module).

    Complexity: O(len(pattern)) to compile; the predicate is O(len(key)).
    """
    if not isinstance(pattern, str):
        return None
    try:
        encoded = pattern.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return None
    if len(encoded) > MAX_PATTERN_BYTES:
        return None
    options = re2.Options()
    options.max_mem = PATTERN_MAX_MEM
    options.never_capture = True  # only "does it match" is asked
    options.log_errors = False
    try:
        compiled = re2.compile(encoded, options)
    except re2.error:
        return None
    finally:
        # re2.compile keeps the last 128 programs (each up to PATTERN_MAX_MEM once its DFA
        # has grown); the master compiles each pattern once per call, so keep none.
        re2.purge()
    search = compiled.search

    def matches(key: str) -> bool:
        # Bytes: no offset translation, and keys with lone surrogates still get an answer.
        return search(key.encode("utf-8", "surrogatepass")) is not None

    return matches


class RemovalService:
    """The bulk removals, in slices (see the module docstring).

    Args:
        context: the shared lock, state, clock and tenant rule.
        remove_locked: removes one object, the lock held: ``(tenant, key, force, now)`` to
            its per-key code (OK when removed).
        slice_size: objects per lock hold.

    Thread-safety: every method takes the context's lock, once for the snapshot and once per
    slice.
    """

    def __init__(
        self,
        context: ServiceContext,
        remove_locked: Callable[[str, str, bool, float], ErrorCode],
        slice_size: int = REMOVAL_SLICE,
    ) -> None:
        self._lock: threading.Lock = context.lock
        self._state = context.state
        self._clock = context.clock
        self._tenants = context.tenants
        self._remove_locked = remove_locked
        self.slice_size = slice_size
        self.slices_run = 0  # lock holds taken for slices, over this service's life (tests)

    def remove_by_regex(
        self, tenant: str, pattern: str, force: bool = False
    ) -> tuple[ErrorCode, int]:
        """Remove the tenant's keys the pattern matches anywhere in; see the module.

        Returns:
            (OK, count removed); (INVALID_PARAMS, 0) for a refused pattern or a bad tenant.

        Complexity: O(objects) for the snapshot plus O(total length of the tenant's keys)
        matching, in slices.
        """
        matches = compile_key_pattern(pattern)
        resolved = self._tenants.resolve(tenant)
        if matches is None or resolved is None:
            return ErrorCode.INVALID_PARAMS, 0
        return ErrorCode.OK, self._remove_sliced(self._snapshot(resolved), force, matches)

    def remove_all(self, tenant: str, force: bool = False) -> int:
        """Remove every removable object of the tenant; returns how many were removed.

        With multi-tenancy on, an empty ``tenant`` means every tenant (as upstream); a bad
        tenant id removes nothing.
        """
        everyone = self._tenants.multi_tenant and tenant == ""
        resolved = self._tenants.resolve(tenant)
        if resolved is None:
            return 0
        return self._remove_sliced(self._snapshot(None if everyone else resolved), force, None)

    def _snapshot(self, tenant: str | None) -> list[ObjectMetadata]:
        """The objects of ``tenant`` (None: of every tenant), now."""
        with self._lock:
            # One C-level copy of references: the lock is held O(objects) with a tiny
            # constant; the tenant filter runs after (an object's tenant and key never change).
            # References rather than ids: no allocation per object (nor collector work).
            every = list(self._state.objects)
        if tenant is None:
            return every
        return [m for m in every if m.tenant == tenant]

    def _remove_sliced(
        self, objects: Sequence[ObjectMetadata], force: bool, matches: KeyMatcher | None
    ) -> int:
        removed = 0
        for chunk in _slices(objects, self.slice_size):
            doomed = chunk if matches is None else [m for m in chunk if matches(m.key)]
            if not doomed:
                continue
            with self._lock:
                self.slices_run += 1
                now = self._clock()
                self._state.reads.expire_due(now)
                for meta in doomed:
                    # By id: what is stored under the key now (removed or re-put meanwhile).
                    if self._remove_locked(meta.tenant, meta.key, force, now) == ErrorCode.OK:
                        removed += 1
            # Give up the GIL for a moment, so a thread waiting for the lock takes it before
            # this one takes it again (the lock is not fair).
            time.sleep(0)
        return removed


def _slices(objects: Sequence[ObjectMetadata], size: int) -> Iterator[Sequence[ObjectMetadata]]:
    for start in range(0, len(objects), size):
        yield objects[start : start + size]
