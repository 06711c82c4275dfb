"""A client process for the disk tier tests: ``client_worker``'s operations plus what a test
needs to see of a segment owner's disk tier, and a writer mode that reports each acknowledged
put as it happens (so a test that kills it knows what was acknowledged).

Line mode (no arguments): requests and answers as in ``client_worker.py``.

Writer mode (``writer CONFIG_JSON PREFIX SIZE COUNT``): sets up a store with ``CONFIG_JSON``,
prints ``ready`` (or ``setup-failed <code>`` and exits 1), then puts ``PREFIX<i>`` for ``i`` in
``0..COUNT-1`` with :func:`~tests.integration.client_worker.value_for` content, printing
``ack <key>`` after each put the store answered 0 and ``fail <key> <code>`` otherwise, then
``done``. Every line is flushed before the next put starts, so a line the test read is a put the
store acknowledged; a put in flight at a kill has printed nothing.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from mooncake_py import MooncakeDistributedStore
from mooncake_py.client.disk_tier_dir import OBJECTS_DIR
from tests.integration.client_worker import Worker, digest, main, value_for

MISS = ""
"""What :meth:`DiskHostWorker.op_digests` answers for a key that read nothing."""
READ_CHUNK = 128
"""Keys one ``get_batch`` of :meth:`DiskHostWorker.op_batch_digests` reads."""


class DiskHostWorker(Worker):
    """A store that may own a segment and a disk tier (both set up by ``setup``)."""

    def op_tier(self) -> dict[str, Any] | None:
        """The disk tier's identifiers and counters, or None without one."""
        core = self.store.client._core  # noqa: SLF001 - the tier's ids are internal
        disk = core.disk
        if disk is None:
            return None
        objects = os.path.join(disk.store.directory, OBJECTS_DIR)
        return {
            "client_id": core.client_id,
            "memory_segment_id": core.segments()[0].id,
            "disk_segment_id": disk.info.id,
            "endpoint": disk.info.te_endpoint,
            "directory": disk.store.directory,
            "files": sorted(os.listdir(objects)) if os.path.isdir(objects) else [],
            "spilled": disk.spilled,
            "promoted": disk.promoted,
            "deleted": disk.deleted,
            "failed": disk.failed,
        }

    def op_put_many(self, keys: list[str], size: int) -> list[int]:
        """One put per key, in order; the codes."""
        return [self.store.put(key, value_for(key, size)) for key in keys]

    def op_remove(self, key: str) -> int:
        """``remove(key, force=True)``."""
        return self.store.remove(key, force=True)

    def op_digests(self, keys: list[str]) -> list[str]:
        """Per key the digest of what ``get`` read, or :data:`MISS` when it read nothing."""
        return _digests_of([self.store.get(key) for key in keys])

    def op_batch_digests(self, keys: list[str]) -> list[str]:
        """:meth:`op_digests` through ``get_batch``, :data:`READ_CHUNK` keys at a time."""
        out: list[str] = []
        for start in range(0, len(keys), READ_CHUNK):
            out += _digests_of(self.store.get_batch(keys[start : start + READ_CHUNK]))
        return out


def _digests_of(values: list[bytes]) -> list[str]:
    return [digest(value) if value else MISS for value in values]


def write_until_done(config: dict[str, Any], prefix: str, size: int, count: int) -> int:
    """Writer mode (see the module docstring); the process's exit status."""
    store = MooncakeDistributedStore()
    code = store.setup(config)
    if code != 0:
        print(f"setup-failed {code}", flush=True)
        return 1
    print("ready", flush=True)
    for i in range(count):
        key = f"{prefix}{i}"
        code = store.put(key, value_for(key, size))
        print(f"ack {key}" if code == 0 else f"fail {key} {code}", flush=True)
    print("done", flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "writer":
        _, _, raw_config, raw_prefix, raw_size, raw_count = sys.argv
        sys.exit(
            write_until_done(json.loads(raw_config), raw_prefix, int(raw_size), int(raw_count))
        )
    main(DiskHostWorker())
