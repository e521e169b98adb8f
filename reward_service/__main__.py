"""``python -m reward_service [--port P] [--config FILE] [--http-port P] | stress CONFIG.yaml [--target T]``.

Serving RewardService and RewardAdminService (and the HTTP endpoint) is here; ``stress`` is
:mod:`reward_service.cli`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from grpo_runtime.openmp import shared_core_openmp

# Before the imports below load torch (and with it OpenMP, which reads its spin settings once).
shared_core_openmp()

from grpo_runtime.cli import run_service  # noqa: E402
from grpo_runtime.server import Cleanup, ServiceBinding  # noqa: E402
from reward_service.cli import stress  # noqa: E402
from reward_service.server import build  # noqa: E402
from reward_service.settings import load_settings  # noqa: E402


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--http-port",
        type=int,
        default=None,
        help="also serve OpenRLHF's POST /get_reward (and GET /health) over HTTP on this port, same host "
        "(overrides http.port of --config; 0 = any free port)",
    )


async def _build(args: argparse.Namespace, settings: dict[str, Any]) -> tuple[list[ServiceBinding], Cleanup]:
    if args.http_port is not None:
        http = settings.get("http")
        settings = {**settings, "http": {**(http if isinstance(http, dict) else {}), "port": args.http_port}}
    return await build(load_settings(settings))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "stress":
        return stress(args[1:])
    return run_service(
        prog="reward_service",
        description="GRPO reward service: built-in rewards, code sandbox, PRM/ORM reward models.",
        default_port=50051,
        build=_build,
        add_arguments=_add_arguments,
        argv=args,
    )


if __name__ == "__main__":
    sys.exit(main())
