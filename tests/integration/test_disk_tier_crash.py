"""The disk tier across SIGKILLs of its owner, with real processes and real files.

A segment owner with a small segment and its disk tier (fsync on) writes under memory pressure,
so spills run all the time, and is killed with SIGKILL at a seeded random moment; a new owner
is started on the same ``ssd_offload_path`` once the master has dropped the dead one, and a
reader process reads every key ever acknowledged. Each read is a miss or exactly the bytes
written, never torn or foreign bytes; every object whose file was complete at the kill is
readable again (objects only in the dead owner's memory are lost, as upstream). A file damaged
while its owner is down is never served after the restart, and the master forgets it. An
object removed while its owner could not be told (frozen, then killed) does not come back. An
owner restarted at once, before the master has dropped its dead predecessor (``client_ttl``),
keeps its files too.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mooncake_py.client.disk_format import read_header
from mooncake_py.testing import InProcessMaster, wait_until
from tests.integration.client_worker import value_for
from tests.integration.disk_host_worker import MISS
from tests.integration.disk_tier_rig import (
    MIB,
    REPO_ROOT,
    DiskHostProcess,
    expected_digest,
    host_config,
    object_files,
    reader_config,
)

SEED = 20_261_201
ROUNDS = 4
SIZE = 64 * 1024
SEGMENT_BYTES = 4 * MIB  # 64 objects: the owner's memory is full after a fraction of a second
QUOTA_BYTES = 4 << 30  # never full here: no object leaves the disk for room
WRITES_PER_ROUND = 1_000_000  # more than a round ever writes before its kill
# The master drops a silent client after client_ttl; its reaper runs once a second. Clients
# ping every second, so live ones stay well inside 3 s.
CLIENT_TTL_S = 3.0


@dataclass
class WritingOwner:
    """A disk_host_worker in writer mode: a segment owner writing its own keys."""

    process: subprocess.Popen[str]
    acked: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    @classmethod
    def start(cls, config: dict[str, object], prefix: str, log: Path) -> WritingOwner:
        with open(log, "a") as stderr:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.integration.disk_host_worker",
                    "writer",
                    json.dumps(config),
                    prefix,
                    str(SIZE),
                    str(WRITES_PER_ROUND),
                ],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                cwd=REPO_ROOT,
            )
        owner = cls(process)
        assert process.stdout is not None
        ready = process.stdout.readline().strip()
        if ready != "ready":
            owner.kill()
            raise AssertionError(f"the owner did not set up: {ready!r}\n{log.read_text()}")
        owner._reader = threading.Thread(target=owner._collect, daemon=True)
        owner._reader.start()
        return owner

    def _collect(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.strip())
            if line.startswith("ack "):
                self.acked.append(line.split()[1])

    def kill(self) -> None:
        """SIGKILL, then take every line it printed before dying."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=10)


def complete_files(tier_root: Path) -> dict[str, bytes]:
    """Key -> payload of every file in the tiers' ``objects/`` (each must be complete)."""
    found: dict[str, bytes] = {}
    for path in object_files(tier_root):
        fd = os.open(path, os.O_RDONLY)
        try:
            length = os.fstat(fd).st_size
            header = read_header(fd, int(path.name, 16), length)
            assert header is not None, f"{path} in objects/ is not a complete object file"
            found[header.key] = os.pread(fd, header.payload_size, header.header_size)
        finally:
            os.close(fd)
    return found


def wait_until_dropped(master: InProcessMaster) -> None:
    """The master noticed the dead owner: its segments and every object they held are gone."""

    def dropped() -> bool:
        stats = master.service.stats()
        return stats["disk_segments"] == 0 and stats["objects"] == 0

    wait_until(dropped, CLIENT_TTL_S + 15, what="the master drops the killed owner")


def wait_for_spills(master: InProcessMaster, spilled_before: int) -> None:
    """The owner's memory is full and its objects spill."""
    wait_until(
        lambda: master.service.stats()["spilled_objects"] > spilled_before,
        30,
        what="the owner spills",
    )


def assert_never_wrong(keys: list[str], digests: list[str]) -> dict[str, bool]:
    """Each read is a miss or the exact value; key -> whether it was read."""
    wrong = [
        k for k, d in zip(keys, digests, strict=True) if d not in (MISS, expected_digest(k, SIZE))
    ]
    assert wrong == [], f"{len(wrong)} reads returned bytes other than written: {wrong[:5]}"
    return {k: d != MISS for k, d in zip(keys, digests, strict=True)}


@pytest.fixture
def reader_and_master(tmp_path: Path) -> Iterator[tuple[InProcessMaster, DiskHostProcess]]:
    with InProcessMaster(client_ttl=CLIENT_TTL_S) as master:
        reader = DiskHostProcess(tmp_path / "reader.log")
        try:
            assert reader.call("setup", config=reader_config(master.address), buffer_bytes=0) == 0
            yield master, reader
        finally:
            reader.stop()
        master.service.check()


def test_killed_owners_come_back_with_every_complete_file_and_never_serve_wrong_bytes(
    tmp_path: Path, reader_and_master: tuple[InProcessMaster, DiskHostProcess]
) -> None:
    master, reader = reader_and_master
    rng = random.Random(SEED)
    tier_root = tmp_path / "tier"
    config = host_config(
        master.address,
        SEGMENT_BYTES,
        tier_root,
        ssd_offload_quota=QUOTA_BYTES,
        ssd_offload_fsync=True,
    )
    ever: list[str] = []  # every key acknowledged, and each round's put in flight at the kill
    figures: list[dict[str, int]] = []
    owner = WritingOwner.start(config, "r0-", tmp_path / "owner-0.log")
    for round_number in range(ROUNDS):
        wait_for_spills(master, master.service.stats()["spilled_objects"])
        time.sleep(rng.uniform(0.05, 1.0))  # a seeded random moment of the write stream
        owner.kill()
        assert "done" not in owner.lines  # killed while writing
        prefix = f"r{round_number}-"
        in_flight = f"{prefix}{len(owner.acked)}"
        assert owner.acked == [f"{prefix}{i}" for i in range(len(owner.acked))]
        ever += [*owner.acked, in_flight]
        acked = len(owner.acked)
        on_disk = complete_files(tier_root)
        bad = [k for k, payload in on_disk.items() if payload != value_for(k, SIZE)]
        assert bad == [], f"complete files holding other bytes than written: {bad[:5]}"
        wait_until_dropped(master)

        # The restarted owner finds the files; it writes new keys while the reader checks.
        owner = WritingOwner.start(
            config, f"r{round_number + 1}-", tmp_path / f"owner-{round_number + 1}.log"
        )
        read = assert_never_wrong(ever, reader.call("batch_digests", keys=ever))
        lost_files = [k for k in on_disk if not read.get(k, False)]
        assert lost_files == [], f"complete files not readable after the restart: {lost_files[:5]}"
        came_back = [k for k in ever if k.startswith(prefix) and read[k]]
        assert came_back, f"nothing of round {round_number} came back"
        figures.append({"acked": acked, "files_at_kill": len(on_disk), "came_back": len(came_back)})
    owner.kill()
    stats = master.service.stats()
    print("rounds:", figures, "spilled:", stats["spilled_objects"])
    assert stats["spill_failures"] == 0


def test_a_file_damaged_while_its_owner_is_down_is_never_served(
    tmp_path: Path, reader_and_master: tuple[InProcessMaster, DiskHostProcess]
) -> None:
    master, reader = reader_and_master
    tier_root = tmp_path / "tier"
    config = host_config(master.address, SEGMENT_BYTES, tier_root, ssd_offload_quota=QUOTA_BYTES)
    owner = DiskHostProcess(tmp_path / "owner.log")
    keys = [f"damaged-{i}" for i in range(128)]
    try:
        assert owner.call("setup", config=config, buffer_bytes=0) == 0
        assert owner.call("put_many", keys=keys, size=SIZE) == [0] * len(keys)
        wait_until(lambda: master.service.stats()["disk_tasks"] == 0, 15, what="spills end")
    finally:
        owner.kill()
    wait_until_dropped(master)
    files = {k: p for p, k in _keys_of_files(tier_root).items()}
    assert len(files) >= 3, files
    payload_flipped, header_flipped, truncated = sorted(files)[:3]
    _flip_byte(files[payload_flipped], from_end=SIZE // 2)
    _flip_byte(files[header_flipped], from_start=8)
    with open(files[truncated], "r+b") as handle:
        handle.truncate(os.path.getsize(files[truncated]) - 1)
    damaged = [payload_flipped, header_flipped, truncated]

    restarted = DiskHostProcess(tmp_path / "restarted.log")
    try:
        assert restarted.call("setup", config=config, buffer_bytes=0) == 0
        for _ in range(2):  # the first read finds the damage, the second must not be luckier
            digests = reader.call("batch_digests", keys=keys)
            read = assert_never_wrong(keys, digests)
            assert [read[k] for k in damaged] == [False, False, False]
            intact = [k for k in files if k not in damaged]
            assert all(read[k] for k in intact), [k for k in intact if not read[k]]
        # The damaged files were never registered, or were dropped once a read found them out.
        wait_until(
            lambda: [reader.call("is_exist", key=k) for k in damaged] == [0, 0, 0],
            15,
            what="the master forgets the damaged objects",
        )
    finally:
        restarted.stop()


def _keys_of_files(tier_root: Path) -> dict[Path, str]:
    out: dict[Path, str] = {}
    for path in object_files(tier_root):
        fd = os.open(path, os.O_RDONLY)
        try:
            header = read_header(fd, int(path.name, 16), os.fstat(fd).st_size)
        finally:
            os.close(fd)
        assert header is not None
        out[path] = header.key
    return out


def _flip_byte(path: Path, from_start: int | None = None, from_end: int | None = None) -> None:
    size = os.path.getsize(path)
    position = from_start if from_start is not None else size - (from_end or 1)
    with open(path, "r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)
        handle.seek(position)
        handle.write(bytes([byte[0] ^ 0xFF]))


def test_an_owner_restarted_before_the_master_notices_the_kill_keeps_its_files(
    tmp_path: Path, reader_and_master: tuple[InProcessMaster, DiskHostProcess]
) -> None:
    master, reader = reader_and_master
    tier_root = tmp_path / "tier"
    config = host_config(master.address, SEGMENT_BYTES, tier_root, ssd_offload_quota=QUOTA_BYTES)
    owner = DiskHostProcess(tmp_path / "owner.log")
    keys = [f"quick-{i}" for i in range(128)]
    try:
        assert owner.call("setup", config=config, buffer_bytes=0) == 0
        assert owner.call("put_many", keys=keys, size=SIZE) == [0] * len(keys)
        wait_until(lambda: master.service.stats()["disk_tasks"] == 0, 15, what="spills end")
    finally:
        owner.kill()
    on_disk = complete_files(tier_root)
    assert len(on_disk) >= len(keys) // 2
    restarted = DiskHostProcess(tmp_path / "restarted.log")
    try:
        assert restarted.call("setup", config=config, buffer_bytes=0) == 0  # at once
        wait_until(
            lambda: master.service.stats()["disk_segments"] == 1,
            CLIENT_TTL_S + 15,
            what="the master drops the killed owner",
        )
        read = assert_never_wrong(keys, reader.call("batch_digests", keys=keys))
        lost = [k for k in on_disk if not read[k]]
        assert lost == [], f"{len(lost)} of {len(on_disk)} complete files lost"
    finally:
        restarted.stop()


def test_an_object_removed_before_a_kill_does_not_come_back(
    tmp_path: Path, reader_and_master: tuple[InProcessMaster, DiskHostProcess]
) -> None:
    master, reader = reader_and_master
    tier_root = tmp_path / "tier"
    config = host_config(master.address, SEGMENT_BYTES, tier_root, ssd_offload_quota=QUOTA_BYTES)
    owner = DiskHostProcess(tmp_path / "owner.log")
    keys = [f"gone-{i}" for i in range(128)]
    try:
        assert owner.call("setup", config=config, buffer_bytes=0) == 0
        assert owner.call("put_many", keys=keys, size=SIZE) == [0] * len(keys)
        wait_until(lambda: master.service.stats()["disk_tasks"] == 0, 15, what="spills end")
        removed = sorted(complete_files(tier_root))[0]
        # The owner is frozen, so it fetches no deletion; then it dies.
        os.kill(owner.pid, signal.SIGSTOP)
        assert reader.call("remove", key=removed) == 0
    finally:
        owner.kill()
    wait_until_dropped(master)
    restarted = DiskHostProcess(tmp_path / "restarted.log")
    try:
        assert restarted.call("setup", config=config, buffer_bytes=0) == 0
        assert reader.call("batch_digests", keys=[removed]) == [MISS], "a removed object is back"
        assert reader.call("is_exist", key=removed) == 0
    finally:
        restarted.stop()
