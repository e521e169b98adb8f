"""grpo.env.v1.EnvironmentService served by the reward service process, driven through EnvironmentClient on
loopback: every shipped environment kind, and hostile input answered with clear statuses or error results."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpo.env.v1 import env_pb2, env_pb2_grpc

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


async def test_concurrent_calls_are_one_batch_each_entry_answered_as_its_single_call(env):
    """The client sends concurrent opens and steps as one batch call; each caller gets what its single call
    would have given, an error naming its field included."""
    opened = await asyncio.gather(
        env.open_episode("calculator"),
        env.open_episode("no-such-env"),
        env.open_episode("calculator", metadata={"answer": math.nan}),
        env.open_episode("calculator"),
        return_exceptions=True,
    )
    first, unknown, nan, last = opened
    assert unknown.code == grpc.StatusCode.INVALID_ARGUMENT and unknown.field == "environment"
    assert nan.code == grpc.StatusCode.INVALID_ARGUMENT and nan.field == "metadata.answer"
    stepped = await asyncio.gather(
        env.step(first.episode_id, [calc("6*7")]),
        env.step("nope", [calc("1")]),
        env.step(last.episode_id, [calc("1")] * 5),
        env.step(last.episode_id, [calc("2**10")]),
        return_exceptions=True,
    )
    assert stepped[0].results[0].content == "42"
    assert stepped[1].code == grpc.StatusCode.NOT_FOUND and stepped[1].field == "episode_id"
    assert stepped[2].code == grpc.StatusCode.RESOURCE_EXHAUSTED and stepped[2].field == "calls"
    assert stepped[3].results[0].content == "1024"
    closed = await asyncio.gather(
        *(env.close_episode(i) for i in (first.episode_id, last.episode_id, "nope"))
    )
    assert closed == [True, True, False]


async def test_too_many_open_episodes_in_one_batch_keep_the_pushback(env):
    opened = await asyncio.gather(*(env.open_episode("calculator") for _ in range(8)), return_exceptions=True)
    refused = [o for o in opened if isinstance(o, ServiceCallError)]
    try:
        # At most 6 open at once: 2 refused, or more when an episode of an earlier test is still open.
        assert len(refused) >= 2 and all(e.code == grpc.StatusCode.RESOURCE_EXHAUSTED for e in refused)
        assert all(e.retryable and "max_open_episodes" in e.details for e in refused)
    finally:
        await asyncio.gather(*(env.close_episode(o.episode_id) for o in opened if o not in refused))


async def test_batch_results_stream_as_they_finish_and_batches_are_bounded(env_server):
    """A hung tool holds back only its own entry: the calculator's result comes in an earlier message."""
    async with grpc.aio.insecure_channel(env_server.address) as channel:
        stub = env_pb2_grpc.EnvironmentServiceStub(channel)
        opening = env_pb2.OpenEpisodesRequest(
            episodes=[env_pb2.OpenEpisodeRequest(environment=e) for e in ("misbehaving", "calculator")]
        )
        episodes = {}
        async for message in stub.OpenEpisodes(opening):
            episodes.update({entry.index: entry.episode.episode_id for entry in message.opened})
        steps = env_pb2.StepEpisodesRequest(
            steps=[
                env_pb2.StepRequest(
                    episode_id=episodes[0],
                    calls=[env_pb2.ToolCall(name="hang", arguments_json='{"seconds": 5}')],
                ),
                env_pb2.StepRequest(
                    episode_id=episodes[1],
                    calls=[env_pb2.ToolCall(name="calculator", arguments_json='{"expression": "1+1"}')],
                ),
            ]
        )
        messages = [message async for message in stub.StepEpisodes(steps)]
        assert [[entry.index for entry in m.stepped] for m in messages] == [[1], [0]]
        assert messages[0].stepped[0].step.results[0].content == "2"
        hung = messages[1].stepped[0].step
        assert hung.done and "did not finish within 1s" in hung.results[0].content
        closing = env_pb2.CloseEpisodesRequest(episode_ids=list(episodes.values()))
        assert list((await stub.CloseEpisodes(closing)).closed) == [True, True]
        for call, request, field in (
            (stub.CloseEpisodes, env_pb2.CloseEpisodesRequest(episode_ids=["x"] * 257), "episode_ids"),
            (stub.StepEpisodes, env_pb2.StepEpisodesRequest(steps=[env_pb2.StepRequest()] * 257), "steps"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                response = call(request)
                await (response if field == "episode_ids" else response.read())
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details() == f"{field}: 257 entries, at most 256"
