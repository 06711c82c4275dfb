"""One client of the many-clients benchmark, in its own process, driven by JSON lines on stdin.

Run as ``python -m tests.bench.many_clients_worker [--impl py|upstream]`` (upstream with the
interpreter of its own virtual environment, as :mod:`tests.bench.worker`, whose ``setup``
command this worker inherits). It prints ``{"ready": ..., "versions": ...}`` once imported,
then answers each command line with one JSON line (``{"error": ...}`` on failure). Commands:

- ``setup``: join the store (see :meth:`tests.bench.worker.Worker.setup`);
- ``preload``: for a round (``prefix``), as client ``me`` of ``clients``, write the client's
  *shared* batches (read by every client during the round, never removed in it) and fill its
  own *window* (the batches it writes, reads and removes during the round); untimed;
- ``run``: from wall-clock time ``start_at`` for ``duration_s`` seconds, run the mixed loop
  (:data:`CYCLE`) and answer per call type the calls, keys, failures and per-call times;
- ``cleanup``: remove every key the client still holds in the round (forced, untimed);
- ``quit`` (or stdin closing): close the store and exit.

The mixed loop repeats one cycle of eight calls, in this order (so the proportions are fixed:
per cycle 2 puts, 2 ``batch_get_into``, 2 ``get_batch``, 1 ``batch_is_exist``, 1 remove):

1. ``put_batch`` of 16 fresh keys x 64 KiB into the window;
2. ``batch_get_into`` of a live window batch of 16 x 64 KiB (keys this client wrote);
3. ``put_batch`` of 64 fresh keys x 4 KiB into the window;
4. ``get_batch`` of a shared batch of 64 x 4 KiB of another client (seeded choice);
5. ``batch_get_into`` of a shared batch of 16 x 64 KiB of another client;
6. ``batch_is_exist`` of 128 keys: another client's shared 64 x 4 KiB batch (present) and 64
   keys nobody writes (absent);
7. ``get_batch`` of a live window batch of 64 x 4 KiB (keys this client wrote);
8. ``batch_remove`` (forced) of the window's oldest 16 x 64 KiB and oldest 64 x 4 KiB batch.

Each cycle writes 80 keys and removes 80, so the window holds ``window`` batches of each size
(plus the one just written): with the shared batches about ``(2 x shared + window) x 1.25
MiB`` per client, far below the segments, and nothing fails for lack of space. Every read is
verified: a value is the key's 16-byte stamp then the benchmark's fixed pattern
(:mod:`tests.bench.worker`), and every byte of every value read is compared; the buffer
``batch_get_into`` reads into is zeroed before each call, so a call that writes nothing
cannot pass. ``batch_is_exist`` must answer 1 for each present key and 0 for each absent one;
a put or remove must answer 0. Only the store call is timed; the loop's stamping and
verification run between calls, the same on both sides.

Only numpy and the standard library are imported besides the store, so that the module runs in
upstream's virtual environment too. Thread-safety: one command at a time, from the main thread.
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tests.bench.worker import STAMP_BYTES, Worker, serve_commands, stamp

COMMANDS = ("setup", "preload", "run", "cleanup")
BIG_BATCH, BIG_SIZE = 16, 64 * 1024
SMALL_BATCH, SMALL_SIZE = 64, 4 * 1024
ABSENT_PROBES = 64
BIG_WRITE_OFFSET = 0
SMALL_WRITE_OFFSET = BIG_WRITE_OFFSET + BIG_BATCH * BIG_SIZE
READ_OFFSET = SMALL_WRITE_OFFSET + SMALL_BATCH * SMALL_SIZE
BUFFER_BYTES = READ_OFFSET + BIG_BATCH * BIG_SIZE
"""The registered buffer: the 64 KiB write slots, the 4 KiB write slots, the read slots."""
REMOVE_CHUNK = 256
ERROR_SAMPLES = 10
CYCLE = (
    "put_big",
    "get_into_big_own",
    "put_small",
    "get_small_other",
    "get_into_big_other",
    "exist",
    "get_small_own",
    "remove",
)
"""The mixed loop's steps; each step is one call of the call type named by its prefix."""


def batch_keys(prefix: str, client: int, kind: str, seq: int, count: int) -> list[str]:
    """The keys of batch ``seq`` of ``kind`` (``big``, ``small``, ``shared-big``, ...)."""
    return [f"{prefix}/c{client}/{kind}/{seq}/{k:03d}" for k in range(count)]


class _Tally:
    """Calls, keys, failures and per-call times of one call type."""

    def __init__(self) -> None:
        self.calls = 0
        self.keys = 0
        self.failures = 0
        self.times: list[float] = []

    def answer(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "keys": self.keys,
            "failures": self.failures,
            "times": self.times,
        }


class ManyClientsWorker(Worker):
    """One client of the benchmark: the inherited store and buffer, plus the round's state.

    The registered buffer must be at least :data:`BUFFER_BYTES` (``setup(buffer=...)``).
    """

    def __init__(self, impl: str) -> None:
        super().__init__(impl)
        self.prefix = ""
        self.me = 0
        self.clients = 1
        self.shared = 0
        self.window = 0
        self.window_big: collections.deque[int] = collections.deque()
        self.window_small: collections.deque[int] = collections.deque()
        self.next_seq = 0
        self.absent_seq = 0
        self.rng = np.random.default_rng(0)
        self.tallies: dict[str, _Tally] = {}
        self.errors: list[str] = []
        self.big_body = np.empty(0, dtype=np.uint8)
        self.small_body = b""

    # -- commands ------------------------------------------------------------------------------

    def preload(
        self, prefix: str, me: int, clients: int, shared: int, window: int, seed: int = 0
    ) -> dict[str, Any]:
        """Start a round: write ``shared`` shared batches and ``window`` window batches of
        each size (untimed).

        Returns: ``written`` keys, ``failed_batches`` (puts that answered a non-zero code) and
        ``errors`` (samples of those codes).
        Raises:
            ValueError: the registered buffer is smaller than :data:`BUFFER_BYTES`, or a count
                is not positive.
        """
        if self.buffer.size < BUFFER_BYTES:
            raise ValueError(f"the buffer must hold {BUFFER_BYTES} bytes, not {self.buffer.size}")
        if min(clients, shared, window) < 1 or not 0 <= me < clients:
            raise ValueError("clients, shared and window must be positive, 0 <= me < clients")
        self.prefix, self.me, self.clients = prefix, me, clients
        self.shared, self.window = shared, window
        self.window_big.clear()
        self.window_small.clear()
        self.next_seq = self.absent_seq = 0
        self.rng = np.random.default_rng([seed, me])
        self.errors = []
        self.big_body = self.pattern[STAMP_BYTES:BIG_SIZE]
        self.small_body = self.pattern[STAMP_BYTES:SMALL_SIZE].tobytes()
        for offset, count, size in (
            (BIG_WRITE_OFFSET, BIG_BATCH, BIG_SIZE),
            (SMALL_WRITE_OFFSET, SMALL_BATCH, SMALL_SIZE),
        ):
            for slot in range(count):  # the slots' bodies; each put writes only the stamps
                start = offset + slot * size
                self.buffer[start : start + size] = self.pattern[:size]
        codes: list[int] = []
        for seq in range(shared):
            for kind, count, size in (
                ("shared-big", BIG_BATCH, BIG_SIZE),
                ("shared-small", SMALL_BATCH, SMALL_SIZE),
            ):
                codes.append(self._put(batch_keys(prefix, me, kind, seq, count), size)[0])
        for _ in range(window):
            codes += [self._put_window("big")[0], self._put_window("small")[0]]
        bad = [code for code in codes if code != 0]
        return {
            "written": shared * (BIG_BATCH + SMALL_BATCH) + window * (BIG_BATCH + SMALL_BATCH),
            "failed_batches": len(bad),
            "errors": [f"put_batch answered {code}" for code in bad[:ERROR_SAMPLES]],
        }

    def run(self, start_at: float, duration_s: float) -> dict[str, Any]:
        """Run the mixed loop (:data:`CYCLE`) from wall-clock ``start_at`` (``time.time()``)
        until ``duration_s`` seconds later; the call under way then is finished and counted.

        Returns: ``elapsed_s`` (the first call's start to the last call's end), ``cycles``
        (whole cycles), ``errors`` (samples) and ``types``: per call type id (the step names
        without ``_own`` / ``_other``) ``calls``, ``keys``, ``failures`` and ``times`` (s).
        Raises:
            ValueError: no round was preloaded.
        """
        if not self.prefix:
            raise ValueError("preload a round first")
        self.tallies = collections.defaultdict(_Tally)
        steps: dict[str, Callable[[], None]] = {
            "put_big": lambda: self._timed_put("big"),
            "put_small": lambda: self._timed_put("small"),
            "get_into_big_own": lambda: self._get_into_big(own=True),
            "get_into_big_other": lambda: self._get_into_big(own=False),
            "get_small_own": lambda: self._get_small(own=True),
            "get_small_other": lambda: self._get_small(own=False),
            "exist": self._exist,
            "remove": self._remove_oldest,
        }
        cycle = [steps[name] for name in CYCLE]
        delay = start_at - time.time()
        if delay > 0:
            time.sleep(delay)
        started = time.perf_counter()
        end = started + duration_s
        done = 0
        while time.perf_counter() < end:
            cycle[done % len(cycle)]()
            done += 1
        elapsed = time.perf_counter() - started
        return {
            "elapsed_s": elapsed,
            "cycles": done // len(cycle),
            "errors": self.errors[:ERROR_SAMPLES],
            "types": {name: tally.answer() for name, tally in self.tallies.items()},
        }

    def cleanup(self) -> dict[str, Any]:
        """Remove (forced) the round's shared and window keys; ``removed`` / ``failed``."""
        keys: list[str] = []
        for seq in range(self.shared):
            keys += batch_keys(self.prefix, self.me, "shared-big", seq, BIG_BATCH)
            keys += batch_keys(self.prefix, self.me, "shared-small", seq, SMALL_BATCH)
        for seq in self.window_big:
            keys += batch_keys(self.prefix, self.me, "big", seq, BIG_BATCH)
        for seq in self.window_small:
            keys += batch_keys(self.prefix, self.me, "small", seq, SMALL_BATCH)
        codes: list[int] = []
        for start in range(0, len(keys), REMOVE_CHUNK):
            codes += self.store.batch_remove(keys[start : start + REMOVE_CHUNK], True)
        self.window_big.clear()
        self.window_small.clear()
        self.prefix = ""
        failed = sum(code != 0 for code in codes)
        return {"removed": len(codes) - failed, "failed": failed}

    # -- the loop's steps ----------------------------------------------------------------------

    def _fail(self, type_id: str, count: int, what: str) -> None:
        self.tallies[type_id].failures += count
        if len(self.errors) < ERROR_SAMPLES:
            self.errors.append(f"{type_id}: {what}")

    def _record(self, type_id: str, elapsed: float, keys: int) -> _Tally:
        tally = self.tallies[type_id]
        tally.calls += 1
        tally.keys += keys
        tally.times.append(elapsed)
        return tally

    def _put(self, keys: Sequence[str], size: int) -> tuple[int, float]:
        """``put_batch`` of ``keys`` from the write slots (their bodies hold the pattern since
        :meth:`preload`; only the stamps are written here); returns the code and the time."""
        offset = BIG_WRITE_OFFSET if size == BIG_SIZE else SMALL_WRITE_OFFSET
        view = self.buffer.data
        values = []
        for slot, key in enumerate(keys):
            start = offset + slot * size
            self.buffer[start : start + STAMP_BYTES] = np.frombuffer(stamp(key), np.uint8)
            values.append(view[start : start + size])
        began = time.perf_counter()
        code = self.store.put_batch(list(keys), values)  # upstream answers one code per batch
        elapsed = time.perf_counter() - began
        return int(code), elapsed

    def _put_window(self, kind: str) -> tuple[int, float, int]:
        """Write the window's next batch of ``kind``; returns its code, time and key count."""
        seq = self.next_seq
        self.next_seq += 1
        count, size = (BIG_BATCH, BIG_SIZE) if kind == "big" else (SMALL_BATCH, SMALL_SIZE)
        code, elapsed = self._put(batch_keys(self.prefix, self.me, kind, seq, count), size)
        (self.window_big if kind == "big" else self.window_small).append(seq)
        return code, elapsed, count

    def _timed_put(self, kind: str) -> None:
        code, elapsed, count = self._put_window(kind)
        type_id = f"put_{kind}"
        self._record(type_id, elapsed, count)
        if code != 0:
            self._fail(type_id, count, f"put_batch answered {code}")

    def _source(self, own: bool, kind: str) -> tuple[int, str, int]:
        """Whose batch to read: ``(client, kind, seq)``; own: a live window batch, else a
        shared batch of another client (itself when it is alone)."""
        if own:
            window = self.window_big if kind == "big" else self.window_small
            return self.me, kind, window[int(self.rng.integers(len(window)))]
        other = self.me
        if self.clients > 1:
            other = (self.me + 1 + int(self.rng.integers(self.clients - 1))) % self.clients
        return other, f"shared-{kind}", int(self.rng.integers(self.shared))

    def _get_into_big(self, own: bool) -> None:
        client, kind, seq = self._source(own, "big")
        keys = batch_keys(self.prefix, client, kind, seq, BIG_BATCH)
        ptrs = [self.base + READ_OFFSET + slot * BIG_SIZE for slot in range(BIG_BATCH)]
        self.buffer[READ_OFFSET:] = 0  # a call that writes nothing cannot pass the check
        began = time.perf_counter()
        codes = self.store.batch_get_into(keys, ptrs, [BIG_SIZE] * BIG_BATCH)
        elapsed = time.perf_counter() - began
        self._record("get_into_big", elapsed, BIG_BATCH)
        for slot, (key, code) in enumerate(zip(keys, codes, strict=True)):
            start = READ_OFFSET + slot * BIG_SIZE
            value = self.buffer[start : start + BIG_SIZE]
            if code != BIG_SIZE:
                self._fail("get_into_big", 1, f"{key}: {code}")
            elif value[:STAMP_BYTES].tobytes() != stamp(key) or not np.array_equal(
                value[STAMP_BYTES:], self.big_body
            ):
                self._fail("get_into_big", 1, f"{key}: wrong bytes")

    def _get_small(self, own: bool) -> None:
        client, kind, seq = self._source(own, "small")
        keys = batch_keys(self.prefix, client, kind, seq, SMALL_BATCH)
        began = time.perf_counter()
        values = self.store.get_batch(keys)
        elapsed = time.perf_counter() - began
        self._record("get_small", elapsed, SMALL_BATCH)
        if len(values) != len(keys):
            self._fail("get_small", len(keys), f"{len(values)} values for {len(keys)} keys")
            return
        for key, value in zip(keys, values, strict=True):
            data = bytes(value)
            if len(data) != SMALL_SIZE:
                self._fail("get_small", 1, f"{key}: {len(data)} bytes")
            elif data[:STAMP_BYTES] != stamp(key) or data[STAMP_BYTES:] != self.small_body:
                self._fail("get_small", 1, f"{key}: wrong bytes")

    def _exist(self) -> None:
        client, kind, seq = self._source(False, "small")
        present = batch_keys(self.prefix, client, kind, seq, SMALL_BATCH)
        absent = batch_keys(self.prefix, self.me, "absent", self.absent_seq, ABSENT_PROBES)
        self.absent_seq += 1
        began = time.perf_counter()
        codes = self.store.batch_is_exist(present + absent)
        elapsed = time.perf_counter() - began
        self._record("exist", elapsed, len(present) + len(absent))
        expected = [1] * len(present) + [0] * len(absent)
        wrong = sum(code != want for code, want in zip(codes, expected, strict=False))
        wrong += abs(len(codes) - len(expected))
        if wrong:
            self._fail("exist", wrong, f"{wrong} of {len(expected)} answers wrong")

    def _remove_oldest(self) -> None:
        keys: list[str] = []
        if len(self.window_big) > self.window:
            keys += batch_keys(self.prefix, self.me, "big", self.window_big.popleft(), BIG_BATCH)
        if len(self.window_small) > self.window:
            seq = self.window_small.popleft()
            keys += batch_keys(self.prefix, self.me, "small", seq, SMALL_BATCH)
        if not keys:
            return
        began = time.perf_counter()
        codes = self.store.batch_remove(keys, True)
        elapsed = time.perf_counter() - began
        self._record("remove", elapsed, len(keys))
        bad = [code for code in codes if code != 0]
        if bad or len(codes) != len(keys):
            self._fail("remove", max(len(bad), 1), f"codes {sorted(set(bad))[:5]}")


def main(argv: list[str] | None = None) -> int:
    """Serve commands until ``quit`` or end of input; always close the store."""
    return serve_commands(ManyClientsWorker, COMMANDS, "many-clients benchmark client", argv)


if __name__ == "__main__":
    sys.exit(main())
