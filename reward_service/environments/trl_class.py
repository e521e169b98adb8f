"""TRL environment classes (``GRPOTrainer(environment_factory=...)``) served unchanged, loaded by import path.

TRL's semantics, kept here: the tools are the class's public functions (``inspect.getmembers`` on the class,
names not starting with ``_``, except ``reset`` and ``get_reward``), described to the model by transformers'
``get_json_schema`` (type hints plus Google-style docstring); ``reset(**columns)`` starts an episode and may
return text appended to the prompt; ``get_reward()`` (optional, sync or async) is the environment's reward;
a tool's return value reaches the model as ``str(value)``. Unlike TRL, which reuses a pool of instances,
every episode gets a fresh instance, so nothing can leak from one episode to the next.

Only import paths from the server's own settings are loaded, never one named in a request: importing a
module runs its code with the service's rights (files, network, the admin token), which no gRPC caller may
have. Sync methods run in a bounded thread pool (``trl_threads``), so one slow tool cannot stall the event
loop; a thread cannot be killed, so a tool that hangs past the call timeout holds its thread until it
returns, and its episode ends.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from transformers.utils import get_json_schema

from grpo_runtime.config import ConfigError
from grpo_runtime.env_types import ToolDefinition
from reward_service.environments.base import OpenFailed

NOT_TOOLS = ("reset", "get_reward")


def load_object(import_path: str, field: str) -> Any:
    """The object named by ``module:name``; ConfigError naming ``field`` when it cannot be imported."""
    module_name, _, attribute = import_path.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{field}: cannot load {import_path!r}: {exc}") from exc


def load_class(import_path: str, field: str) -> type:
    """The class named by ``module:Class``; ConfigError naming ``field`` when it cannot be imported."""
    cls = load_object(import_path, field)
    if not inspect.isclass(cls):
        raise ConfigError(f"{field}: {import_path!r} is not a class")
    if not callable(getattr(cls, "reset", None)):
        raise ConfigError(f"{field}: {import_path!r} has no callable `reset` (TRL requires one)")
    return cls


def tool_names(cls: type) -> list[str]:
    """TRL's tool methods of ``cls``: public functions on the class, minus reset and get_reward."""
    return [
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in NOT_TOOLS and not name.startswith("_")
    ]


def tool_definition(cls: type, name: str) -> ToolDefinition:
    """The JSON schema of method ``name`` as the model sees it: bound (to the class itself, only to drop
    ``self`` from the signature, as on an instance), so no instance is needed."""
    return function_tool_definition(types.MethodType(getattr(cls, name), cls))


def function_tool_definition(func: Callable[..., Any]) -> ToolDefinition:
    """The JSON schema of ``func`` (transformers' ``get_json_schema``: type hints plus Google-style
    docstring), as TRL's ``GRPOTrainer(tools=[func])`` describes it to the model."""
    function = get_json_schema(func)["function"]
    return ToolDefinition(
        name=function["name"],
        description=function.get("description", ""),
        parameters=function.get("parameters", {"type": "object", "properties": {}}),
    )


class TrlSession:
    """One instance of the class, reset for one episode."""

    prompt_suffix = ""

    def __init__(self, instance: Any, tools: tuple[ToolDefinition, ...], threads: ThreadPoolExecutor):
        self._instance = instance
        self.tools = tools
        self._threads = threads

    async def _invoke(self, method: Callable[..., Any], **kwargs: Any) -> Any:
        if inspect.iscoroutinefunction(method):
            return await method(**kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, lambda: method(**kwargs))

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        return str(await self._invoke(getattr(self._instance, name), **arguments))

    async def reward(self) -> float | None:
        get_reward = getattr(self._instance, "get_reward", None)
        return None if get_reward is None else await self._invoke(get_reward)

    async def close(self) -> None:
        self._instance = None  # TRL defines no close hook; a public `close` method would be a tool


class TrlEnvironment:
    """Episodes of one TRL environment class."""

    kind = "trl"
    available = True

    def __init__(self, name: str, import_path: str, threads: ThreadPoolExecutor):
        self.name = name
        self._cls = load_class(import_path, f"environments.trl.{name}")
        self._threads = threads
        self.status = f"class {import_path}"
        doc = inspect.getdoc(self._cls) or ""
        self.description = doc.split("\n\n")[0] or f"TRL environment {import_path}"
        try:
            self._tools = tuple(tool_definition(self._cls, n) for n in tool_names(self._cls))
        except Exception as exc:  # transformers' TypeHintParsingException / DocstringParsingException
            raise ConfigError(f"environments.trl.{name}: tools of {import_path!r}: {exc}") from exc

    def _start(self, metadata: dict[str, Any]) -> TrlSession:
        """Runs in a pool thread: constructs and resets an instance (both may be slow or block)."""
        try:
            instance = self._cls()
            suffix = instance.reset(**metadata)
        except Exception as exc:
            raise OpenFailed(f"{type(exc).__name__}: {exc}") from exc
        if suffix is not None and not isinstance(suffix, str):
            raise OpenFailed(f"reset returned {type(suffix).__name__}; only text (or None) is supported")
        session = TrlSession(instance, self._tools, self._threads)
        session.prompt_suffix = suffix or ""
        return session

    async def open(self, metadata: dict[str, Any]) -> TrlSession:
        return await asyncio.get_running_loop().run_in_executor(self._threads, self._start, metadata)
