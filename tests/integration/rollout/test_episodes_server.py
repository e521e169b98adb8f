"""Tool episodes through real gRPC servers on loopback: the rollout service runs the loop against the
EnvironmentService the reward service process serves (its real calculator), and a RolloutClient reads the
episode fields back."""

from __future__ import annotations

import re
from contextlib import AbstractContextManager

import pytest

from grpo_runtime.call_errors import InvalidArgumentError
from grpo_runtime.server import GrpcServer
from rollout_service.client import RolloutClient
from rollout_service.types import EpisodeSpec, FinishReason
from tests.integration.reward.fixtures import SETTINGS, reward_server_thread
from tests.support.episodes import scripted_rollout_server, tool_call

pytestmark = pytest.mark.slow  # the reward service (math-verify workers, sandbox probe) starts per module

QUESTION = [{"role": "user", "content": "What is 123 * 456?"}]


def calculator_script(prompt: str) -> str:
    results = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", prompt, re.DOTALL)
    if results:
        return f"The answer is {results[-1]}."
    return tool_call(re.search(r"What is (.+?)\?", prompt).group(1))


@pytest.fixture(scope="module")
def env_server():
    with reward_server_thread(SETTINGS) as running:
        yield running


def rollout_server(model_dir, env_address: str, **episodes) -> AbstractContextManager[GrpcServer]:
    """A rollout server whose engine follows the calculator script, dialing ``env_address`` as "default"."""
    _, server = scripted_rollout_server(model_dir, calculator_script, {"default": env_address}, **episodes)
    return server


def test_episode_through_both_services(tiny_models, env_server):
    with (
        rollout_server(tiny_models["policy"], env_server.address) as server,
        RolloutClient(server.address, timeout_s=60) as client,
    ):
        spec = EpisodeSpec("calculator", metadata={"answer": "56088"}, max_turns=3)
        out = client.generate([QUESTION], n=2, sampling={"max_tokens": 200}, episodes=[spec])
    assert len(out) == 2
    for c in out:
        assert c.finish_reason == FinishReason.STOP and not c.error
        assert c.tool_call_count == 1 and c.tool_failure_count == 0
        assert "The answer is 56088." in c.text  # the real calculator's result, read back by the model
        assert len(c.tool_mask) == len(c.token_ids) == len(c.logprobs)
        first, second = c.turns
        assert c.tool_mask.count(0) == second.start - first.end > 0
        assert all(lp == 0.0 for lp, m in zip(c.logprobs, c.tool_mask, strict=True) if m == 0)


def test_a_dead_environment_server_is_a_per_completion_error(tiny_models):
    with reward_server_thread(SETTINGS) as doomed:
        address = doomed.address
    # The environment server is gone: each episode ends with the reason, the call itself succeeds.
    with (
        rollout_server(tiny_models["policy"], address, open_timeout_s=3) as server,
        RolloutClient(server.address, timeout_s=60) as client,
    ):
        [c] = client.generate([QUESTION], sampling={"max_tokens": 50}, episodes=[EpisodeSpec("calculator")])
    assert c.finish_reason == FinishReason.ERROR
    assert "OpenEpisode" in c.error and c.token_ids == []


def test_unknown_target_is_invalid_argument(tiny_models, env_server):
    """A caller names a configured target, never an address: anything else is refused before any dial."""
    with (
        rollout_server(tiny_models["policy"], env_server.address) as server,
        RolloutClient(server.address, timeout_s=60) as client,
        pytest.raises(InvalidArgumentError) as info,
    ):
        client.generate([QUESTION], episodes=[EpisodeSpec("calculator", target="10.0.0.1:50051")])
    assert info.value.field == "prompts[0].episode.target"
