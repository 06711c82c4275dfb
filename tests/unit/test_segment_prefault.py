"""Prefaulted segments: the owner's pages are resident after creation, peers' page tables are
filled when the pages exist, and a segment that cannot be populated fails cleanly."""

from __future__ import annotations

import logging
import mmap
import os
from pathlib import Path

import pytest

from mooncake_py.client import segment as segment_module
from mooncake_py.client.config import ClientConfig, ClientConfigError
from mooncake_py.client.prefault import (
    POPULATE_CHUNK_BYTES,
    PREFAULT_ENV,
    SegmentMemoryError,
    _headroom_of,
    available_memory,
    memory_shortfall,
    populate,
)
from mooncake_py.client.segment import MEMFD_PREFIX, LocalSegment, MappedMemory
from mooncake_py.errors import ErrorCode

SIZE = 32 << 20


def resident_bytes(address: int) -> int:
    """Rss of the mapping of this process that starts at ``address`` (``/proc/self/smaps``)."""
    start = f"{address:x}-"
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split(maxsplit=1)[0]
        if "-" in first and not first.endswith(":"):
            inside = first.startswith(start)
        elif inside and first == "Rss:":
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping starts at {address:#x}")


def allocated_bytes(fd: int) -> int:
    return os.fstat(fd).st_blocks * 512


def segment_memfds() -> list[str]:
    names = []
    for entry in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:
            continue
        if target.startswith(f"/memfd:{MEMFD_PREFIX}"):
            names.append(target)
    return names


def test_a_prefaulted_segment_is_resident_and_allocated() -> None:
    segment = LocalSegment(SIZE)
    try:
        assert segment.populated_by in ("madvise", "touch")
        assert resident_bytes(segment.address) == SIZE
        assert allocated_bytes(segment.fd) >= SIZE
        assert bytes(segment.view[SIZE - 8 :]) == bytes(8)  # still zero-filled
        segment.view[:5] = b"hello"
        assert os.pread(segment.fd, 5, 0) == b"hello"
    finally:
        segment.close()


def test_without_prefault_the_pages_come_on_first_write() -> None:
    segment = LocalSegment(SIZE, prefault=False)
    try:
        assert segment.populated_by == ""
        assert resident_bytes(segment.address) < SIZE // 8
        assert allocated_bytes(segment.fd) < SIZE // 8
        segment.view[: 1 << 20] = b"x" * (1 << 20)
        assert resident_bytes(segment.address) >= 1 << 20
        assert resident_bytes(segment.address) < SIZE // 2
    finally:
        segment.close()


def test_a_peer_mapping_of_a_populated_segment_gets_its_page_tables_at_once() -> None:
    segment = LocalSegment(SIZE)
    try:
        peer = MappedMemory(segment.fd, SIZE)
        try:
            assert peer.page_tables_populated
            assert resident_bytes(peer.address) == SIZE
        finally:
            peer.close()
    finally:
        segment.close()


def test_a_peer_maps_a_segment_above_the_populate_limit_lazily(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(segment_module, "PEER_POPULATE_MAX_BYTES", SIZE // 2)
    segment = LocalSegment(SIZE)
    try:
        peer = MappedMemory(segment.fd, SIZE)
        try:
            assert not peer.page_tables_populated
            assert resident_bytes(peer.address) < SIZE // 8
        finally:
            peer.close()
    finally:
        segment.close()


def test_a_peer_mapping_of_a_lazy_segment_allocates_nothing() -> None:
    segment = LocalSegment(SIZE, prefault=False)
    try:
        peer = MappedMemory(segment.fd, SIZE)
        try:
            assert not peer.page_tables_populated
            assert resident_bytes(peer.address) < SIZE // 8
            assert allocated_bytes(segment.fd) < SIZE // 8  # not charged to the peer
            peer.view[:4] = b"peer"
            assert bytes(segment.view[:4]) == b"peer"
        finally:
            peer.close()
    finally:
        segment.close()


def test_a_segment_larger_than_the_available_memory_is_mapped_lazily(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # As before segments were populated: overcommit, the pages come on first write.
    available = available_memory()
    assert available is not None and available > 0
    too_big = (available * 2 // mmap.PAGESIZE + 1) * mmap.PAGESIZE
    assert memory_shortfall(too_big) and memory_shortfall(SIZE) == ""
    with caplog.at_level(logging.WARNING, logger="mooncake_py.client.segment"):
        segment = LocalSegment(too_big)
    try:
        assert segment.populated_by == ""
        assert "mapping it lazily" in caplog.text
        segment.view[:4] = b"lazy"
        assert bytes(segment.view[:4]) == b"lazy"
    finally:
        segment.close()


def test_cgroup_headroom_does_not_count_reclaimable_page_cache(tmp_path: Path) -> None:
    gib = 1 << 30
    (tmp_path / "memory.max").write_text(f"{4 * gib}\n")
    (tmp_path / "memory.current").write_text(f"{3 * gib}\n")
    (tmp_path / "memory.stat").write_text(f"anon {gib // 2}\ninactive_file {5 * gib // 2}\n")
    assert _headroom_of(tmp_path, "memory.max", "memory.current") == 4 * gib - gib // 2
    (tmp_path / "memory.stat").unlink()
    assert _headroom_of(tmp_path, "memory.max", "memory.current") == gib
    (tmp_path / "memory.max").write_text("max\n")
    assert _headroom_of(tmp_path, "memory.max", "memory.current") is None


def test_a_range_the_kernel_cannot_populate_is_reported() -> None:
    # A mapping reaching past the end of its file: populating the tail would raise SIGBUS on
    # touch, and MADV_POPULATE_WRITE reports it (EFAULT) instead.
    fd = os.memfd_create("prefault-test", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 4 * mmap.PAGESIZE)
        memory = MappedMemory(fd, 4 * mmap.PAGESIZE, map_populate=False)
        try:
            os.ftruncate(fd, mmap.PAGESIZE)
            with pytest.raises(SegmentMemoryError) as caught:
                populate(memory._mapping, memory.address)
            assert caught.value.code == ErrorCode.INTERNAL_ERROR
            assert "at byte 0 of" in str(caught.value)
        finally:
            memory.close()
    finally:
        os.close(fd)


def test_prefault_segment_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PREFAULT_ENV, raising=False)
    assert ClientConfig().prefault_segment
    assert ClientConfig.from_mapping({}).prefault_segment
    assert not ClientConfig.from_mapping({"prefault_segment": "false"}).prefault_segment
    assert not ClientConfig.from_mapping({"prefault_segment": False}).prefault_segment
    monkeypatch.setenv(PREFAULT_ENV, "0")
    assert not ClientConfig.from_mapping({}).prefault_segment
    assert ClientConfig.from_mapping({"prefault_segment": "on"}).prefault_segment
    monkeypatch.setenv(PREFAULT_ENV, "")
    assert ClientConfig.from_mapping({}).prefault_segment  # empty keeps the default
    monkeypatch.setenv(PREFAULT_ENV, "maybe")
    with pytest.raises(ClientConfigError):
        ClientConfig.from_mapping({})
    with pytest.raises(ClientConfigError):
        ClientConfig.from_mapping({"prefault_segment": "maybe"})


def test_a_failure_in_a_later_chunk_is_reported_with_its_offset() -> None:
    # The first chunk populates; a later one, past the end of the file, fails in a worker.
    chunk = POPULATE_CHUNK_BYTES
    fd = os.memfd_create("prefault-test", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 3 * chunk)
        memory = MappedMemory(fd, 3 * chunk, map_populate=False)
        try:
            os.ftruncate(fd, chunk + mmap.PAGESIZE)
            with pytest.raises(SegmentMemoryError) as caught:
                populate(memory._mapping, memory.address)
            assert f"at byte {chunk} of {3 * chunk}" in str(caught.value)
            assert resident_bytes(memory.address) >= chunk  # the first chunk was populated
        finally:
            memory.close()
    finally:
        os.close(fd)
