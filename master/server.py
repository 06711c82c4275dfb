"""The master process's server: the gRPC endpoint and the stream channel, both serving the one
call pipeline, plus ``/metrics`` and the background timers."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from mooncake_py import tls
from mooncake_py._wire.rpcs import SERVICE_NAME

from .background import BackgroundLoops
from .clock import monotonic_clock
from .config import MasterConfig
from .ha.durability import MetadataDurability
from .metrics import MetricsServer, RpcCounters
from .occupancy import OccupancyHistory
from .service.facade import MasterService
from .transport.auth import TokenAuthority
from .transport.grpc_transport import TokenGate, add_to_server
from .transport.pipeline import CallPipeline
from .transport.stream import StreamChannel, start_channel

log = logging.getLogger(__name__)

GRPC_MAX_STREAMS_PER_CONNECTION = 256
"""Concurrent calls one gRPC connection may carry (HTTP/2 streams)."""


def free_port(host: str) -> int:
    """A port free on ``host`` now (bound and released at once; another process could take
    it before it is bound again, which the bind then reports)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class MasterServer:
    """A running master: service state, gRPC server, stream channel and timers, on the current
    event loop.

    Args:
        config: validated configuration (``port`` 0 picks a free port).
        clock: time source shared by the service and the timers.
        background: run the timers (tests that drive steps by hand turn them off).

    Attributes:
        service: the :class:`MasterService` behind the endpoint.
        port: the bound gRPC port, known after :meth:`start`.
        fast_port: the bound stream-channel port (0 when disabled).
        metrics_port: the bound ``/metrics`` port (0 when disabled).
    """

    def __init__(
        self,
        config: MasterConfig,
        clock: Callable[[], float] = monotonic_clock,
        background: bool = True,
    ) -> None:
        self.config = config
        self.service = MasterService(config, clock=clock, view_version=time.time_ns() // 1_000_000)
        self.port = 0
        self.fast_port = 0
        self.metrics_port = 0
        self._reserved_port = 0
        self._metrics: MetricsServer | None = None
        self._server: grpc.aio.Server | None = None
        self._channel: StreamChannel | None = None
        # The dashboard's occupancy history: sampled by a timer, read by the memory API.
        self.occupancy = OccupancyHistory(self.service.stats)
        self._loops = (
            BackgroundLoops(
                self.service,
                clock,
                extra_steps=[(config.occupancy_sample_sec, self.occupancy.sample)],
            )
            if background
            else None
        )
        # Read at construction so a bad tokens file fails the start with a clear message.
        authority = (
            TokenAuthority.from_file(config.auth_tokens_file) if config.auth_tokens_file else None
        )
        self._authority = authority
        # Built here too, so a certificate that does not load fails the start with its name.
        self._tls = config.tls()
        self._tls_context = tls.server_context(self._tls) if self._tls is not None else None
        self._pipeline = CallPipeline(self.service, authority, RpcCounters())
        # The replicated metadata log (--enable_ha, --enable_snapshot); its standby phase runs
        # inside start(), before any port is bound.
        self.durability = MetadataDurability(config, self.service, self._lost_leadership)
        self.lost_leadership = asyncio.Event()
        self.on_standby: Callable[[], None] = lambda: None

    @property
    def address(self) -> str:
        """``host:port`` clients should dial."""
        return self._address_of(self.port)

    def _address_of(self, port: int) -> str:
        host = self.config.rpc_address
        if host in ("0.0.0.0", "", "::"):
            host = "127.0.0.1"
        return f"{host}:{port}"

    def _bind_port(self) -> int:
        # An HA master publishes its address before it binds: port 0 was resolved up front.
        return self._reserved_port or self.config.port

    def _lost_leadership(self, exc: BaseException) -> None:
        """Another master may be writing the log: stop answering at once."""
        log.error("stopping: %s", exc)
        self.lost_leadership.set()
        asyncio.get_running_loop().create_task(self.stop(0))

    async def start(self) -> int:
        """Bind and start serving; returns the bound port. With ``--enable_ha`` this
        waits, as a standby following the log, until this master is elected leader (it
        calls :attr:`on_standby` once it follows); with ``--enable_snapshot`` it first
        restores the state when asked to.

        Raises:
            RuntimeError: the address could not be bound.
            LogStoreError, ValueError: the metadata log could not be read.
        """
        if self.durability.enabled:
            if self.config.enable_ha and self.config.port == 0:
                self._reserved_port = free_port(self.config.rpc_address)
            advertise = self.config.ha_advertise_address or self._address_of(self._bind_port())
            await self.durability.before_serving(advertise, self.on_standby)
            self._pipeline.replicator = self.durability.replicator
            if self.config.enable_ha:
                self._pipeline.serving = self.durability.serving
        limit = self.config.max_message_bytes
        options: list[tuple[str, int]] = [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
            # Calls run one at a time on the loop: many streams per connection buy nothing.
            ("grpc.max_concurrent_streams", GRPC_MAX_STREAMS_PER_CONNECTION),
        ]
        idle_ms = int(self.config.rpc_conn_timeout_seconds * 1000)
        if idle_ms:
            options.append(("grpc.max_connection_idle_ms", idle_ms))
        gates = [TokenGate(self._pipeline)] if self._pipeline.requires_token else []
        server = grpc.aio.server(
            options=options,
            maximum_concurrent_rpcs=self.config.rpc_max_concurrent_calls,
            interceptors=gates,
        )
        add_to_server(self._pipeline, server)
        bind = f"{self.config.rpc_address}:{self._bind_port()}"
        try:
            if self._tls is None:
                self.port = server.add_insecure_port(bind)
            else:
                self.port = server.add_secure_port(bind, tls.grpc_server_credentials(self._tls))
        except RuntimeError as exc:
            raise RuntimeError(f"cannot listen on {bind}: {exc}") from exc
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        await server.start()
        self._server = server
        for name in ("", SERVICE_NAME):
            await health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.config.metrics_port >= 0:
            self._metrics = MetricsServer(
                self.service,
                self._pipeline.counters,
                self.config.rpc_address,
                self.config.metrics_port,
                authority=self._authority,
                tls_context=self._tls_context,
                occupancy=self.occupancy,
                allowed_hosts=[
                    h.strip() for h in self.config.http_allowed_hosts.split(",") if h.strip()
                ],
                replicator=self.durability.replicator,
                leader=self.durability.leader_view(),
                serving=self._pipeline.serving,
            )
            self.metrics_port = self._metrics.port
        if self.config.fast_rpc_port >= 0:
            self._channel = await start_channel(
                self._pipeline,
                self.config.rpc_address,
                self.config.fast_rpc_port,
                self.config.max_message_bytes,
                self.config.stream_max_connections,
                self.config.rpc_conn_timeout_seconds,
                ssl_context=self._tls_context,
            )
            self.fast_port = self._channel.port
            self._pipeline.fast_port = self.fast_port
        if self._loops is not None:
            self.occupancy.sample()  # the history starts with the first moment served
            self._loops.start()
        log.info(
            "master listening on %s:%d (%s)",
            self.config.rpc_address,
            self.port,
            "plaintext"
            if self._tls is None
            else "TLS" + (" mutual" if self._tls.require_client_cert else ""),
        )
        return self.port

    async def stop(self, grace_s: float | None = 0.5) -> None:
        """Stop the timers and the server."""
        if self._loops is not None:
            await self._loops.stop()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        await self.durability.close()

    async def wait_for_termination(self) -> None:
        """Block until the server stops."""
        if self._server is not None:
            await self._server.wait_for_termination()
