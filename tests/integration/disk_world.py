"""A real store with a disk tier, for the tests of the operator's views of it.

:func:`disk_client_config` sets a client up with ``enable_ssd_offload`` and a small quota;
:func:`fill_until_spilled` writes objects past its memory until the master has spilled some of
them to the disk tier and every disk task has finished. On a master without background work
(``InProcessMaster(background=False)``: spills then come from the writes' own evictions) the
figures then stand still while the test reads them.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from mooncake_py import MooncakeDistributedStore
from mooncake_py.testing import InProcessMaster
from tests.conftest import client_config

MEMORY_BYTES = 4 << 20
DISK_QUOTA = 64 << 20
OBJECT_BYTES = 256 << 10
WAIT_S = 30.0


def disk_client_config(address: str, root: str, memory_bytes: int = MEMORY_BYTES) -> dict[str, Any]:
    """A setup dict for a client of ``address`` with ``memory_bytes`` of memory and a disk
    tier of :data:`DISK_QUOTA` bytes under ``root``."""
    return {
        **client_config(address, memory_bytes),
        "enable_ssd_offload": True,
        "ssd_offload_path": root,
        "ssd_offload_quota": DISK_QUOTA,
    }


def payload(index: int, size: int = OBJECT_BYTES) -> bytes:
    """Distinct bytes for object ``index``."""
    block = hashlib.sha256(str(index).encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def settled(master: InProcessMaster) -> bool:
    """No disk task in flight and no freed disk file waiting for its owner."""
    stats = master.service.stats()
    return stats["disk_tasks"] == 0 and stats["disk_deletes_pending"] == 0


def wait_until_settled(master: InProcessMaster) -> dict[str, int]:
    """Wait (at most :data:`WAIT_S`) until :func:`settled`; the master's stats then.

    Raises:
        AssertionError: the disk tasks did not finish in time.
    """
    deadline = time.monotonic() + WAIT_S
    while not settled(master):
        assert time.monotonic() < deadline, master.service.stats()
        time.sleep(0.02)
    return master.service.stats()


def fill_until_spilled(
    master: InProcessMaster, store: MooncakeDistributedStore, prefix: str = "k", minimum: int = 1
) -> dict[str, int]:
    """Write objects of :data:`OBJECT_BYTES` under ``prefix`` until at least ``minimum`` have
    been spilled to the disk tier, then wait until every disk task is done.

    Returns:
        The master's stats once settled.

    Raises:
        AssertionError: a write failed, or nothing spilled within twice the memory's worth.
    """
    before = master.service.stats()["spilled_objects"]
    limit = 2 * MEMORY_BYTES // OBJECT_BYTES + minimum
    for index in range(limit):
        assert store.put(f"{prefix}{index}", payload(index)) == 0
        stats = wait_until_settled(master)
        if stats["spilled_objects"] - before >= minimum:
            return stats
    raise AssertionError(f"nothing spilled after {limit} writes: {master.service.stats()}")
