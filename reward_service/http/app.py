"""The HTTP endpoint of the reward service: OpenRLHF's ``POST /get_reward`` and ``GET /health``, served by
aiohttp in the gRPC server's event loop and scored by the same :class:`~reward_service.core.scorer.Scorer`
as Score.

Errors are the gRPC ones as HTTP statuses, with a JSON body ``{"error": "<field>: <message>", "field": ...}``:
INVALID_ARGUMENT and FAILED_PRECONDITION → 400, a body over ``http.max_body_bytes`` or a count over a limit
→ 413, the concurrency bound → 429 with ``Retry-After`` (seconds); hostile input never gets a 500.
"""

from __future__ import annotations

import logging
import math
import re
import ssl

from aiohttp import web

from grpo_runtime.config import ServerConfig
from grpo_runtime.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, ServiceError
from grpo_runtime.server import BindError
from reward_service.core.bounds import reward_bounds
from reward_service.core.scorer import Scorer
from reward_service.http import openrlhf
from reward_service.http.metrics import HttpMetrics
from reward_service.http.settings import HttpSettings

log = logging.getLogger(__name__)

# The scorer names sample fields after ScoreRequest (samples[3].completion); here the samples are the queries.
_SAMPLES_FIELD = re.compile(r"^samples(?=$|[\[.])")


def _error(status: int, exc: ServiceError, headers: dict[str, str] | None = None) -> web.Response:
    field = _SAMPLES_FIELD.sub("query", exc.field) if exc.field else None
    message = f"{field}: {exc.message}" if field else exc.message
    body = {"error": message[:1000], "field": field}
    return web.json_response(body, status=status, headers=headers)


def _status_of(exc: ServiceError) -> tuple[int, dict[str, str] | None]:
    if isinstance(exc, ResourceExhausted):
        if exc.retry_after_s is not None:  # the concurrency bound: goes away by itself
            return 429, {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
        return 413, None
    if isinstance(exc, InvalidArgument | FailedPrecondition):
        return 400, None
    return 503, None


class RewardHttpApi:
    """The aiohttp application: converts JSON ↔ domain objects and awaits the scorer; ``metrics`` counts
    every request."""

    def __init__(self, scorer: Scorer, settings: HttpSettings, metrics: HttpMetrics):
        self._scorer = scorer
        self._settings = settings
        self.app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[metrics.middleware])
        self.app.router.add_post("/get_reward", self.get_reward)
        self.app.router.add_get("/health", self.health)

    async def get_reward(self, request: web.Request) -> web.Response:
        try:
            body = openrlhf.parse_body(await request.read())
            samples = openrlhf.samples_of(body, self._settings)
            rewards = openrlhf.rewards_of(request.query, self._settings)
            results = await self._scorer.score(samples, rewards)
        except web.HTTPRequestEntityTooLarge:
            return _error(
                413,
                InvalidArgument(f"over http.max_body_bytes={self._settings.max_body_bytes}", field="body"),
            )
        except ServiceError as exc:
            status, headers = _status_of(exc)
            return _error(status, exc, headers)
        bounds = self._settings.score_range or reward_bounds(rewards, self._scorer.describe())
        return web.json_response(
            openrlhf.response_of(results, rewards, bounds, self._settings.missing_reward)
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "SERVING", "in_flight": self._scorer.in_flight})


def _ssl_context(config: ServerConfig) -> ssl.SSLContext | None:
    """The gRPC server's TLS (and mutual TLS) settings for HTTPS; None when TLS is off."""
    if not config.tls_enabled:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(config.tls_cert_file), str(config.tls_key_file))
    if config.tls_client_ca_file is not None:
        context.load_verify_locations(str(config.tls_client_ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class HttpEndpoint:
    """The API as a companion of the gRPC server (``grpo_runtime.server.Companion``): on the server's host,
    with its TLS files, stopped with it. ``metrics`` is the collector the server exports (the binding's
    ``collectors``)."""

    def __init__(self, scorer: Scorer, settings: HttpSettings):
        if settings.port is None:
            raise ValueError("HttpEndpoint needs http.port")
        self.metrics = HttpMetrics()
        self._api = RewardHttpApi(scorer, settings, self.metrics)
        self._requested_port = settings.port
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self, config: ServerConfig) -> None:
        runner = web.AppRunner(self._api.app, access_log=None, shutdown_timeout=config.grace_period_s)
        await runner.setup()
        site = web.TCPSite(runner, config.host, self._requested_port, ssl_context=_ssl_context(config))
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise BindError(f"cannot bind HTTP {config.host}:{self._requested_port}: {exc.strerror}") from exc
        self._runner = runner
        self.port = runner.addresses[0][1]
        log.info("HTTP endpoint (OpenRLHF /get_reward) on %s:%d", config.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
