"""grpo.env.v1.EnvironmentService served by the reward service process, driven through EnvironmentClient on
loopback: every shipped environment kind, and hostile input answered with clear statuses or error results."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from grpo_runtime.call_errors import ServiceCallError
from grpo_runtime.env_client import EnvironmentClient, ToolCall
from grpo_runtime.server import GrpcServer
from tests.integration.reward.fixtures import SETTINGS, reward_server_thread

ROOT = Path(__file__).resolve().parents[3]
ENV_SETTINGS = {
    **SETTINGS,
    "environments": {
        "max_open_episodes": 6,
        "max_calls_per_step": 4,
        "tool_timeout_s": 1,
        "max_arguments_chars": 1000,
        "max_result_chars": 500,
        "trl": {
            "counter": "tests.support.trl_envs:Counter",
            "misbehaving": "tests.support.trl_envs:Misbehaving",
        },
        "mcp": {
            "notes": {"command": sys.executable, "args": ["-m", "tests.support.mcp_server"], "cwd": str(ROOT)}
        },
    },
}


@pytest.fixture(scope="module")
def env_server() -> Iterator[GrpcServer]:
    with reward_server_thread(ENV_SETTINGS) as running:
        yield running


@pytest.fixture
async def env(env_server) -> EnvironmentClient:
    async with EnvironmentClient(env_server.address, timeout_s=60) as client:
        yield client


def calc(expression: str) -> ToolCall:
    return ToolCall("calculator", json.dumps({"expression": expression}), "call-1")


async def test_list_environments(env):
    listed = {e.name: e for e in await env.list_environments()}
    assert sorted(listed) == ["calculator", "counter", "misbehaving", "notes", "python"]
    assert {n: e.kind for n, e in listed.items()} == {
        "calculator": "calculator",
        "counter": "trl",
        "misbehaving": "trl",
        "notes": "mcp",
        "python": "python",
    }
    assert listed["python"].available and "bwrap" in listed["python"].status
    assert (
        listed["counter"].description
        == "Counts up to a target; the reward is 1 when the count hits it exactly."
    )


async def test_calculator_episode(env):
    episode = await env.open_episode("calculator", metadata={"answer": "456831"})
    described = episode.tools[0].parameters["properties"]["expression"]["description"]
    assert episode.chat_template_tools() == [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": episode.tools[0].description,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "expression": {
                            "type": "string",
                            "description": described,
                        }
                    },
                    "required": ["expression"],
                },
            },
        }
    ]
    outcome = await env.step(episode.episode_id, [calc("(123 + 456) * 789")])
    assert (outcome.results[0].call_id, outcome.results[0].content, outcome.done) == (
        "call-1",
        "456831",
        False,
    )
    reward = await env.get_reward(episode.episode_id)
    assert (reward.value, reward.error) == (None, "")
    assert await env.close_episode(episode.episode_id)
    assert not await env.close_episode(episode.episode_id)


async def test_python_episode_keeps_state(env):
    episode = await env.open_episode("python")
    run = lambda source: env.step(episode.episode_id, [ToolCall("python", json.dumps({"code": source}))])  # noqa: E731
    assert (await run("total = sum(range(10))")).results[0].content == "(no output)"
    assert (await run("total * 2")).results[0].content == "90"
    await env.close_episode(episode.episode_id)


async def test_trl_episode_with_reward(env):
    episode = await env.open_episode("counter", metadata={"target": 3, "prompt": "Count."})
    assert episode.prompt_suffix == "\nReach exactly 3."
    assert [t.name for t in episode.tools] == ["increment", "peek"]
    assert episode.tools[0].parameters["properties"]["by"] == {
        "type": "integer",
        "description": "How much to add.",
    }
    outcome = await env.step(
        episode.episode_id, [ToolCall("increment", '{"by": 2}'), ToolCall("increment", '{"by": 1}')]
    )
    assert [r.content for r in outcome.results] == ["count=2", "count=3"]
    assert (await env.get_reward(episode.episode_id)).value == 1.0
    await env.close_episode(episode.episode_id)


async def test_mcp_episode_and_a_server_that_dies(env):
    episode = await env.open_episode("notes")
    outcome = await env.step(
        episode.episode_id, [ToolCall("add", '{"a": 20, "b": 22}'), ToolCall("crash", "{}")]
    )
    added, crashed = outcome.results
    assert (added.content, added.error) == ("42", False)
    assert crashed.error and "MCP server has stopped" in crashed.content
    assert outcome.done
    assert await env.close_episode(episode.episode_id)


@pytest.mark.parametrize(
    ("call", "message", "truncated"),
    [
        (ToolCall("calculator", "{not json"), "not valid JSON", False),
        (ToolCall("calculator", '{"expression": 1}'), "is not of type 'string'", False),
        (ToolCall("calculator", json.dumps({"expression": "1" * 2000})), "at most 1000", False),
        (ToolCall("nope", "{}"), "unknown tool 'nope'", False),
    ],
)
async def test_bad_tool_calls_are_error_results(env, call, message, truncated):
    episode = await env.open_episode("calculator")
    outcome = await env.step(episode.episode_id, [call, calc("1 + 1")])
    bad, good = outcome.results
    assert bad.error and message in bad.content and bad.truncated == truncated
    assert (good.content, good.error) == ("2", False)
    await env.close_episode(episode.episode_id)


async def test_hanging_and_flooding_tools(env):
    episode = await env.open_episode("misbehaving")
    (flood,) = (await env.step(episode.episode_id, [ToolCall("flood", '{"chars": 100000}')])).results
    assert flood.truncated and len(flood.content) == 500
    (surrogate,) = (await env.step(episode.episode_id, [ToolCall("surrogate", "{}")])).results
    assert (surrogate.content, surrogate.error) == ("bad ? text", False)
    (secret,) = (await env.step(episode.episode_id, [ToolCall("secret", "{}")])).results
    assert not secret.error  # a TRL class runs in the service: it is trusted code, allow-listed in settings
    outcome = await env.step(episode.episode_id, [ToolCall("hang", '{"seconds": 5}')])
    assert outcome.results[0].error and "did not finish within 1s" in outcome.results[0].content
    assert outcome.done
    reward = await env.get_reward(episode.episode_id)
    assert reward.value is None and "not a finite number" in reward.error
    assert await env.close_episode(episode.episode_id)


async def _status(coro) -> ServiceCallError:
    with pytest.raises(ServiceCallError) as info:
        await coro
    return info.value


async def test_caller_errors_are_statuses_naming_the_field(env):
    error = await _status(env.open_episode("no-such-env"))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT and error.details.startswith("environment: unknown")
    error = await _status(env.open_episode("calculator", params={"digits": 3}))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT and error.details.startswith("params.digits: ")
    error = await _status(env.open_episode("calculator", metadata={"answer": math.nan}))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT and error.details.startswith("metadata.answer: ")
    error = await _status(env.open_episode("counter", metadata={"target": "x"}))
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION and "could not open an episode" in error.details
    for call in (env.step("nope", [calc("1")]), env.get_reward("nope")):
        error = await _status(call)
        assert error.code == grpc.StatusCode.NOT_FOUND and error.details.startswith("episode_id: ")
    episode = await env.open_episode("calculator")
    error = await _status(env.step(episode.episode_id, [calc("1")] * 5))
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.details.startswith("calls: ")
    error = await _status(env.step(episode.episode_id, []))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    await env.close_episode(episode.episode_id)


async def test_too_many_open_episodes(env):
    opened = []
    try:
        with pytest.raises(ServiceCallError) as info:
            for _ in range(7):
                opened.append((await env.open_episode("calculator")).episode_id)
        assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_open_episodes" in info.value.details
        assert info.value.retryable  # transient (the server's pushback): closing episodes frees room
    finally:
        for episode_id in opened:
            await env.close_episode(episode_id)
    assert (await env.open_episode("calculator")).episode_id
