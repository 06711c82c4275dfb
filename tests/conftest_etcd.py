"""Fixtures with real etcd: ``etcd_server`` (one member) and ``etcd_cluster`` (three).

Both skip when etcd is not installed, and fail instead when ``MOONCAKE_PY_REQUIRE_ETCD=1``
(see :mod:`tests.etcd_server`). ``tests/conftest.py`` imports them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.etcd_server import EtcdCluster, EtcdServer


@pytest.fixture
def etcd_server() -> Iterator[EtcdServer]:
    """A fresh single-member etcd on free loopback ports, killed and removed afterwards."""
    with EtcdServer() as server:
        yield server


@pytest.fixture
def etcd_cluster() -> Iterator[EtcdCluster]:
    """A fresh three-member etcd cluster on loopback, killed and removed afterwards."""
    with EtcdCluster(3) as cluster:
        yield cluster
