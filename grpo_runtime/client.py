"""One channel factory for every client of the services (trainer, tests, tools).

``create_channel(cfg)`` gives a ``grpc.aio.Channel`` and ``create_sync_channel(cfg)`` a
``grpc.Channel``, both with:

- a gRPC service config that retries UNAVAILABLE (exponential backoff; gRPC caps attempts at 5 and
  only retries calls whose response has not started) and ``waitForReady`` off, so a dead server fails
  fast after the retries instead of hanging;
- max send/receive message sizes (default 64 MiB, like the servers), keepalive pings, and a capped
  reconnect backoff (10 s) so a restarted service is found again quickly;
- TLS from PEM files (``tls_ca_file``; ``tls_cert_file``/``tls_key_file`` for mutual TLS);
- the admin bearer token added to every call's metadata when set. This is a client interceptor, not
  call credentials, because gRPC refuses call credentials on insecure channels (local, tests);
- a default deadline of ``default_timeout_s`` for calls that pass no timeout.
"""

from __future__ import annotations

import collections
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal, Self, TypeVar, overload

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from grpo_runtime.auth import AUTHORIZATION_KEY, bearer_metadata
from grpo_runtime.call_errors import UnavailableError, call_error
from grpo_runtime.config import MiB
from grpo_runtime.retry import RetryPolicy, call_with_retry
from grpo_runtime.tls import channel_credentials

T = TypeVar("T")


class ChannelConfig(BaseModel):
    """How to reach one service. Validated like every config (``extra="forbid"``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str = Field(description="host:port (or any gRPC target URI).")
    admin_token: SecretStr | None = Field(None, description="Sent as 'authorization: Bearer <token>'.")
    tls: bool = Field(False, description="Use TLS; implied by tls_ca_file. Without a CA file: system roots.")
    tls_ca_file: Path | None = Field(None, description="PEM CA bundle that signed the server certificate.")
    tls_cert_file: Path | None = Field(None, description="PEM client certificate chain (mutual TLS).")
    tls_key_file: Path | None = Field(None, description="PEM private key of tls_cert_file.")
    tls_server_name: str | None = Field(
        None, description="Name to check the server certificate against instead of the target host."
    )
    max_message_bytes: int = Field(
        64 * MiB, ge=1024, description="Max send and receive message size (bytes)."
    )
    retry_max_attempts: int = Field(
        5, ge=1, le=5, description="Attempts per call on UNAVAILABLE (gRPC caps at 5)."
    )
    retry_initial_backoff_s: float = Field(
        0.1, gt=0, description="First retry delay (s); randomized by gRPC."
    )
    retry_max_backoff_s: float = Field(2.0, gt=0, description="Upper bound of a retry delay (s).")
    retry_backoff_multiplier: float = Field(2.0, ge=1, description="Delay growth per attempt.")
    reconnect_initial_backoff_ms: int = Field(
        1000, ge=10, description="First delay before reconnecting after a lost connection (ms)."
    )
    reconnect_max_backoff_ms: int = Field(
        10_000,
        ge=100,
        description="Longest delay between reconnect attempts (ms); gRPC's default of 120 s would leave a "
        "restarted service unreached for minutes.",
    )
    keepalive_time_ms: int = Field(
        30_000, ge=10_000, description="Keepalive ping interval (ms); servers accept ≥ 10 s by default."
    )
    keepalive_timeout_ms: int = Field(10_000, ge=100, description="Wait for a ping ack before closing (ms).")
    default_timeout_s: float | None = Field(
        None, gt=0, description="Deadline for calls that pass none (s); None = no deadline."
    )
    load_balancing: Literal["pick_first", "round_robin"] = Field(
        "pick_first",
        description="round_robin spreads calls over every address the target resolves to (a Kubernetes "
        "headless Service: 'dns:///rollout-headless:50052'); pick_first keeps one connection.",
    )

    @model_validator(mode="after")
    def _tls_files_consistent(self) -> ChannelConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be set together")
        return self

    @property
    def secure(self) -> bool:
        return self.tls or self.tls_ca_file is not None or self.tls_cert_file is not None


def service_config(cfg: ChannelConfig) -> dict[str, Any]:
    """The gRPC service config (JSON object) applied to every method of the channel."""
    method_config: dict[str, Any] = {"name": [{}], "waitForReady": False}
    if cfg.retry_max_attempts > 1:
        method_config["retryPolicy"] = {
            "maxAttempts": cfg.retry_max_attempts,
            "initialBackoff": f"{cfg.retry_initial_backoff_s}s",
            "maxBackoff": f"{cfg.retry_max_backoff_s}s",
            "backoffMultiplier": cfg.retry_backoff_multiplier,
            "retryableStatusCodes": ["UNAVAILABLE"],
        }
    return {"loadBalancingConfig": [{cfg.load_balancing: {}}], "methodConfig": [method_config]}


def channel_options(cfg: ChannelConfig) -> list[tuple[str, Any]]:
    """grpc channel arguments from ``cfg``."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", cfg.max_message_bytes),
        ("grpc.max_receive_message_length", cfg.max_message_bytes),
        ("grpc.keepalive_time_ms", cfg.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", cfg.keepalive_timeout_ms),
        ("grpc.initial_reconnect_backoff_ms", cfg.reconnect_initial_backoff_ms),
        ("grpc.min_reconnect_backoff_ms", cfg.reconnect_initial_backoff_ms),
        (
            "grpc.max_reconnect_backoff_ms",
            max(cfg.reconnect_max_backoff_ms, cfg.reconnect_initial_backoff_ms),
        ),
        ("grpc.enable_retries", 1 if cfg.retry_max_attempts > 1 else 0),
        ("grpc.service_config", json.dumps(service_config(cfg))),
    ]
    if cfg.tls_server_name:
        options.append(("grpc.ssl_target_name_override", cfg.tls_server_name))
    return options


def _as_config(cfg: ChannelConfig | str) -> ChannelConfig:
    return ChannelConfig(target=cfg) if isinstance(cfg, str) else cfg


def _with_defaults(
    metadata: Any, timeout: float | None, token: str | None, default_timeout_s: float | None
) -> tuple[list[tuple[str, Any]] | None, float | None]:
    """Call metadata with the bearer token added (unless the caller set one) and the timeout defaulted."""
    pairs = list(metadata) if metadata is not None else None
    if token is not None:
        pairs = pairs or []
        if not any(key.lower() == AUTHORIZATION_KEY for key, _ in pairs):
            pairs.append(bearer_metadata(token))
    return pairs, timeout if timeout is not None else default_timeout_s


class _AsyncCallDefaults:
    """Adds the bearer token and the default deadline to a call's details (aio channels)."""

    def __init__(self, token: str | None, default_timeout_s: float | None) -> None:
        self._token = token
        self._default_timeout_s = default_timeout_s

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        pairs, timeout = _with_defaults(
            details.metadata, details.timeout, self._token, self._default_timeout_s
        )
        metadata = grpc.aio.Metadata(*pairs) if pairs is not None else details.metadata
        return details._replace(metadata=metadata, timeout=timeout)


# grpc.aio files each interceptor under the first call type it implements, so one class per type.
class _AsyncUnaryUnaryDefaults(_AsyncCallDefaults, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _AsyncUnaryStreamDefaults(_AsyncCallDefaults, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _AsyncStreamUnaryDefaults(_AsyncCallDefaults, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


class _AsyncStreamStreamDefaults(_AsyncCallDefaults, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


class _SyncCallDetails(
    collections.namedtuple(
        "_SyncCallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    """Concrete ``grpc.ClientCallDetails`` (the grpc class is abstract)."""


class _SyncCallDefaults(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the bearer token and the default deadline to every call of a sync channel."""

    def __init__(self, token: str | None, default_timeout_s: float | None) -> None:
        self._token = token
        self._default_timeout_s = default_timeout_s

    def _details(self, details: grpc.ClientCallDetails) -> _SyncCallDetails:
        pairs, timeout = _with_defaults(
            details.metadata, details.timeout, self._token, self._default_timeout_s
        )
        return _SyncCallDetails(
            details.method,
            timeout,
            pairs,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


def _token(cfg: ChannelConfig) -> str | None:
    return cfg.admin_token.get_secret_value() if cfg.admin_token is not None else None


def create_channel(cfg: ChannelConfig | str) -> grpc.aio.Channel:
    """An aio channel to ``cfg`` (a ChannelConfig or a plain ``host:port``); see the module docstring."""
    cfg = _as_config(cfg)
    interceptors = [
        kind(_token(cfg), cfg.default_timeout_s)
        for kind in (
            _AsyncUnaryUnaryDefaults,
            _AsyncUnaryStreamDefaults,
            _AsyncStreamUnaryDefaults,
            _AsyncStreamStreamDefaults,
        )
    ]
    options = channel_options(cfg)
    if cfg.secure:
        credentials = channel_credentials(cfg.tls_ca_file, cfg.tls_cert_file, cfg.tls_key_file)
        return grpc.aio.secure_channel(cfg.target, credentials, options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(cfg.target, options=options, interceptors=interceptors)


def create_sync_channel(cfg: ChannelConfig | str) -> grpc.Channel:
    """A blocking channel with the same options as :func:`create_channel` (for sync callers)."""
    cfg = _as_config(cfg)
    options = channel_options(cfg)
    if cfg.secure:
        credentials = channel_credentials(cfg.tls_ca_file, cfg.tls_cert_file, cfg.tls_key_file)
        channel = grpc.secure_channel(cfg.target, credentials, options=options)
    else:
        channel = grpc.insecure_channel(cfg.target, options=options)
    return grpc.intercept_channel(channel, _SyncCallDefaults(_token(cfg), cfg.default_timeout_s))


class ServiceClient:
    """Base of the services' blocking clients (``RewardClient``, ``RolloutClient``, ``TrainerClient``).

    They all behave alike: the channel (:func:`create_sync_channel`) opens at the first call, not in the
    constructor; every call gets ``timeout_s`` as its deadline unless it passes its own; a failed call raises
    the :class:`~grpo_runtime.call_errors.ServiceCallError` for its status; and a retryable failure is
    retried by :func:`~grpo_runtime.retry.call_with_retry` within ``retry_budget_s`` (0: the channel's own
    quick UNAVAILABLE retries only). A client pickles as its settings (a reward function shipped to a
    spawned process opens its own channel there).

    ``target``: ``host:port`` or a :class:`ChannelConfig`; ``admin_token`` overrides the config's.
    """

    service_name: ClassVar[str] = "service"
    stub_class: ClassVar[type]
    # Backoff of the client's own retries (the budget comes from retry_budget_s).
    initial_backoff_s: ClassVar[float] = 0.2
    max_backoff_s: ClassVar[float] = 5.0

    def __init__(
        self,
        target: str | ChannelConfig,
        *,
        admin_token: str | None = None,
        timeout_s: float | None = None,
        retry_budget_s: float = 0.0,
    ) -> None:
        cfg = _as_config(target)
        if admin_token is not None:
            cfg = ChannelConfig.model_validate({**cfg.model_dump(), "admin_token": admin_token})
        self._config = cfg
        self.target = cfg.target
        self.timeout_s = timeout_s
        self.retry = RetryPolicy(
            budget_s=retry_budget_s,
            initial_backoff_s=self.initial_backoff_s,
            max_backoff_s=self.max_backoff_s,
        )
        self._channel: grpc.Channel | None = None
        self._stub: Any = None

    @property
    def channel(self) -> grpc.Channel:
        """The channel, opened on first use."""
        if self._channel is None:
            self._channel = create_sync_channel(self._config)
        return self._channel

    @property
    def stub(self) -> Any:
        if self._stub is None:
            self._stub = self.stub_class(self.channel)
        return self._stub

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until the channel connects; :class:`~grpo_runtime.call_errors.UnavailableError` after
        ``timeout_s`` seconds."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise UnavailableError(
                grpc.StatusCode.UNAVAILABLE,
                f"{self.target} did not connect within {timeout_s:g} s",
                service=self.service_name,
            ) from None

    def serving_status(self, service: str = "", *, timeout_s: float | None = None) -> str:
        """The gRPC health status of ``service`` ("" = the whole server): "SERVING", "NOT_SERVING", ..."""
        request = health_pb2.HealthCheckRequest(service=service)
        check = health_pb2_grpc.HealthStub(self.channel).Check
        reply = self._call(check, request, timeout_s=timeout_s, what="Check")
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_channel": None, "_stub": None}

    # An RPC named by a string is untyped (the generated stubs have no .pyi): its reply is Any.
    @overload
    def _call(self, method: str, request: Any, *, timeout_s: float | None = None, what: str = "") -> Any: ...

    @overload
    def _call(
        self, method: Callable[..., T], request: Any, *, timeout_s: float | None = None, what: str = ""
    ) -> T: ...

    def _call(
        self, method: str | Callable[..., T], request: Any, *, timeout_s: float | None = None, what: str = ""
    ) -> T | Any:
        """Call ``method`` (the name of an RPC of :attr:`stub`, or a callable made from :attr:`channel`) with
        ``request``, retried within the budget; a failure raises its ServiceCallError. ``request`` may be a
        function returning the request (a fresh request iterator for each attempt of a client stream)."""
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        name = method if isinstance(method, str) else what

        def attempt() -> T:
            rpc = getattr(self.stub, method) if isinstance(method, str) else method
            try:
                return rpc(request() if callable(request) else request, timeout=timeout)
            except grpc.RpcError as error:
                raise call_error(error, self.service_name) from error

        return call_with_retry(attempt, self.retry, what=name or "call", logger=self._log)

    @property
    def _log(self) -> logging.Logger:
        return logging.getLogger(type(self).__module__)

    def _stream(self, method: str, request: Any, *, timeout_s: float | None = None) -> Iterator[Any]:
        """The messages of the server-streaming RPC ``method``; a failure, also mid-stream, raises its
        ServiceCallError. The client's ``timeout_s`` (meant for one call) does not bound a stream, which lasts
        as long as what it watches; ``timeout_s`` here does. Not retried: the messages seen would come
        again."""
        try:
            yield from getattr(self.stub, method)(request, timeout=timeout_s)
        except grpc.RpcError as error:
            raise call_error(error, self.service_name) from error
