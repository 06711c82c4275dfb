"""Upstream's HTTP admin paths on the metrics port: probes, key and segment queries, remove-all.

:class:`AdminApi` turns one HTTP request (method, target, ``Authorization`` header) into one
:class:`Reply`; :class:`~mooncake_py.master.metrics.MetricsServer` runs it on its HTTP thread.
Paths, methods, query parameters, bodies and content types follow upstream's
``master_admin_service.cpp`` and its HTTP service documentation:

======================================  ======  ==================================================
path                                    method  answer
======================================  ======  ==================================================
``/metrics``                            GET     Prometheus text
``/metrics/summary``                    GET     one line: role, state, readiness, master={...}
``/health``                             GET     ``{status, role, ha_state, service_ready}``
``/role``, ``/ha_status``               GET     ``leader``, ``serving`` (text)
``/leader``                             GET     ``{present, leader_address, view_version}`` (HA)
``/version``                            GET     ``{version, display_version}``
``/get_all_keys``                       GET     the tenant's keys, one per line (streamed)
``/query_key?key=K``                    GET     ``{"success":true,"data":[descriptor...]}``
``/batch_query_keys?keys=K1,K2``        GET     ``{"success":true,"data":{K:{ok,values|error}}}``
``/get_all_segments``                   GET     mounted segment names, one per line
``/get_segments_detail``                GET     ``{total_segments, segments:[...]}``
``/query_segment?segment=S``            GET     ``S\\nUsed(bytes): U\\nCapacity(bytes) : C\\n``
``/api/v1/segments/status?segment=S``   GET     ``{success, segment, status, status_name, ...}``
``/api/v1/remove_all?force=&tenant_id=``  POST  ``{"success":true,"removed_count":N}``
======================================  ======  ==================================================

A descriptor is upstream's ``{"size_", "buffer_address_", "protocol_", "transport_endpoint_"}``.
JSON errors are upstream's ``{"success":false,"error_code":N,"error_message":"NAME"}`` (or
``{"success":false,"error":"..."}`` where upstream uses that shape): 400 for bad input
(INVALID_PARAMS: a missing parameter, a value that is not UTF-8 once percent-decoded, a key
longer than 4096 bytes), 404 for what does not exist. An unknown path answers 404, a known path
asked with another method 405 (with ``Allow``); a request line over 64 KiB gets http.server's 414.

**Where this differs from upstream, and why.**

- Probes hold nothing: ``/query_key`` and ``/batch_query_keys`` describe replicas without
  granting a read lease or an existence hold and without renewing recency (upstream's
  ``/query_key`` grants a lease through ``GetReplicaList``). Right after a query the object can
  be removed without ``force``. See :mod:`~mooncake_py.master.service.admin_queries`.
- No HA: the master is always the serving leader (``role=leader``, ``ha_state=serving``,
  upstream's strings for a serving master), ``/leader`` reports no leader view, and
  ``leader_address`` / ``view_version`` are left out of ``/health``, as upstream does without one.
- Tokens: with ``--auth_tokens_file`` the key paths, the segment paths (``/get_all_segments``
  included: SGLang's ``check_server`` accepts any answer, a 401 too) and remove-all need
  ``Authorization: Bearer <token>`` (401 without a known one) and act for the token's tenant
  only: its keys alone are listed and described, remove-all removes its objects alone, and a
  ``tenant_id`` naming another tenant is refused (403). Segments belong to their mounter's
  tenant: a tenant's token sees the segments it may use (its own; shared ones without other
  tenants' client ids and with only its own bytes counted), an admin token sees every
  segment. The probes (``/metrics``, ``/metrics/summary``, ``/health``, ``/role``,
  ``/ha_status``, ``/leader``, ``/version``) stay open. Without tokens the key paths act on the
  default tenant (as upstream), and remove-all honours ``tenant_id`` with multi-tenancy on
  (none: every tenant, as upstream).
- ``/batch_query_keys`` splits the raw parameter on ``,`` before percent-decoding each part,
  so a key holding a comma can be asked for as ``%2C``.
- ``/query_segment`` answers 400 for a missing ``segment`` and 404 for an unknown one (upstream:
  500 "Failed to query segment" for both).
- Remove-all works in slices (:meth:`MasterService.remove_all_sliced`, driven on the HTTP
  thread), so other callers are served while it runs; it is not one transaction (see
  :mod:`~mooncake_py.master.service.removal`).
- ``/get_all_keys`` is streamed (no ``Content-Length``; the connection closes at its end): its
  size is not capped, and the master holds its lock only for the snapshot.

Thread-safety: an :class:`AdminApi` is immutable after construction; :meth:`AdminApi.handle` may
run on many HTTP threads at once (every state access takes the service lock as described in
:mod:`~mooncake_py.master.service.admin_queries`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mooncake_py import __version__
from mooncake_py.errors import ErrorCode
from mooncake_py.types import valid_tenant_id
from mooncake_py.units import ConfigError, parse_bool

from .http_common import (
    JSON,
    PLAIN,
    TEXT,
    BadRequest,
    BrowserGuard,
    BrowserHeaders,
    Reply,
    Request,
    Route,
    decode_query_value,
    error_reply,
    parse_query,
    simple_error,
)
from .http_common import json_reply as _json
from .http_common import text_reply as _text
from .http_memory import MemoryApi
from .http_static import StaticFiles
from .occupancy import OccupancyHistory
from .service.admin_queries import AdminQueries, BufferDescriptor, Description
from .service.context import DEFAULT_TENANT
from .service.facade import SERVICE_VERSION, MasterService
from .service.slices import drive
from .transport.auth import Denial, TokenAuthority

if TYPE_CHECKING:
    from .metrics import RpcCounters

__all__ = ["JSON", "PLAIN", "TEXT", "AdminApi", "Reply", "error_reply", "simple_error"]

ROLE = "leader"
HA_STATE = "serving"
"""Upstream's role and state strings for a serving master (``MasterRuntimeState::kServing``)."""


class AdminApi:
    """The admin paths of one master (see the module docstring for each path's contract).

    Args:
        service: the master's service.
        rpcs: per-RPC counters (for ``/metrics/summary``; remove-all counts as ``RemoveAll``).
        metrics_text: renders ``/metrics``.
        authority: the master's tokens, or None when it requires none.
        occupancy: the sampled occupancy history for the memory API's stats (None: none).
        allowed_hosts: host names browsers may use besides IP literals, ``localhost`` and this
            machine's names (:class:`~.http_common.BrowserGuard`).
        leader: an HA leader's view (``leader_address``, ``view_version``, ``cluster_id``);
            None without HA (``/leader`` then answers ``{"present": false}``).
    """

    def __init__(
        self,
        service: MasterService,
        rpcs: RpcCounters,
        metrics_text: Callable[[bool], bytes],
        authority: TokenAuthority | None,
        occupancy: OccupancyHistory | None = None,
        allowed_hosts: Sequence[str] = (),
        leader: Mapping[str, Any] | None = None,
    ) -> None:
        self._service = service
        # Upstream's leader view (present, leader_address, view_version) of an HA leader.
        leader_view = {"present": True, **leader} if leader else {"present": False}
        self._rpcs = rpcs
        self._metrics_text = metrics_text
        self._authority = authority
        self._guard = BrowserGuard(allowed_hosts)
        self._multi_tenant = service.context.tenants.multi_tenant
        self._max_batch = service.config.max_batch_keys
        self.queries = AdminQueries(service.context)
        get, post = "GET", "POST"
        self._routes: dict[str, Route] = {
            # Families labelled by tenant only for admin tokens (or a master without tokens).
            "/metrics": Route(get, lambda r: Reply(200, TEXT, metrics_text(r.admin)), False),
            "/metrics/summary": Route(get, self._summary, False),
            "/health": Route(get, self._health, False),
            "/role": Route(get, lambda _: _text(200, ROLE, PLAIN), False),
            "/ha_status": Route(get, lambda _: _text(200, HA_STATE, PLAIN), False),
            "/leader": Route(get, lambda _: _json(200, leader_view), False),
            "/version": Route(get, self._version, False),
            "/get_all_keys": Route(get, self._all_keys, True),
            "/query_key": Route(get, self._query_key, True),
            "/batch_query_keys": Route(get, self._batch_query_keys, True),
            "/get_all_segments": Route(get, self._all_segments, True),
            "/get_segments_detail": Route(get, self._segments_detail, True),
            "/query_segment": Route(get, self._query_segment, True),
            "/api/v1/segments/status": Route(get, self._segment_status, True),
            "/api/v1/remove_all": Route(post, self._remove_all, True),
        }
        # The memory API (/v1/memory/...), the dashboard's files and /openapi.json.
        self.memory = MemoryApi(service, occupancy)
        self._routes.update(self.memory.routes)
        self._routes.update(StaticFiles().routes)

    def handle(
        self,
        method: str,
        target: str,
        authorization: str | None,
        body: bytes = b"",
        content_type: str | None = None,
        browser: BrowserHeaders | None = None,
    ) -> Reply:
        """Answer one request.

        Args:
            method: the HTTP method.
            target: the request target (path and query string).
            authorization: the ``Authorization`` header, if any.
            body: the request body (the memory API's POST paths read JSON from it).
            content_type: the ``Content-Type`` header, if any.
            browser: ``Host``, ``Origin`` and ``Sec-Fetch-Site``; a browser's request that
                another site could have made is refused (403, :class:`BrowserGuard`).

        Returns:
            The reply; never raises for bad input (400, 401, 403, 404, 405, 415 replies).

        Complexity: that of the path's query (see the module docstring and
        :mod:`.http_memory`); remove-all and the releases run every slice before they return.
        """
        path, _, query = target.partition("?")
        route = self._routes.get(path)
        if route is None:
            return _text(404, "not found\n", PLAIN)
        if method != route.method:
            reply = _text(405, f"method {method} not allowed; use {route.method}\n", PLAIN)
            return dataclasses.replace(reply, headers=(("Allow", route.method),))
        refusal = self._guard.refusal(method, browser or BrowserHeaders())
        if refusal is not None:
            return simple_error(403, refusal)
        token_tenant = None
        segment_scope = None
        admin = True
        if self._authority is not None:
            # Open paths read the token too (an admin's scrape of /metrics gets the families
            # labelled by tenant), but need none.
            principal = self._authority.principal_of_header(authorization)
            if principal is None and route.guarded:
                reply = simple_error(401, Denial.UNAUTHENTICATED.value)
                return dataclasses.replace(reply, headers=(("WWW-Authenticate", "Bearer"),))
            admin = principal is not None and principal.admin
            if principal is not None:
                token_tenant = principal.tenant
                segment_scope = None if admin else principal.tenant
        try:
            request = Request(
                parse_query(query),
                token_tenant or DEFAULT_TENANT,
                token_tenant,
                segment_scope,
                admin,
                body,
                content_type,
            )
            return route.handler(request)
        except BadRequest as bad:
            return bad.reply

    # -- probes ------------------------------------------------------------------------------

    def _health(self, _: Request) -> Reply:
        body = {"status": "ok", "role": ROLE, "ha_state": HA_STATE, "service_ready": True}
        return _json(200, body)

    def _version(self, _: Request) -> Reply:
        return _json(200, {"version": SERVICE_VERSION, "display_version": __version__})

    def _summary(self, _: Request) -> Reply:
        line = f"role={ROLE}, state={HA_STATE}, service_ready=true, master={{{self._master()}}}"
        return _text(200, line + ", ha={}")

    def _master(self) -> str:
        stats = self._service.stats()
        requests, failures = dict(self._rpcs.requests), dict(self._rpcs.failures)

        def ratio(*rpcs: str) -> str:
            total = sum(requests.get(r, 0) for r in rpcs)
            return f"{total - sum(failures.get(r, 0) for r in rpcs)}/{total}"

        used, capacity = stats["allocated_bytes"], stats["capacity_bytes"]
        storage = f"Storage: {_bytes(used)} / {_bytes(capacity)}"
        if capacity:
            storage += f" ({used / capacity * 100:.1f}%)"
        parts = [
            storage,
            f"Keys: {stats['objects']}",
            f"Clients: {stats['active_clients']}",
            "Requests (Success/Total): "
            + ", ".join(
                [
                    f"PutStart={ratio('PutStart', 'BatchPutStart')}",
                    f"PutEnd={ratio('PutEnd', 'BatchPutEnd')}",
                    f"PutRevoke={ratio('PutRevoke', 'BatchPutRevoke')}",
                    f"Get={ratio('GetReplicaList', 'BatchGetReplicaList')}",
                    f"Exist={ratio('ExistKey', 'BatchExistKey')}",
                    f"Del={ratio('Remove', 'BatchRemove')}",
                    f"DelAll={ratio('RemoveAll')}",
                    f"Ping={ratio('Ping')}",
                ]
            ),
            f"Eviction: passes={stats['eviction_passes']}, keys={stats['evicted_objects']}, "
            f"size={_bytes(stats['evicted_bytes'])}",
            f"Sessions: {stats['sessions']} (pinned: {stats['pinned_sessions']})",
        ]
        return " | ".join(parts)

    # -- keys --------------------------------------------------------------------------------

    def _all_keys(self, request: Request) -> Reply:
        chunks = self.queries.key_chunks(request.tenant)  # the snapshot is taken here
        return Reply(200, TEXT, _key_lines(chunks))

    def _query_key(self, request: Request) -> Reply:
        key = request.param("key")
        if not key:
            return error_reply(400, ErrorCode.INVALID_PARAMS, "Missing key query parameter")
        found = self.queries.describe(request.tenant, key)
        if found.code != ErrorCode.OK:
            # Upstream answers 404 for every failed lookup; a malformed key is bad input.
            return error_reply(400 if found.code == ErrorCode.INVALID_PARAMS else 404, found.code)
        return _json(200, {"success": True, "data": [_descriptor(d) for d in found.replicas]})

    def _batch_query_keys(self, request: Request) -> Reply:
        raw = request.raw("keys")
        keys = [decode_query_value("keys", part) for part in raw.split(",")] if raw else []
        if not keys:
            return simple_error(400, "No keys provided. Use ?keys=key1,key2,...")
        if len(keys) > self._max_batch:
            return simple_error(400, f"Too many keys: at most {self._max_batch} per request")
        found = drive(self.queries.describe_sliced(request.tenant, keys))
        data: dict[str, dict[str, Any]] = {}
        for key, description in zip(keys, found, strict=True):
            data.setdefault(key, _batch_item(description))
        # Upstream's answer is a std::map: keys in sorted order, each once.
        return _json(200, {"success": True, "data": dict(sorted(data.items()))})

    # -- segments ----------------------------------------------------------------------------

    def _all_segments(self, request: Request) -> Reply:
        names = self.queries.segment_names(request.segment_scope)
        return _text(200, "".join(f"{name}\n" for name in names))

    def _segments_detail(self, request: Request) -> Reply:
        details = self.queries.segments(request.segment_scope)
        segments = [
            {
                "segment_name": d.name,
                "segment_id": d.segment_id,
                "client_id": d.client_id,
                "base_address": f"0x{d.base:x}",
                "size_bytes": d.size,
                "size_human": f"{d.size / (1 << 30):g} GiB",
                "te_endpoint": d.te_endpoint,
                "protocol": d.protocol,
                "status": d.status.name,
                "allocator_used_bytes": d.used_bytes,
                "allocator_capacity_bytes": d.capacity_bytes,
                "allocator_usage_percent": (
                    d.used_bytes / d.capacity_bytes * 100.0 if d.capacity_bytes else 0.0
                ),
                "tier": d.tier,
            }
            for d in details
        ]
        return _json(200, {"total_segments": len(segments), "segments": segments})

    def _query_segment(self, request: Request) -> Reply:
        name = request.param("segment")
        if not name:
            return _text(400, "Missing segment query parameter\n")
        usage = self.queries.segment_usage(name, request.segment_scope)
        if usage is None:
            return _text(404, f"Failed to query segment: {ErrorCode.SEGMENT_NOT_FOUND.name}\n")
        used, capacity = usage
        return _text(200, f"{name}\nUsed(bytes): {used}\nCapacity(bytes) : {capacity}\n")

    def _segment_status(self, request: Request) -> Reply:
        name = request.param("segment")
        if not name:
            return error_reply(400, ErrorCode.INVALID_PARAMS, "Missing segment query parameter")
        status = self.queries.segment_status(name, request.segment_scope)
        if status is None:
            return error_reply(404, ErrorCode.SEGMENT_NOT_FOUND)
        body = {
            "success": True,
            "segment": name,
            "status": int(status),
            "status_name": status.name,
            "error_code": 0,
            "error_message": "",
        }
        return _json(200, body)

    # -- removal -----------------------------------------------------------------------------

    def _remove_all(self, request: Request) -> Reply:
        force_text = request.param("force")
        try:
            force = parse_bool(force_text, "force") if force_text else False
        except ConfigError as exc:
            return error_reply(400, ErrorCode.INVALID_PARAMS, str(exc))
        named = request.param("tenant_id") or ""
        if request.token_tenant is not None:
            if named and named != request.token_tenant:
                return simple_error(403, Denial.PERMISSION_DENIED.value)
            tenant = request.token_tenant  # never "": that would mean every tenant
        else:
            if named and self._multi_tenant and not valid_tenant_id(named):
                return error_reply(400, ErrorCode.INVALID_PARAMS, f"invalid tenant_id {named!r}")
            tenant = named  # "" with multi-tenancy: every tenant, as upstream
        removed = drive(self._service.remove_all_sliced(tenant, force))
        self._rpcs.record("RemoveAll", False)
        return _json(200, {"success": True, "removed_count": removed})


def _key_lines(chunks: Iterable[list[str]]) -> Iterator[bytes]:
    for chunk in chunks:
        yield ("\n".join(chunk) + "\n").encode("utf-8", "backslashreplace")


def _descriptor(d: BufferDescriptor) -> dict[str, Any]:
    return {
        "size_": d.size,
        "buffer_address_": d.buffer_address,
        "protocol_": d.protocol,
        "transport_endpoint_": d.transport_endpoint,
    }


def _batch_item(description: Description) -> dict[str, Any]:
    if description.code != ErrorCode.OK:
        return {"ok": False, "error": description.code.name}
    return {"ok": True, "values": [_descriptor(d) for d in description.replicas]}


def _bytes(count: float) -> str:
    """Upstream's summary style: two decimals and the largest unit that fits."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count:.2f} B"
