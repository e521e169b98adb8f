"""Environments that fail mid-episode, through real servers: a tool that hangs in the reward service's TRL
environment, a hung environment server, and the Node.js environment server killed between two turns. Each is
that completion's outcome (a tool-error result the model sees, or FINISH_REASON_ERROR with the reason), the
Generate call returns promptly, and the other completions of the same request finish normally."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator

import pytest

from rollout_service.client import RolloutClient
from rollout_service.types import EpisodeSpec, FinishReason
from tests.integration.reward.fixtures import SETTINGS, reward_server_thread
from tests.support.episodes import scripted_rollout_server, tool_call
from tests.support.node_env import node_env_server

pytestmark = pytest.mark.slow  # the reward service (math-verify workers, sandbox probe) starts per module

TOOL_TIMEOUT_S = 2
HANG_S = 8  # the hanging tool's sleep: past the reward service's tool timeout
RESULT = re.compile(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", re.DOTALL)
ARITHMETIC = [{"role": "user", "content": "What is 6 * 7?"}]
HANG = [{"role": "user", "content": "Please hang."}]
GAME = [{"role": "user", "content": "Find the secret number."}]


def script(prompt: str) -> str:
    """Calls one tool per question (calculator, the hanging tool, a guess), then reports the last result."""
    results = RESULT.findall(prompt)
    if results:
        return f"Result: {results[-1]}"
    if "Please hang." in prompt:
        return f"<tool_call>\n{json.dumps({'name': 'hang', 'arguments': {'seconds': HANG_S}})}\n</tool_call>"
    if "secret number" in prompt:
        return f"<tool_call>\n{json.dumps({'name': 'guess', 'arguments': {'number': 50}})}\n</tool_call>"
    return tool_call(re.search(r"What is (.+?)\?", prompt).group(1))


@pytest.fixture(scope="module")
def env_server():
    settings = {
        **SETTINGS,
        "environments": {
            "tool_timeout_s": TOOL_TIMEOUT_S,
            "trl": {"misbehaving": "tests.support.trl_envs:Misbehaving"},
        },
    }
    with reward_server_thread(settings) as running:
        yield running


def assert_answered(completion, expected: str) -> None:
    assert completion.finish_reason == FinishReason.STOP and not completion.error, completion
    assert completion.tool_call_count == 1 and completion.tool_failure_count == 0
    assert f"Result: {expected}" in completion.text


def test_a_hung_tool_is_a_tool_error_result_and_the_rest_of_the_request_completes(tiny_models, env_server):
    _, rollout = scripted_rollout_server(tiny_models["policy"], script, {"default": env_server.address})
    with rollout as server, RolloutClient(server.address, timeout_s=60) as client:
        start = time.monotonic()
        arithmetic, hung = client.generate(
            [ARITHMETIC, HANG],
            sampling={"max_tokens": 200},
            episodes=[EpisodeSpec("calculator"), EpisodeSpec("misbehaving", max_turns=3)],
        )
        elapsed = time.monotonic() - start
    assert elapsed < HANG_S, elapsed  # the call did not wait for the hung tool
    assert_answered(arithmetic, "42")
    # The reward service timed the call out: an error result the model read, and the episode ended there.
    assert hung.finish_reason == FinishReason.STOP and not hung.error
    assert hung.tool_call_count == 1 and hung.tool_failure_count == 1
    assert f"did not finish within {TOOL_TIMEOUT_S}s" in hung.text
    assert hung.env_reward is None  # Misbehaving's reward is NaN: reported as no reward, not passed on


def test_a_hung_environment_server_ends_that_episode_with_an_error(tiny_models, env_server):
    """The rollout service's own Step deadline is shorter than the reward service's tool timeout here, so to
    the rollout service the environment server itself hangs."""
    _, rollout = scripted_rollout_server(
        tiny_models["policy"], script, {"default": env_server.address}, step_timeout_s=1
    )
    with rollout as server, RolloutClient(server.address, timeout_s=60) as client:
        start = time.monotonic()
        arithmetic, hung = client.generate(
            [ARITHMETIC, HANG],
            sampling={"max_tokens": 200},
            episodes=[EpisodeSpec("calculator"), EpisodeSpec("misbehaving")],
        )
        elapsed = time.monotonic() - start
    assert elapsed < HANG_S, elapsed
    assert_answered(arithmetic, "42")
    assert hung.finish_reason == FinishReason.ERROR and "Step" in hung.error, hung.error
    # The turn the model wrote is kept; its call counts as made and failed.
    assert hung.token_ids and hung.tool_call_count == hung.tool_failure_count == 1


@pytest.fixture
def node_env() -> Iterator:
    with node_env_server() as server:
        yield server


def test_an_environment_server_killed_mid_episode(tiny_models, env_server, node_env):
    def kill_after_first_turn(prompt: str) -> str:
        # Between the first turn and the Step of its call: the Node server dies with the episode open.
        if "secret number" in prompt and node_env.process.poll() is None:
            os.kill(node_env.process.pid, signal.SIGKILL)
            node_env.process.wait()
        return script(prompt)

    _, rollout = scripted_rollout_server(
        tiny_models["policy"],
        kill_after_first_turn,
        {"default": env_server.address, "node": node_env.address},
        step_timeout_s=20,
    )
    with rollout as server, RolloutClient(server.address, timeout_s=60) as client:
        start = time.monotonic()
        arithmetic, game = client.generate(
            [ARITHMETIC, GAME],
            sampling={"max_tokens": 200},
            episodes=[EpisodeSpec("calculator"), EpisodeSpec("guess-number", target="node")],
        )
        elapsed = time.monotonic() - start
    assert elapsed < 20, elapsed  # a dead server is noticed, not waited on until the Step deadline
    assert_answered(arithmetic, "42")
    assert game.finish_reason == FinishReason.ERROR and "Step" in game.error, game.error
    assert game.token_ids and game.tool_call_count == game.tool_failure_count == 1
