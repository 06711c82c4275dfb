"""Segments and liveness: mounting, remounting and withdrawing segments, heartbeats, and
expiring silent clients.

:class:`MembershipService` is reached as ``MasterService.membership`` (the facade's segment
methods delegate to it); it depends only on the shared
:class:`~mooncake_py.master.service.context.ServiceContext`. Withdrawing a segment is sliced
(:mod:`.slices`): the segment goes at once, its objects in slices
(:meth:`~mooncake_py.master.state.store.StoreState.start_unmount`).

With tokens required (``--auth_tokens_file``) a mounted segment belongs to its mounter's
tenant (only that tenant's objects, besides any tenant's in shared segments, are placed in
it), and client ids are bound to tenants (:meth:`MembershipService.bind_client`); the call
pipeline refuses calls carrying another tenant's client id, so only the tenant that
registered a client may mount, remount, unmount or ping as it.
"""

from __future__ import annotations

import dataclasses
import hmac
from collections.abc import Callable, Sequence

from mooncake_py import capability
from mooncake_py.errors import ErrorCode
from mooncake_py.types import ClientStatus, SegmentInfo

from .context import ServiceContext
from .slices import SliceTimer, Steps


def valid_endpoint(endpoint: str) -> bool:
    """Whether a segment's transfer endpoint is ``host:port`` (port 1-65535, host without
    spaces or control characters; IPv6 in brackets): every client that writes to the segment
    connects there, so a malformed one would fail them all. O(len(endpoint))."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit():
        return False
    if not 0 < int(port) < 65536:
        return False
    return host.isprintable() and " " not in host


@dataclasses.dataclass(frozen=True, slots=True)
class PingResult:
    """Answer to a heartbeat."""

    code: int
    client_status: ClientStatus
    view_version: int


class MembershipService:
    """The segment and liveness calls.

    Args:
        context: the shared lock, state, clock and tenant rule.
        view_version: the master's view version, answered by every ping.
        on_client_expired: called with ``(client_id, now)``, the lock held, for each client
            that expires (its replica tasks fail).

    Thread-safety: every method takes the context's lock (withdrawing once per slice).
    """

    def __init__(
        self,
        context: ServiceContext,
        view_version: int,
        on_client_expired: Callable[[str, float], None] | None = None,
    ) -> None:
        self._on_client_expired = on_client_expired
        self._lock = context.lock
        self._state = context.state
        self._clock = context.clock
        self._segments = context.state.segments
        self._clients = context.state.clients
        self._view_version = view_version
        self._owned_segments = bool(context.state.config.auth_tokens_file)
        self._resolve_tenant = context.tenants.resolve

    def bind_client(self, client_id: str, tenant: str) -> bool:
        """Bind ``client_id`` to ``tenant`` unless another tenant holds it (see
        :meth:`~mooncake_py.master.state.clients.ClientRegistry.bind`).

        Returns:
            True when the client id is ``tenant``'s. O(1); the lock only for a first binding.
        """
        # Every call of a token-carrying client asks: an existing binding is read without the
        # lock (bindings are set and dropped whole, under it).
        holder = self._clients.tenant_of(client_id)
        if holder is not None:
            return holder == tenant
        with self._lock:
            return self._clients.bind(client_id, tenant, self._clock())

    def _owner_of(self, tenant: str) -> str | None:
        """The tenant a segment mounted for ``tenant`` belongs to: "" (nobody) without tokens;
        None for an invalid tenant id."""
        if not self._owned_segments:
            return ""
        return self._resolve_tenant(tenant)

    def mount_segment(self, client_id: str, segment: SegmentInfo, tenant: str = "") -> ErrorCode:
        """Contribute ``segment`` to the store; idempotent for the same client.

        Args:
            tenant: the mounter's tenant (the segment's owner when tokens are required).

        Returns:
            OK; INVALID_PARAMS for a malformed segment, one owned by another client or an
            invalid tenant.
        """
        with self._lock:
            owner = self._owner_of(tenant)
            if owner is None:
                return ErrorCode.INVALID_PARAMS
            code = self._mount_locked(client_id, segment, owner)
            if code == ErrorCode.OK:
                self._clients.touch(client_id, self._clock())
            return code

    def remount_segments(
        self, client_id: str, segments: Sequence[SegmentInfo], tenant: str = ""
    ) -> ErrorCode:
        """Re-register every segment a client holds and put it in good standing.

        All segments are validated before any is mounted.

        Args:
            tenant: the mounter's tenant (the segments' owner when tokens are required).

        Returns:
            OK, or INVALID_PARAMS (nothing mounted) when one segment is malformed or the
            tenant is invalid. A disk tier this master does not take (offload off, or held by
            another tenant's or over its new quota) is left out; the others still mount.
        """
        with self._lock:
            owner = self._owner_of(tenant)
            if not client_id or owner is None:
                return ErrorCode.INVALID_PARAMS
            taken: list[SegmentInfo] = []
            for segment in segments:
                code = self._validate_segment(client_id, segment)
                if code == ErrorCode.UNABLE_OFFLOAD:
                    continue  # a disk tier this master does not take: the rest still mount
                if code != ErrorCode.OK:
                    return ErrorCode.INVALID_PARAMS
                taken.append(segment)
            for segment in taken:
                code = self._mount_locked(client_id, segment, owner)
                if code != ErrorCode.OK and not segment.disk:
                    return code  # (a disk tier refused stays out; the segments still mount)
            self._clients.touch(client_id, self._clock())
            self._clients.mark_ok(client_id)
            return ErrorCode.OK

    def unmount_segment_sliced(
        self, client_id: str, segment_id: str, tenant: str = ""
    ) -> Steps[ErrorCode]:
        """Withdraw a segment; objects left without a replica are deleted. Idempotent.

        ``tenant`` is the caller's: a segment that belongs to another tenant is not withdrawn.

        The segment is withdrawn in the first slice (nothing is placed on it, no reader is
        given it from then on); its objects are dropped in slices, and the answer comes once
        they all are.

        Returns:
            OK; INVALID_PARAMS when another client (or tenant) owns the segment.

        Complexity: O(objects on the segment), in slices.
        """
        with self._lock:
            mounted = self._segments.get(segment_id)
            if mounted is None:
                return ErrorCode.OK
            if mounted.client_id != client_id or mounted.tenant not in ("", self._owner_of(tenant)):
                return ErrorCode.INVALID_PARAMS
            drain = self._state.start_unmount(segment_id)
        timer = SliceTimer()
        while True:
            with self._lock:
                if self._state.drain(drain, timer.spent):
                    return ErrorCode.OK
            yield
            timer.restart()

    def ping(self, client_id: str) -> PingResult:
        """Heartbeat: refresh the client's deadline and tell it whether to remount."""
        with self._lock:
            if not client_id:
                return PingResult(ErrorCode.INVALID_PARAMS, ClientStatus.UNDEFINED, 0)
            self._clients.touch(client_id, self._clock())
            status = (
                ClientStatus.OK if self._clients.is_ok(client_id) else ClientStatus.NEED_REMOUNT
            )
            return PingResult(ErrorCode.OK, status, self._view_version)

    def _validate_segment(self, client_id: str, segment: SegmentInfo) -> ErrorCode:
        if not client_id or not segment.id or not segment.name:
            return ErrorCode.INVALID_PARAMS
        # A disk tier's base means nothing (its offsets are virtual); memory's must be set.
        if (segment.base <= 0 and not segment.disk) or segment.base < 0 or segment.size <= 0:
            return ErrorCode.INVALID_PARAMS
        if not valid_endpoint(segment.te_endpoint):
            return ErrorCode.INVALID_PARAMS
        if segment.disk and not self._state.config.enable_offload:
            return ErrorCode.UNABLE_OFFLOAD
        # Without a key the master hands out no capability for the segment: the owner's data
        # plane then serves nobody, which only the owner itself can choose.
        if segment.capability_key and len(segment.capability_key) != capability.KEY_BYTES:
            return ErrorCode.INVALID_PARAMS
        existing = self._segments.get(segment.id)
        taken = existing is not None and existing.client_id != client_id
        if taken and existing is not None and not _same_disk_tier(existing.info, segment):
            return ErrorCode.INVALID_PARAMS
        return ErrorCode.OK

    def _mount_locked(self, client_id: str, segment: SegmentInfo, owner: str) -> ErrorCode:
        code = self._validate_segment(client_id, segment)
        if code != ErrorCode.OK:
            return code
        existing = self._segments.get(segment.id)
        if existing is None:
            # A drain of an earlier mount of this id ends first: its replicas must never
            # meet the new allocator.
            self._state.finish_drain(segment.id)
            mounted = self._segments.mount(client_id, segment, owner)
            if segment.disk:
                self._state.resume_disk_tier(mounted, segment.base)
        elif existing.client_id != client_id:
            # The same disk tier (its id and key, read from its directory) mounted by the
            # process that restarted on it: it takes the tier over, objects and all.
            if existing.tenant != owner:
                return ErrorCode.INVALID_PARAMS
            if not self._state.take_over_disk_tier(segment.id, client_id, segment):
                return ErrorCode.INVALID_PARAMS  # it holds more than its new quota
        return code

    def reap_expired_clients(self, now: float, drain: bool = True) -> list[str]:
        """Expire clients silent for ``client_ttl``: unmount their segments, drop lost objects.

        Args:
            drain: drop the lost objects now; False leaves that to :meth:`continue_drains`
                (the background loop's way, so a dead client with a million objects does
                not stall the master).

        Returns:
            The expired client ids. Complexity: O(expired clients × their objects), or
            O(expired clients × their segments) plus id copies without ``drain``.
        """
        with self._lock:
            expired = self._clients.pop_expired(now)
            for client_id in expired:
                for mounted in self._segments.segments_of(client_id):
                    started = self._state.start_unmount(mounted.info.id)
                    if drain:
                        self._state.drain(started)
                # It reads and writes nothing any more: what it held goes back.
                self._state.reads.drop_client(client_id)
                self._state.drop_client_writes(client_id)
                if self._on_client_expired is not None:
                    self._on_client_expired(client_id, now)
            return expired

    def continue_drains(self) -> bool:
        """Run one bounded slice of the pending segment drains (see :meth:`reap_expired_clients`).

        Returns:
            True when drains remain (call again after letting other calls in).
        """
        timer = SliceTimer()
        with self._lock:
            for drain in list(self._state.draining.values()):
                if not self._state.drain(drain, timer.spent):
                    return True
            return bool(self._state.draining)


def _same_disk_tier(mounted: SegmentInfo, mounting: SegmentInfo) -> bool:
    """Whether ``mounting`` is the disk tier ``mounted`` is: both disk tiers under one id with
    the same (non-empty) capability key, which only a process that can read the tier's
    directory holds. Compared in constant time."""
    return (
        mounted.disk
        and mounting.disk
        and bool(mounting.capability_key)
        and hmac.compare_digest(mounted.capability_key, mounting.capability_key)
    )
