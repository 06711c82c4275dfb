"""What a caller's principal may do, checked by the call pipeline after tenant binding.

With tokens required (``--auth_tokens_file``):

- **client ids belong to a tenant**: the first call carrying a ``client_id`` (at the top of
  the request or under ``put``) binds it to the caller's tenant
  (:meth:`~mooncake_py.master.service.facade.MasterService.bind_client`); a later call
  carrying it with another tenant's token is refused with PERMISSION_DENIED, whichever RPC
  (unmount, remount, mount, ping, end of reads, end of writes, replica tasks...). The binding
  lasts as long as the client's registration.
- **shared segments need an admin token**: a MountSegment / ReMountSegment with a segment
  marked ``shared`` from a non-admin token is refused with PERMISSION_DENIED; nothing is
  mounted.

Whatever the tokens:

- **endpoint attribution**: a mounted segment's ``te_endpoint`` host must be the address the
  caller connects from (a loopback caller may declare any loopback address); otherwise the
  call is answered INVALID_PARAMS and nothing is mounted. ``--allow_unattributed_endpoints``
  turns the check off (NAT, proxies); a caller whose transport reports no address skips it.
- **views**: GetStats and ListSegments get ``all_tenants`` from the caller's role (admin, or
  no tokens required), never from what the caller sent.

Thread-safety: immutable after construction; the client-id binding takes the service's lock.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mooncake_py._wire.rpcs import RPCS, Rpc
from mooncake_py.errors import ErrorCode

from ..service.facade import MasterService
from .auth import Caller, endpoint_attributed

MOUNTING_RPCS = {"MountSegment": "segment", "ReMountSegment": "segments"}
"""RPCs that mount segments, and the request field holding them."""

SHARED_NEEDS_ADMIN_TEXT = "a shared segment may only be mounted with an admin token"


def foreign_client_text(client_id: str) -> str:
    """The refusal text of a call carrying another tenant's client id."""
    return f"client id {client_id!r} belongs to another tenant than the token's"


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """A call the checks stop.

    Attributes:
        code: the error code to answer with; None: refuse with PERMISSION_DENIED.
        text: why (sent with a refusal).
    """

    code: int | None
    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class _Shape:
    """What the checks look at in one RPC's requests, resolved once."""

    views: bool  # has ``all_tenants``
    client_id_in: str | None  # "" at the top, "put" under put, None: no client id
    segments_in: str | None  # the mounted segments' field, None: mounts nothing


def _shape_of(rpc: Rpc) -> _Shape:
    fields = rpc.request_type.DESCRIPTOR.fields_by_name
    client_id_in: str | None = None
    if "client_id" in fields:
        client_id_in = ""
    elif "put" in fields and "client_id" in fields["put"].message_type.fields_by_name:
        client_id_in = "put"
    return _Shape("all_tenants" in fields, client_id_in, MOUNTING_RPCS.get(rpc.name))


class PrincipalChecks:
    """The checks above, for one master.

    Args:
        service: holds the client-id bindings and the configuration.
        tokens_required: whether callers present tokens (bindings and roles apply).
    """

    def __init__(self, service: MasterService, tokens_required: bool) -> None:
        self._service = service
        self._tokens_required = tokens_required
        self._attribute_endpoints = not service.config.allow_unattributed_endpoints
        self._shapes = {name: _shape_of(rpc) for name, rpc in RPCS.items()}

    def applies_to(self, rpc: Rpc) -> bool:
        """Whether :meth:`admit` can do anything for ``rpc``'s requests on this master (the
        pipeline skips it otherwise: most calls of a master without tokens). O(1)."""
        shape = self._shapes[rpc.name]
        return (
            shape.views
            or shape.segments_in is not None
            or (self._tokens_required and shape.client_id_in is not None)
        )

    def admit(self, rpc: Rpc, request: Any, caller: Caller) -> Verdict | None:
        """None when ``request`` may run for ``caller`` (after setting ``all_tenants`` on the
        views), else why not.

        Complexity: O(1) plus O(segments) for mounting calls; the client-id binding takes the
        service lock once.
        """
        shape = self._shapes[rpc.name]
        if shape.views:
            request.all_tenants = caller.admin
        if self._tokens_required and shape.client_id_in is not None:
            holder = request.put if shape.client_id_in else request
            client_id = holder.client_id
            if client_id and not self._service.bind_client(client_id, caller.tenant):
                return Verdict(None, foreign_client_text(client_id))
        if shape.segments_in is None:
            return None
        segments = getattr(request, shape.segments_in)
        if shape.segments_in == "segment":
            segments = [segments]
        if self._tokens_required and not caller.admin and any(s.shared for s in segments):
            return Verdict(None, SHARED_NEEDS_ADMIN_TEXT)
        if self._attribute_endpoints and caller.peer_host is not None:
            for segment in segments:
                if not endpoint_attributed(segment.te_endpoint, caller.peer_host):
                    return Verdict(int(ErrorCode.INVALID_PARAMS), "unattributed endpoint")
        return None
