"""The gateway's HTTP layer: aiohttp routes, JSON in and out through :mod:`openai_codec`, statuses; every
call's logic is one :class:`~rollout_service.gateway.service.AgentGateway` method.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses`` (OpenAI's Responses
API over the chat path, :mod:`responses_codec`), ``GET /v1/models``, and the same under
``/sessions/{session_id}/v1/``. Errors are OpenAI's shape ``{"error": {"message", "type", "param",
"code"}}``, ``param`` naming the request field: a malformed body or field 400; an unknown or expired
session, or a path outside a session when ``serve_without_session`` is off, 404; a body over
``gateway.max_body_bytes`` or a count over a limit 413; a body slower than ``gateway.body_timeout_s`` 408;
sessions, calls of a session or the service's concurrent-call bound 429 with ``Retry-After`` (seconds); the
engine asleep or its weights invalid 503. Input never gets a 500.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from grpo_runtime.config import ServerConfig
from grpo_runtime.errors import InvalidArgument, NotFound, ResourceExhausted, ServiceError
from grpo_runtime.http_companion import HttpCompanion
from grpo_runtime.http_metrics import HttpMetrics
from grpo_runtime.off_loop import off_loop_unless
from rollout_service.gateway import openai_codec, responses_codec
from rollout_service.gateway.service import AgentGateway
from rollout_service.gateway.types import Answer
from rollout_service.settings import GatewaySettings

log = logging.getLogger(__name__)

SESSION_PREFIX = "/sessions/{session_id}"
# A body up to this size is parsed, decoded and its prompt rendered on the event loop (about 1.5 ms at
# most), an answer of up to this many sampled tokens encoded there: grpo_runtime.off_loop.
INLINE_BODY_BYTES = 2048
INLINE_ANSWER_TOKENS = 1024
_STATUS_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}

# OpenAI's machine-readable ``code`` where one applies (else null).
_STATUS_CODES = {404: "not_found", 413: "limit_exceeded", 429: "rate_limit_exceeded"}


def error_response(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    kind = _STATUS_TYPES.get(status, "invalid_request_error")
    body = openai_codec.error_body(message, kind, param, _STATUS_CODES.get(status))
    return web.json_response(body, status=status, headers=headers)


def _status_of(exc: ServiceError) -> tuple[int, dict[str, str] | None]:
    if isinstance(exc, ResourceExhausted):
        if exc.retry_after_s is not None:  # a bound that frees itself
            return 429, {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
        return 413, None
    if isinstance(exc, InvalidArgument):
        return 400, None
    if isinstance(exc, NotFound):
        return 404, None
    return 503, None  # the engine asleep, weights invalid, shutting down: the server's state, not the input


@web.middleware
async def openai_errors(request: web.Request, handler) -> web.StreamResponse:
    """aiohttp's own refusals (no such path, wrong method) and a failure of the server's own (500, logged)
    in OpenAI's error shape."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return error_response(exc.status, exc.reason, headers=allow)
    except Exception:
        log.exception("gateway request %s %s failed", request.method, request.path)
        return error_response(500, "internal error of the gateway (logged)")


class _SlowBody(Exception):
    pass


def _completion_object(answer: Answer, call) -> dict:
    return openai_codec.encode_answer(answer, return_token_ids=call.return_token_ids)


def _completion_events(answer: Answer, call) -> Iterator[bytes]:
    """Chat and text completion chunks as server-sent events: ``data: <chunk>``, then ``data: [DONE]``."""
    chunks = openai_codec.chunks_of(
        answer, include_usage=call.include_usage, return_token_ids=call.return_token_ids
    )
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    yield b"data: [DONE]\n\n"


def _response_events(answer: Answer, call) -> Iterator[bytes]:
    """Responses API events as server-sent events: ``event: <type>`` and ``data: <event>`` each."""
    for event in responses_codec.response_events(answer, call):
        yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


@dataclass(frozen=True)
class _Route:
    """How one endpoint reads its body (``decode``), serves it (``serve``, an :class:`AgentGateway` method)
    and answers: whole (``encode(answer, call)``) or streamed (``events(answer, call)``: SSE frames).
    ``prompt_field`` names a prompt's errors; ``rename`` other fields as the endpoint's request does."""

    prompt_field: str
    decode: Callable[[Any, GatewaySettings], Any]
    serve: Callable[..., Awaitable[Answer]]
    encode: Callable[[Answer, Any], dict] = _completion_object
    events: Callable[[Answer, Any], Iterator[bytes]] = _completion_events
    rename: Callable[[str | None], str | None] | None = None


class GatewayHttpApi:
    def __init__(self, gateway: AgentGateway, settings: GatewaySettings, metrics: HttpMetrics) -> None:
        self._gateway = gateway
        self._settings = settings
        self.app = web.Application(
            client_max_size=settings.max_body_bytes, middlewares=[metrics.middleware, openai_errors]
        )
        self._chat = _Route("messages", openai_codec.decode_chat_request, gateway.chat)
        self._completion = _Route("prompt", openai_codec.decode_completion_request, gateway.complete)
        self._response = _Route(
            "input",
            responses_codec.decode_responses_request,
            gateway.respond,
            encode=responses_codec.encode_response,
            events=_response_events,
            rename=responses_codec.responses_field,
        )
        for prefix in ("", SESSION_PREFIX):
            self.app.router.add_post(f"{prefix}/v1/chat/completions", self.chat_completions)
            self.app.router.add_post(f"{prefix}/v1/completions", self.completions)
            self.app.router.add_post(f"{prefix}/v1/responses", self.responses)
            self.app.router.add_get(f"{prefix}/v1/models", self.models)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, self._chat)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, self._completion)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, self._response)

    async def models(self, request: web.Request) -> web.Response:
        try:
            self._gateway.check_session(request.match_info.get("session_id"))
        except ServiceError as exc:
            return self._error(exc, "")
        body = openai_codec.encode_models(
            self._gateway.model_name, self._gateway.started, self._gateway.max_model_len
        )
        return web.json_response(body)

    async def _serve(self, request: web.Request, route: _Route) -> web.StreamResponse:
        """Session check, body, decode, one gateway call, the answer whole or streamed (:class:`_Route`); a
        large body's decoding and rendering, and a long answer's encoding, in worker threads."""
        session_id = request.match_info.get("session_id")
        try:
            self._gateway.check_session(session_id)
            raw = await self._body(request)
            small = len(raw) <= INLINE_BODY_BYTES
            call = await off_loop_unless(small, self._decode, raw, route.decode)
            answer = await route.serve(call, session_id, small=small)
        except web.HTTPRequestEntityTooLarge:
            return error_response(
                413,
                f"the body is larger than the server's limit gateway.max_body_bytes = "
                f"{self._settings.max_body_bytes}",
                "body",
            )
        except _SlowBody:
            return error_response(
                408,
                "the body did not arrive within the server's limit gateway.body_timeout_s = "
                f"{self._settings.body_timeout_s:g} s",
            )
        except ServiceError as exc:
            return self._error(exc, route.prompt_field, route.rename)
        if call.stream:
            return await self._stream(request, route.events(answer, call))
        small = sum(len(choice.token_ids) for choice in answer.choices) <= INLINE_ANSWER_TOKENS
        encoded = await off_loop_unless(small, route.encode, answer, call)
        return web.json_response(encoded)

    async def _body(self, request: web.Request) -> bytes:
        try:
            async with asyncio.timeout(self._settings.body_timeout_s):
                return await request.read()
        except TimeoutError:
            raise _SlowBody() from None

    def _decode(self, raw: bytes, decode):
        """The body parsed as JSON and decoded into the endpoint's request."""
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise InvalidArgument(f"the body is not valid JSON: {exc}"[:300]) from None
        return decode(body, self._settings)

    @staticmethod
    async def _stream(request: web.Request, frames: Iterator[bytes]) -> web.StreamResponse:
        """The server-sent event ``frames`` of an answer."""
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for frame in frames:
            await response.write(frame)
        await response.write_eof()
        return response

    @staticmethod
    def _error(exc: ServiceError, prompt_field: str, rename=None) -> web.Response:
        status, headers = _status_of(exc)
        param = openai_codec.openai_field(exc.field, prompt_field)
        if rename is not None:
            param = rename(param)
        message = f"{param}: {exc.message}" if param else exc.message
        return error_response(status, message, param, headers)


class GatewayEndpoint(HttpCompanion):
    """The gateway as a companion of the rollout service's gRPC server (same host and TLS, stopped with it);
    ``metrics`` is the collector the server exports."""

    def __init__(self, gateway: AgentGateway, settings: GatewaySettings) -> None:
        if settings.port is None:
            raise ValueError("GatewayEndpoint needs gateway.port")
        metrics = HttpMetrics()
        super().__init__(
            GatewayHttpApi(gateway, settings, metrics).app,
            settings.port,
            header_timeout_s=settings.header_timeout_s,
            metrics=metrics,
            what="OpenAI-compatible gateway",
        )
        self._gateway = gateway

    async def start(self, config: ServerConfig) -> None:
        await super().start(config)
        self._gateway.port = self.port
