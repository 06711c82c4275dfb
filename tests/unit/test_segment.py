"""Shared-memory segment files: permissions, removal, peer mappings and crash recovery."""

from __future__ import annotations

import os
import stat
import subprocess
import uuid
from pathlib import Path

from mooncake_py.client.segment import (
    SHM_DIR,
    SHM_PREFIX,
    LocalSegment,
    PeerMappings,
    remove_stale_segment_files,
)


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_local_segment_is_owner_only_and_removed_on_close() -> None:
    segment = LocalSegment(1 << 20)
    path = Path(segment.path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.name.startswith(f"{SHM_PREFIX}{os.getpid()}-")
    segment.view[:5] = b"hello"
    peers = PeerMappings()
    mapped = peers.get(segment.segment_id, segment.path, 5)
    assert mapped is not None and bytes(mapped.view[:5]) == b"hello"
    assert peers.prune() == []  # owner (this process) is alive
    peers.close()
    segment.close()
    assert not path.exists()


def test_files_of_dead_owners_are_removed_and_unmapped() -> None:
    path = SHM_DIR / f"{SHM_PREFIX}{_dead_pid()}-{uuid.uuid4()}"
    path.write_bytes(b"x" * 4096)
    peers = PeerMappings()
    assert peers.get("seg", str(path), 4096) is not None
    assert peers.prune() == ["seg"]
    assert not path.exists()
    path.write_bytes(b"y" * 4096)
    assert str(path) in remove_stale_segment_files()
    assert not path.exists()


def test_peer_mapping_refuses_paths_outside_the_segment_namespace(tmp_path: Path) -> None:
    outside = tmp_path / "file"
    outside.write_bytes(b"z" * 100)
    assert PeerMappings().get("seg", str(outside), 10) is None
    assert PeerMappings().get("seg", str(SHM_DIR / f"{SHM_PREFIX}missing"), 10) is None
