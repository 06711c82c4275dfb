"""The client of the master RSS benchmark, in its own process, driven by JSON lines on stdin.

Run as ``python -m tests.bench.master_rss_worker [--impl py|upstream]`` (upstream with the
interpreter of its own virtual environment). It is :class:`tests.bench.worker.Worker` (its
``setup``, ``put`` and ``remove`` commands, the values' stamps and pattern) plus one command:

- ``verify_sample``: read back a seeded random sample of the keys a ``put`` command wrote
  (``get_batch``) and compare every byte of each value with what was written.

Only numpy and the standard library are imported besides the store, so that the module runs in
upstream's virtual environment too. Thread-safety: one command at a time, from the main thread.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from tests.bench.worker import STAMP_BYTES, Worker, keys_of, serve_commands, stamp

COMMANDS = ("setup", "put", "remove", "verify_sample")
READ_CHUNK = 256
ERROR_SAMPLES = 20


def sample_indices(n: int, sample: int, seed: int) -> list[int]:
    """``min(sample, n)`` distinct indices of ``range(n)``, seeded, in ascending order.

    Always includes the first and the last index when ``sample >= 2``, so that both ends of a
    write are read back whatever the seed.
    """
    count = min(sample, n)
    if count <= 0:
        return []
    ends = [0, n - 1][:count] if n > 1 else [0]
    middle = np.random.default_rng(seed).choice(
        np.arange(1, n - 1), size=count - len(ends), replace=False
    )
    return sorted({*ends, *(int(i) for i in middle)})


class MasterRssWorker(Worker):
    """The inherited store client and buffer, plus :meth:`verify_sample`."""

    def verify_sample(
        self, prefix: str, n: int, size: int, sample: int, seed: int = 0
    ) -> dict[str, Any]:
        """Read ``sample`` of the ``n`` keys of ``prefix`` (written by ``put`` with ``size``)
        with ``get_batch`` and check each value's length, stamp and body byte for byte.

        Returns: ``checked`` (values read and found exact), ``error_count`` and ``errors``
        (samples: missing values, wrong lengths or bytes).
        Cost: O(sample x size) bytes compared, ``sample / 256`` calls.
        """
        keys = keys_of(prefix, n)
        wanted = [keys[i] for i in sample_indices(n, sample, seed)]
        body = self.pattern[STAMP_BYTES:size].tobytes()
        failures: list[str] = []
        checked = 0
        for start in range(0, len(wanted), READ_CHUNK):
            chunk = wanted[start : start + READ_CHUNK]
            values = self.store.get_batch(chunk)
            if len(values) != len(chunk):
                failures.append(f"get_batch answered {len(values)} values for {len(chunk)} keys")
                continue
            for key, value in zip(chunk, values, strict=True):
                data = bytes(value)
                if len(data) != size:
                    failures.append(f"{key}: {len(data)} bytes, not {size}")
                elif data[:STAMP_BYTES] != stamp(key) or data[STAMP_BYTES:] != body:
                    failures.append(f"{key}: wrong bytes")
                else:
                    checked += 1
        return {
            "checked": checked,
            "error_count": len(failures),
            "errors": failures[:ERROR_SAMPLES],
        }


def main(argv: list[str] | None = None) -> int:
    """Serve commands until ``quit`` or end of input; always close the store."""
    return serve_commands(MasterRssWorker, COMMANDS, "master RSS benchmark client", argv)


if __name__ == "__main__":
    sys.exit(main())
