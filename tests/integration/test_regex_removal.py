"""Bulk removals against a real in-process master: a pathological pattern over the wire is
answered at once, and refused patterns get INVALID_PARAMS. (Other callers are served while a
removal runs: :mod:`tests.integration.test_master_fairness`.)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.errors import ErrorCode
from mooncake_py.master.state.objects import MAX_KEY_BYTES
from mooncake_py.testing import InProcessMaster
from tests.integration.test_master_fairness import _fill


@pytest.fixture
def master() -> Iterator[InProcessMaster]:
    # No timers: the filler "client" never pings, and must not be reaped.
    with InProcessMaster(background=False) as running:
        yield running
        running.service.check()


def test_removal_over_the_wire(master: InProcessMaster) -> None:
    keys = ["a" * (MAX_KEY_BYTES - 1) + "!", "aaa", "bbb"]
    _fill(master, keys)
    client = MasterClient(master.address)
    try:
        # Exponential for a backtracking engine over this 4096-byte key; linear for RE2 (the
        # unit tests check the growth).
        assert client.remove_by_regex("", "(a+)+$", False) == 1  # "aaa"
        assert client.remove_by_regex("", r"(a)\1", False) == ErrorCode.INVALID_PARAMS
        assert client.remove_by_regex("", "x" * 4097, False) == ErrorCode.INVALID_PARAMS
        assert client.remove_all("", False) == 2
    finally:
        client.close()
