"""The connector's decisions, as pure functions over the store's per-key results.

Nothing here talks to a store: :mod:`mooncake_py.connector.core` asks the store and hands the
answers to these functions, so the synchronous and the asyncio connector decide alike and the
rules can be tested without a master.

Results read here are the typed :class:`~mooncake_py.Client`'s: ``batch_probe_key`` gives a
found flag per key (False also for a key whose probe failed), ``batch_get_into`` a code and the
bytes read per key, ``batch_put_from`` a code per key (0 also for a put of an existing key:
first writer wins).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, TypeVar

from mooncake_py.errors import ErrorCode
from mooncake_py.types import ObjectDataType, ReplicateConfig

BACKPRESSURE = int(ErrorCode.NO_AVAILABLE_HANDLE)

T = TypeVar("T")


class Page(NamedTuple):
    """One page of KV in registered memory, to be saved.

    Attributes:
        hash: the page's chained hash (see :func:`mooncake_py.connector.keys.page_hashes`).
        ptr: address of its bytes, inside a buffer registered with the store.
        size: its length in bytes (> 0).
    """

    hash: str
    ptr: int
    size: int


class Buffer(NamedTuple):
    """Registered memory a page is loaded into: ``size`` bytes at ``ptr``."""

    ptr: int
    size: int


@dataclasses.dataclass(frozen=True)
class SavePlan:
    """What a save must do, from one existence probe.

    Attributes:
        missing: indices of pages to write, in page order.
        present: indices of pages already stored (only attached to the session).
    """

    missing: tuple[int, ...]
    present: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class SaveResult:
    """What a save did.

    Attributes:
        requested: pages passed to the save.
        present: pages that were already stored (written by anyone, e.g. another rank).
        written: pages the store accepted now (0 from ``batch_put_from``).
        bytes_written: their bytes.
        failed: pages that got an error other than back-pressure; they are not retried.
        refused: pages the store refused with NO_AVAILABLE_HANDLE (back-pressure).
        skipped: pages not attempted because the store pushed back earlier in the save.
        backpressure: the store answered NO_AVAILABLE_HANDLE: it is full of data it may not
            evict. The engine should go on serving, recomputing what is not stored, and try
            saving again later rather than retrying at once.
        attached: present pages attached to the session (0 without a session).
        errors: count of pages per negative code (back-pressure included).
    """

    requested: int = 0
    present: int = 0
    written: int = 0
    bytes_written: int = 0
    failed: int = 0
    refused: int = 0
    skipped: int = 0
    backpressure: bool = False
    attached: int = 0
    errors: dict[int, int] = dataclasses.field(default_factory=dict)


def leading(items: Sequence[T], ok: Callable[[T], bool]) -> int:
    """How many items from the start satisfy ``ok`` (stops at the first that does not)."""
    count = 0
    for item in items:
        if not ok(item):
            break
        count += 1
    return count


def stored_prefix(found: Sequence[bool]) -> int:
    """Pages of the longest stored prefix, from ``batch_probe_key``'s found flags.

    A failed probe counts as a miss, like absence: the engine recomputes from there.
    """
    return leading(found, bool)


def loaded_prefix(
    codes: Sequence[int], bytes_read: Sequence[int | None], sizes: Sequence[int]
) -> int:
    """Pages loaded in full from the start, from ``batch_get_into``'s codes and bytes read.

    A page counts when the store read exactly its expected size; a miss, an error or a
    short read ends the usable prefix.
    """
    outcomes = list(zip(codes, bytes_read, sizes, strict=True))
    return leading(outcomes, lambda item: item[0] == 0 and item[1] == item[2])


def plan_save(found: Sequence[bool]) -> SavePlan:
    """Split pages into those to write and those already stored.

    A page whose probe failed is written: a put of an existing key is harmless, whereas
    skipping it could leave a hole in the stored prefix.
    """
    present = tuple(i for i, hit in enumerate(found) if hit)
    missing = tuple(i for i, hit in enumerate(found) if not hit)
    return SavePlan(missing=missing, present=present)


def chunks(indices: Sequence[int], size: int) -> Iterator[tuple[int, ...]]:
    """Consecutive runs of at most ``size`` indices (``size`` > 0), in order."""
    for start in range(0, len(indices), size):
        yield tuple(indices[start : start + size])


def write_config(count: int, session_id: str | None) -> ReplicateConfig:
    """The ``ReplicateConfig`` of a KV-cache batch write of ``count`` keys.

    With a session, every key is tagged with it (``kv_sessions``), so the write joins the
    session at admission and, when the session is pinned, is protected from the start.
    """
    tags = [[session_id]] * count if session_id else None
    return ReplicateConfig(data_type=ObjectDataType.KVCACHE, kv_sessions=tags)


def tally_put(
    result: SaveResult, sizes: Sequence[int], put_codes: Sequence[int], remaining: int
) -> SaveResult:
    """Add one ``batch_put_from`` answer to ``result``.

    Args:
        result: the save so far.
        sizes: bytes of each page of the batch.
        put_codes: the store's per-key codes for the batch.
        remaining: pages of the save after this batch; with back-pressure they are skipped.

    Returns:
        The updated result. When any code is NO_AVAILABLE_HANDLE, ``backpressure`` is set and
        ``remaining`` pages are counted as skipped: the caller must not send them.
    """
    errors = dict(result.errors)
    written = bytes_written = 0
    for code, size in zip(put_codes, sizes, strict=True):
        if code == 0:
            written += 1
            bytes_written += size
        else:
            errors[code] = errors.get(code, 0) + 1
    refused = errors.get(BACKPRESSURE, 0) - result.errors.get(BACKPRESSURE, 0)
    failed = len(put_codes) - written - refused
    pushed_back = refused > 0
    return dataclasses.replace(
        result,
        written=result.written + written,
        bytes_written=result.bytes_written + bytes_written,
        failed=result.failed + failed,
        refused=result.refused + refused,
        skipped=result.skipped + (remaining if pushed_back else 0),
        backpressure=result.backpressure or pushed_back,
        errors=errors,
    )


def count_attached(attach_codes: Sequence[int]) -> int:
    """Keys ``attach_kv_session`` added (code 0); misses (evicted meanwhile) do not count."""
    return sum(1 for code in attach_codes if code == 0)
