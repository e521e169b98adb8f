"""Open episodes: their isolation, limits and lifetime, and the tool-call pipeline every kind shares.

A tool call goes: size cap → JSON object parse → known tool → arguments checked against the tool's JSON
schema (``jsonschema``) → the session runs it under ``tool_timeout_s`` → output cut to ``max_result_chars``.
Every failure on the way is an error *result* (the model sees why and may retry); only a request the caller
got wrong (unknown episode, too many calls, too many open episodes) raises a domain error, which the runtime
maps to a status code.

Every check that needs only the request's counts and names (the environment, parameter names, the episode
bound, the episode id, the number of calls) runs before any of its contents is read: the servicer calls
:meth:`EpisodeRegistry.check_open` and :meth:`EpisodeRegistry.check_step` on the wire form. What is linear in
a caller's input and may take more than a few milliseconds (sizing metadata, parsing and schema-checking a
long call) runs off the event loop.

Calls of one episode run one at a time (a lock per episode); episodes run concurrently. A call that times
out, or whose Step the caller cancels, cannot be assumed to have stopped (a thread cannot be killed), so its
episode is marked done and every later call gets an error result. An episode with no call for
``idle_timeout_s`` is closed by a sweeper task.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import numbers
import secrets
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from grpo_runtime.env_types import (
    EnvironmentInfo,
    Episode,
    EpisodeReward,
    StepOutcome,
    ToolCall,
    ToolDefinition,
    ToolResult,
)
from grpo_runtime.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from reward_service.core.scorer import json_chars
from reward_service.environments.base import Environment, OpenFailed, Session, SessionBroken, ToolError
from reward_service.environments.settings import EnvironmentSettings

log = logging.getLogger(__name__)

TRUNCATION_MARK = "\n[output truncated]"
# Arguments longer than this are parsed and schema-checked on a worker thread: jsonschema walks every value
# in Python, about a millisecond per few thousand characters.
INLINE_ARGUMENTS_CHARS = 4096
# Metadata of at most this many values, none of them a container, is sized on the event loop: the walk is
# then a sum of string lengths, cheaper than the hop to a thread.
INLINE_METADATA_VALUES = 64
# Client's wait before retrying an OpenEpisode refused for the open-episode bound.
OPEN_RETRY_AFTER_S = 1.0


def valid_text(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates a tool may return) replaced by '?': protobuf
    refuses to serialise such a string, which would fail the whole RPC."""
    return text.encode("utf-8", errors="replace").decode("utf-8")


def cap(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to at most ``limit`` characters (the mark included); (text, whether it was cut)."""
    if len(text) <= limit:
        return text, False
    return text[: max(0, limit - len(TRUNCATION_MARK))] + TRUNCATION_MARK, True


def _flat_and_short(metadata: Mapping[str, Any]) -> bool:
    """Whether sizing ``metadata`` is a few microseconds (see ``INLINE_METADATA_VALUES``)."""
    return len(metadata) <= INLINE_METADATA_VALUES and not any(
        isinstance(value, Mapping | list | tuple) for value in metadata.values()
    )


@dataclass
class _Tool:
    definition: ToolDefinition
    validator: jsonschema.protocols.Validator


def _tools(definitions: Sequence[ToolDefinition]) -> dict[str, _Tool]:
    tools = {}
    for d in definitions:
        cls = jsonschema.validators.validator_for(d.parameters, default=jsonschema.Draft202012Validator)
        tools[d.name] = _Tool(d, cls(d.parameters))
    return tools


@dataclass
class _Episode:
    id: str
    environment: str
    session: Session
    tools: dict[str, _Tool]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    broken: str = ""  # why the episode cannot go on; empty while it can
    closed: bool = False


def parse_arguments(call: ToolCall, tool: _Tool, max_chars: int) -> dict[str, Any]:
    """The call's arguments as a dict valid for the tool's schema; ToolError saying what is wrong. The
    length is checked as sent, before anything reads the text."""
    if len(call.arguments_json) > max_chars:
        raise ToolError(f"arguments are {len(call.arguments_json)} characters, at most {max_chars}")
    text = call.arguments_json.strip() or "{}"
    try:
        arguments = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ToolError(f"arguments are not valid JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise ToolError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    try:
        error = jsonschema.exceptions.best_match(tool.validator.iter_errors(arguments))
    except RecursionError:
        raise ToolError("arguments are nested too deeply") from None
    if error is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise ToolError(f"invalid arguments{' at ' + where.lstrip('.') if where else ''}: {error.message}")
    return arguments


def _finite_float(value: Any) -> float | None:
    """``value`` as a finite float; None for anything else (a bool, text, NaN, an int past float range)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError):
        return None
    return number if math.isfinite(number) else None


class EpisodeRegistry:
    """Opens, steps and closes episodes of the configured environments."""

    def __init__(self, environments: Sequence[Environment], settings: EnvironmentSettings):
        self._environments = {e.name: e for e in environments}
        self._settings = settings
        self._episodes: dict[str, _Episode] = {}
        self._opening = 0  # episodes being opened: they count against the bound already
        self._sweeper: asyncio.Task[None] | None = None

    def list(self) -> list[EnvironmentInfo]:
        return [
            EnvironmentInfo(e.name, e.description, e.kind, e.available, e.status)
            for e in sorted(self._environments.values(), key=lambda e: e.name)
        ]

    @property
    def open_count(self) -> int:
        return len(self._episodes)

    def start(self) -> None:
        """Starts the idle-episode sweeper (needs a running event loop)."""
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    @property
    def max_metadata_chars(self) -> int:
        return self._settings.max_metadata_chars

    def check_open(self, environment: str, params: Collection[str]) -> Environment:
        """The checks OpenEpisode needs no metadata for: the environment, the parameters' names (``params``
        may be the request's map, unread), the bound on open episodes. Raises the domain error."""
        env = self._environments.get(environment)
        if not environment:
            raise InvalidArgument("is required", field="environment")
        if env is None:
            known = ", ".join(sorted(self._environments)) or "none"
            raise InvalidArgument(
                f"unknown environment {environment[:100]!r} (known: {known})", field="environment"
            )
        if not env.available:
            raise InvalidArgument(
                f"environment {environment!r} is unavailable: {env.status}", field="environment"
            )
        if params:  # no shipped environment takes any; other servers may
            key = next(iter(params))
            raise InvalidArgument(
                f"environment {environment!r} takes no parameters", field=f"params.{key[:100]}"
            )
        self._check_capacity()
        return env

    def _check_capacity(self) -> None:
        if len(self._episodes) + self._opening >= self._settings.max_open_episodes:
            raise ResourceExhausted(
                f"{self._settings.max_open_episodes} episodes are open (environments.max_open_episodes); "
                "close finished ones",
                retry_after_s=OPEN_RETRY_AFTER_S,
            )

    async def open(self, environment: str, params: Mapping[str, Any], metadata: Mapping[str, Any]) -> Episode:
        env = self.check_open(environment, params)
        if _flat_and_short(metadata):
            size = json_chars(dict(metadata))
        else:
            size = await asyncio.to_thread(json_chars, dict(metadata))  # a walk of every value
        if size > self._settings.max_metadata_chars:
            raise InvalidArgument(
                f"about {size} characters, at most max_metadata_chars={self._settings.max_metadata_chars}",
                field="metadata",
            )
        self._check_capacity()  # again: others may have opened episodes meanwhile
        self._opening += 1
        try:
            session = await self._open_session(env, dict(metadata))
        finally:
            self._opening -= 1
        episode = _Episode(secrets.token_urlsafe(16), env.name, session, _tools(session.tools))
        self._episodes[episode.id] = episode
        return Episode(episode.id, tuple(session.tools), valid_text(session.prompt_suffix))

    async def _open_session(self, env: Environment, metadata: dict[str, Any]) -> Session:
        timeout = self._settings.open_timeout_s
        try:
            return await asyncio.wait_for(env.open(metadata), timeout)
        except TimeoutError:
            raise FailedPrecondition(
                f"environment {env.name!r} did not open an episode within {timeout:g}s"
            ) from None
        except OpenFailed as exc:
            raise FailedPrecondition(f"environment {env.name!r} could not open an episode: {exc}") from None

    def _get(self, episode_id: str) -> _Episode:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise NotFound(
                f"no open episode {episode_id[:64]!r} (closed, expired or never opened)", field="episode_id"
            )
        return episode

    def check_step(self, episode_id: str, calls: int) -> None:
        """The checks Step needs only the episode id and the number of ``calls`` for."""
        self._admit_step(episode_id, calls)

    def _admit_step(self, episode_id: str, calls: int) -> _Episode:
        episode = self._get(episode_id)
        if not calls:
            raise InvalidArgument("at least one tool call is required", field="calls")
        if calls > self._settings.max_calls_per_step:
            raise ResourceExhausted(
                f"{calls} tool calls, at most max_calls_per_step={self._settings.max_calls_per_step}",
                field="calls",
            )
        return episode

    async def step(self, episode_id: str, calls: Sequence[ToolCall]) -> StepOutcome:
        episode = self._admit_step(episode_id, len(calls))
        async with episode.lock:
            if episode.closed:
                raise NotFound(f"episode {episode_id[:64]!r} was closed", field="episode_id")
            try:
                results = [await self._call(episode, call) for call in calls]
            except asyncio.CancelledError:
                # The caller gave up mid-call; the tool may still be running (a thread cannot be stopped),
                # so no later call may touch the same state.
                episode.broken = episode.broken or "an earlier Step was cancelled while a tool was running"
                raise
            episode.last_used = time.monotonic()
        return StepOutcome(tuple(results), done=bool(episode.broken))

    async def _call(self, episode: _Episode, call: ToolCall) -> ToolResult:
        try:
            content = await self._run(episode, call)
            error = False
        except ToolError as exc:
            content, error = str(exc) or type(exc).__name__, True
            if isinstance(exc, SessionBroken) and not episode.broken:
                episode.broken = content
        text, truncated = cap(content, self._settings.max_result_chars)
        text = valid_text(text)  # after the cut: it encodes the whole text, and keeps its length
        return ToolResult(call.id, call.name, text, error=error, truncated=truncated)

    async def _run(self, episode: _Episode, call: ToolCall) -> str:
        if episode.broken:
            raise ToolError(f"the episode has ended: {episode.broken}")
        tool = episode.tools.get(call.name)
        if tool is None:
            known = ", ".join(episode.tools) or "none"
            raise ToolError(f"unknown tool {call.name[:100]!r}; the tools are: {known}")
        max_chars = self._settings.max_arguments_chars
        if len(call.arguments_json) > INLINE_ARGUMENTS_CHARS:
            arguments = await asyncio.to_thread(parse_arguments, call, tool, max_chars)
        else:
            arguments = parse_arguments(call, tool, max_chars)
        timeout = self._settings.tool_timeout_s
        try:
            return await asyncio.wait_for(episode.session.call(call.name, arguments), timeout)
        except TimeoutError:
            raise SessionBroken(f"tool {call.name!r} did not finish within {timeout:g}s") from None
        except ToolError:
            raise
        except Exception as exc:  # an environment's own bug: the model sees it, the service goes on
            log.warning("environment %s: tool %s raised", episode.environment, call.name, exc_info=True)
            raise ToolError(f"tool {call.name!r} failed: {type(exc).__name__}: {exc}") from None

    async def reward(self, episode_id: str) -> EpisodeReward:
        episode = self._get(episode_id)
        async with episode.lock:
            episode.last_used = time.monotonic()
            timeout = self._settings.tool_timeout_s
            try:
                value = await asyncio.wait_for(episode.session.reward(), timeout)
            except TimeoutError:
                return EpisodeReward(None, f"get_reward did not finish within {timeout:g}s")
            except Exception as exc:
                reason = f"get_reward failed: {type(exc).__name__}: {exc}"
                return EpisodeReward(None, valid_text(reason[:1000]))
        if value is None:
            return EpisodeReward(None)
        number = _finite_float(value)
        if number is None:
            # repr() of a float is short; of anything else it may be any length (str of a huge int raises)
            shown = repr(value) if isinstance(value, float) else f"a value of type {type(value).__name__}"
            return EpisodeReward(None, f"get_reward returned {shown}, not a finite number")
        return EpisodeReward(number)

    async def close(self, episode_id: str) -> bool:
        episode = self._episodes.pop(episode_id, None)
        if episode is None:
            return False
        await self._close(episode)
        return True

    async def _close(self, episode: _Episode) -> None:
        # The lock waits for a running step; a hung tool call holds it at most tool_timeout_s.
        async with episode.lock:
            episode.closed = True
            try:
                await episode.session.close()
            except Exception:
                log.warning("environment %s: closing an episode failed", episode.environment, exc_info=True)

    async def expire_idle(self) -> int:
        """Closes the episodes idle past ``idle_timeout_s``; returns how many."""
        deadline = time.monotonic() - self._settings.idle_timeout_s
        idle = [e for e in self._episodes.values() if e.last_used < deadline and not e.lock.locked()]
        for episode in idle:
            self._episodes.pop(episode.id, None)
        await asyncio.gather(*(self._close(e) for e in idle))
        if idle:
            log.info("closed %d idle episodes", len(idle))
        return len(idle)

    async def _sweep_forever(self) -> None:
        interval = min(30.0, self._settings.idle_timeout_s / 4)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.expire_idle()
            except Exception:
                log.exception("closing idle episodes failed")

    async def close_all(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        episodes = list(self._episodes.values())
        self._episodes.clear()
        await asyncio.gather(*(self._close(e) for e in episodes))
