"""Prefaulted segments through the drop-in store's setup, against a real master: the segment a
store contributes is resident once setup returns (``prefault_segment``, default on), is left
to first writes with the setting off, and one larger than the memory available is mapped
lazily (a kernel's refusal to populate is tested in tests/unit/test_segment_prefault.py)."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mooncake_py import MooncakeDistributedStore
from mooncake_py.client.prefault import PREFAULT_ENV, available_memory
from mooncake_py.client.segment import MEMFD_PREFIX
from mooncake_py.testing import InProcessMaster

SEGMENT = 64 << 20


@pytest.fixture(scope="module")
def master() -> Iterator[InProcessMaster]:
    with InProcessMaster() as running:
        yield running


@pytest.fixture
def store() -> Iterator[MooncakeDistributedStore]:
    opened = MooncakeDistributedStore()
    yield opened
    opened.close()


def _config(master: InProcessMaster, size: int = SEGMENT, **extra: Any) -> dict[str, Any]:
    return {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": size,
        "local_buffer_size": 16 << 20,
        "master_server_address": master.address,
        **extra,
    }


def segment_rss() -> dict[str, int]:
    """Rss in bytes of each segment memfd mapped in this process, by its mapping's name."""
    found: dict[str, int] = {}
    name = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if "-" in fields[0] and not fields[0].endswith(":"):
            name = fields[5] if len(fields) == 6 else ""  # the path may hold spaces
        elif fields[0] == "Rss:" and f"/memfd:{MEMFD_PREFIX}" in name:
            found[name] = int(fields[1]) * 1024
    return found


def test_setup_populates_the_segment(
    master: InProcessMaster, store: MooncakeDistributedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PREFAULT_ENV, raising=False)
    before = segment_rss()
    assert store.setup(_config(master)) == 0
    new = {name: rss for name, rss in segment_rss().items() if name not in before}
    assert list(new.values()) == [SEGMENT]
    assert store.put("after-prefault", b"v" * 4096) == 0
    assert store.get("after-prefault") == b"v" * 4096


@pytest.mark.parametrize("how", ["key", "env"])
def test_setup_with_prefault_off_maps_lazily(
    how: str,
    master: InProcessMaster,
    store: MooncakeDistributedStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PREFAULT_ENV, raising=False)
    extra: dict[str, Any] = {}
    if how == "key":
        extra["prefault_segment"] = False
    else:
        monkeypatch.setenv(PREFAULT_ENV, "0")
    before = segment_rss()
    assert store.setup(_config(master, **extra)) == 0
    new = {name: rss for name, rss in segment_rss().items() if name not in before}
    assert len(new) == 1
    assert next(iter(new.values())) < SEGMENT // 4
    value = os.urandom(1 << 20)
    assert store.put("lazy", value) == 0
    assert store.get("lazy") == value


def test_a_segment_larger_than_the_memory_sets_up_lazily(
    master: InProcessMaster, store: MooncakeDistributedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Twice the available memory: nothing can be populated, so nothing is (as before
    # segments were populated); the store works and holds only what is written.
    monkeypatch.delenv(PREFAULT_ENV, raising=False)
    available = available_memory()
    assert available is not None
    too_big = (available * 2 // mmap.PAGESIZE + 1) * mmap.PAGESIZE
    assert store.setup(_config(master, too_big)) == 0
    value = os.urandom(1 << 20)
    assert store.put("lazy-big", value) == 0
    assert store.get("lazy-big") == value
    assert sum(segment_rss().values()) < 64 << 20
    assert store.close() == 0
