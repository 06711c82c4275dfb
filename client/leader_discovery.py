"""Finding the leader master of an HA cluster through etcd.

A master address ``etcd://h1:2379;h2:2379`` names the etcd cluster in which the masters elect
a leader. The leader keeps its ``host:port`` (the address clients call) under
:func:`mooncake_py.ha_names.leader_key` with an etcd lease; when it dies the key vanishes with
the lease and the next leader writes its own address there. :class:`LeaderDiscovery` reads
that key: one etcd ``Range`` per read, over a plain synchronous gRPC channel per endpoint
(etcd's generated stubs from ``aetcd.rpc``), endpoints tried in order, starting with the one
that answered last, each with a short deadline.

The cluster id (the ``<cluster_id>`` of the key) is, in order: the one the caller passes,
the ``MC_STORE_CLUSTER_ID`` environment variable (upstream Mooncake's name for it), or
:data:`~mooncake_py.ha_names.DEFAULT_CLUSTER_ID`.

Thread-safety: a :class:`LeaderDiscovery` may be shared between threads (gRPC channels are
thread-safe; the only other state is the index of the endpoint that answered last).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import grpc
from aetcd.rpc import rpc_pb2, rpc_pb2_grpc

from mooncake_py.errors import ErrorCode, InvalidParamsError, UnavailableError
from mooncake_py.ha_names import DEFAULT_CLUSTER_ID, leader_key, parse_etcd_endpoints

from .leader_follow import FAST_RECONNECT_OPTIONS, VIEW_CHANGE_POLL_INTERVAL_S

log = logging.getLogger(__name__)

CLUSTER_ID_ENV = "MC_STORE_CLUSTER_ID"
"""Environment variable naming the cluster whose leader a client looks for (upstream's name)."""

ETCD_REQUEST_TIMEOUT_S = 1.0
"""Deadline of one etcd read at one endpoint: a dead endpoint costs at most this much."""


@dataclasses.dataclass(frozen=True, slots=True)
class MasterView:
    """Who leads: the leader's address and the etcd revision that wrote it.

    Attributes:
        leader_address: the leader's ``host:port``.
        view_version: the key's modification revision; a later leader always has a larger one.
    """

    leader_address: str
    view_version: int


def resolve_cluster_id(cluster_id: str | None = None) -> str:
    """The cluster id to look the leader up under (see the module docstring).

    Args:
        cluster_id: an explicit id; None or "" to use the environment or the default.

    Returns:
        The id, without a trailing ``/`` (upstream accepts either spelling).
    """
    chosen = cluster_id or os.environ.get(CLUSTER_ID_ENV, "") or DEFAULT_CLUSTER_ID
    return chosen.rstrip("/") or DEFAULT_CLUSTER_ID


def _target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _valid_address(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


class LeaderDiscovery:
    """Reads the leader's address of one HA cluster from etcd.

    Args:
        spec: ``etcd://HOST:PORT[;HOST:PORT...]`` (``,`` also separates endpoints).
        cluster_id: the cluster (see :func:`resolve_cluster_id`).
        request_timeout_s: deadline of one read at one endpoint.

    Raises:
        InvalidParamsError: ``spec`` names no valid endpoint (INVALID_PARAMS).
    """

    def __init__(
        self,
        spec: str,
        cluster_id: str | None = None,
        request_timeout_s: float = ETCD_REQUEST_TIMEOUT_S,
    ) -> None:
        try:
            self.endpoints = parse_etcd_endpoints(spec)
        except ValueError as exc:
            raise InvalidParamsError(ErrorCode.INVALID_PARAMS, str(exc)) from exc
        self.cluster_id = resolve_cluster_id(cluster_id)
        self.key = leader_key(self.cluster_id)
        self._request_timeout_s = request_timeout_s
        # Channels connect lazily: making one per endpoint up front costs no connection.
        self._channels = [
            grpc.insecure_channel(_target(host, port), options=FAST_RECONNECT_OPTIONS)
            for host, port in self.endpoints
        ]
        self._ranges = [rpc_pb2_grpc.KVStub(channel).Range for channel in self._channels]
        self._preferred = 0

    def describe_endpoints(self) -> str:
        """The endpoints as ``h1:p1;h2:p2`` (for messages)."""
        return ";".join(_target(host, port) for host, port in self.endpoints)

    def read_current_view(self) -> MasterView | None:
        """The current leader, or None while no master leads (the key is absent).

        Tries the endpoint that answered last first, then the others in their given order;
        the first answer counts.

        Returns:
            The view; None when the key is absent or holds no valid ``host:port`` (logged).

        Raises:
            UnavailableError: no endpoint answered (ETCD_OPERATION_ERROR), each failure named.

        Complexity: one etcd read per endpoint tried; at most ``len(endpoints)`` reads, each
        bounded by ``request_timeout_s``.
        """
        count = len(self._ranges)
        start = self._preferred
        failures: list[str] = []
        request = rpc_pb2.RangeRequest(key=self.key)
        for step in range(count):
            index = (start + step) % count
            try:
                response = self._ranges[index](request, timeout=self._request_timeout_s)
            except grpc.RpcError as exc:
                status = exc.code() if isinstance(exc, grpc.Call) else None
                detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
                failures.append(f"{_target(*self.endpoints[index])}: {status} {detail}")
                continue
            except ValueError as exc:  # the channel was closed
                failures.append(f"{_target(*self.endpoints[index])}: {exc}")
                continue
            self._preferred = index
            if not response.kvs:
                return None
            entry = response.kvs[0]
            address = entry.value.decode("utf-8", "replace").strip()
            if not _valid_address(address):
                log.warning("etcd key %r holds %r, not host:port: no leader", self.key, address)
                return None
            return MasterView(address, int(entry.mod_revision))
        raise UnavailableError(
            ErrorCode.ETCD_OPERATION_ERROR,
            "no etcd endpoint answered: " + "; ".join(failures),
        )

    def wait_for_view(self, deadline: float) -> MasterView:
        """The current leader, waiting (polling every :data:`VIEW_CHANGE_POLL_INTERVAL_S`)
        until one is named or ``deadline`` passes.

        Args:
            deadline: ``time.monotonic()`` value after which to give up.

        Returns:
            The view.

        Raises:
            UnavailableError: at the deadline: UNAVAILABLE_IN_CURRENT_STATUS when etcd answered
                but no master leads (the key stayed absent), ETCD_OPERATION_ERROR when no etcd
                endpoint ever answered; the message names the key and the endpoints.

        Complexity: one :meth:`read_current_view` per poll.
        """
        started = time.monotonic()
        etcd_answered = False
        last_failure = ""
        while True:
            try:
                view = self.read_current_view()
            except UnavailableError as exc:
                last_failure = exc.detail
                view = None
            else:
                etcd_answered = True
            if view is not None:
                return view
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(VIEW_CHANGE_POLL_INTERVAL_S, remaining))
        waited = time.monotonic() - started
        key = self.key.decode()
        if etcd_answered:
            raise UnavailableError(
                ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS,
                f"no leader master: etcd key {key!r} absent at {self.describe_endpoints()} "
                f"for {waited:.1f} s (cluster id {self.cluster_id!r}, env {CLUSTER_ID_ENV})",
            )
        raise UnavailableError(
            ErrorCode.ETCD_OPERATION_ERROR,
            f"cannot read the leader (etcd key {key!r}) for {waited:.1f} s: {last_failure}",
        )

    def close(self) -> None:
        """Close the etcd channels; later reads raise UnavailableError. Idempotent."""
        for channel in self._channels:
            channel.close()
