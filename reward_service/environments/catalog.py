"""The environments a server offers, built from its ``environments:`` settings."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from reward_service.environments.base import Environment
from reward_service.environments.calculator import CalculatorEnvironment
from reward_service.environments.python_tool import PythonEnvironment
from reward_service.environments.settings import EnvironmentSettings
from reward_service.sandbox.runner import SandboxRunner


def build_environments(
    settings: EnvironmentSettings,
    sandbox: SandboxRunner | None,
    sandbox_status: str,
    threads: ThreadPoolExecutor,
) -> list[Environment]:
    """calculator and python (when enabled), then each configured TRL class, function list and MCP server.

    Raises ConfigError when a TRL class or function cannot be loaded (a typo in a config file should stop
    the start)."""
    environments: list[Environment] = []
    if settings.calculator.enabled:
        environments.append(CalculatorEnvironment(settings.calculator))
    if settings.python.enabled:
        environments.append(PythonEnvironment(sandbox, settings.python, sandbox_status))
    if settings.trl:
        # transformers (for get_json_schema) is imported only when a TRL class is configured: the slim
        # reward image has no transformers, and its other environments do not need it.
        from reward_service.environments.trl_class import TrlEnvironment

        environments += [TrlEnvironment(name, path, threads) for name, path in settings.trl.items()]
    if settings.functions:
        # Same schema machinery (transformers) as the TRL classes.
        from reward_service.environments.functions import FunctionsEnvironment

        environments += [
            FunctionsEnvironment(name, paths, threads) for name, paths in settings.functions.items()
        ]
    if settings.mcp:
        # The mcp SDK is in the `reward` extra, which the slim image leaves out.
        from reward_service.environments.mcp_server import McpEnvironment

        environments += [McpEnvironment(name, server) for name, server in settings.mcp.items()]
    return environments
