"""The HTTP endpoint of the reward service: OpenRLHF's ``POST /get_reward`` and ``GET /health``, served by
aiohttp in the gRPC server's event loop and scored by the same :class:`~reward_service.core.scorer.Scorer`
as Score.

Errors are the gRPC ones as HTTP statuses, with a JSON body ``{"error": "<field>: <message>", "field": ...}``:
INVALID_ARGUMENT and FAILED_PRECONDITION → 400, a body over ``http.max_body_bytes`` or a count over a limit
→ 413, a body slower than ``http.body_timeout_s`` → 408, the concurrency bound → 429 with ``Retry-After``
(seconds); hostile input never gets a 500. ``field`` names what the caller sent (``query[3]``,
``prompts[3]``, ``labels[3]``, ``weights[1]``), never the scorer's own sample fields.

Cost: the rewards (query string) and the body's size come first; the body is parsed, its counts checked and
its samples built on a worker thread, and so is the response: near ``max_body_bytes`` each takes seconds of
Python, and this loop also serves gRPC. A connection gets ``http.header_timeout_s`` to send its headers.
"""

from __future__ import annotations

import asyncio
import math
import re

from aiohttp import web

from grpo_runtime.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, ServiceError
from grpo_runtime.http_companion import HttpCompanion
from grpo_runtime.http_metrics import HttpMetrics
from reward_service.core.bounds import reward_bounds
from reward_service.core.scorer import Scorer
from reward_service.core.types import Sample
from reward_service.http import openrlhf
from reward_service.http.settings import HttpSettings

# The scorer names fields after ScoreRequest (samples[3].metadata, rewards[1].weight): each as what the
# caller sent. Rewards named by the configuration (no ?rewards=) are the config's http.rewards entries.
_SAMPLE_FIELDS = (
    (re.compile(r"^samples\[(\d+)\]\.metadata"), r"labels[\1]"),
    (re.compile(r"^samples\[(\d+)\]\.prompt(?:\[\d+\])?(?:\.\w+)?"), r"prompts[\1]"),
    (re.compile(r"^samples\[(\d+)\](?:\.\w+)?"), r"query[\1]"),
    (re.compile(r"^samples$"), "query"),
)
_QUERY_REWARD_FIELDS = (
    (re.compile(r"^rewards\[(\d+)\]\.weight"), r"weights[\1]"),
    (re.compile(r"^rewards\[(\d+)\]\.name"), r"rewards[\1]"),
)
_CONFIG_REWARD_FIELDS = ((re.compile(r"^rewards(?=\[)"), "http.rewards"),)


def _caller_field(field: str, rewards_in_query: bool) -> str:
    """The scorer's field name as the field of the HTTP request (or config key) it came from."""
    rules = _SAMPLE_FIELDS + (_QUERY_REWARD_FIELDS if rewards_in_query else _CONFIG_REWARD_FIELDS)
    for pattern, replacement in rules:
        renamed, count = pattern.subn(replacement, field, count=1)
        if count:
            return renamed
    return field


def _error(
    status: int,
    exc: ServiceError,
    headers: dict[str, str] | None = None,
    *,
    rewards_in_query: bool = True,
) -> web.Response:
    field = _caller_field(exc.field, rewards_in_query) if exc.field else None
    message = f"{field}: {exc.message}" if field else exc.message
    body = {"error": message[:1000], "field": field}
    return web.json_response(body, status=status, headers=headers)


class _SlowBody(Exception):
    """The request's body did not arrive within ``http.body_timeout_s``."""


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
        rewards_in_query = "rewards" in request.query
        try:
            rewards = openrlhf.rewards_of(request.query, self._settings)
            body = await self._read(request)
            samples = await asyncio.to_thread(self._samples, body, len(rewards))
            # No samples (OpenRLHF's share for a second URL when the batch is smaller): nothing to score.
            results = await self._scorer.score(samples, rewards) if samples else []
        except web.HTTPRequestEntityTooLarge:
            return _error(
                413,
                InvalidArgument(f"over http.max_body_bytes={self._settings.max_body_bytes}", field="body"),
            )
        except _SlowBody:
            return _error(
                408,
                InvalidArgument(
                    f"not received within http.body_timeout_s={self._settings.body_timeout_s:g}s",
                    field="body",
                ),
            )
        except ServiceError as exc:
            status, headers = _status_of(exc)
            return _error(status, exc, headers, rewards_in_query=rewards_in_query)
        bounds = self._settings.score_range or reward_bounds(rewards, self._scorer.describe())
        missing = self._settings.missing_reward
        return web.json_response(
            await asyncio.to_thread(openrlhf.response_of, results, rewards, bounds, missing)
        )

    async def _read(self, request: web.Request) -> bytes:
        """The body (at most ``max_body_bytes``: aiohttp refuses more); _SlowBody past ``body_timeout_s``."""
        try:
            async with asyncio.timeout(self._settings.body_timeout_s):
                return await request.read()
        except TimeoutError:
            raise _SlowBody() from None

    def _samples(self, body: bytes, rewards: int) -> list[Sample]:
        """The body's samples, the counts checked before any item is read (on a worker thread); none for an
        empty ``query`` list."""
        columns = openrlhf.columns_of(openrlhf.parse_body(body))
        if not columns.queries:
            return []
        self._scorer.check_counts(len(columns.queries), rewards)
        return openrlhf.samples_of(columns, self._settings, self._scorer.limits)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "SERVING", "in_flight": self._scorer.in_flight})


class HttpEndpoint(HttpCompanion):
    """The API as a companion of the gRPC server: on the server's host, with its TLS files, stopped with it.
    ``metrics`` is the collector the server exports (the binding's ``collectors``)."""

    def __init__(self, scorer: Scorer, settings: HttpSettings):
        if settings.port is None:
            raise ValueError("HttpEndpoint needs http.port")
        metrics = HttpMetrics()
        super().__init__(
            RewardHttpApi(scorer, settings, metrics).app,
            settings.port,
            header_timeout_s=settings.header_timeout_s,
            metrics=metrics,
            what="OpenRLHF /get_reward",
        )
