"""The disk tier with real processes: a segment owner (a child process with a 32 MiB segment
and its disk tier on real files), a writer (this process, through the drop-in
``MooncakeDistributedStore``, contributing no memory) and a reader (another child, no segment),
all on 127.0.0.1 against an in-process master.

Objects the master evicts from the owner's memory are spilled to files and stay readable from
the reader byte-exact; removal, upsert and session release free their files; descriptors tell
disk replicas from memory ones; a disk-only object read while memory has room is promoted; a
pinned session's objects stay in memory; a master with the tier disabled refuses the mount and
evicts as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mooncake_py import MooncakeDistributedStore, ReplicateConfig
from mooncake_py.client.disk_format import file_name
from mooncake_py.testing import InProcessMaster, wait_until
from tests.integration.client_worker import digest, value_for
from tests.integration.disk_host_worker import MISS
from tests.integration.disk_tier_rig import (
    MIB,
    DiskHostProcess,
    expected_digest,
    host_config,
    object_files,
    reader_config,
)

SEGMENT_BYTES = 32 * MIB
QUOTA_BYTES = 512 * MIB
# Enough 1 MiB objects written after a key to push it out of a 32 MiB segment, whatever the
# eviction pass sizes.
FILLER = 48


@dataclass
class World:
    master: InProcessMaster
    tier_root: Path
    host: DiskHostProcess
    reader: DiskHostProcess
    writer: MooncakeDistributedStore

    def stats(self) -> dict[str, Any]:
        return self.master.service.stats()

    def idle(self) -> None:
        """Wait until no disk task runs and every freed file's deletion was handed out and
        done by the owner."""

        def settled() -> bool:
            stats = self.stats()
            return stats["disk_tasks"] == 0 and stats["disk_deletes_pending"] == 0

        wait_until(settled, 15, what="the disk tier is idle")

    def put(self, keys: list[str]) -> None:
        for key in keys:
            assert self.writer.put(key, value_for(key, MIB)) == 0, key

    def push_out(self, prefix: str) -> list[str]:
        """Write :data:`FILLER` objects so that everything written before leaves memory; the
        filler keys."""
        keys = [f"{prefix}-filler-{i}" for i in range(FILLER)]
        self.put(keys)
        self.idle()
        return keys

    def file_of(self, key: str) -> Path:
        """The file of ``key``'s disk replica (from its descriptor)."""
        [disk] = [d for d in self.writer.get_replica_desc(key) if d.is_disk_replica()]
        offset = int(disk.get_disk_descriptor().file_path.rsplit(":", 1)[1], 16)
        [path] = [p for p in object_files(self.tier_root) if p.name == file_name(offset)]
        return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with _world(tmp_path_factory.mktemp("disk-tier")) as made:
        yield made


@contextlib.contextmanager
def _world(base: Path, **master_overrides: Any) -> Iterator[World]:
    """A master (with ``master_overrides``), a segment host with a tier, a reader, a writer."""
    tier_root = base / "tier"
    with InProcessMaster(**master_overrides) as master:
        host = DiskHostProcess(base / "host.log")
        reader = DiskHostProcess(base / "reader.log")
        writer = MooncakeDistributedStore()
        try:
            config = host_config(
                master.address, SEGMENT_BYTES, tier_root, ssd_offload_quota=QUOTA_BYTES
            )
            assert host.call("setup", config=config, buffer_bytes=0) == 0
            assert reader.call("setup", config=reader_config(master.address), buffer_bytes=0) == 0
            assert writer.setup(reader_config(master.address)) == 0
            yield World(master, tier_root, host, reader, writer)
        finally:
            writer.close()
            reader.stop()
            host.stop()
        master.service.check()


@pytest.fixture(autouse=True)
def empty_store(world: World) -> Iterator[None]:
    """Each test starts and ends with no object and no object file."""
    yield
    world.writer.remove_all(force=True)
    wait_until(
        lambda: world.stats()["disk_used_bytes"] == 0 and not object_files(world.tier_root),
        15,
        what="every object file is deleted",
    )
    world.master.service.check()


def test_128_objects_through_a_32_mib_segment_read_back_from_another_process(
    world: World,
) -> None:
    keys = [f"done-{i}" for i in range(128)]
    before = world.stats()
    codes = [world.writer.put(key, value_for(key, MIB)) for key in keys]
    assert codes.count(0) == len(keys), [c for c in codes if c != 0][:5]
    world.idle()
    stats = world.stats()
    assert stats["disk_segments"] == 1 and stats["disk_capacity_bytes"] == QUOTA_BYTES
    # At most 32 of the 128 objects fit in memory: the others are on disk.
    on_disk_at_least = len(keys) - SEGMENT_BYTES // MIB
    assert stats["spilled_objects"] - before["spilled_objects"] >= on_disk_at_least, stats
    assert stats["disk_used_bytes"] >= on_disk_at_least * MIB, stats
    assert stats["spill_failures"] == 0
    assert world.reader.call("digests", keys=keys) == [expected_digest(k) for k in keys]
    assert world.stats()["disk_hits"] - before["disk_hits"] >= on_disk_at_least
    tier = world.host.call("tier")
    assert tier["spilled"] >= stats["spilled_objects"] and tier["failed"] == 0
    assert len(object_files(world.tier_root)) > 0
    world.master.service.check()

    assert world.writer.remove_all() == len(keys)
    wait_until(
        lambda: world.stats()["disk_used_bytes"] == 0 and not object_files(world.tier_root),
        15,
        what="remove_all deletes every object file",
    )
    assert world.stats()["objects"] == 0


def test_batches_under_pressure_all_succeed_and_read_back(world: World) -> None:
    keys = [f"batch-{i}" for i in range(96)]
    for start in range(0, len(keys), 16):
        chunk = keys[start : start + 16]
        assert world.writer.put_batch(chunk, [value_for(k, MIB) for k in chunk]) == 0
    world.idle()
    assert world.stats()["spilled_objects"] > 0
    values = world.writer.get_batch(keys)
    bad = [k for k, v in zip(keys, values, strict=True) if v != value_for(k, MIB)]
    assert bad == []
    assert world.reader.call("digests", keys=keys[:32]) == [expected_digest(k) for k in keys[:32]]


def test_descriptors_tell_a_disk_only_object_from_a_memory_one(world: World) -> None:
    world.put(["desc-old"])
    world.push_out("desc")
    world.put(["desc-new"])
    found = world.writer.batch_get_replica_desc(["desc-old", "desc-new"])
    old, new = found["desc-old"], found["desc-new"]
    assert old and all(d.is_disk_replica() and not d.is_memory_replica() for d in old), old
    assert old[0].get_disk_descriptor().object_size == MIB
    with pytest.raises(RuntimeError):
        old[0].get_memory_descriptor()
    assert new and new[0].is_memory_replica() and not new[0].is_disk_replica(), new
    assert world.writer.get_replica_desc("desc-old")  # still there for the single-key call


def test_upsert_of_an_object_on_disk_serves_the_new_value_and_deletes_the_old_file(
    world: World,
) -> None:
    world.put(["upsert-me"])
    world.push_out("upsert")
    old_file = world.file_of("upsert-me")
    fresh = b"\x5a" * MIB
    assert world.writer.upsert("upsert-me", fresh) == 0
    assert world.writer.get("upsert-me") == fresh
    assert world.reader.call("digests", keys=["upsert-me"]) == [digest(fresh)]
    wait_until(lambda: not old_file.exists(), 15, what="the old value's file is deleted")


def test_remove_of_a_disk_only_object_deletes_its_file(world: World) -> None:
    world.put(["remove-me"])
    world.push_out("remove")
    path = world.file_of("remove-me")
    used = world.stats()["disk_used_bytes"]
    assert world.writer.remove("remove-me", force=True) == 0
    assert world.reader.call("digests", keys=["remove-me"]) == [MISS]
    assert world.stats()["disk_used_bytes"] <= used - MIB
    wait_until(lambda: not path.exists(), 15, what="the removed object's file is deleted")


def test_a_disk_only_object_read_while_memory_has_room_is_promoted(world: World) -> None:
    world.put(["promote-me"])
    fillers = world.push_out("promote")
    assert world.writer.batch_remove(fillers, force=True) == [0] * len(fillers)
    world.idle()
    before = world.stats()
    assert world.reader.call("digests", keys=["promote-me"]) == [expected_digest("promote-me")]
    after = world.stats()
    assert after["disk_hits"] == before["disk_hits"] + 1  # that read was served from disk
    wait_until(
        lambda: world.stats()["promoted_objects"] > before["promoted_objects"],
        15,
        what="the object is promoted",
    )
    descriptors = world.writer.get_replica_desc("promote-me")
    assert descriptors[0].is_memory_replica(), descriptors
    assert world.reader.call("digests", keys=["promote-me"]) == [expected_digest("promote-me")]
    assert world.stats()["disk_hits"] == after["disk_hits"]  # now read from memory


def test_the_offload_read_count_counts_reads_served_from_disk(world: World) -> None:
    """Upstream's ``get_offload_rpc_read_count``: up by one for a read of a disk-only object,
    unchanged for a read once the object is back in memory."""
    world.put(["counted"])
    fillers = world.push_out("counted")
    assert world.writer.batch_remove(fillers, force=True) == [0] * len(fillers)
    world.idle()
    reads = world.writer.get_offload_rpc_read_count()
    promoted = world.stats()["promoted_objects"]
    assert world.writer.get("counted") == value_for("counted", MIB)
    assert world.writer.get_offload_rpc_read_count() == reads + 1
    wait_until(
        lambda: world.stats()["promoted_objects"] > promoted, 15, what="the object is promoted"
    )
    assert world.writer.get("counted") == value_for("counted", MIB)
    assert world.writer.get_offload_rpc_read_count() == reads + 1


def test_releasing_a_session_on_disk_reports_the_disk_bytes_freed(world: World) -> None:
    members = [f"session-{i}" for i in range(8)]
    tagged = ReplicateConfig(kv_sessions=[["on-disk"]] * len(members))
    assert world.writer.put_batch(members, [value_for(k, MIB) for k in members], tagged) == 0
    world.push_out("session")
    files_before = len(object_files(world.tier_root))
    released = world.writer.release_kv_session("on-disk")
    assert released.released_objects == len(members), released
    assert released.freed_disk_bytes == len(members) * MIB, released
    assert world.writer.get_batch(members) == [b""] * len(members)
    wait_until(
        lambda: len(object_files(world.tier_root)) <= files_before - len(members),
        15,
        what="the released members' files are deleted",
    )


def test_a_pinned_sessions_objects_stay_in_memory_while_unpinned_ones_spill(
    tmp_path: Path,
) -> None:
    # Soft-pinned objects (a pinned session's among them) are only evicted last by default:
    # when a pass finds too few others (say, most of them spilling on a slow disk), it takes
    # them too. With that fallback off, the protection is absolute and the test exact.
    with _world(tmp_path, allow_evict_soft_pinned_objects=False) as world:
        _pinned_session_stays_in_memory(world)


def _pinned_session_stays_in_memory(world: World) -> None:
    pinned = [f"pinned-{i}" for i in range(4)]
    tagged = ReplicateConfig(kv_sessions=[["pinned"]] * len(pinned))
    assert world.writer.put_batch(pinned, [value_for(k, MIB) for k in pinned], tagged) == 0
    assert world.writer.pin_kv_session("pinned") == 0
    world.put(["unpinned"])
    world.push_out("pinned")
    found = world.writer.batch_get_replica_desc([*pinned, "unpinned"])
    for key in pinned:
        assert all(d.is_memory_replica() for d in found[key]), (key, found[key])
    assert found["unpinned"][0].is_disk_replica(), found["unpinned"]
    assert world.writer.get_batch(pinned) == [value_for(k, MIB) for k in pinned]
    world.writer.unpin_kv_session("pinned")


def test_with_the_tier_disabled_on_the_master_evictions_drop_objects(tmp_path: Path) -> None:
    tier_root = tmp_path / "tier"
    with InProcessMaster(enable_offload=False) as master:
        host = DiskHostProcess(tmp_path / "host.log")
        writer = MooncakeDistributedStore()
        try:
            config = host_config(master.address, SEGMENT_BYTES, tier_root)
            assert host.call("setup", config=config, buffer_bytes=0) == 0
            assert "refused the disk tier" in host.log_text()
            assert host.call("tier") is None
            assert writer.setup(reader_config(master.address)) == 0
            keys = [f"dropped-{i}" for i in range(64)]
            assert [writer.put(k, value_for(k, MIB)) for k in keys] == [0] * len(keys)
            stats = master.service.stats()
            assert stats["disk_segments"] == 0 and stats["spills_started"] == 0
            assert stats["evicted_objects"] >= len(keys) - SEGMENT_BYTES // MIB
            assert writer.get(keys[0]) == b""
            assert writer.get(keys[-1]) == value_for(keys[-1], MIB)
            assert object_files(tier_root) == []
        finally:
            writer.close()
            host.stop()
        master.service.check()


def test_the_tier_can_be_set_up_from_the_environment_alone(tmp_path: Path) -> None:
    tier_root = tmp_path / "tier"
    env = {
        "MOONCAKE_OFFLOAD_ENABLED": "true",
        "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": str(tier_root),
        "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": str(QUOTA_BYTES),
        "MOONCAKE_PY_OFFLOAD_FSYNC": "false",
    }
    with InProcessMaster() as master:
        host = DiskHostProcess(tmp_path / "host.log", env=env)
        writer = MooncakeDistributedStore()
        try:
            config = {**reader_config(master.address), "global_segment_size": SEGMENT_BYTES}
            assert host.call("setup", config=config, buffer_bytes=0) == 0
            assert master.service.stats()["disk_capacity_bytes"] == QUOTA_BYTES
            assert writer.setup(reader_config(master.address)) == 0
            keys = [f"env-{i}" for i in range(FILLER)]
            assert [writer.put(k, value_for(k, MIB)) for k in keys] == [0] * len(keys)
            wait_until(lambda: object_files(tier_root), 15, what="an object file is written")
            assert writer.get(keys[0]) == value_for(keys[0], MIB)
        finally:
            writer.close()
            host.stop()
        master.service.check()
