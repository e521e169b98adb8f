"""The command line every service's ``python -m <service>`` goes through.

A service's ``__main__`` is three lines::

    def main(argv=None) -> int:
        return run_service(prog="reward_service", description="...", default_port=50051,
                           add_arguments=add_my_flags, build=build)

``build(args, settings)`` is awaited inside the server's event loop and returns the service bindings
and an optional cleanup; ``settings`` is the ``--config`` YAML without its ``server:`` block.

Exit codes: 0 after a clean shutdown (or ``--help``); 2 for a usage or configuration error, one line
on stderr naming the key (``reward_service: config error: server.port: Input should be ...``) —
raised as a pydantic ValidationError, ConfigError, InvalidArgument or NotFound by ``build`` too;
``EXIT_BIND_ERROR`` (3) when a port cannot be bound (one line), so a launcher that picked the port can tell
"taken meanwhile" from a failure; 1 when the service fails for another reason (traceback logged).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError

from grpo_runtime.config import ConfigError, LogLevel, ServerConfig, format_validation_error, load_config_file
from grpo_runtime.errors import InvalidArgument, NotFound
from grpo_runtime.logging_setup import configure_logging
from grpo_runtime.server import BindError, Cleanup, GrpcServer, ServiceBinding

logger = logging.getLogger("grpo_runtime.cli")

EXIT_BIND_ERROR = 3

Build = Callable[[argparse.Namespace, dict[str, Any]], Awaitable[tuple[list[ServiceBinding], Cleanup | None]]]

# CLI flag destination → ServerConfig field; a flag given on the command line beats the config file.
_SERVER_FLAGS = {
    "host": "host",
    "port": "port",
    "metrics_port": "metrics_port",
    "log_level": "log_level",
    "grace_period": "grace_period_s",
}


def build_parser(
    prog: str,
    description: str,
    default_port: int,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None,
) -> argparse.ArgumentParser:
    """The argument parser: the runtime's server flags plus the service's own."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    server = parser.add_argument_group("server")
    server.add_argument(
        "--host", default=None, help="interface to bind (default 127.0.0.1; containers pass 0.0.0.0)"
    )
    server.add_argument("--port", type=int, default=None, help=f"port to listen on (default {default_port})")
    server.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="YAML config: a `server:` block (ServerConfig keys) plus the service's own settings",
    )
    server.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="Prometheus HTTP port (default: off; 0 = any free port)",
    )
    server.add_argument(
        "--log-level", default=None, choices=get_args(LogLevel), help="log level (default INFO)"
    )
    server.add_argument(
        "--grace-period",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds in-flight RPCs get to finish on SIGTERM/SIGINT (default 10)",
    )
    if add_arguments is not None:
        add_arguments(parser)
    return parser


def server_config_from(
    args: argparse.Namespace, file_block: dict[str, Any], default_port: int
) -> ServerConfig:
    """Merge the config file's ``server:`` block with the CLI flags (flags win) into a ServerConfig.

    Raises :class:`ConfigError` naming the offending key (``server.<key>``).
    """
    values = dict(file_block)
    values.setdefault("port", default_port)
    for flag, key in _SERVER_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            values[key] = value
    try:
        return ServerConfig.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, prefix="server")) from exc


async def _serve(
    args: argparse.Namespace, config: ServerConfig, settings: dict[str, Any], build: Build
) -> None:
    bindings, cleanup = await build(args, settings)
    # What the build loaded (models, tokenizers, reward libraries) lives as long as the process. Frozen, it is
    # out of the collector's sight: a full collection walks only what requests create, where it took
    # 50-100 ms, stalling every call in flight, with the reward service's libraries tracked.
    gc.collect()
    gc.freeze()
    server = GrpcServer(config, bindings, on_shutdown=cleanup)
    await server.serve_forever()


def run_service(
    *,
    prog: str,
    description: str,
    default_port: int,
    build: Build,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    argv: Sequence[str] | None = None,
) -> int:
    """Parse the command line, load the config, build the service and serve until SIGTERM/SIGINT.

    Returns the process exit code (see the module docstring).
    """
    parser = build_parser(prog, description, default_port, add_arguments)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed by argparse)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        file_block, settings = load_config_file(args.config) if args.config else ({}, {})
        config = server_config_from(args, file_block, default_port)
        config.resolve_admin_token()  # a blank token is refused before the service starts its backends
    except ConfigError as exc:
        print(f"{prog}: config error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level)
    try:
        asyncio.run(_serve(args, config, settings, build))
    except ValidationError as exc:  # the service's own settings model
        print(f"{prog}: config error: {format_validation_error(exc)}", file=sys.stderr)
        return 2
    except (ConfigError, InvalidArgument, NotFound) as exc:  # bad settings, missing model dir, ...
        print(f"{prog}: config error: {exc}", file=sys.stderr)
        return 2
    except BindError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_BIND_ERROR
    except KeyboardInterrupt:  # a second Ctrl-C before the handlers were installed
        return 130
    except Exception:
        logger.exception("%s failed", prog)
        return 1
    return 0
