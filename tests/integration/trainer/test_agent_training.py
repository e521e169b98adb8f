"""Agents as rollout workers, through real servers on loopback: a rollout service with its OpenAI gateway (in
this process), an agent written with the official ``openai`` SDK served over grpo.agent.v1 by
``grpo_runtime.agent_server``, and the trainer's agent episodes — first played directly (the failure rules
and that training gets the gateway's exact sampled ids), then a 2-step run on the tiny policy."""

from __future__ import annotations

import asyncio
import math

import openai
import pytest

from grpo_runtime.client import ChannelConfig
from rollout_service.client import FinishReason, RolloutClient
from tests.integration.trainer.fixtures import run_config
from tests.support.agents import python_agent, rollout_with_gateway
from trainer_service.config.agents import AgentsConfig
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import RunState
from trainer_service.local.launcher import start_local_services
from trainer_service.rollout.agent_episodes import AgentEpisodes, agent_metrics
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow

# Token ids the gateway returned to the agent, per question (return_token_ids, vLLM's extension).
SAMPLED: dict[str, list[list[int]]] = {}
FLAKY_TRIES: dict[str, int] = {}


async def chat_agent(task, base_url, deadline):
    """One chat call with the official SDK; the task's question decides how the episode goes wrong."""
    question = task["prompt"][-1]["content"] if isinstance(task["prompt"], list) else task["prompt"]
    if question == "raise":
        raise RuntimeError("the agent crashed")
    if question == "hang":
        await asyncio.sleep(30)
    if question == "nan":
        return math.nan, {}
    if question == "flaky" and FLAKY_TRIES.setdefault(question, 0) == 0:
        FLAKY_TRIES[question] += 1
        raise RuntimeError("first try fails")
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    reply = await client.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": question}],
        max_tokens=8,
        temperature=1.0,
        extra_body={"return_token_ids": True},
    )
    SAMPLED.setdefault(question, []).append(list(reply.choices[0].token_ids))
    answer = reply.choices[0].message.content or ""
    gold = str(task.get("answer", ""))
    return float(bool(gold) and gold in answer), {"answer": answer}


@pytest.fixture(scope="module")
def gateway_rollout(tiny_models):
    """A rollout service (HF engine, the tiny policy) with its gateway: (gRPC address, gateway URL)."""
    with rollout_with_gateway(tiny_models["policy"]) as served:
        yield served


@pytest.fixture(scope="module")
def agent_target():
    with python_agent(chat_agent) as target:
        yield target


def test_failed_episodes_are_retried_then_masked_and_trained_tokens_are_the_gateways(
    gateway_rollout, agent_target
):
    rollout_address, gateway_url = gateway_rollout
    config = AgentsConfig(
        target=agent_target, gateway_url=gateway_url, episode_timeout_s=2.0, max_episode_retries=1
    )
    questions = ["What is 2 + 2?", "raise", "hang", "nan", "flaky"]
    rows = [{"prompt": [{"role": "user", "content": q}], "answer": "4"} for q in questions]
    episodes = AgentEpisodes(config, ChannelConfig(target=agent_target), rows, end_token_id=7)
    with RolloutClient(rollout_address, timeout_s=60) as rollout:
        played = episodes.play([row["prompt"] for row in rows], rollout, step=0, version=0)
    ok, crashed, hung, nan, flaky = played
    for completion, question in ((ok, questions[0]), (flaky, "flaky")):
        assert completion.finish_reason == FinishReason.STOP
        sampled = [t for t, m in zip(completion.token_ids, completion.tool_mask, strict=True) if m]
        assert sampled == SAMPLED[question][-1]  # exactly the ids the gateway returned to the agent
        assert completion.env_reward in (0.0, 1.0)
        assert len(completion.logprobs) == len(completion.token_ids) == len(completion.token_versions)
    assert ok.attempts == 1 and flaky.attempts == 2
    for completion, reason in ((crashed, "the agent crashed"), (hung, "DEADLINE_EXCEEDED"), (nan, "reward")):
        assert completion.finish_reason == FinishReason.ERROR
        assert completion.attempts == 2  # one retry, then given up
        assert reason in completion.error, completion.error
        assert completion.tool_mask == [0] and completion.token_ids == [7] and completion.env_reward is None
    metrics = agent_metrics(played)
    assert metrics["agents/episodes"] == 5.0
    assert metrics["agents/failed_episodes"] == 3.0
    assert metrics["agents/retried_episodes"] == 4.0
    assert metrics["agents/retokenized_tokens"] == 0.0 and metrics["agents/prefix_mismatches"] == 0.0


def test_a_run_trains_two_steps_on_agent_episodes(
    tiny_models, train_file, gateway_rollout, agent_target, tmp_path
):
    rollout_address, gateway_url = gateway_rollout
    with start_local_services(
        need_reward=True, need_rollout=False, model=tiny_models["policy"], log_dir=tmp_path / "logs"
    ) as local:
        raw = run_config(
            tiny_models,
            train_file,
            tmp_path / "run",
            local.reward.target,
            rollout_address,
            max_steps=2,
            agents={"target": agent_target, "gateway_url": gateway_url, "reward_weight": 0.5},
        )
        result = run_job(parse_config(raw))
    assert result.state is RunState.COMPLETED, result.message
    rows = read_metrics(result.output_dir / "metrics.jsonl")
    trained = [row for row in rows if "agents/episodes" in row]
    assert len(trained) == 2, rows
    for row in trained:
        assert row["agents/episodes"] == 4.0 and row["agents/failed_episodes"] == 0.0
        assert row["agents/prefix_mismatches"] == 0.0
