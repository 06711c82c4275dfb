"""Seeded multi-process, multi-thread stress of content integrity through the drop-in API.

One in-process master with a total segment about a third of the working set (so eviction
runs all the time); three client processes (:mod:`tests.stress._rw_worker`) with two threads
each:

- worker 0: both threads share one store (one client id), same-host reads by mapping;
- worker 1: one store per thread, the first contributing a small segment of its own;
- worker 2: both threads share one store that reads over TCP (``force_tcp``).

Every thread draws operations from a seeded RNG over a small key space with a few hot keys
(put, upsert, upsert_from, get, get_into, batch_get_into, batch_is_exist, remove,
remove(force=True)), and checks every value it reads (:func:`tests.stress._rw_worker.check_value`:
right key, right length, digest and payload). Contract checked:

- no read ever returns bytes that were not written, complete, for the key asked for (a torn,
  foreign or truncated value): wrong reads must be 0;
- no drop-in call raises (they return codes);
- failed operations (not found, no space, busy, lease expired, ...) are allowed and counted;
- eviction ran; ``MasterService.check()`` passes with the workers still joined and after they
  left;
- after every worker has closed, ``remove_all(force=True)`` from a fresh client frees every
  byte at once: no read lease or preempted write outlives its client's calls (allocated
  bytes 0 with the owner's segment still mounted, within seconds although the lease TTL is
  10 s and the release timeout 600 s), and closing the last clients
  leaves no segment and no allocation.

``MOONCAKE_PY_STRESS_SCALE`` (default 1) multiplies the seconds of work;
``MOONCAKE_PY_STRESS_SEED`` changes the seed. The seed fixes each thread's sequence of
operations, not how threads and processes interleave, so a run is not exactly reproducible.
The per-operation counts are printed (``-s``) and included in every assertion message. On a
2-core machine the default run takes about 11 s.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mooncake_py import MooncakeDistributedStore
from mooncake_py.testing import InProcessMaster, wait_until
from tests.stress._rw_worker import (
    HEADER,
    MAX_VALUE,
    check_value,
    make_value,
    working_set_bytes,
)

ROOT = Path(__file__).resolve().parents[2]
SCALE = float(os.environ.get("MOONCAKE_PY_STRESS_SCALE", "1") or "1")
SECONDS = 10.0 * SCALE
SEED = int(os.environ.get("MOONCAKE_PY_STRESS_SEED", "20240917"))
KEYS = 96
OVERSUBSCRIPTION = 3.0
WORKING_SET = working_set_bytes(KEYS)
TOTAL_SEGMENT = int(WORKING_SET / OVERSUBSCRIPTION)
WORKER_SEGMENT = 512 << 10
"""The segment worker 1's first store contributes; the test's owner store holds the rest."""
OWNER_SEGMENT = TOTAL_SEGMENT - WORKER_SEGMENT
MASTER_CONFIG: dict[str, Any] = {
    # Upstream's lease and write timeouts (10 s, 30 s, 600 s): readers end their leases when
    # their copies are done and a preempted write's buffer comes back when its writer's end
    # arrives, so neither may hold memory for its timeout in a healthy store.
    "eviction_high_watermark_ratio": 0.8,
    "eviction_ratio": 0.2,
}
STARTUP_S = 60.0


def _workers(address: str) -> list[dict[str, Any]]:
    common = {"master": address, "seconds": SECONDS, "threads": 2, "keys": KEYS}
    return [
        {**common, "worker": 0, "seed": SEED, "shared": True, "segments": [0], "force_tcp": False},
        {
            **common,
            "worker": 1,
            "seed": SEED + 1,
            "shared": False,
            "segments": [WORKER_SEGMENT, 0],
            "force_tcp": False,
        },
        {
            **common,
            "worker": 2,
            "seed": SEED + 2,
            "shared": True,
            "segments": [0],
            "force_tcp": True,
        },
    ]


class Worker:
    """A ``tests.stress._rw_worker`` child: JSON lines out, one line in per step."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.name = f"worker-{spec['worker']}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.stress._rw_worker", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name=f"{self.name}-out").start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put("")

    def receive(self, timeout_s: float) -> dict[str, Any]:
        """The next JSON line; raises AssertionError if the child exits or stays silent."""
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"{self.name}: no answer within {timeout_s:.0f} s") from None
        if not line:
            raise AssertionError(f"{self.name} exited with {self.process.wait(10)}")
        message: dict[str, Any] = json.loads(line)
        return message

    def signal(self) -> None:
        """Send the next step's line (start, then close)."""
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        """SIGKILL by pid if still running, and reap."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


def _store(address: str, segment: int) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    config = {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": segment,
        "master_server_address": address,
    }
    assert store.setup(config) == 0
    return store


def _check(master: InProcessMaster, when: str, problems: list[str]) -> None:
    try:
        master.service.check()
    except AssertionError as exc:
        problems.append(f"service.check() {when}: {exc}")


def _report(
    totals: Counter[str],
    wrong: list[dict[str, Any]],
    errors: list[str],
    stats: dict[str, dict[str, int]],
    elapsed: float,
) -> str:
    ops: dict[str, dict[str, int]] = {}
    for name, count in sorted(totals.items()):
        op, _, outcome = name.partition(":")
        ops.setdefault(op, {})[outcome] = count
    lines = [
        f"segments {OWNER_SEGMENT} + {WORKER_SEGMENT} B for a working set of about "
        f"{WORKING_SET} B over {KEYS} keys; master {MASTER_CONFIG}",
        f"{elapsed:.1f} s of work, {sum(totals.values())} operations; per op:",
    ]
    lines += [f"  {op}: {outcomes}" for op, outcomes in ops.items()]
    lines += [f"  wrong read: {w}" for w in wrong]
    lines += [f"  exception: {e}" for e in errors[:5]]
    lines += [f"  master stats {when}: {s}" for when, s in stats.items()]
    return "\n".join(lines)


def test_checker_flags_corrupted_values() -> None:
    """The integrity check accepts exactly the complete value written for the key."""
    value = make_value("rw-1", 7, 5000)
    assert len(value) == 5000 and check_value("rw-1", value) is None
    assert check_value("rw-1", memoryview(value)) is None
    flipped = bytearray(value)
    flipped[2500] ^= 1
    assert "digest" in (check_value("rw-1", bytes(flipped)) or "")
    digest_flipped = bytearray(value)
    digest_flipped[-1] ^= 0x80
    assert "digest" in (check_value("rw-1", bytes(digest_flipped)) or "")
    assert "foreign" in (check_value("rw-2", value) or "")
    assert "length" in (check_value("rw-1", value[:-1]) or "")
    assert "length" in (check_value("rw-1", value + b"\0") or "")
    assert "short" in (check_value("rw-1", b"") or "")
    assert "magic" in (check_value("rw-1", bytes(len(value))) or "")
    # Torn: the first half of one version and the second half of another, same key and length.
    other = make_value("rw-1", 8, 5000)
    assert check_value("rw-1", other) is None
    assert "digest" in (check_value("rw-1", value[:2500] + other[2500:]) or "")
    assert "digest" in (check_value("rw-1", other[: HEADER.size] + value[HEADER.size :]) or "")
    # Another key's bytes with only the key field rewritten to the asked one.
    forged = bytearray(make_value("rw-3", 9, 5000))
    forged[HEADER.size : HEADER.size + 4] = b"rw-1"
    assert "digest" in (check_value("rw-1", bytes(forged)) or "")
    assert len(make_value("rw-1", 1, MAX_VALUE)) == MAX_VALUE
    with pytest.raises(ValueError):
        make_value("rw-1", 1, HEADER.size)


@pytest.mark.timeout(int(STARTUP_S + 90 * SCALE + 60))
def test_readers_and_writers_never_see_wrong_bytes() -> None:
    totals: Counter[str] = Counter()
    wrong: list[dict[str, Any]] = []
    errors: list[str] = []
    wrong_count = error_count = 0
    problems: list[str] = []
    stats: dict[str, dict[str, int]] = {}
    elapsed = 0.0
    with InProcessMaster(**MASTER_CONFIG) as master:
        owner = _store(master.address, OWNER_SEGMENT)
        workers = [Worker(spec) for spec in _workers(master.address)]
        try:
            for worker in workers:
                assert worker.receive(STARTUP_S).get("ready"), worker.name
            started = time.monotonic()
            for worker in workers:
                worker.signal()
            for worker in workers:
                result = worker.receive(SECONDS + 60)
                totals.update(result["counts"])
                wrong += result["wrong"]
                errors += result["errors"]
                wrong_count += result["wrong_count"]
                error_count += result["error_count"]
            elapsed = time.monotonic() - started
            stats["after work"] = master.service.stats()
            _check(master, "with the workers joined", problems)
            for worker in workers:
                worker.signal()
            for worker in workers:
                assert worker.receive(30).get("closed"), worker.name
                assert worker.process.wait(timeout=30) == 0, worker.name
        finally:
            for worker in workers:
                worker.kill()
        _check(master, "after the workers closed", problems)

        cleaner = _store(master.address, 0)
        removed = cleaner.remove_all(force=True)
        try:
            wait_until(
                lambda: master.service.stats()["allocated_bytes"] == 0,
                timeout_s=10,
                what="remove_all(force=True) has freed every byte",
            )
        except AssertionError as exc:
            problems.append(f"{exc} (remove_all removed {removed})")
        stats["after remove_all"] = master.service.stats()
        if stats["after remove_all"]["objects"] != 0:
            problems.append(f"{stats['after remove_all']['objects']} objects after remove_all")
        _check(master, "after remove_all", problems)
        cleaner.close()
        owner.close()
        try:
            wait_until(
                lambda: (
                    master.service.stats()["segments"] == 0
                    and master.service.stats()["allocated_bytes"] == 0
                ),
                timeout_s=10,
                what="every segment is unmounted and nothing is allocated",
            )
        except AssertionError as exc:
            problems.append(str(exc))
        stats["after every client closed"] = master.service.stats()
        _check(master, "after every client closed", problems)

    report = _report(totals, wrong, errors, stats, elapsed)
    print(report)
    assert wrong_count == 0, f"{wrong_count} wrong reads\n{report}"
    assert error_count == 0, f"{error_count} exceptions from drop-in calls\n{report}"
    assert not problems, "\n".join(problems) + "\n" + report
    verified = sum(n for name, n in totals.items() if name.endswith(":ok") and "get" in name)
    assert verified > 100, f"too few verified reads to mean anything\n{report}"
    assert stats["after work"]["evicted_objects"] > 0, f"eviction never ran\n{report}"
    written = sum(totals[f"{op}:ok"] for op in ("put", "upsert", "upsert_from"))
    assert written > 100, f"too few successful writes to mean anything\n{report}"
