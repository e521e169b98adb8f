"""MCP servers as environments: one server process per episode over stdio, its tools exposed as tools.

The process is started with the MCP SDK's ``Client(StdioServerParameters(...))``, which passes it only the
SDK's safe environment variables (``PATH``, ``HOME``, ...) plus the configured ``env`` — none of the service's
own, so no secret reaches it — and kills its process tree on close. The SDK's client lives in anyio task
scopes that must be entered and left by one task, so each session runs a worker task that owns the client and
takes calls from a queue. A server that dies mid-episode makes its call (and every later one) an error result
and ends the episode; closing it still works.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent, Tool

from grpo_runtime.env_types import ToolDefinition
from grpo_runtime.errors import ResourceExhausted
from reward_service.environments.base import OpenFailed, SessionBroken, ToolError
from reward_service.environments.episodes import OPEN_RETRY_AFTER_S
from reward_service.environments.settings import McpServerSettings

# Pages of tools/list read at most (a server paging forever must not hang OpenEpisode).
MAX_TOOL_PAGES = 100


def tool_definition(tool: Tool) -> ToolDefinition:
    return ToolDefinition(
        name=tool.name,
        description=tool.description or tool.title or "",
        parameters=tool.input_schema or {"type": "object", "properties": {}},
    )


def result_text(result: CallToolResult) -> str:
    """The text blocks of a result joined by newlines; other blocks (images, resources) as a placeholder."""
    parts = [b.text if isinstance(b, TextContent) else f"[{b.type} content]" for b in result.content]
    if not parts and result.structured_content is not None:
        parts.append(str(result.structured_content))
    return "\n".join(parts)


class McpSession:
    """One running MCP server and the worker task that owns its client."""

    prompt_suffix = ""

    def __init__(self, parameters: StdioServerParameters, on_close: Callable[[], None]):
        self._parameters = parameters
        self._on_close = on_close
        self._jobs: asyncio.Queue[tuple[str, dict[str, Any], asyncio.Future[CallToolResult]]] = (
            asyncio.Queue()
        )
        self._ready: asyncio.Future[list[Tool]] = asyncio.get_running_loop().create_future()
        self._worker: asyncio.Task[None] | None = None
        self.tools: tuple[ToolDefinition, ...] = ()

    async def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._serve())
        try:
            tools = await self._ready
        except BaseException:
            await self.close()
            raise
        self.tools = tuple(tool_definition(t) for t in tools)

    async def _serve(self) -> None:
        try:
            with open(os.devnull, "w") as errlog:  # the server's own logs; it may print anything
                async with Client(stdio_client(self._parameters, errlog=errlog)) as client:
                    self._ready.set_result(await _list_tools(client))
                    while True:
                        name, arguments, reply = await self._jobs.get()
                        try:
                            result = await client.call_tool(name, arguments)
                        except Exception as exc:
                            if not reply.done():
                                reply.set_exception(exc)
                        else:
                            if not reply.done():
                                reply.set_result(result)
        except Exception as exc:
            if not self._ready.done():
                self._ready.set_exception(OpenFailed(f"MCP server did not start: {_describe(exc)}"))

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        assert self._worker is not None
        reply: asyncio.Future[CallToolResult] = asyncio.get_running_loop().create_future()
        self._jobs.put_nowait((name, arguments, reply))
        watched: list[asyncio.Future[Any]] = [reply, self._worker]
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        if not reply.done():
            reply.cancel()
            raise SessionBroken("the MCP server has stopped")
        try:
            result = reply.result()
        except MCPError as exc:
            if "closed" in str(exc).lower():  # the SDK's "Connection closed": the server process is gone
                raise SessionBroken(f"the MCP server has stopped: {exc}") from None
            raise ToolError(f"MCP error: {exc}") from None
        text = result_text(result)
        if result.is_error:
            raise ToolError(text or "the tool reported an error")
        return text

    async def reward(self) -> float | None:
        return None

    async def close(self) -> None:
        try:
            if self._worker is not None:
                self._worker.cancel()  # leaves the client's context: the SDK ends the server's process tree
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._worker
        finally:
            on_close, self._on_close = self._on_close, _nothing
            on_close()


def _nothing() -> None:
    return None


async def _list_tools(client: Client) -> list[Tool]:
    tools: list[Tool] = []
    cursor = None
    for _ in range(MAX_TOOL_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


class McpEnvironment:
    kind = "mcp"
    available = True

    def __init__(self, name: str, settings: McpServerSettings):
        self.name = name
        self._parameters = StdioServerParameters(
            command=settings.command, args=settings.args, env=settings.env or None, cwd=settings.cwd
        )
        self.description = settings.description or f"MCP server `{settings.command}`"
        self.status = f"stdio, one server process per episode, at most {settings.max_episodes} at once"
        self._max_episodes = settings.max_episodes
        self._running = 0  # sessions started and not yet closed

    def _closed(self) -> None:
        self._running -= 1

    async def open(self, metadata: dict[str, Any]) -> McpSession:
        if self._running >= self._max_episodes:
            raise ResourceExhausted(
                f"{self._max_episodes} episodes of MCP server {self.name!r} are open "
                f"(environments.mcp.{self.name}.max_episodes); close finished ones",
                retry_after_s=OPEN_RETRY_AFTER_S,
            )
        self._running += 1
        session = McpSession(self._parameters, self._closed)
        await session.start()  # closes the session (so counts it closed) when it fails
        return session
