"""copy_bytes: the client's memcpy, including its two-thread split and use after fork."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mooncake_py.client.data_plane import PARALLEL_COPY_MIN_BYTES, copy_bytes


@pytest.mark.parametrize("size", [1, 4095, 64 * 1024 + 7, PARALLEL_COPY_MIN_BYTES + 12345])
def test_copies_exactly_the_source(size: int) -> None:
    source = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    target = np.full(size + 16, 7, dtype=np.uint8)
    copy_bytes(memoryview(target), memoryview(source))
    assert np.array_equal(target[:size], source)
    assert (target[size:] == 7).all()  # nothing written past the source's length


def test_read_only_sources_are_copied_too() -> None:
    source = bytes(range(256)) * (PARALLEL_COPY_MIN_BYTES // 256 + 1)
    target = bytearray(len(source))
    copy_bytes(memoryview(target), memoryview(source))
    assert target == source


def test_a_forked_child_can_still_copy_large_values() -> None:
    source = np.ones(PARALLEL_COPY_MIN_BYTES * 2, dtype=np.uint8)
    copy_bytes(memoryview(np.zeros_like(source)), memoryview(source))  # starts the helper
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        target = np.zeros_like(source)
        copy_bytes(memoryview(target), memoryview(source))
        os._exit(0 if target.all() else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
