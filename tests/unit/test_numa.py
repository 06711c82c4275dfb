"""bind_to_numa_node: the calling thread runs on the node's CPUs; bad nodes only warn."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from mooncake_py import bind_to_numa_node
from mooncake_py.numa import numa_nodes, parse_cpu_list


def test_cpu_lists_parse_as_the_kernel_writes_them() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("5") == {5}
    assert parse_cpu_list("") == set()
    with pytest.raises(ValueError):
        parse_cpu_list("3-1")


def _fake_nodes(tmp_path: Path, lists: dict[int, str]) -> Path:
    for node, cpus in lists.items():
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpus + "\n")
    (tmp_path / "online").write_text("0\n")  # not a node
    return tmp_path


def _in_a_thread(action: object) -> object:
    """Run ``action`` in a fresh thread (binding changes only the calling thread)."""
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(action()))  # type: ignore[operator]
    thread.start()
    thread.join()
    return out[0]


def test_binding_sets_the_calling_threads_cpus(tmp_path: Path) -> None:
    first = min(os.sched_getaffinity(0))
    root = _fake_nodes(tmp_path, {0: str(first), 1: "100000-100001"})
    assert numa_nodes(root) == [0, 1]

    def bind_and_look() -> tuple[bool, set[int]]:
        return bind_to_numa_node(0, root), os.sched_getaffinity(0)

    assert _in_a_thread(bind_and_look) == (True, {first})
    assert first in os.sched_getaffinity(0)  # this thread is untouched


@pytest.mark.parametrize("node", [7, -1, "0"])
def test_a_bad_node_warns_and_changes_nothing(
    tmp_path: Path, node: object, caplog: pytest.LogCaptureFixture
) -> None:
    root = _fake_nodes(tmp_path, {0: "0"})
    before = os.sched_getaffinity(0)
    with caplog.at_level(logging.WARNING, logger="mooncake_py.numa"):
        assert bind_to_numa_node(node, root) is False  # type: ignore[arg-type]
    assert "invalid NUMA node" in caplog.text
    assert os.sched_getaffinity(0) == before


def test_no_numa_information_or_no_usable_cpu_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="mooncake_py.numa"):
        assert bind_to_numa_node(0, tmp_path / "absent") is False
        assert bind_to_numa_node(0, _fake_nodes(tmp_path, {0: "100000"})) is False
    assert "not available" in caplog.text and "no CPU" in caplog.text


def test_the_real_node_zero_when_the_kernel_lists_it() -> None:
    if 0 not in numa_nodes():
        pytest.skip("this kernel lists no NUMA node 0")
    assert _in_a_thread(lambda: bind_to_numa_node(0)) is True
