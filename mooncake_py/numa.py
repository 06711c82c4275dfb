"""NUMA placement of the calling thread, as upstream's module-level ``bind_to_numa_node``.

Upstream binds with libnuma: the calling thread runs on the node's CPUs
(``numa_run_on_node``) and prefers the node's memory for later allocations, falling back to
other nodes (``numa_set_bind_policy(0)`` + preferred node). This does the same without libnuma:
the CPU list comes from ``/sys/devices/system/node/node<N>/cpulist`` and goes to
``os.sched_setaffinity``; the memory preference is the ``set_mempolicy(MPOL_PREFERRED)``
system call on Linux x86_64 and aarch64. Like upstream, a machine without NUMA information or
an invalid node only logs a warning: serving engines call this on every host and must not fail
where binding means nothing.

Thread-safety: affects only the calling thread (and threads it starts afterwards).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from pathlib import Path

log = logging.getLogger(__name__)

NODE_ROOT = Path("/sys/devices/system/node")
_MPOL_PREFERRED = 1
_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}


def parse_cpu_list(text: str) -> set[int]:
    """The CPUs of a kernel CPU list such as ``"0-3,8,10-11"``.

    Raises:
        ValueError: the text is not a CPU list.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        low, high = int(first), int(last or first)
        if low < 0 or high < low:
            raise ValueError(f"bad CPU range {part!r}")
        cpus.update(range(low, high + 1))
    return cpus


def numa_nodes(root: Path = NODE_ROOT) -> list[int]:
    """The NUMA nodes the kernel lists, ascending; empty without NUMA information."""
    if not root.is_dir():
        return []
    nodes = []
    for entry in root.iterdir():
        suffix = entry.name.removeprefix("node")
        if entry.name.startswith("node") and suffix.isdigit():
            nodes.append(int(suffix))
    return sorted(nodes)


def bind_to_numa_node(node: int, root: Path = NODE_ROOT) -> bool:
    """Run the calling thread on ``node``'s CPUs and prefer its memory.

    Args:
        node: the NUMA node (``/sys/devices/system/node/node<node>``).
        root: where the kernel lists the nodes (tests point it elsewhere).

    Returns:
        True when the thread now runs on the node's CPUs; False (after a warning) when NUMA
        information is missing, the node does not exist or has no usable CPU, or the kernel
        refused. Never raises for those, as upstream.
    """
    nodes = numa_nodes(root)
    if not nodes:
        log.warning("NUMA is not available on this system; binding skipped")
        return False
    if not isinstance(node, int) or node not in nodes:
        log.warning("invalid NUMA node %r; valid nodes: %s", node, nodes)
        return False
    try:
        cpus = parse_cpu_list((root / f"node{node}" / "cpulist").read_text())
        usable = cpus & os.sched_getaffinity(0) if cpus else set()
        if not usable:
            log.warning("NUMA node %d has no CPU this process may use; binding skipped", node)
            return False
        os.sched_setaffinity(0, usable)
    except (OSError, ValueError) as exc:
        log.warning("binding to NUMA node %d failed: %s", node, exc)
        return False
    _prefer_memory_of(node)
    return True


def _prefer_memory_of(node: int) -> None:
    """Best effort ``set_mempolicy(MPOL_PREFERRED, {node})``; logs and goes on when refused."""
    number = _SET_MEMPOLICY.get(platform.machine())
    if number is None or node >= 64:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mask = ctypes.c_ulong(1 << node)
        if libc.syscall(number, _MPOL_PREFERRED, ctypes.byref(mask), 64) != 0:
            log.warning(
                "preferring NUMA node %d's memory failed (errno %d)", node, ctypes.get_errno()
            )
    except (OSError, AttributeError) as exc:
        log.warning("preferring NUMA node %d's memory failed: %s", node, exc)
