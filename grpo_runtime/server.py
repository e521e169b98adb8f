"""The shared grpc.aio server: health, reflection, auth, metrics, TLS, limits, graceful shutdown.

Usage::

    binding = ServiceBinding(
        servicer=RewardServicer(scorer),
        add_to_server=reward_pb2_grpc.add_RewardServiceServicer_to_server,
        descriptor=reward_pb2.DESCRIPTOR.services_by_name["RewardService"],
    )
    async with GrpcServer(ServerConfig(port=0), [binding]) as server:
        ...  # server.port, server.address; health says SERVING for "" and each service
    # or, in a process entry point: await server.serve_forever()  (returns after SIGTERM/SIGINT)

Lifecycle: ``start`` binds the port, starts the metrics endpoint and the server, then the bindings'
companions (other listeners of the same service, e.g. an HTTP API, on the same host), then marks ``""``
and every service SERVING. ``stop`` marks everything NOT_SERVING at once (open health ``Watch``
streams see it and end), waits ``shutdown_delay_s``, refuses new RPCs (and companion requests) and gives
in-flight ones ``grace_period_s`` to finish (then cancels them), and finally runs ``on_shutdown`` (which
also runs when ``async with`` fails to start the server).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client.registry import Collector

from grpo_runtime.auth import admin_methods
from grpo_runtime.config import ServerConfig
from grpo_runtime.health import OVERALL, SERVING, HealthServicer
from grpo_runtime.interceptors import RuntimeInterceptor
from grpo_runtime.metrics import RpcMetrics
from grpo_runtime.tls import server_credentials

logger = logging.getLogger("grpo_runtime.server")

HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
Cleanup = Callable[[], Awaitable[None] | None]


class BindError(RuntimeError):
    """The server could not listen on its host:port."""


class Companion(Protocol):
    """A second listener of a service that lives and dies with the gRPC server (an HTTP API beside it).

    ``start`` gets the server's config (bind to ``config.host``; TLS files are there too) and raises
    :class:`BindError` when it cannot listen; ``stop`` refuses new requests and gives in-flight ones the
    config's ``grace_period_s``."""

    async def start(self, config: ServerConfig) -> None: ...
    async def stop(self) -> None: ...


@dataclass(frozen=True)
class ServiceBinding:
    """One service to serve: the servicer, the generated ``add_XServicer_to_server`` function, and the
    service descriptor (its full name is used for health and reflection, its method options for auth).
    ``collectors`` are Prometheus collectors of the service's own metrics, exported beside the RPC metrics;
    ``companions`` other listeners served with it (see :class:`Companion`)."""

    servicer: Any
    add_to_server: Callable[[Any, grpc.aio.Server], None]
    descriptor: ServiceDescriptor
    collectors: tuple[Collector, ...] = ()
    companions: tuple[Companion, ...] = ()

    @property
    def name(self) -> str:
        """Full proto name, e.g. ``grpo.reward.v1.RewardService``."""
        return self.descriptor.full_name


def _bind_host(host: str) -> str:
    """Host as it goes in front of ``:port``: IPv6 literals in brackets."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def server_options(config: ServerConfig) -> list[tuple[str, int]]:
    """grpc channel arguments for the server from its config."""
    options = [
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.keepalive_time_ms", config.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", config.keepalive_timeout_ms),
        ("grpc.http2.min_ping_interval_without_data_ms", config.min_ping_interval_without_data_ms),
        # Accept client keepalive pings on idle connections (clients keep channels warm).
        ("grpc.keepalive_permit_without_calls", 1),
        # A port already in use must fail loudly rather than be shared with another server.
        ("grpc.so_reuseport", 0),
    ]
    if config.max_connection_age_ms is not None:
        options.append(("grpc.max_connection_age_ms", config.max_connection_age_ms))
    if config.max_connection_age_grace_ms is not None:
        options.append(("grpc.max_connection_age_grace_ms", config.max_connection_age_grace_ms))
    return options


class GrpcServer:
    """A grpc.aio server for ``bindings`` configured by ``config`` (see the module docstring).

    ``on_shutdown`` (sync or async, no arguments) runs after in-flight RPCs have finished or been
    cancelled: release engines, pools and files there.
    """

    def __init__(
        self, config: ServerConfig, bindings: Sequence[ServiceBinding], on_shutdown: Cleanup | None = None
    ) -> None:
        if not bindings:
            raise ValueError("GrpcServer needs at least one ServiceBinding")
        names = [b.name for b in bindings]
        if len(set(names)) != len(names):
            raise ValueError(f"services bound twice: {names}")
        self.config = config
        self.bindings = tuple(bindings)
        self.health = HealthServicer()
        self.metrics = RpcMetrics()
        for binding in self.bindings:
            for collector in binding.collectors:
                self.metrics.registry.register(collector)
        self._on_shutdown = on_shutdown
        self._server: grpc.aio.Server | None = None
        self._port: int | None = None
        self._metrics_port: int | None = None
        self._stop_task: asyncio.Task[None] | None = None
        self._stop_requested: asyncio.Event | None = None

    @property
    def service_names(self) -> list[str]:
        return [b.name for b in self.bindings]

    @property
    def port(self) -> int:
        """The bound port (the real one when the config asked for port 0)."""
        if self._port is None:
            raise RuntimeError("server not started")
        return self._port

    @property
    def address(self) -> str:
        """``host:port`` as bound, usable as a channel target when the host is not a wildcard."""
        return f"{_bind_host(self.config.host)}:{self.port}"

    @property
    def metrics_port(self) -> int | None:
        """The bound Prometheus port, or None when metrics are off."""
        return self._metrics_port

    async def start(self) -> None:
        """Bind, start, and report SERVING. Raises :class:`BindError` when the port cannot be bound."""
        if self._server is not None:
            raise RuntimeError("server already started")
        config = self.config
        token = config.resolve_admin_token()
        protected = admin_methods(b.descriptor for b in self.bindings)
        if protected and token is None:
            logger.warning(
                "no admin token configured (ServerConfig.admin_token, env GRPO_ADMIN_TOKEN or "
                "admin_token_file): admin RPCs are open to every caller: %s",
                ", ".join(sorted(protected)),
            )
        interceptor = RuntimeInterceptor(metrics=self.metrics, admin_methods=protected, admin_token=token)
        server = grpc.aio.server(
            interceptors=[interceptor],
            options=server_options(config),
            maximum_concurrent_rpcs=config.max_concurrent_rpcs,
        )
        for binding in self.bindings:
            binding.add_to_server(binding.servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            [*self.service_names, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        target = f"{_bind_host(config.host)}:{config.port}"
        try:
            # The config's validator sets both files or neither (tls_enabled); narrowed here for the types.
            if config.tls_cert_file is not None and config.tls_key_file is not None:
                credentials = server_credentials(
                    config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file
                )
                port = server.add_secure_port(target, credentials)
            else:
                port = server.add_insecure_port(target)
        except RuntimeError as exc:
            raise BindError(f"cannot bind {target}: address in use or not available on this host") from exc
        if not port:
            raise BindError(f"cannot bind {target}")
        if config.metrics_port is not None:
            self._metrics_port = self.metrics.serve_http(config.host, config.metrics_port)
        try:
            await server.start()
        except BaseException:
            self.metrics.stop_http()
            raise
        try:
            await self._start_companions()
        except BaseException:
            await server.stop(0)
            self.metrics.stop_http()
            raise
        self._server, self._port = server, port
        self._stop_requested = asyncio.Event()
        for name in [OVERALL, *self.service_names]:
            await self.health.set(name, SERVING)
        logger.info(
            "serving %s on %s",
            ", ".join(self.service_names),
            self.address,
            extra={
                "tls": "mutual" if config.tls_client_ca_file else "on" if config.tls_enabled else "off",
                "metrics_port": self._metrics_port,
                "admin_auth": token is not None,
            },
        )

    @property
    def companions(self) -> tuple[Companion, ...]:
        return tuple(c for b in self.bindings for c in b.companions)

    async def _start_companions(self) -> None:
        started: list[Companion] = []
        try:
            for companion in self.companions:
                await companion.start(self.config)
                started.append(companion)
        except BaseException:
            for companion in reversed(started):
                await companion.stop()
            raise

    def request_stop(self) -> None:
        """Ask :meth:`serve_forever` to shut down (what SIGTERM/SIGINT do). Safe to call twice."""
        if self._stop_requested is not None:
            self._stop_requested.set()

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful shutdown (see the module docstring); ``grace_s`` overrides the config. Idempotent:
        later callers wait for the first one's shutdown."""
        if self._server is None:
            return
        if self._stop_task is None:
            self._stop_task = asyncio.create_task(
                self._shutdown(self.config.grace_period_s if grace_s is None else grace_s)
            )
        await asyncio.shield(self._stop_task)

    async def _shutdown(self, grace_s: float) -> None:
        assert self._server is not None
        logger.info("shutting down: NOT_SERVING, in-flight RPCs get %.1f s", grace_s)
        await self.health.enter_graceful_shutdown()
        if self.config.shutdown_delay_s > 0:
            await asyncio.sleep(self.config.shutdown_delay_s)
        try:
            await asyncio.gather(
                self._server.stop(grace_s), *(companion.stop() for companion in self.companions)
            )
            await self._release()
        except Exception:
            logger.exception("error during shutdown cleanup")
        finally:
            self.metrics.stop_http()
        logger.info("stopped")

    async def wait_for_termination(self) -> None:
        """Return when the server has stopped. Cancelling this wait does not disturb the server."""
        if self._server is not None:
            # Shielded: grpc's wait shares a future with the shutdown, which a cancel would kill.
            await asyncio.shield(self._server.wait_for_termination())

    async def serve_forever(self) -> None:
        """Start, serve until SIGTERM/SIGINT (or :meth:`request_stop`), then stop gracefully.

        Signal handlers are installed only when running in the main thread's event loop.
        """
        loop = asyncio.get_running_loop()
        async with self:
            assert self._stop_requested is not None
            installed = []
            for signum in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(signum, self._on_signal, signum)
                    installed.append(signum)
                except (NotImplementedError, RuntimeError, ValueError):
                    logger.debug("cannot install a handler for %s here", signal.Signals(signum).name)
            try:
                stop_wait = asyncio.create_task(self._stop_requested.wait())
                termination = asyncio.create_task(self.wait_for_termination())
                await asyncio.wait({stop_wait, termination}, return_when=asyncio.FIRST_COMPLETED)
                stop_wait.cancel()
                termination.cancel()
                await self.stop()
            finally:
                for signum in installed:
                    loop.remove_signal_handler(signum)

    def _on_signal(self, signum: int) -> None:
        if self._stop_task is not None:
            logger.info("%s received: already shutting down", signal.Signals(signum).name)
            return
        logger.info("%s received", signal.Signals(signum).name)
        self.request_stop()

    async def _release(self) -> None:
        if self._on_shutdown is not None:
            result = self._on_shutdown()
            if inspect.isawaitable(result):
                await result

    async def __aenter__(self) -> GrpcServer:
        try:
            await self.start()
        except BaseException:
            # A server that never started still owns what on_shutdown releases (worker pools, engines).
            try:
                await self._release()
            except Exception:
                logger.exception("error during cleanup after a failed start")
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
