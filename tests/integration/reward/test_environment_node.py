"""The Node.js environment server (examples/node/env_server.js) implements grpo.env.v1: full episodes of its
number game through the Python EnvironmentClient, bad tool calls as error results, caller errors as statuses.
Needs ``node`` (20+) and ``npm`` on PATH; ``npm ci`` runs once when examples/node/node_modules is missing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import grpc
import pytest

from grpo_runtime.call_errors import ServiceCallError
from grpo_runtime.env_client import EnvironmentClient, ToolCall
from tests.support.node_env import node_env_server


@pytest.fixture(scope="module")
def node_env() -> Iterator[str]:
    """The server started as users start it, on a free loopback port; its address."""
    with node_env_server("--max-open", "3") as server:
        yield server.address


def guess(number) -> ToolCall:
    return ToolCall("guess", json.dumps({"number": number}), f"g{number}")


async def play(env: EnvironmentClient, secret: int) -> tuple[int, float]:
    """Plays one episode by bisection, as a policy that uses the tool well; (turns, reward)."""
    episode = await env.open_episode("guess-number", metadata={"secret": secret, "answer": str(secret)})
    assert "guess tool" in episode.prompt_suffix
    low, high, turns = 1, 100, 0
    try:
        while True:
            turns += 1
            middle = (low + high) // 2
            outcome = await env.step(episode.episode_id, [guess(middle)])
            (result,) = outcome.results
            assert not result.error and result.call_id == f"g{middle}"
            if outcome.done:
                assert result.content.startswith("correct")
                break
            low, high = (middle + 1, high) if result.content == "higher" else (low, middle - 1)
            assert turns < 10
        return turns, (await env.get_reward(episode.episode_id)).value
    finally:
        assert await env.close_episode(episode.episode_id)


async def test_full_episodes(node_env):
    async with EnvironmentClient(node_env, timeout_s=30) as env:
        (info,) = await env.list_environments()
        assert (info.name, info.kind, info.available) == ("guess-number", "node", True)
        results = await asyncio.gather(*(play(env, secret) for secret in (1, 50, 77)))
    for turns, reward in results:
        assert reward == pytest.approx(max(0.1, 1 - 0.1 * (turns - 1)))
    assert results[1] == (1, 1.0)  # 50 is the first bisection guess


async def test_tools_are_json_schema_for_the_chat_template(node_env):
    async with EnvironmentClient(node_env, timeout_s=30) as env:
        episode = await env.open_episode("guess-number")
        (tool,) = episode.chat_template_tools()
        assert tool["type"] == "function" and tool["function"]["name"] == "guess"
        assert tool["function"]["parameters"]["properties"]["number"]["type"] == "integer"
        assert tool["function"]["parameters"]["required"] == ["number"]
        await env.close_episode(episode.episode_id)


async def test_bad_calls_are_error_results_and_caller_errors_are_statuses(node_env):
    async with EnvironmentClient(node_env, timeout_s=30) as env:
        episode = await env.open_episode("guess-number", metadata={"secret": 10})
        outcome = await env.step(
            episode.episode_id,
            [
                ToolCall("guess", "{oops"),
                ToolCall("shout", "{}"),
                guess("ten"),
                ToolCall("guess", "[1]"),
                guess(10),
            ],
        )
        not_json, unknown, wrong_type, not_object, right = outcome.results
        assert not_json.error and "not valid JSON" in not_json.content
        assert unknown.error and "unknown tool 'shout'" in unknown.content
        assert wrong_type.error and "must be an integer" in wrong_type.content
        assert not_object.error and "JSON object" in not_object.content
        assert (right.content, right.error, outcome.done) == ("correct! found in 1 guesses", False, True)
        (late,) = (await env.step(episode.episode_id, [guess(3)])).results
        assert late.error and "game is over" in late.content
        await env.close_episode(episode.episode_id)
        assert not await env.close_episode(episode.episode_id)

        for coro, code, prefix in [
            (env.open_episode("chess"), grpc.StatusCode.INVALID_ARGUMENT, "environment: "),
            (
                env.open_episode("guess-number", metadata={"secret": 1000}),
                grpc.StatusCode.INVALID_ARGUMENT,
                "metadata.secret: ",
            ),
            (
                env.open_episode("guess-number", params={"level": 2}),
                grpc.StatusCode.INVALID_ARGUMENT,
                "params.level: ",
            ),
            (env.step("missing", [guess(1)]), grpc.StatusCode.NOT_FOUND, "episode_id: "),
            (env.get_reward("missing"), grpc.StatusCode.NOT_FOUND, "episode_id: "),
        ]:
            with pytest.raises(ServiceCallError) as info:
                await coro
            assert info.value.code == code and info.value.details.startswith(prefix), info.value

        opened = [(await env.open_episode("guess-number")).episode_id for _ in range(3)]
        with pytest.raises(ServiceCallError) as info:
            await env.open_episode("guess-number")
        assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        for episode_id in opened:
            await env.close_episode(episode_id)
