"""Bulk removal (remove_by_regex, remove_all): RE2 search semantics, refused patterns, linear
time on pathological patterns, and the slices (lock free between them, leases expired per
slice, what a slice sees of changes made meanwhile). Pure logic on a FakeClock.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from mooncake_py.errors import ErrorCode
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.service.removal import MAX_PATTERN_BYTES, compile_key_pattern
from mooncake_py.master.service.slices import Steps, drive
from mooncake_py.master.state.objects import MAX_KEY_BYTES
from tests.unit.test_service import make_service, mount, put, start

T = TypeVar("T")
OK = ErrorCode.OK
BAD = ErrorCode.INVALID_PARAMS


def filled(keys: list[str], **overrides: object) -> MasterService:
    service, _ = make_service(**overrides)
    mount(service, "c1", "s1", size=64 << 20)
    for key in keys:
        put(service, "w", key, 10)
    return service


def present(service: MasterService, keys: list[str], tenant: str = "") -> list[str]:
    return [k for k in keys if service.object_of(tenant, k) is not None]


# --- semantics ---------------------------------------------------------------------------------


def test_search_semantics_match_anywhere_in_the_key() -> None:
    keys = ["a/b/c/d", "b/c", "xb/cx", "cb/", "abc"]
    service = filled(keys)
    assert service.remove_by_regex("", "b/c") == (OK, 3)  # anywhere, as std::regex_search
    assert present(service, keys) == ["cb/", "abc"]
    assert service.remove_by_regex("", "^b") == (OK, 0)  # anchors anchor
    assert service.remove_by_regex("", "c$") == (OK, 1)  # abc
    assert service.remove_by_regex("", "") == (OK, 1)  # the empty pattern matches every key
    assert service.stats()["objects"] == 0
    service.check()


def test_ecmascript_like_details() -> None:
    keys = ["k\n", "naïve", "x1"]
    service = filled(keys)
    assert service.remove_by_regex("", "k$") == (OK, 0)  # $ is the key's very end only
    assert service.remove_by_regex("", r"^na\wve$") == (OK, 0)  # \w is ASCII, as ECMAScript
    assert service.remove_by_regex("", "^na.ve$") == (OK, 1)  # . is one character, not byte
    assert service.remove_by_regex("", r"\d") == (OK, 1)
    assert service.remove_by_regex("", "(?s)k.") == (OK, 1)
    service.check()


@pytest.mark.parametrize(
    "pattern",
    [
        "(",
        "[a-",
        "*a",
        r"(a)\1",  # backreference
        "(?=a)",  # lookahead
        "(?!a)",
        "(?<=a)b",  # lookbehind
        "(?<!a)b",
        "a++",  # possessive
        "a{1001}",  # RE2 counts stop at 1000
        "((a{1000}){1000}){1000}",  # a program far beyond the memory budget
        "x" * (MAX_PATTERN_BYTES + 1),
        "é" * (MAX_PATTERN_BYTES // 2 + 1),  # the bound is in UTF-8 bytes, not characters
        "\ud800",  # a lone surrogate (cannot come over the wire, but direct callers)
    ],
)
def test_refused_patterns_are_invalid_params(pattern: str) -> None:
    service = filled(["a", "ab", "aaa"])
    assert service.remove_by_regex("", pattern, force=True) == (BAD, 0)
    assert service.stats()["objects"] == 3
    assert compile_key_pattern(pattern) is None
    service.check()


def test_longest_accepted_pattern() -> None:
    key = "y" * MAX_PATTERN_BYTES
    service = filled([key])
    assert service.remove_by_regex("", "y" * MAX_PATTERN_BYTES) == (OK, 1)
    assert compile_key_pattern(None) is None  # not a string


def test_leased_skipped_unless_forced_writes_never() -> None:
    keys = ["u/1", "u/2", "u/3"]
    service = filled(keys)
    start(service, "w", "u/pending", 10)
    assert service.reads.exist_key("", "u/2") == 1  # an existence hold: leased
    assert service.remove_by_regex("", "^u/") == (OK, 2)
    assert present(service, [*keys, "u/pending"]) == ["u/2", "u/pending"]
    assert service.remove_by_regex("", "^u/", force=True) == (OK, 1)
    assert present(service, ["u/2", "u/pending"]) == ["u/pending"]  # writes stay, even forced
    assert service.remove_all("", force=True) == 0
    service.check()


def test_tenant_isolation() -> None:
    service, _ = make_service(enable_multi_tenants=True)
    mount(service, "c1", "s1")
    for tenant in ("t1", "t2", ""):
        for key in ("k1", "k2", "other"):
            put(service, "w", key, 10, tenant=tenant)
    assert service.remove_by_regex("t1", "^k") == (OK, 2)
    assert present(service, ["k1", "k2", "other"], "t1") == ["other"]
    assert present(service, ["k1", "k2", "other"], "t2") == ["k1", "k2", "other"]
    assert service.remove_all("t2") == 3
    assert present(service, ["k1", "k2", "other"], "") == ["k1", "k2", "other"]
    assert service.remove_by_regex("_bad", "k") == (BAD, 0)
    assert service.remove_all("") == 4  # every tenant: t1's "other" and default's three
    service.check()


def test_count_over_many_slices() -> None:
    n = 2 * 1024 + 17
    keys = [f"k/{i:05d}" for i in range(n)]
    service = filled(keys)
    removals = service._removals
    removals.slice_seconds = 0.0  # every object its own slice
    before = removals.slices_run
    assert service.remove_by_regex("", r"[02468]$") == (OK, len(keys) // 2 + 1)
    assert removals.slices_run - before == n
    assert service.remove_all("") == n - (len(keys) // 2 + 1)
    assert service.stats()["objects"] == 0
    service.check()


# --- complexity --------------------------------------------------------------------------------


def _best_of(runs: int, call: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(runs):
        began = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - began)
    return best


def test_pathological_pattern_is_linear() -> None:
    # (a+)+$ against a's and a final "!" is exponential for a backtracker (Python's re takes
    # seconds for 27 a's, 4x more per two more). Short keys first, so that a backtracking
    # engine fails here (its work grows 16x from 16 to 20 a's) instead of hanging below.
    matches = compile_key_pattern("(a+)+$")
    assert matches is not None
    short, longer = "a" * 16 + "!", "a" * 20 + "!"
    small_ratio = _best_of(20, lambda: [matches(longer) for _ in range(200)]) / _best_of(
        20, lambda: [matches(short) for _ in range(200)]
    )
    assert small_ratio < 4, small_ratio
    # Linear, not merely fast: doubling a long key about doubles the work.
    short, long_ = "a" * 2047 + "!", "a" * 4095 + "!"
    ratio = _best_of(20, lambda: [matches(long_) for _ in range(50)]) / _best_of(
        20, lambda: [matches(short) for _ in range(50)]
    )
    assert ratio < 6, ratio
    key = "a" * (MAX_KEY_BYTES - 1) + "!"
    service = filled([key, "aaa"])
    assert service.remove_by_regex("", "(a+)+$") == (OK, 1)  # "aaa" only
    assert matches(key) is False and matches("a" * 10) is True


def test_python_re_agrees_where_both_apply() -> None:
    keys = ["layer/1/block/7", "layer/12/block/3", "meta", "x-layer/1"]
    for pattern in [r"^layer/\d+/", "block/[37]$", "meta|x-", "l.y", "^$"]:
        matches = compile_key_pattern(pattern)
        assert matches is not None
        assert [matches(k) for k in keys] == [bool(re.search(pattern, k)) for k in keys]


# --- slices ------------------------------------------------------------------------------------


def _run_with(steps: Steps[T], hook: Callable[[], None]) -> T:
    """Drive a sliced call, running ``hook`` where it first gives up the lock."""
    next(steps)
    hook()
    return drive(steps)


def test_lock_is_free_between_slices_and_changes_meanwhile() -> None:
    service, clock = make_service()
    mount(service, "c1", "s1", size=64 << 20)
    keys = [f"k/{i}" for i in range(3 * 4)]  # four slices of three
    for key in keys:
        put(service, "w", key, 10)
    service._removals.slice_seconds = 0.0  # one object per slice
    assert service.reads.exist_key("", "k/10") == 1  # leased now; the hold ends at its TTL
    seen: list[bool] = []

    def meanwhile() -> None:
        seen.append(service._lock.locked())
        assert service.remove("", "k/5") == OK  # a later slice finds it gone: not counted
        put(service, "w", "k/new", 10)  # written after the snapshot: not seen
        put(service, "w", "k/0", 10)  # re-put behind the walk: not seen either
        clock.advance(service.config.default_kv_lease_ttl / 1000 + 1)  # k/10's hold ends

    # 12 keys, less k/5 (gone); k/10 too, its hold having ended before its slice ran.
    steps = service._removals.remove_by_regex_sliced("", "^k/")
    assert _run_with(steps, meanwhile) == (OK, 11)
    assert seen == [False]
    assert present(service, [*keys, "k/new"]) == ["k/0", "k/new"]
    service.check()


def test_remove_all_slices_too() -> None:
    keys = [f"k{i}" for i in range(10)]
    service = filled(keys)
    service._removals.slice_seconds = 0.0
    before = service._removals.slices_run
    steps = service._removals.remove_all_sliced("")
    assert _run_with(steps, lambda: put(service, "w", "late", 10)) == 10
    assert service._removals.slices_run - before == 10
    assert present(service, ["late"]) == ["late"]
    service.check()
