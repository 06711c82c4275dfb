"""What TLS costs the TCP transfer path: plaintext vs TLS, same run, over loopback.

For each mode a master (in this process) and a segment-holder client process are started;
this process joins with ``MOONCAKE_PY_FORCE_TCP=1`` and no segment of its own, so every byte it
reads or writes crosses a transfer connection to the holder. Measured, as medians of
``--rounds`` repetitions:

- a batch of 32 values of 4 MiB read with ``batch_get_into`` and written with
  ``batch_put_from`` (then removed);
- one 4 KiB value read with ``get_into`` (``--small-reads`` times per round).

Usage: ``python -m tests.bench.tls_bench [--rounds N] [--small-reads N] [--modes plain,tls]``.
Prints one line per figure and mode.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ["MOONCAKE_PY_FORCE_TCP"] = "1"

from mooncake_py import MooncakeDistributedStore, ReplicateConfig  # noqa: E402
from mooncake_py.testing import InProcessMaster  # noqa: E402
from tests.conftest import ClientProcess, client_config  # noqa: E402
from tests.tls_certs import Pki  # noqa: E402

BATCH = 32
VALUE = 4 << 20
SMALL = 4096


def _modes(pki: Pki) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Mode -> (master overrides, client setup keys)."""
    client = {
        "tls_ca_file": pki.ca_file,
        "tls_cert_file": pki.client_cert,
        "tls_key_file": pki.client_key,
    }
    master = {"tls_cert_file": pki.cert_file, "tls_key_file": pki.key_file}
    return {"plain": ({}, {}), "tls": (master, client)}


def _measure(
    mode: str, master_overrides: dict[str, Any], keys: dict[str, Any], args: argparse.Namespace
) -> dict[str, float]:
    with InProcessMaster(**master_overrides) as master:
        holder = ClientProcess()
        try:
            setup = client_config(master.address, 512 << 20) | keys
            assert holder.call("setup", config=setup, buffer_bytes=BATCH * VALUE) == 0
            names = [f"{mode}-batch-{i}" for i in range(BATCH)]
            assert holder.call("put_from", keys=names, size=VALUE) == [0] * BATCH
            assert holder.call("put", key=f"{mode}-small", size=SMALL) == 0
            store = MooncakeDistributedStore()
            assert store.setup(client_config(master.address, 0) | keys) == 0
            try:
                return _rounds(store, mode, names, args)
            finally:
                store.close()
        finally:
            holder.stop()


def _rounds(
    store: MooncakeDistributedStore, mode: str, names: list[str], args: argparse.Namespace
) -> dict[str, float]:
    buffer = np.zeros(BATCH * VALUE, dtype=np.uint8)
    base = buffer.ctypes.data
    assert store.register_buffer(base, buffer.nbytes) == 0
    ptrs = [base + i * VALUE for i in range(BATCH)]
    sizes = [VALUE] * BATCH
    reads, writes, small = [], [], []
    for round_index in range(args.rounds):
        start = time.perf_counter()
        assert store.batch_get_into(names, ptrs, sizes) == sizes
        reads.append(time.perf_counter() - start)
        fresh = [f"{name}-w{round_index}" for name in names]
        start = time.perf_counter()
        assert store.batch_put_from(fresh, ptrs, sizes, ReplicateConfig()) == [0] * BATCH
        writes.append(time.perf_counter() - start)
        store.batch_remove(fresh, True)
        start = time.perf_counter()
        for _ in range(args.small_reads):
            assert store.get_into(f"{mode}-small", base, SMALL) == SMALL
        small.append((time.perf_counter() - start) / args.small_reads)
    store.unregister_buffer(base)
    return {
        "batch_read_ms": statistics.median(reads) * 1e3,
        "batch_write_ms": statistics.median(writes) * 1e3,
        "read_4k_us": statistics.median(small) * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--small-reads", type=int, default=300)
    parser.add_argument("--modes", default="plain,tls")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        modes = _modes(Pki(Path(scratch)))
        for mode in args.modes.split(","):
            master_overrides, keys = modes[mode]
            figures = _measure(mode, master_overrides, keys, args)
            gbps = BATCH * VALUE / (figures["batch_read_ms"] / 1e3) / 1e9
            print(
                f"{mode:5}  32x4MiB batch_get_into {figures['batch_read_ms']:7.1f} ms "
                f"({gbps:4.2f} GB/s)  batch_put_from {figures['batch_write_ms']:7.1f} ms  "
                f"4KiB get_into {figures['read_4k_us']:6.1f} us",
                flush=True,
            )


if __name__ == "__main__":
    main()
