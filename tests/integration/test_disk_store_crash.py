"""The disk tier store survives SIGKILL at any moment.

A child process (this module run as a script) opens a DiskStore with fsync on and writes
batches of seeded random objects in a loop, their sizes and bytes derived from their offsets,
printing each batch's offsets once ``write_batch`` has returned. The test kills it with SIGKILL
at random moments, several rounds on one root (each round's child takes the directory over
and goes on). After every kill, a DiskStore opened on the root in the test process finds:
every entry byte-exact (tenant and key derived from the offset too), no staging file left, the
store's invariants holding, and every object of every batch a child reported done.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from mooncake_py.client.disk_store import DiskStore, DiskWrite

ROUNDS = 6
ROUND_SPAN = 1 << 40
"""Each round's child writes at offsets ``round * ROUND_SPAN`` onwards: offsets never repeat."""
FIRST_BATCH_TIMEOUT_S = 60.0


def size_of(offset: int) -> int:
    return random.Random(offset * 2 + 1).choice([1, 100, 4096, 65_536, 300_000])


def content_of(offset: int) -> bytes:
    return random.Random(offset).randbytes(size_of(offset))


def key_of(offset: int) -> str:
    return f"object-{offset:x}"


def tenant_of(offset: int) -> str:
    return f"tenant-{offset % 3}"


def child(root: str, first_offset: int, seed: int) -> None:
    """Write batches forever, printing ``done <offsets>`` after each batch returns."""
    rng = random.Random(seed)
    store = DiskStore(root, fsync=True)
    print("open", store.directory, flush=True)
    offset = first_offset
    while True:
        batch = []
        for _ in range(rng.randrange(1, 9)):
            data = content_of(offset)
            # A view of a larger buffer, as the owner's segment memory hands it over.
            segment = memoryview(bytearray(len(data) + 64))
            segment[32 : 32 + len(data)] = data
            batch.append(
                DiskWrite(offset, tenant_of(offset), key_of(offset), segment[32 : 32 + len(data)])
            )
            offset += len(data) + rng.randrange(0, 4096)
        results = store.write_batch(batch)
        if any(results):
            print("failed", results, flush=True)
            return
        print("done", *(write.offset for write in batch), flush=True)


def _run_round(root: str, number: int, rng: random.Random) -> tuple[list[int], str]:
    """Start a child, wait for its first batch, kill it at a random moment; returns the
    offsets it reported done and the directory it held."""
    process = subprocess.Popen(
        [sys.executable, __file__, root, str(number * ROUND_SPAN), str(rng.randrange(1 << 30))],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert process.stdout is not None
    try:
        ready = select.select([process.stdout], [], [], FIRST_BATCH_TIMEOUT_S)[0]
        assert ready, "the child printed nothing"
        opened = process.stdout.readline().decode().split()
        assert opened[0] == "open", opened
        first = process.stdout.readline().decode()
        assert first.startswith("done "), first
        time.sleep(rng.uniform(0.0, 0.4))  # the moment of death, anywhere in the write loop
    finally:
        process.send_signal(signal.SIGKILL)
        output = process.stdout.read().decode()
        process.wait()
    assert process.returncode == -signal.SIGKILL
    done = [int(o) for o in first.split()[1:]]
    lines = output.split("\n")
    for line in lines[:-1]:  # the last one may be cut short by the kill
        assert line.startswith("done "), line
        done.extend(int(o) for o in line.split()[1:])
    return done, opened[1]


def test_every_reported_batch_survives_sigkill_byte_exact(tmp_path: Path) -> None:
    root = str(tmp_path / "tier-root")
    rng = random.Random(1201)
    reported: set[int] = set()
    directories: set[str] = set()
    for number in range(ROUNDS):
        done, directory = _run_round(root, number, rng)
        reported.update(done)
        directories.add(directory)
        with DiskStore(root) as store:
            assert store.directory == directory  # the directory holding the files
            store.check()  # index == files, staging/ empty, used bytes summed
            assert os.listdir(os.path.join(store.directory, "staging")) == []
            entries = store.entries()
            found = {entry.offset for entry in entries}
            assert reported <= found, sorted(reported - found)[:5]
            for entry in entries:
                expected = content_of(entry.offset)
                assert (entry.size, entry.tenant, entry.key) == (
                    len(expected),
                    tenant_of(entry.offset),
                    key_of(entry.offset),
                )
                buffer = bytearray(entry.size)
                code = store.read_into(
                    entry.offset,
                    entry.size,
                    memoryview(buffer),
                    tenant=entry.tenant,
                    key=entry.key,
                )
                assert code == 0 and buffer == expected, entry
            # Unreported objects can only be a killed child's last batch: after all it reported.
            for offset in found - reported:
                span = offset // ROUND_SPAN
                assert all(offset > o for o in reported if o // ROUND_SPAN == span), offset
            assert store.take_quarantined() == []
    assert len(directories) == 1  # every child took the same directory over


if __name__ == "__main__":
    child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
