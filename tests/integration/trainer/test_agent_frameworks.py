"""The example agents (examples/agents, examples/node) train the policy unchanged but for their base URL:
each trains two steps end to end through real servers on loopback — a rollout service with its OpenAI
gateway, a reward service, and the agent: the ``openai`` SDK, OpenAI Agents SDK and LangGraph ones served
from this process, the TypeScript one (the official ``openai`` npm package, compiled by ``npm ci``) as a real
``node`` process. The policy is the shipped calculator one (models/tools), which calls the calculator in
about a third of its answers, so the agents' tool loops run for real."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from examples.agents import agents_sdk_agent, langgraph_agent, openai_sdk_agent
from examples.agents.calculator_task import Sampling
from tests.integration.trainer.fixtures import REPO, run_config
from tests.support.agents import node_agent, python_agent, rollout_with_gateway
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import RunState
from trainer_service.local.launcher import start_local_services
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow

TOOLS_MODEL = REPO / "models" / "tools"
TOOLS_DATA = REPO / "data" / "tools" / "train.jsonl"
# Two model calls of up to 16 tokens: a calculator call, then the answer after the tool's result.
SAMPLING = Sampling(temperature=1.0, max_tokens=16, max_turns=2)


@pytest.fixture(scope="module")
def services(tmp_path_factory) -> Iterator[tuple[str, str, str]]:
    """(reward address, rollout address, gateway URL) of services shared by this module's runs."""
    logs = tmp_path_factory.mktemp("services")
    with (
        rollout_with_gateway(TOOLS_MODEL, max_tokens=SAMPLING.max_tokens) as (rollout, gateway_url),
        start_local_services(need_reward=True, need_rollout=False, model=TOOLS_MODEL, log_dir=logs) as local,
    ):
        yield local.reward.target, rollout, gateway_url


def train_two_steps(tiny_models, services, agent_target: str, output) -> list[dict]:
    """A 2-step run (2 prompts x G = 2 per step) whose episodes the agent at ``agent_target`` plays; the
    metrics of its training steps."""
    reward, rollout, gateway_url = services
    raw = run_config(
        tiny_models,
        TOOLS_DATA,
        output,
        reward,
        rollout,
        max_steps=2,
        generation={"max_completion_length": 64, "temperature": SAMPLING.temperature},
        agents={"target": agent_target, "gateway_url": gateway_url, "episode_timeout_s": 60},
    )
    result = run_job(parse_config({**raw, "base": str(TOOLS_MODEL)}))
    assert result.state is RunState.COMPLETED, result.message
    return [row for row in read_metrics(result.output_dir / "metrics.jsonl") if "agents/episodes" in row]


def assert_trained_on_agent_episodes(steps: list[dict]) -> None:
    assert len(steps) == 2, steps
    for row in steps:
        assert row["agents/episodes"] == 4.0 and row["agents/failed_episodes"] == 0.0, row
        assert row["agents/prefix_mismatches"] == 0.0, row


@pytest.mark.parametrize(
    ("example", "options"),
    [
        (openai_sdk_agent, {}),
        (agents_sdk_agent, {}),  # the SDK's default model: the Responses API
        (agents_sdk_agent, {"chain_responses": True}),  # previous_response_id
        (agents_sdk_agent, {"api": "chat_completions"}),
        (langgraph_agent, {}),
    ],
    ids=["openai-sdk", "agents-sdk-responses", "agents-sdk-chained", "agents-sdk-chat", "langgraph"],
)
def test_a_python_sdk_agent_trains(example, options, tiny_models, services, tmp_path):
    with python_agent(example.episode_player(SAMPLING, **options)) as target:
        steps = train_two_steps(tiny_models, services, target, tmp_path / "run")
    assert_trained_on_agent_episodes(steps)


def test_a_typescript_agent_with_the_openai_npm_package_trains(tiny_models, services, tmp_path):
    args = ("--max-tokens", str(SAMPLING.max_tokens), "--max-turns", str(SAMPLING.max_turns))
    with node_agent(*args) as target:
        steps = train_two_steps(tiny_models, services, target, tmp_path / "run")
    assert_trained_on_agent_episodes(steps)
