"""Test parts for multi-turn episodes: an in-process calculator environment, and an engine that follows a
script (a random tiny policy never writes a tool call, so the loop's tool paths need a policy that does).

``ScriptedEngine`` is a real :class:`~rollout_service.engines.base.Engine`: the core batches its turns
like any engine's. Each turn's text is ``script(prompt_text)``, encoded with the model's tokenizer and
ended with EOS; it is cut to the job's ``max_tokens`` (finish LENGTH).
"""

from __future__ import annotations

import ast
import asyncio
import itertools
import json
import operator
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from transformers import AutoTokenizer

from grpo_runtime.env_types import Episode, EpisodeReward, StepOutcome, ToolCall, ToolDefinition, ToolResult
from grpo_runtime.server import GrpcServer
from rollout_service.core.rollout import RolloutCore
from rollout_service.engines.base import Engine, UpdatePause
from rollout_service.server import binding, environment_clients
from rollout_service.settings import EpisodeSettings, RolloutSettings
from rollout_service.types import FinishReason, GenerationJob, RawCompletion
from rollout_service.weights import ParamCatalog
from tests.support.server_thread import server_thread

SCRIPTED_LOGPROB = -0.5
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def tool_call(expression: str) -> str:
    body = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<tool_call>\n{body}\n</tool_call>"


def evaluate(expression: str) -> int:
    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"unsupported expression {expression!r}")

    return walk(ast.parse(expression, mode="eval").body)


class ScriptedEngine(Engine):
    name = "scripted"
    device = "cpu"

    def __init__(self, model_dir: str, script: Callable[[str], str]) -> None:
        self.model_dir = str(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.max_model_len = 512
        self.script = script
        self.turns_generated = 0
        self.updates_applied = 0

    def generate(self, jobs: list[GenerationJob], pause: UpdatePause | None = None) -> None:
        # A turn is written at once: there is no segment boundary to pause at.
        eos = self.tokenizer.eos_token_id
        for job in jobs:
            job.results = []
            for prompt in job.prompt_token_ids:
                text = self.script(self.tokenizer.decode(prompt, skip_special_tokens=False))
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
                finish = FinishReason.STOP
                if len(ids) > job.sampling.max_tokens:
                    ids, finish = ids[: job.sampling.max_tokens], FinishReason.LENGTH
                self.turns_generated += 1
                job.results += [RawCompletion(ids, [SCRIPTED_LOGPROB] * len(ids), finish)] * job.n

    def apply_update(self, update) -> None:
        # The script ignores weights; the core has validated the update against the model's catalog.
        self.updates_applied += 1

    def sleep(self, level: int) -> None:
        pass

    def wake_up(self, tags: set[str]) -> None:
        pass


CALCULATOR = ToolDefinition(
    "calculator",
    "Evaluates an arithmetic expression of integers with + - *.",
    {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
)


class CalculatorEnvironment:
    """An in-process EnvironmentBackend with one ``calculator`` tool; reward 1.0 when the last result
    equals metadata ``answer``. ``mode`` makes it misbehave: "hang" (Step never returns), "die" (Step
    raises as a dead server's client does), "flood" (results of ``flood_chars`` characters), "done"
    (Step says the episode is over)."""

    def __init__(self, mode: str = "ok", flood_chars: int = 100_000) -> None:
        self.mode = mode
        self.flood_chars = flood_chars
        self.open: dict[str, dict[str, Any]] = {}
        self.opened = 0
        self.closed = 0
        self.rewards_read = 0
        self.steps: list[list[ToolCall]] = []
        self._ids = itertools.count()

    async def open_episode(
        self,
        environment: str,
        *,
        params: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Episode:
        if environment != "calculator":
            raise RuntimeError(f"unknown environment {environment!r}")
        episode_id = f"ep{next(self._ids)}"
        self.open[episode_id] = {"metadata": dict(metadata or {}), "last": None}
        self.opened += 1
        return Episode(episode_id, (CALCULATOR,), (params or {}).get("suffix", ""))

    async def step(self, episode_id: str, calls: Sequence[ToolCall]) -> StepOutcome:
        self.steps.append(list(calls))
        if self.mode == "hang":
            await asyncio.Event().wait()
        if self.mode == "die":
            raise ConnectionError("the environment server went away")
        results = []
        for call in calls:
            if call.name != "calculator":
                results.append(
                    ToolResult(call.id, call.name, f"error: unknown tool {call.name!r}", error=True)
                )
                continue
            try:
                value = evaluate(json.loads(call.arguments_json)["expression"])
            except (ValueError, KeyError, TypeError, SyntaxError) as exc:
                results.append(ToolResult(call.id, call.name, f"error: {exc}", error=True))
                continue
            self.open[episode_id]["last"] = str(value)
            content = "9" * self.flood_chars if self.mode == "flood" else str(value)
            results.append(ToolResult(call.id, call.name, content))
        return StepOutcome(tuple(results), done=self.mode == "done")

    async def get_reward(self, episode_id: str) -> EpisodeReward:
        state = self.open[episode_id]
        self.rewards_read += 1
        return EpisodeReward(float(state["last"] == state["metadata"].get("answer")))

    async def close_episode(self, episode_id: str) -> bool:
        self.closed += 1
        return self.open.pop(episode_id, None) is not None

    async def close(self) -> None:
        pass


def scripted_rollout_server(
    model_dir, script: Callable[[str], str], targets: Mapping[str, str], **episodes: Any
) -> tuple[ScriptedEngine, AbstractContextManager[GrpcServer]]:
    """A real rollout server (in a thread, on loopback) whose engine follows ``script`` and whose episodes
    dial ``targets`` (name → environment service address); ``episodes``: more EpisodeSettings fields.
    Returns the engine (to read its counters) and the server's context manager."""
    settings = RolloutSettings(
        model=str(model_dir), episodes=EpisodeSettings(targets=dict(targets), **episodes)
    )
    engine = ScriptedEngine(model_dir, script)

    async def build():
        core = RolloutCore(
            engine,
            engine.tokenizer,
            ParamCatalog.from_model_dir(model_dir),
            environments=environment_clients(settings),
            episode_settings=settings.episodes,
        )
        await core.start()
        return [binding(core)], core.close

    return engine, server_thread(build)
