"""Server configuration (pydantic) and the helpers that turn config errors into one readable line.

A service's YAML config file has a ``server:`` block validated into :class:`ServerConfig`; the rest
of the file is the service's own settings. Unknown keys are errors (``extra="forbid"``), and every
error names its key as a dotted path, e.g. ``server.grace_period_s: Input should be a valid number``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
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
    """A configuration problem, phrased as one line naming the key: ``"<key>: <message>"`` when ``key``
    (the dotted config key, ``training.optimizer.learning_rate``) is given apart, else ``message`` already
    names it.

    One error may carry several problems (:meth:`collected`): ``errors`` holds every ``(key, message)``,
    ``key`` the first one's key, and the text joins their lines with ``"; "``.
    """

    def __init__(self, message: str, key: str | None = None) -> None:
        self.key = key
        self.errors: tuple[tuple[str | None, str], ...] = ((key, message),)
        super().__init__(f"{key}: {message}" if key else message)

    @classmethod
    def collected(cls, errors: Sequence[tuple[str | None, str]]) -> ConfigError:
        """One error carrying every ``(key, message)`` of ``errors`` (at least one), in order."""
        if not errors:
            raise ValueError("ConfigError.collected needs at least one error")
        first_key, first_message = errors[0]
        error = cls(first_message, key=first_key)
        error.errors = tuple(errors)
        error.args = ("; ".join(error.lines()),)
        return error

    def lines(self, limit: int | None = None) -> list[str]:
        """One ``"<key>: <message>"`` line per problem; past ``limit`` lines, a last ``"and N more"``."""
        lines = [f"{key}: {message}" if key else message for key, message in self.errors]
        if limit is not None and len(lines) > limit:
            return [*lines[:limit], f"and {len(lines) - limit} more"]
        return lines


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

        None only when no source is given at all (admin RPCs open, which the server logs). A source that
        is given but empty or only whitespace is a :class:`ConfigError` naming it: a blank secret (an
        unset compose variable, an empty secret file) must never silently turn authentication off. So is
        an unreadable token file.
        """
        if self.admin_token is not None:
            return _non_blank(self.admin_token.get_secret_value(), "server.admin_token")
        env = os.environ.get(ADMIN_TOKEN_ENV)
        if env is not None:
            return _non_blank(env, f"env {ADMIN_TOKEN_ENV}")
        if self.admin_token_file is not None:
            try:
                token = self.admin_token_file.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(
                    f"server.admin_token_file: cannot read {self.admin_token_file}: {exc}"
                ) from exc
            return _non_blank(token, f"server.admin_token_file ({self.admin_token_file})")
        return None


def _non_blank(token: str, source: str) -> str:
    """``token`` stripped; ConfigError naming ``source`` when nothing is left."""
    stripped = token.strip()
    if not stripped:
        raise ConfigError(f"{source}: the admin token is empty or whitespace; set a token or remove {source}")
    return stripped


# pydantic's wording for the two errors a hand-written config meets most, in a config file's terms.
_CONFIG_MESSAGES = {"extra_forbidden": "unknown key", "missing": "required key is missing"}


def validation_errors(error: ValidationError, prefix: str | None = None) -> list[tuple[str, str]]:
    """``(dotted.key, message)`` of each pydantic error; list positions as ``[i]`` (``rewards[1].q``).

    ``prefix`` is prepended to every key (``"server"`` for the ``server:`` block of a file). Errors of a
    whole-model validator (empty ``loc``) are named by the prefix alone, or ``config``.
    """
    named = []
    for item in error.errors():
        loc = [prefix] if prefix else []
        for element in item["loc"]:
            if isinstance(element, int) and loc:
                loc[-1] = f"{loc[-1]}[{element}]"
            else:
                loc.append(str(element))
        message = _CONFIG_MESSAGES.get(item["type"], item["msg"].removeprefix("Value error, "))
        named.append((".".join(loc) or "config", message))
    return named


def format_validation_error(error: ValidationError, prefix: str | None = None) -> str:
    """One ``dotted.key: message`` per pydantic error (:func:`validation_errors`), joined with ``; ``."""
    return "; ".join(f"{key}: {message}" for key, message in validation_errors(error, prefix))


@dataclass(frozen=True)
class YamlLimits:
    """Bounds on one YAML document, so that a hostile document costs bounded memory and time.

    ``max_bytes``: size of the text (UTF-8). ``max_depth``: nesting of collections. ``max_aliases``:
    ``*alias`` references. ``max_nodes``: scalars and collections counted as if every alias were
    expanded in place — what a consumer that walks the result (pydantic, ``json.dumps``) visits; this is
    what refuses an alias bomb ("billion laughs"), whose few aliases expand to billions of nodes.
    """

    max_bytes: int = 4 * MiB
    max_depth: int = 64
    max_aliases: int = 1000
    max_nodes: int = 1_000_000


DEFAULT_YAML_LIMITS = YamlLimits()


class _LimitedLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader that counts nesting and aliases while it composes the node graph."""

    def __init__(self, text: str, limits: YamlLimits, what: str) -> None:
        super().__init__(text)
        self._limits = limits
        self._what = what
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > self._limits.max_aliases:
                raise ConfigError(f"{self._what}: more than {self._limits.max_aliases} YAML aliases")
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > self._limits.max_depth:
            raise ConfigError(f"{self._what}: YAML nested deeper than {self._limits.max_depth} levels")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_size(root: yaml.Node, limit: int, what: str) -> None:
    """Raises ConfigError when the graph, aliases expanded, has more than ``limit`` nodes.

    Each node's expanded size is computed once (memoised by identity) in post-order without recursion,
    so the check itself costs time linear in the composed graph, not in its expansion.
    """
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            sizes[id(node)] = 1
            continue
        if not children_done:
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
            continue
        total = 1 + sum(sizes.get(id(child), 1) for child in children)
        if total > limit:
            raise ConfigError(f"{what}: YAML expands to more than {limit} nodes (alias bomb?)")
        sizes[id(node)] = total


def safe_load_yaml(text: str | bytes, *, what: str = "yaml", limits: YamlLimits = DEFAULT_YAML_LIMITS) -> Any:
    """Parse one YAML document with ``yaml.SafeLoader`` semantics within ``limits``.

    ``what`` names the source in errors (a file path, a request field such as ``config_yaml``). Raises
    :class:`ConfigError` — one line starting with ``what`` — for text over ``max_bytes``, nesting past
    ``max_depth``, too many aliases or an alias bomb, and invalid YAML. CPU-bound (milliseconds per
    100 KiB): servicers call :func:`safe_load_yaml_async` instead.
    """
    size = len(text.encode() if isinstance(text, str) else text)
    if size > limits.max_bytes:
        raise ConfigError(f"{what}: YAML of {size} bytes, at most {limits.max_bytes}")
    if isinstance(text, bytes):
        try:
            text = text.decode()
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{what}: YAML is not UTF-8: {exc}") from exc
    try:
        loader = _LimitedLoader(text, limits, what)
    except yaml.YAMLError as exc:  # the reader refuses control characters before any parsing
        raise ConfigError(f"{what}: invalid YAML: {' '.join(str(exc).split())}") from exc
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, limits.max_nodes, what)
        return loader.construct_document(node)
    except ConfigError:
        raise
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what}: invalid YAML: {' '.join(str(exc).split())}") from exc
    except (
        ValueError,
        TypeError,
        OverflowError,
    ) as exc:  # a scalar its tag cannot hold: 10**5000, 2001-13-45
        raise ConfigError(f"{what}: invalid YAML value: {' '.join(str(exc).split())[:300]}") from exc
    except RecursionError as exc:  # a deep construct PyYAML recurses on despite max_depth
        raise ConfigError(f"{what}: YAML nested too deeply") from exc
    finally:
        loader.dispose()


async def safe_load_yaml_async(
    text: str | bytes, *, what: str = "yaml", limits: YamlLimits = DEFAULT_YAML_LIMITS
) -> Any:
    """:func:`safe_load_yaml` in a worker thread, so parsing a request's YAML never stalls the event loop."""
    return await asyncio.to_thread(safe_load_yaml, text, what=what, limits=limits)


def load_config_file(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read a YAML config file into ``(server block, the rest)``; both are plain dicts.

    An empty file is an empty config. Raises :class:`ConfigError` for a missing file, bad YAML (or YAML
    past :data:`DEFAULT_YAML_LIMITS`), or a top level (or ``server:`` block) that is not a mapping.
    """
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    data = safe_load_yaml(text, what=str(path))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, not {type(data).__name__}")
    settings = dict(data)
    server = settings.pop("server", None) or {}
    if not isinstance(server, dict):
        raise ConfigError(f"server: must be a mapping of keys, not {type(server).__name__}")
    return server, settings
