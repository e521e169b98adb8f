"""Plain Python functions served as one environment's tools (TRL's ``GRPOTrainer(tools=[func, ...])``).

Each function is a tool, described by the same schema machinery as a TRL class's methods (transformers'
``get_json_schema``: type hints plus Google-style docstring); its return value reaches the model as
``str(value)``. Function tools hold no episode state and the environment has no reward of its own.

As with TRL classes, only import paths from the server's own settings (``environments.functions``) are
loaded, never one named in a request; sync functions run in the ``trl_threads`` pool.
"""

from __future__ import annotations

import inspect
import types
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from grpo_runtime.config import ConfigError
from reward_service.environments.trl_class import (
    NOT_TOOLS,
    TrlSession,
    function_tool_definition,
    load_object,
)


class FunctionsEnvironment:
    """Episodes whose tools are a list of allow-listed functions."""

    kind = "functions"
    available = True

    def __init__(self, name: str, import_paths: list[str], threads: ThreadPoolExecutor):
        self.name = name
        self._threads = threads
        field = f"environments.functions.{name}"
        functions: dict[str, Any] = {}
        tools = []
        for path in import_paths:
            func = load_object(path, field)
            if not inspect.isfunction(func):
                raise ConfigError(f"{field}: {path!r} is not a function")
            # The session looks tools up by attribute, next to the reset/get_reward hooks of TRL classes.
            if func.__name__ in NOT_TOOLS or func.__name__.startswith("_"):
                raise ConfigError(f"{field}: {path!r}: a tool may not be named {func.__name__!r}")
            if func.__name__ in functions:
                raise ConfigError(f"{field}: two functions are named {func.__name__!r}")
            try:
                tools.append(function_tool_definition(func))
            except Exception as exc:  # transformers' TypeHintParsingException / DocstringParsingException
                raise ConfigError(f"{field}: {path!r}: {exc}") from exc
            functions[func.__name__] = func
        self._functions = types.MappingProxyType(functions)
        self._tools = tuple(tools)
        self.status = "functions " + ", ".join(import_paths)
        self.description = "Tools: " + ", ".join(functions)

    async def open(self, metadata: dict[str, Any]) -> TrlSession:
        """A session calling the functions; ``metadata`` is unused (a function tool has no reset)."""
        return TrlSession(types.SimpleNamespace(**self._functions), self._tools, self._threads)
