"""Names the masters and clients of one HA cluster share: etcd endpoints and keys.

A master address ``etcd://HOST:PORT[;HOST:PORT...]`` (upstream's spelling; ``,`` also
separates) names the etcd cluster in which the masters of ``cluster_id`` elect a leader;
clients read the leader's address from :func:`leader_key`, the key upstream Mooncake's masters
write, so either side's clients can find either side's leader.
"""

from __future__ import annotations

ETCD_SCHEME = "etcd://"
DEFAULT_CLUSTER_ID = "mooncake_cluster"
"""Upstream's default ``--cluster_id``."""


def is_etcd_address(address: str) -> bool:
    """Whether a master address names an etcd cluster rather than one master."""
    return address.strip().lower().startswith(ETCD_SCHEME)


def parse_etcd_endpoints(spec: str) -> list[tuple[str, int]]:
    """``(host, port)`` of every endpoint in ``spec``.

    Args:
        spec: ``etcd://h1:2379;h2:2379``, or the same without the scheme (``--etcd_endpoints``);
            endpoints are separated by ``;`` or ``,``; an ``http://`` prefix on an endpoint is
            accepted (etcdctl's spelling); IPv6 hosts go in brackets.

    Returns:
        The endpoints in the order given, duplicates removed.

    Raises:
        ValueError: no endpoint, or one without a valid port.

    Complexity: O(len(spec)).
    """
    body = spec.strip()
    if body.lower().startswith(ETCD_SCHEME):
        body = body[len(ETCD_SCHEME) :]
    endpoints: list[tuple[str, int]] = []
    for raw in body.replace(",", ";").split(";"):
        item = raw.strip()
        if not item:
            continue
        for prefix in ("http://", "https://"):
            if item.lower().startswith(prefix):
                item = item[len(prefix) :]
        item = item.rstrip("/")
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"etcd endpoint {raw.strip()!r} is not HOST:PORT")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        endpoint = (host, int(port))
        if endpoint not in endpoints:
            endpoints.append(endpoint)
    if not endpoints:
        raise ValueError(f"no etcd endpoint in {spec!r}")
    return endpoints


def leader_key(cluster_id: str) -> bytes:
    """The key whose value is the leader's ``host:port`` (under the leader's etcd lease)."""
    return f"mooncake-store/{cluster_id}/master_view".encode()


def log_prefix(cluster_id: str) -> bytes:
    """The prefix of the replicated metadata log's records."""
    return f"mooncake-py/{cluster_id}/oplog/".encode()


def snapshot_prefix(cluster_id: str) -> bytes:
    """The prefix of the metadata snapshots' keys."""
    return f"mooncake-py/{cluster_id}/snapshot/".encode()
