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

**Slices.** Both calls are sliced operations (:mod:`~mooncake_py.master.service.slices`):
they take a snapshot of the object table once (one C-level copy of references, O(objects)
with a tiny constant), then walk it for :data:`~mooncake_py.master.service.slices.SLICE_SECONDS`
at a time, each slice under one hold of the service lock with expired read leases ended first
(as every data-path call does). Other calls run between slices, so a bulk removal is not one
transaction. The count returned is the number of objects removed: those that matched and were
removable when their slice reached them. An object is judged by what is stored under its key
when its slice runs (removed meanwhile: skipped; re-put meanwhile: the new object is
considered); keys first written after the call took its snapshot are not seen. Objects being
written (even with ``force``) and objects under a live read lease (without ``force``) are
skipped silently.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import re2

from mooncake_py.errors import ErrorCode

from ..state.objects import ObjectMetadata, Replica
from .context import ServiceContext
from .plain_removal import plain_replica, remove_plain
from .slices import SLICE_SECONDS, SliceTimer, Steps, drive

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
        slice_seconds: how long one slice may hold the lock.

    Thread-safety: every method takes the context's lock, once for the snapshot and once per
    slice; the ``*_sliced`` generators yield between slices with the lock free.
    """

    def __init__(
        self,
        context: ServiceContext,
        remove_locked: Callable[[str, str, bool, float], ErrorCode],
        slice_seconds: float = SLICE_SECONDS,
    ) -> None:
        self._lock: threading.Lock = context.lock
        self._state = context.state
        self._clock = context.clock
        self._tenants = context.tenants
        self._remove_locked = remove_locked
        self.slice_seconds = slice_seconds
        self.slices_run = 0  # lock holds taken for slices, over this service's life (tests)

    def remove_by_regex(
        self, tenant: str, pattern: str, force: bool = False
    ) -> tuple[ErrorCode, int]:
        """:meth:`remove_by_regex_sliced`, every slice back to back."""
        return drive(self.remove_by_regex_sliced(tenant, pattern, force))

    def remove_by_regex_sliced(
        self, tenant: str, pattern: str, force: bool = False
    ) -> Steps[tuple[ErrorCode, int]]:
        """Remove the tenant's keys the pattern matches anywhere in; see the module.

        Returns:
            (OK, count removed); (INVALID_PARAMS, 0) for a refused pattern or a bad tenant
            (before any slice).

        Complexity: O(objects) for the snapshot plus O(total length of the tenant's keys)
        matching, in slices.
        """
        matches = compile_key_pattern(pattern)
        resolved = self._tenants.resolve(tenant)
        if matches is None or resolved is None:
            return ErrorCode.INVALID_PARAMS, 0
        removed = yield from self._remove_sliced(resolved, force, matches)
        return ErrorCode.OK, removed

    def remove_all(self, tenant: str, force: bool = False) -> int:
        """:meth:`remove_all_sliced`, every slice back to back."""
        return drive(self.remove_all_sliced(tenant, force))

    def remove_all_sliced(self, tenant: str, force: bool = False) -> Steps[int]:
        """Remove every removable object of the tenant; returns how many were removed.

        With multi-tenancy on, an empty ``tenant`` means every tenant (as upstream); a bad
        tenant id removes nothing.
        """
        everyone = self._tenants.multi_tenant and tenant == ""
        resolved = self._tenants.resolve(tenant)
        if resolved is None:
            return 0
        return (yield from self._remove_sliced(None if everyone else resolved, force, None))

    def _remove_sliced(
        self, tenant: str | None, force: bool, matches: KeyMatcher | None
    ) -> Steps[int]:
        """Walk a snapshot of the objects of ``tenant`` (None: every tenant) in slices,
        removing those ``matches`` accepts (None: all)."""
        with self._lock:
            # References rather than ids: no allocation per object (nor collector work). An
            # object's tenant and key never change, so the walk may read them unlocked.
            objects: Sequence[ObjectMetadata] = self._state.objects.snapshot()
        removed = 0
        position = 0
        total = len(objects)
        timer = SliceTimer(self.slice_seconds)
        state = self._state
        get = state.objects.get
        while position < total:
            with self._lock:
                self.slices_run += 1
                now = self._clock()
                state.reads.expire_due(now)
                # The slice's plain objects go together at its end (see plain_removal).
                plain: list[ObjectMetadata] = []
                replicas: list[Replica] = []
                while position < total:
                    meta = objects[position]
                    position += 1
                    if (tenant is None or meta.tenant == tenant) and (
                        matches is None or matches(meta.key)
                    ):
                        # By id: what is stored under the key now (removed or re-put meanwhile).
                        current = get((meta.tenant, meta.key))
                        replica = None if current is None else plain_replica(state, current)
                        if current is not None and replica is not None:
                            plain.append(current)
                            replicas.append(replica)
                        else:
                            code = self._remove_locked(meta.tenant, meta.key, force, now)
                            removed += code == ErrorCode.OK
                    if timer.spent():
                        break
                remove_plain(state, plain, replicas)
                removed += len(plain)
            if position < total:
                yield
                timer.restart()
        return removed
