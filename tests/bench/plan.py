"""What a benchmark run does (:class:`Plan`), and the bookkeeping that keeps it honest: read
verification and the budget of A's segment."""

from __future__ import annotations

import dataclasses
from typing import Any

from tests.bench.common import GIB, KIB, MIB


@dataclasses.dataclass(frozen=True)
class Plan:
    """How much of everything one run does (counts are per round unless said otherwise)."""

    mode: str
    # single process: the segment owner writes and reads its own segment
    local_sizes: tuple[int, ...]
    local_calls: dict[int, int]  # calls per round of each single-value size
    local_batches: tuple[tuple[int, int, int], ...]  # (keys per call, value size, calls)
    # cross-process: A owns the segment, B has none
    sizes: tuple[int, ...]
    batches: dict[int, int]
    values: dict[int, int]
    rounds: int
    warmup: int
    segment: int
    memcpy_sizes: tuple[int, ...]
    memcpy_reps: int
    stream_bytes: int
    stream_reps: int
    ping_calls: int
    echo_calls: int
    exist_calls: int
    batch_exist_sizes: tuple[int, ...]
    batch_exist_calls: dict[int, int]
    remove_calls: int
    call_reps: int
    # memory pressure: one client with a small segment writes far more than it holds
    pressure_segment: int
    pressure_bytes: int
    pressure_value: int
    pressure_reps: int
    meta_value: int = 64
    lease_ms: int = 10_000  # the masters' default_kv_lease_ttl for the run (upstream's default)
    budget: float = 0.8  # share of A's segment the run may hold at once
    # A's segment is written end to end once up front, to fault its pages in: all of it, since
    # the master's best-fit allocator prefers the smallest free range, so any unwritten tail
    # would be used first (and every write there pays first-touch page faults).
    prefill: float = 1.0

    def buffer_bytes(self) -> int:
        """The registered buffer each worker needs: the most bytes one call moves."""
        most = max(size * self.batches[size] for size in self.sizes)
        most = max(most, *self.local_sizes, *(n * size for n, size, _ in self.local_batches))
        return max(most, max(self.batch_exist_sizes) * self.meta_value, self.pressure_value)


def plan_for(quick: bool, tiny: bool) -> Plan:
    """Full run (a few minutes per implementation), ``quick`` (under a minute for mooncake-py)
    or ``tiny`` (plumbing only)."""
    sizes = (1 * MIB, 4 * MIB)
    local_sizes = (4 * KIB, 64 * KIB, 1 * MIB, 4 * MIB, 16 * MIB)
    full = Plan(
        mode="full",
        local_sizes=local_sizes,
        local_calls=dict(zip(local_sizes, (400, 200, 48, 16, 6), strict=True)),
        # 1024 x 64 B: the per-key cost of batches of tiny values (metadata, not bytes).
        local_batches=((1024, 64, 4), (64, 64 * KIB, 6), (16, 1 * MIB, 4), (32, 4 * MIB, 2)),
        sizes=sizes,
        batches={1 * MIB: 16, 4 * MIB: 32},
        values={1 * MIB: 256, 4 * MIB: 128},
        rounds=7,
        warmup=1,
        segment=2 * GIB,
        memcpy_sizes=(16 * MIB, 256 * MIB),
        memcpy_reps=31,
        stream_bytes=256 * MIB,
        stream_reps=16,
        ping_calls=2000,
        echo_calls=1000,
        exist_calls=1000,
        batch_exist_sizes=(128, 1024),
        batch_exist_calls={128: 100, 1024: 20},
        remove_calls=500,
        call_reps=7,
        pressure_segment=256 * MIB,
        pressure_bytes=1 * GIB,
        pressure_value=1 * MIB,
        pressure_reps=2,
    )
    if quick and not tiny:
        return dataclasses.replace(
            full,
            mode="quick",
            local_calls=dict(zip(local_sizes, (150, 60, 16, 6, 2), strict=True)),
            local_batches=((1024, 64, 2), (64, 64 * KIB, 2), (16, 1 * MIB, 2), (32, 4 * MIB, 1)),
            segment=1 * GIB,
            values={1 * MIB: 64, 4 * MIB: 32},
            rounds=3,
            memcpy_reps=8,
            stream_bytes=64 * MIB,
            stream_reps=4,
            ping_calls=500,
            echo_calls=150,
            exist_calls=200,
            batch_exist_calls={128: 20, 1024: 4},
            remove_calls=100,
            call_reps=3,
            pressure_reps=1,
        )
    if not tiny:
        return full
    small = (64 * KIB, 256 * KIB)
    return dataclasses.replace(
        full,
        mode="tiny",
        local_sizes=(4 * KIB, 64 * KIB),
        local_calls={4 * KIB: 10, 64 * KIB: 5},
        local_batches=((4, 16 * KIB, 2), (4, 64 * KIB, 1)),
        sizes=small,
        batches=dict.fromkeys(small, 4),
        values=dict.fromkeys(small, 8),
        rounds=2,
        warmup=0,
        segment=64 * MIB,
        memcpy_sizes=(1 * MIB, 4 * MIB),
        memcpy_reps=3,
        stream_bytes=4 * MIB,
        stream_reps=2,
        ping_calls=50,
        echo_calls=50,
        exist_calls=30,
        batch_exist_sizes=(16, 64),
        batch_exist_calls={16: 3, 64: 3},
        remove_calls=10,
        call_reps=2,
        pressure_segment=16 * MIB,  # upstream's smallest segment
        pressure_bytes=48 * MIB,
        pressure_value=1 * MIB,
        pressure_reps=1,
    )


class Verification:
    """What the readers checked, over the whole run."""

    def __init__(self) -> None:
        self.stamps_checked = 0
        self.full_checked = 0
        self.error_count = 0
        self.errors: list[str] = []

    def absorb(self, answer: dict[str, Any]) -> dict[str, Any]:
        self.stamps_checked += answer.get("stamps_checked", 0)
        self.full_checked += answer.get("full_checked", 0)
        errors = answer.get("errors", [])
        self.error_count += answer.get("error_count", len(errors))
        self.errors += errors[: max(0, 50 - len(self.errors))]
        return answer

    def summary(self) -> dict[str, Any]:
        ok = self.error_count == 0 and self.stamps_checked > 0 and self.full_checked > 0
        return {
            "ok": ok,
            "stamps_checked": self.stamps_checked,
            "full_checked": self.full_checked,
            "error_count": self.error_count,
            "errors": self.errors,
        }


def _string_field(text: str) -> int:
    """Bytes a protobuf string field takes on the wire (field number < 16)."""
    length = len(text.encode())
    varint = 1
    while length >= 128**varint:
        varint += 1
    return 1 + varint + length


def echo_payloads(tag: str, batch_sizes: tuple[int, ...]) -> dict[str, int]:
    """Wire sizes of the master requests the metadata rows make: ``KeyRequest`` and
    ``BatchKeysRequest`` (keys + tenant), used as the gRPC echo payloads."""
    tenant = _string_field("default")
    sizes = {"ExistKey": _string_field(f"{tag}/meta/{0:06d}") + tenant}
    for n in batch_sizes:
        keys = sum(_string_field(f"{tag}/meta/{i:06d}") for i in range(n))
        sizes[f"BatchExistKey{n}"] = keys + tenant
    return sizes


class SegmentBudget:
    """Keeps the bytes held in A's segment under ``budget`` of it, so puts never fail for room
    and the master never evicts a value the run still reads.

    A remove (forced or not) of a key nobody is reading gives its memory back at once: readers
    end their leases when their copies are done, so nothing waits for a lease TTL. A master
    that held such memory longer shows up as failed puts in the rows, not as waiting here.
    """

    def __init__(self, segment: int, budget: float) -> None:
        self.capacity = int(segment * budget)
        self.live = 0
        self.waited_s = 0.0

    def held(self) -> int:
        return self.live

    def reserve(self, nbytes: int) -> None:
        """Count ``nbytes`` more as live.

        Raises:
            ValueError: they could never fit.
            RuntimeError: the live bytes leave no room for them.
        """
        if nbytes > self.capacity:
            raise ValueError(f"{nbytes} bytes never fit in a budget of {self.capacity}")
        if self.live + nbytes > self.capacity:
            raise RuntimeError(f"{self.live} live bytes leave no room for {nbytes} more")
        self.live += nbytes

    def removed(self, nbytes: int) -> None:
        """``nbytes`` were removed: their memory is free again."""
        self.live -= nbytes
