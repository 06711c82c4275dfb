"""Observability: Prometheus metrics at ``/metrics`` and upstream's HTTP admin paths
(:mod:`.http_admin`: ``/health``, ``/metrics/summary``, ``/get_all_segments`` which SGLang's
``check_server`` reads, key and segment queries, remove-all) on ``--metrics_port``.

Metric names follow upstream Mooncake's where they exist (``master_key_count``,
``master_allocated_bytes``, ``master_total_capacity_bytes``, ``master_active_clients``,
``master_<op>_requests_total`` / ``master_<op>_failures_total``, eviction counters), plus KV
session metrics and the disk tier's: its bytes (``master_disk_capacity_bytes``,
``master_disk_used_bytes``, also under upstream's ``master_total_file_capacity_bytes`` and
``master_allocated_file_size_bytes``), tasks in flight, spills, promotions (upstream's
``master_promotion_completed_total`` / ``_failed_total``), disk evictions and hits. Gauges
and counters are read from the service when scraped, so serving a request costs nothing but
one counter increment (:class:`RpcCounters`).

The HTTP endpoint runs on its own threads (``http.server``), so a scrape never waits for the
event loop; the service's lock keeps what it reads consistent, and no path holds it for long.
"""

from __future__ import annotations

import contextlib
import logging
import re
import selectors
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .http_admin import TEXT, AdminApi, Reply
from .http_common import BrowserHeaders
from .occupancy import OccupancyHistory
from .service.admin_queries import AdminQueries
from .service.facade import MasterService
from .service.release import AWAKE, KV_CACHE_RELEASED, RELEASE_KINDS, SLEEP_STATES
from .transport.auth import TokenAuthority

CONTENT_TYPE = TEXT


if TYPE_CHECKING:
    from .ha.replicator import Replicator

log = logging.getLogger(__name__)


def snake_case(rpc: str) -> str:
    """``PutStart`` -> ``put_start``; ``ReMountSegment`` -> ``remount_segment`` (upstream's)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", rpc.replace("ReMount", "Remount")).lower()


class RpcCounters:
    """Requests and failures per RPC. Increments are plain dict updates on the event-loop
    thread; scrapes copy the dicts, so a value can be one call behind, never torn."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.failures: dict[str, int] = {}

    def record(self, rpc: str, failed: bool) -> None:
        """Count one call of ``rpc``."""
        self.requests[rpc] = self.requests.get(rpc, 0) + 1
        if failed:
            self.failures[rpc] = self.failures.get(rpc, 0) + 1


# stats() key -> (metric name, help, kind)
_STATS_METRICS = {
    "objects": ("master_key_count", "Objects stored.", "gauge"),
    "capacity_bytes": ("master_total_capacity_bytes", "Bytes of all mounted segments.", "gauge"),
    "allocated_bytes": ("master_allocated_bytes", "Bytes allocated to replicas.", "gauge"),
    "segments": ("master_mounted_segments", "Mounted segments.", "gauge"),
    "active_clients": ("master_active_clients", "Clients in good standing.", "gauge"),
    "eviction_candidates": ("master_eviction_candidates", "Objects eviction may take.", "gauge"),
    "preempted_buffers": (
        "master_preempted_buffers",
        "Buffers of preempted writes kept until their writers stop.",
        "gauge",
    ),
    "retired_buffers": (
        "master_retired_buffers",
        "Buffers of removed or replaced objects kept until their readers are done.",
        "gauge",
    ),
    "retired_bytes": (
        "master_retired_bytes",
        "Bytes of removed or replaced objects kept until their readers are done.",
        "gauge",
    ),
    "read_holds": ("master_read_leases", "Read leases held by readers.", "gauge"),
    "reads_in_flight": ("master_reads_in_flight", "Reads whose copies are not done.", "gauge"),
    "existence_holds": (
        "master_existence_holds",
        "Existence checks waiting for their client's read of the key.",
        "gauge",
    ),
    "late_reads": (
        "master_late_reads",
        "Expired read leases remembered so late readers can be told if their bytes held.",
        "gauge",
    ),
    "expired_read_holds": (
        "master_expired_read_leases",
        "Read leases that reached their TTL before their readers ended them.",
        "counter",
    ),
    "sessions": ("master_kv_sessions", "Active KV sessions.", "gauge"),
    "pinned_sessions": ("master_kv_pinned_sessions", "Pinned KV sessions.", "gauge"),
    "memberships": ("master_kv_session_memberships", "Object-in-session memberships.", "gauge"),
    "evicted_objects": ("master_evicted_key_count", "Objects evicted.", "counter"),
    "evicted_bytes": ("master_evicted_size_bytes", "Bytes evicted.", "counter"),
    "evicted_soft_pinned": (
        "master_evicted_soft_pinned_key_count",
        "Soft-pinned objects (TTL pin or pinned session) evicted in fallback passes.",
        "counter",
    ),
    "eviction_passes": ("master_eviction_passes", "Watermark eviction passes run.", "counter"),
    "sync_evictions": (
        "master_sync_evictions",
        "Objects evicted by writes to make room.",
        "counter",
    ),
    "alloc_failures": (
        "master_put_start_alloc_failures",
        "Writes refused for lack of evictable space.",
        "counter",
    ),
    "released_objects": ("master_released_key_count", "Objects removed by releases.", "counter"),
    "released_bytes": ("master_released_bytes", "Bytes freed by releases.", "counter"),
    "replicated_objects": (
        "master_replicated_objects",
        "Objects copied or moved to other segments by replica tasks.",
        "counter",
    ),
    "replicated_bytes": (
        "master_replicated_bytes",
        "Bytes written into other segments by replica tasks.",
        "counter",
    ),
    "get_hits": (
        "master_get_hits",
        "GetReplicaList keys found readable (each key of a batch counts).",
        "counter",
    ),
    "get_misses": (
        "master_get_misses",
        "GetReplicaList keys answered OBJECT_NOT_FOUND (each key of a batch counts).",
        "counter",
    ),
}

# The disk tier: stats() key -> every (metric name, help, kind) it is exported as. Upstream's
# names where it has one (its file-storage gauges, its promotion counters), ours for the rest;
# a byte gauge may be exported under both.
_DISK_METRICS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "disk_segments": (("master_disk_segments", "Mounted disk tiers.", "gauge"),),
    "disk_capacity_bytes": (
        ("master_disk_capacity_bytes", "Bytes of quota of every mounted disk tier.", "gauge"),
        ("master_total_file_capacity_bytes", "Disk tier quota (upstream's name).", "gauge"),
    ),
    "disk_used_bytes": (
        ("master_disk_used_bytes", "Bytes held in disk tiers.", "gauge"),
        (
            "master_allocated_file_size_bytes",
            "Bytes held in disk tiers (upstream's name).",
            "gauge",
        ),
    ),
    "disk_tasks": (("master_disk_tasks", "Spills and promotions in flight.", "gauge"),),
    "spills_in_flight": (("master_spills_in_flight", "Spills in flight.", "gauge"),),
    "disk_deletes_pending": (
        ("master_disk_deletes_pending", "Disk files freed, not yet deleted by owners.", "gauge"),
    ),
    "spills_started": (("master_spills_started", "Spills handed to owners.", "counter"),),
    "spilled_objects": (
        ("master_spilled_key_count", "Objects written to a disk tier.", "counter"),
    ),
    "spilled_bytes": (("master_spilled_size_bytes", "Bytes written to disk tiers.", "counter"),),
    "spill_failures": (("master_spill_failures", "Spills that failed.", "counter"),),
    "demoted_objects": (
        (
            "master_demoted_key_count",
            "Objects whose memory replicas were dropped, leaving them on disk only.",
            "counter",
        ),
    ),
    "promotions_started": (
        ("master_promotion_started", "Promotions (disk to memory) begun.", "counter"),
    ),
    "promoted_objects": (
        ("master_promotion_completed", "Objects copied back from disk to memory.", "counter"),
    ),
    "promotion_failures": (("master_promotion_failed", "Promotions that failed.", "counter"),),
    "disk_evicted_objects": (
        ("master_disk_evicted_key_count", "Objects evicted from disk tiers.", "counter"),
    ),
    "disk_evicted_bytes": (
        ("master_disk_evicted_size_bytes", "Bytes evicted from disk tiers.", "counter"),
    ),
    "disk_hits": (
        ("master_disk_hits", "GetReplicaList keys readable only from a disk tier.", "counter"),
    ),
}

# stats() key suffix -> (metric name, help) of the counters labelled by release kind; kind k
# reads stats()[f"{k}_{suffix}"].
_RELEASE_METRICS = {
    "releases": ("master_releases", "Release calls answered OK, by kind."),
    "released_objects": (
        "master_released_key_count_by_kind",
        "Objects removed by releases, by kind.",
    ),
    "released_bytes": ("master_released_bytes_by_kind", "Bytes freed by releases, by kind."),
}

# tenant_figures() key -> (metric name, help) of the gauges labelled by tenant.
_TENANT_METRICS = {
    "objects": ("master_tenant_objects", "Objects stored, per tenant."),
    "bytes": (
        "master_tenant_bytes",
        "Bytes the tenant's objects hold (size x replicas, in flight or written), per tenant.",
    ),
    "sessions": ("master_tenant_kv_sessions", "Active KV sessions, per tenant."),
    "pinned_sessions": ("master_tenant_kv_pinned_sessions", "Pinned KV sessions, per tenant."),
}


class _StoreCollector(Collector):
    """Every metric of the store, read from the service when scraped.

    Besides the store-wide families (:data:`_STATS_METRICS`), the disk tier's
    (:data:`_DISK_METRICS`: bytes, tasks in flight, spills, promotions, disk evictions and
    hits; memory figures such as ``master_total_capacity_bytes`` count memory only) and the
    per-RPC counters:

    - ``master_releases_total``, ``master_released_key_count_by_kind_total``,
      ``master_released_bytes_by_kind_total`` with label ``kind`` (``session``, ``stale``,
      ``all``, ``kv_cache``), always all four kinds.
    - ``master_kv_cache_sleep_state{tenant, sleep_state}``: 1 for the tenant's current state
      (``awake`` or ``kv_cache_released``), 0 for the other, and the ``master_tenant_*``
      gauges (:data:`_TENANT_METRICS`, and ``master_tenant_disk_bytes``: the part of its bytes
      held in disk tiers), for every tenant with objects or sessions or in the
      ``kv_cache_released`` state (0 for what it has not). ``tenant`` is the tenant the master
      resolved: without multi-tenancy, or for an empty id, ``default``.

    Each part is read under one hold of the service lock, so families read apart can be one
    call apart from each other. Cost per scrape: O(segments + tenants x disk tiers + RPCs).

    Args:
        service: the service to report on.
        rpcs: per-RPC counters.
        per_tenant: include the families labelled by tenant (a master with tokens serves
            them only to admin tokens: they name tenants and their figures).
    """

    def __init__(self, service: MasterService, rpcs: RpcCounters, per_tenant: bool = True) -> None:
        self._service = service
        self._rpcs = rpcs
        self._per_tenant = per_tenant
        self._queries = AdminQueries(service.context)

    def collect(self) -> Iterator[Metric]:
        stats = self._service.stats()
        for key, (name, doc, kind) in _STATS_METRICS.items():
            family = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            yield family(name, doc, value=stats.get(key, 0))
        for key, exports in _DISK_METRICS.items():
            for name, doc, kind in exports:
                family = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
                yield family(name, doc, value=stats.get(key, 0))
        for suffix, (name, doc) in _RELEASE_METRICS.items():
            by_kind = CounterMetricFamily(name, doc, labels=["kind"])
            for release_kind in RELEASE_KINDS:
                by_kind.add_metric([release_kind], stats.get(f"{release_kind}_{suffix}", 0))
            yield by_kind
        if self._per_tenant:
            yield from self._tenant_families()
        for rpc, count in sorted(dict(self._rpcs.requests).items()):
            op = snake_case(rpc)
            yield CounterMetricFamily(f"master_{op}_requests", f"{rpc} calls.", value=count)
            failed = self._rpcs.failures.get(rpc, 0)
            yield CounterMetricFamily(
                f"master_{op}_failures", f"{rpc} calls that failed.", value=failed
            )

    def _tenant_families(self) -> Iterator[Metric]:
        figures = self._service.tenant_figures()
        released = set(self._service.releases.kv_cache_released_tenants())
        tenants = sorted(figures.keys() | released)
        sleep = GaugeMetricFamily(
            "master_kv_cache_sleep_state",
            "KV-cache sleep state per tenant: 1 for the current one (kv_cache_released from a "
            "release_kv_cache that removed objects until the next KV-cache write commits).",
            labels=["tenant", "sleep_state"],
        )
        for tenant in tenants:
            current = KV_CACHE_RELEASED if tenant in released else AWAKE
            for state in SLEEP_STATES:
                sleep.add_metric([tenant, state], 1 if state == current else 0)
        yield sleep
        for key, (name, doc) in _TENANT_METRICS.items():
            per_tenant = GaugeMetricFamily(name, doc, labels=["tenant"])
            for tenant in tenants:
                per_tenant.add_metric([tenant], figures.get(tenant, {}).get(key, 0))
            yield per_tenant
        # Read under a hold of its own: it may be one call apart from the figures above.
        on_disk = self._queries.tenant_disk_bytes()
        disk_bytes = GaugeMetricFamily(
            "master_tenant_disk_bytes",
            "Bytes the tenant's objects hold in disk tiers (part of master_tenant_bytes).",
            labels=["tenant"],
        )
        for tenant in tenants:
            disk_bytes.add_metric([tenant], on_disk.get(tenant, 0))
        yield disk_bytes


class _MetricsHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's backlog of 5 makes a connection beyond it wait for a SYN retry (a second)
    # when several scrapers and probes arrive together.
    request_queue_size = 64
    # Set for HTTPS: each accepted connection's handshake runs on its own request thread, so
    # a client that stalls the handshake delays no one else.
    tls_context: ssl.SSLContext | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Connections served at once (a thread each); one beyond is closed at once, so a flood
        # of idle or stalling connections costs at most this many threads.
        self.connection_slots = threading.BoundedSemaphore(MAX_HTTP_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.connection_slots.acquire(blocking=False):
            log.debug(
                "metrics port: %s refused: %d connections open",
                client_address,
                MAX_HTTP_CONNECTIONS,
            )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.connection_slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connection_slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        context = self.tls_context
        if context is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(REQUEST_TIMEOUT_S)
        try:
            secure = context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:  # plaintext HTTP, no client certificate, ...
            log.debug("metrics port: TLS handshake with %s failed: %s", client_address, exc)
            return
        try:
            super().finish_request(secure, client_address)
        finally:
            with contextlib.suppress(OSError):
                secure.shutdown(socket.SHUT_WR)
            secure.close()


MAX_HTTP_CONNECTIONS = 128
"""Connections the metrics port serves at once; one beyond is closed without an answer."""

REQUEST_TIMEOUT_S = 30.0
"""Longest a connection may stay silent (request not sent, answer not read) before it is
dropped, so a stalled client cannot keep a serving thread forever."""

MAX_REQUEST_BODY = 1 << 20
"""Largest request body accepted (the memory API's JSON bodies are a few hundred bytes; a path
that takes none reads and ignores it, so that closing the connection does not reset it under
the client before it reads the answer)."""


class MetricsServer:
    """The metrics port: ``/metrics``, upstream's admin paths (:mod:`.http_admin`), over HTTP on
    a background thread.

    Each request is answered on a thread of its own (``ThreadingHTTPServer``), so a slow
    request or a slow reader never delays a scrape; no path holds the service lock for long
    (see :mod:`.http_admin`).

    Args:
        service: the service to report on.
        rpcs: per-RPC counters filled by the call pipeline.
        host: address to listen on.
        port: 0 picks a free port.
        authority: the master's tokens; by default read from ``service.config.auth_tokens_file``
            (None when it names none: no path then needs a token).
        tls_context: serve HTTPS only (:func:`mooncake_py.tls.server_context`); a plaintext
            request gets no answer (its connection is closed when the handshake fails). None
            serves HTTP.
        occupancy: the occupancy history the memory API's stats return (None: none).
        allowed_hosts: host names a browser may use to reach this port besides IP literals,
            ``localhost`` and this machine's names (:class:`~.http_admin.BrowserGuard`).

    Raises:
        ConfigError: the tokens file cannot be read.
        OSError: the address cannot be bound.
    """

    def __init__(
        self,
        service: MasterService,
        rpcs: RpcCounters,
        host: str,
        port: int,
        authority: TokenAuthority | None = None,
        tls_context: ssl.SSLContext | None = None,
        occupancy: OccupancyHistory | None = None,
        allowed_hosts: Sequence[str] = (),
        replicator: Replicator | None = None,
        leader: Mapping[str, Any] | None = None,
        serving: Callable[[], bool] | None = None,
    ) -> None:
        # Two views of the same figures: every family, and every family but those labelled
        # by tenant, which a master with tokens serves only to admin tokens (/metrics stays
        # open for scrapers and probes, with store-wide figures alone).
        full = CollectorRegistry()
        full.register(_StoreCollector(service, rpcs))
        store_wide = CollectorRegistry()
        store_wide.register(_StoreCollector(service, rpcs, per_tenant=False))
        tokens_file = service.config.auth_tokens_file
        if authority is None and tokens_file:
            authority = TokenAuthority.from_file(tokens_file)

        def metrics_text(per_tenant: bool) -> bytes:
            return generate_latest(full if per_tenant else store_wide)

        api = AdminApi(service, rpcs, metrics_text, authority, occupancy, allowed_hosts, leader)
        self.api = api

        class Handler(BaseHTTPRequestHandler):
            timeout = REQUEST_TIMEOUT_S

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._serve("POST")

            def do_PUT(self) -> None:  # noqa: N802
                self._serve("PUT")

            def do_DELETE(self) -> None:  # noqa: N802
                self._serve("DELETE")

            def do_PATCH(self) -> None:  # noqa: N802
                self._serve("PATCH")

            def do_HEAD(self) -> None:  # noqa: N802
                self._serve("HEAD")

            def __getattr__(self, name: str) -> Any:
                # Every other method (OPTIONS, TRACE, ...) is answered like these: 404 or 405
                # with Allow, not http.server's 501. No CORS preflight is ever granted.
                if name.startswith("do_"):
                    return lambda: self._serve(name[3:])
                raise AttributeError(name)

            def _serve(self, method: str) -> None:
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if length < 0:
                    self._send(Reply(400, "text/plain", b"bad Content-Length\n"), method)
                    return
                if length > MAX_REQUEST_BODY:
                    self._send(Reply(413, "text/plain", b"request body too large\n"), method)
                    return
                body = self.rfile.read(length) if length else b""
                if serving is not None and not serving():
                    self._send(Reply(503, "text/plain", b"this master is not the leader\n"), method)
                    return
                marks = replicator.journal.marks if replicator is not None else 0
                try:
                    reply = api.handle(
                        method,
                        self.path,
                        self.headers.get("Authorization"),
                        body,
                        self.headers.get("Content-Type"),
                        BrowserHeaders(
                            self.headers.get("Host"),
                            self.headers.get("Origin"),
                            self.headers.get("Sec-Fetch-Site"),
                        ),
                    )
                except Exception:  # a bug must not kill the port: answer 500 and say why
                    log.exception("admin path %s failed", self.path.split("?")[0])
                    reply = Reply(500, "text/plain", b"internal error\n")
                if replicator is not None:
                    # What the request changed is answered only once it is in the log.
                    needed = replicator.needed(marks)
                    if needed and not replicator.wait_durable_blocking(needed, REQUEST_TIMEOUT_S):
                        reply = Reply(503, "text/plain", b"the change could not be replicated\n")
                self._send(reply, method)

            def _send(self, reply: Reply, method: str) -> None:
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                # No answer is to be read as anything but its declared type.
                self.send_header("X-Content-Type-Options", "nosniff")
                for name, value in reply.headers:
                    self.send_header(name, value)
                if isinstance(reply.body, bytes):
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    if method != "HEAD":
                        self.wfile.write(reply.body)
                    return
                # Streamed: the end of the body is the end of the connection (HTTP/1.0).
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    for part in reply.body:
                        self.wfile.write(part)
                except OSError:  # the reader went away (or stalled past the timeout)
                    self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return  # scrapes are frequent; they are not news

        self._http = _MetricsHTTPServer((host, port), Handler)
        self._http.tls_context = tls_context
        # handle_request() only accepts: the loop below has already seen a connection waiting.
        self._http.timeout = 0
        self.port = int(self._http.server_address[1])
        # serve_forever() notices shutdown() only at its next poll tick (0.5 s by default); a
        # byte on this pair wakes the loop at once, so close() returns without waiting.
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="mooncake-metrics", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._http, selectors.EVENT_READ)
            selector.register(self._wake_reader, selectors.EVENT_READ)
            while True:
                ready = selector.select()
                if any(key.fileobj is self._wake_reader for key, _ in ready):
                    return
                self._http.handle_request()

    def close(self) -> None:
        """Stop serving: stop accepting at once, wait for requests already being answered,
        release the port. Closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        self._wake_writer.send(b"x")
        self._thread.join(timeout=5)
        self._http.server_close()
        self._wake_reader.close()
        self._wake_writer.close()
