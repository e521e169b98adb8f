"""Server configuration (pydantic) and the helpers that turn config errors into one readable line.

A service's YAML config file has a ``server:`` block validated into :class:`ServerConfig`; the rest
of the file is the service's own settings. Unknown keys are errors (``extra="forbid"``), and every
error names its key as a dotted path, e.g. ``server.grace_period_s: Input should be a valid number``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

MiB = 1024 * 1024
ADMIN_TOKEN_ENV = "GRPO_ADMIN_TOKEN"

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class ConfigError(ValueError):
    """A configuration problem, already phrased as one line naming the key."""


class ServerConfig(BaseModel):
    """Everything the shared gRPC server runtime needs; services add their own settings beside it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", description="Interface to bind; '0.0.0.0' or '[::]' for all.")
    port: int = Field(0, ge=0, le=65535, description="TCP port; 0 = pick a free one (see GrpcServer.port).")
    grace_period_s: float = Field(
        10.0, ge=0, description="Seconds in-flight RPCs get to finish after shutdown starts."
    )
    shutdown_delay_s: float = Field(
        0.0,
        ge=0,
        description="Seconds between reporting NOT_SERVING and refusing new RPCs, so load balancers "
        "that poll health stop routing here first.",
    )
    max_message_bytes: int = Field(
        64 * MiB, ge=1024, description="Max send and receive message size in bytes (gRPC default: 4 MiB)."
    )
    keepalive_time_ms: int = Field(
        60_000, ge=1000, description="Interval of server-initiated keepalive pings (ms)."
    )
    keepalive_timeout_ms: int = Field(20_000, ge=100, description="Wait for a ping ack before closing (ms).")
    min_ping_interval_without_data_ms: int = Field(
        10_000,
        ge=0,
        description="Shortest client ping interval tolerated when no data flows (ms); faster pings "
        "earn a GOAWAY 'too_many_pings'. Clients from grpo_runtime.client ping every 30 s.",
    )
    max_connection_age_ms: int | None = Field(
        None, ge=1000, description="Close connections after this age so clients rebalance (ms); None = never."
    )
    max_connection_age_grace_ms: int | None = Field(
        None, ge=0, description="Time RPCs get to finish on a connection closed for its age (ms)."
    )
    max_concurrent_rpcs: int | None = Field(
        None, ge=1, description="RPCs beyond this many in flight get RESOURCE_EXHAUSTED; None = no limit."
    )
    admin_token: SecretStr | None = Field(
        None, description=f"Bearer token for admin RPCs; else env {ADMIN_TOKEN_ENV}, else admin_token_file."
    )
    admin_token_file: Path | None = Field(None, description="File whose stripped contents are the token.")
    tls_cert_file: Path | None = Field(None, description="PEM server certificate chain; enables TLS.")
    tls_key_file: Path | None = Field(None, description="PEM private key of tls_cert_file.")
    tls_client_ca_file: Path | None = Field(
        None, description="PEM CA bundle; when set, clients must present a certificate it signed (mTLS)."
    )
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Prometheus HTTP port on the same host; None = off, 0 = free port."
    )
    log_level: LogLevel = "INFO"

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_case_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _tls_files_consistent(self) -> ServerConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be set together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_client_ca_file (mutual TLS) needs tls_cert_file and tls_key_file")
        return self

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert_file is not None

    def resolve_admin_token(self) -> str | None:
        """The admin token in force: ``admin_token``, else env ``GRPO_ADMIN_TOKEN``, else the file.

        Empty values count as unset. Raises :class:`ConfigError` when the token file is unreadable.
        """
        if self.admin_token is not None and self.admin_token.get_secret_value():
            return self.admin_token.get_secret_value()
        env = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
        if env:
            return env
        if self.admin_token_file is not None:
            try:
                token = self.admin_token_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"admin_token_file: cannot read {self.admin_token_file}: {exc}") from exc
            return token or None
        return None


def format_validation_error(error: ValidationError, prefix: str | None = None) -> str:
    """One line per pydantic error, each ``dotted.key: message``, joined with ``; ``.

    ``prefix`` is prepended to every key (``"server"`` for the ``server:`` block of a file).
    Errors of a whole-model validator (empty ``loc``) are named by the prefix alone.
    """
    parts = []
    for item in error.errors():
        loc = [prefix] if prefix else []
        for element in item["loc"]:
            if isinstance(element, int) and loc:
                loc[-1] = f"{loc[-1]}[{element}]"
            else:
                loc.append(str(element))
        key = ".".join(loc) or "config"
        message = item["msg"].removeprefix("Value error, ")
        parts.append(f"{key}: {message}")
    return "; ".join(parts)


def load_config_file(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read a YAML config file into ``(server block, the rest)``; both are plain dicts.

    An empty file is an empty config. Raises :class:`ConfigError` for a missing file, bad YAML,
    or a top level (or ``server:`` block) that is not a mapping.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {' '.join(str(exc).split())}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, not {type(data).__name__}")
    settings = dict(data)
    server = settings.pop("server", None) or {}
    if not isinstance(server, dict):
        raise ConfigError(f"server: must be a mapping of keys, not {type(server).__name__}")
    return server, settings
