"""Agents as rollout workers, through real servers on loopback: a rollout service with its OpenAI gateway (in
this process), an agent written with the official ``openai`` SDK served over grpo.agent.v1 by
``grpo_runtime.agent_server``, and the trainer's agent episodes — first played directly (the failure rules
and that training gets the gateway's exact sampled ids), then a 2-step run on the tiny policy."""

from __future__ import annotations

import asyncio
import math

import grpc
import openai
import pytest

from grpo_runtime.call_errors import FailedPreconditionError, ServiceCallError
from grpo_runtime.client import ChannelConfig
from rollout_service.client import FinishReason, RolloutClient
from rollout_service.settings import RolloutSettings
from tests.integration.rollout.fixtures import rollout_server_thread
from tests.integration.trainer.fixtures import run_config
from tests.support.agents import python_agent, rollout_with_gateway
from trainer_service.config.agents import AgentsConfig
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import RunState
from trainer_service.local.launcher import free_port, start_local_services
from trainer_service.rollout.agent_episodes import (
    AgentEpisodes,
    Placement,
    SessionOpener,
    agent_metrics,
)
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow

# Token ids the gateway returned to the agent, per question (return_token_ids, vLLM's extension).
SAMPLED: dict[str, list[list[int]]] = {}
# The gateways the agent was sent to (the base URL before /sessions).
GATEWAYS: set[str] = set()
FLAKY_TRIES: dict[str, int] = {}
# Base URLs the "slow" question's episodes were given.
SLOW_URLS: list[str] = []


async def chat_agent(task, base_url, deadline):
    """One chat call with the official SDK; the task's question decides how the episode goes wrong."""
    question = task["prompt"][-1]["content"] if isinstance(task["prompt"], list) else task["prompt"]
    if question == "raise":
        raise RuntimeError("the agent crashed")
    if question == "hang":
        await asyncio.sleep(30)
    if question == "nan":
        return math.nan, {}
    if question == "slow":
        SLOW_URLS.append(base_url)
        await asyncio.sleep(5)
    if question == "flaky" and FLAKY_TRIES.setdefault(question, 0) == 0:
        FLAKY_TRIES[question] += 1
        raise RuntimeError("first try fails")
    GATEWAYS.add(base_url.split("/sessions/")[0])
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    reply = await client.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": question}],
        max_tokens=32,  # the trainer's session caps it
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
    episodes = AgentEpisodes(config, [ChannelConfig(target=agent_target)], rows, end_token_id=7)
    prompts = [row["prompt"] for row in rows]
    with RolloutClient(rollout_address, timeout_s=60) as rollout:
        place = Placement(rollout, gateway_url)
        sampling = {"temperature": 1.0, "max_tokens": 3}
        try:
            played = episodes.play(prompts, [place] * len(prompts), sampling, "step0", version=0)
        finally:
            episodes.close()
    ok, crashed, hung, nan, flaky = played
    for completion, question in ((ok, questions[0]), (flaky, "flaky")):
        assert completion.finish_reason == FinishReason.STOP
        sampled = [t for t, m in zip(completion.token_ids, completion.tool_mask, strict=True) if m]
        assert sampled == SAMPLED[question][-1]  # exactly the ids the gateway returned to the agent
        assert 1 <= len(sampled) <= 3  # the session's cap, not the agent's 32
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
    # One call each in the played sessions that were kept; none counted for the episodes given up on.
    assert ok.model_calls == flaky.model_calls == 1 and metrics["agents/model_calls"] == 2.0


def serving(name: str, played: dict[str, list[str]]):
    """``chat_agent`` that records the questions it played under ``name``."""

    async def run_episode(task, base_url, deadline):
        played.setdefault(name, []).append(task["prompt"][-1]["content"])
        return await chat_agent(task, base_url, deadline)

    return run_episode


def test_episodes_are_dealt_to_several_agent_servers_and_a_retry_goes_to_the_next(gateway_rollout):
    rollout_address, gateway_url = gateway_rollout
    played: dict[str, list[str]] = {}
    down = f"127.0.0.1:{free_port()}"  # an agent server that is not running
    questions = [f"dealt {i}" for i in range(6)]
    rows = [{"prompt": [{"role": "user", "content": q}]} for q in questions]
    with (
        python_agent(serving("a", played)) as first,
        python_agent(serving("b", played)) as second,
        RolloutClient(rollout_address, timeout_s=60) as rollout,
    ):
        targets = [first, down, second]
        config = AgentsConfig(target=targets, gateway_url=gateway_url, max_episode_retries=1)
        episodes = AgentEpisodes(config, [ChannelConfig(target=t) for t in targets], rows)
        place = Placement(rollout, gateway_url)
        try:
            completions = episodes.play(
                [r["prompt"] for r in rows], [place] * 6, {"max_tokens": 3}, "deal", 0
            )
        finally:
            episodes.close()
    assert all(c.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) for c in completions)
    # Dealt a, down, b, a, down, b; the two dealt to the server that is down were played again on b.
    assert [c.attempts for c in completions] == [1, 2, 1, 1, 2, 1]
    assert sorted(played["a"]) == ["dealt 0", "dealt 3"]
    assert sorted(played["b"]) == ["dealt 1", "dealt 2", "dealt 4", "dealt 5"]


def test_a_completion_budget_caps_each_episodes_calls_at_the_gateway(gateway_rollout, agent_target):
    rollout_address, gateway_url = gateway_rollout
    config = AgentsConfig(target=agent_target, gateway_url=gateway_url, max_completion_tokens=2)
    questions = [f"budget {i}" for i in range(4)]
    rows = [{"prompt": [{"role": "user", "content": q}]} for q in questions]
    episodes = AgentEpisodes(config, [ChannelConfig(target=agent_target)], rows)
    with RolloutClient(rollout_address, timeout_s=60) as rollout:
        place = Placement(rollout, gateway_url)
        sampling = {"temperature": 1.0, "max_tokens": 3}
        try:
            played = episodes.play([r["prompt"] for r in rows], [place] * 4, sampling, "budget", version=0)
        finally:
            episodes.close()
    for completion, question in zip(played, questions, strict=True):
        # What the gateway answered the agent: capped at the budget of 2 (the session's per-call cap is 3),
        # so nothing was sampled only to be cut away.
        sampled = SAMPLED[question][-1]
        assert 1 <= len(sampled) <= 2
        assert completion.token_ids == sampled and completion.tool_mask == [1] * len(sampled)


def test_a_failing_replica_stops_the_other_episodes_of_its_batch(gateway_rollout, agent_target):
    """A rollout service's failure is the step's (it propagates, and the step's generation is retried); the
    batch's other episodes stop then, their sessions closed, not left running on the trainer's loop."""
    rollout_address, gateway_url = gateway_rollout
    config = AgentsConfig(target=agent_target, gateway_url=gateway_url, episode_timeout_s=30.0)
    rows = [{"prompt": [{"role": "user", "content": q}]} for q in ("slow", "What is 2 + 2?")]
    episodes = AgentEpisodes(config, [ChannelConfig(target=agent_target)], rows)
    down = f"127.0.0.1:{free_port()}"  # nothing listens: its opens fail once their 1 s of retries is spent
    with (
        RolloutClient(rollout_address, timeout_s=60) as live,
        RolloutClient(down, retry_budget_s=1.0) as dead,
    ):
        places = [Placement(live, gateway_url), Placement(dead, gateway_url)]
        try:
            with pytest.raises(ServiceCallError) as failed:
                episodes.play([row["prompt"] for row in rows], places, {"max_tokens": 3}, "step0", version=0)
            assert failed.value.code == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(openai.NotFoundError):  # the slow episode's session is gone already
                openai.OpenAI(base_url=SLOW_URLS[-1], api_key="unused", max_retries=0).models.list()
        finally:
            episodes.close()


def test_the_sessions_asked_for_together_open_in_one_call(gateway_rollout):
    """The episodes that get a slot together ask for their sessions in one loop turn: one OpenAgentSessions
    call opens them all, each episode getting its own."""
    rollout_address, _ = gateway_rollout
    with RolloutClient(rollout_address, timeout_s=60) as rollout:
        counts = []
        open_many = rollout.open_agent_sessions

        def counted(count, *args, **kwargs):
            counts.append(count)
            return open_many(count, *args, **kwargs)

        rollout.open_agent_sessions = counted
        opener = SessionOpener(rollout, 60.0, {"temperature": 1.0}, 0)

        async def open_five():
            return await asyncio.gather(*(opener.open() for _ in range(5)))

        tickets = asyncio.run(open_five())
        assert counts == [5] and len({t.session_id for t in tickets}) == 5
        for ticket in tickets:
            assert rollout.close_agent_session(ticket.session_id)


def train_with_agents(tiny_models, files, gateway_rollout, agent_target, output, **training):
    """A run on the tiny policy whose episodes the agent plays; its metrics and eval rows."""
    rollout_address, gateway_url = gateway_rollout
    train_file, eval_file = files
    with start_local_services(
        need_reward=True, need_rollout=False, model=tiny_models["policy"], log_dir=output / "logs"
    ) as local:
        raw = run_config(
            tiny_models,
            train_file,
            output / "run",
            local.reward.target,
            rollout_address,
            agents={"target": agent_target, "gateway_url": gateway_url, "reward_weight": 0.5},
            **training,
        )
        raw["data"]["eval"] = str(eval_file)
        result = run_job(parse_config(raw))
    assert result.state is RunState.COMPLETED, result.message
    eval_path = result.output_dir / "eval_metrics.jsonl"
    evals = read_metrics(eval_path) if eval_path.exists() else []
    return read_metrics(result.output_dir / "metrics.jsonl"), evals


@pytest.fixture
def files(train_file, tmp_path):
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(train_file.read_text().splitlines(keepends=True)[:3]))
    return train_file, eval_file


def assert_agent_steps(rows: list[dict], steps: int) -> list[dict]:
    trained = [row for row in rows if "agents/episodes" in row]
    assert len(trained) == steps, rows
    for row in trained:
        assert row["agents/episodes"] >= 4.0 and row["agents/failed_episodes"] == 0.0, row
        assert row["agents/prefix_mismatches"] == 0.0 and row["agents/untrained_branches"] == 0.0
    return trained


def test_a_run_trains_on_agent_episodes_with_held_out_evaluation_and_dynamic_sampling(
    tiny_models, files, gateway_rollout, agent_target, tmp_path
):
    rows, evals = train_with_agents(
        tiny_models,
        files,
        gateway_rollout,
        agent_target,
        tmp_path,
        max_steps=2,
        evaluation={"eval_steps": 1, "num_generations_eval": 2},
        sampling={"dynamic_sampling": {"max_gen_batches": 2}},
    )
    for row in assert_agent_steps(rows, 2):
        assert 1 <= row["dynamic_sampling/generation_batches"] <= 2, row
    # The agent's episodes, greedy and sampled, evaluated at step 0, 1 and 2.
    assert [int(row["step"]) for row in evals] == [0, 1, 2]
    for row in evals:
        assert 0.0 <= row["accuracy_greedy"] <= 1.0 and any(k.startswith("pass@2") for k in row), row


def test_an_async_run_bounds_agent_tokens_one_by_one(
    tiny_models, files, gateway_rollout, agent_target, tmp_path
):
    rows, _ = train_with_agents(
        tiny_models,
        files,
        gateway_rollout,
        agent_target,
        tmp_path,
        max_steps=3,
        rollout={"async_rollout": True, "max_staleness": 1},
    )
    trained = assert_agent_steps(rows, 3)
    assert sum(row["async/prefetch_hits"] > 0 for row in trained) >= 1, trained
    assert all(row["async/max_trained_token_lag"] <= 1 for row in trained), trained


def test_a_run_starts_its_agent_and_its_rollout_gateway_itself(tiny_models, files, tmp_path):
    """No services and an agent ``command``: the run starts a rollout service with its gateway on a free
    port and the example OpenAI-SDK agent as a process, trains on its episodes, and stops both."""
    command = ["{python}", "-m", "examples.agents.openai_sdk_agent", "--port", "{port}", "--max-turns", "2"]
    raw = run_config(
        tiny_models,
        files[0],
        tmp_path / "run",
        "unused",
        "unused",
        max_steps=1,
        agents={"command": command, "episode_timeout_s": 60},
    )
    raw["services"] = {}
    result = run_job(parse_config(raw))
    assert result.state is RunState.COMPLETED, result.message
    assert_agent_steps(read_metrics(result.output_dir / "metrics.jsonl"), 1)
    agent_log = (result.output_dir / "services" / "agent.log").read_text()
    assert "agent service listening" in agent_log, agent_log


def test_each_groups_sessions_live_on_one_of_several_replicas(tiny_models, files, agent_target, tmp_path):
    """Two rollout replicas, no gateway_url: each group's episodes are sent to the gateway of the replica
    their sessions are on, found from its GetStatus (127.0.0.1 at the reported port)."""
    with (
        rollout_with_gateway(tiny_models["policy"]) as (first, first_url),
        rollout_with_gateway(tiny_models["policy"]) as (second, second_url),
        start_local_services(
            need_reward=True, need_rollout=False, model=tiny_models["policy"], log_dir=tmp_path / "logs"
        ) as local,
    ):
        raw = run_config(
            tiny_models,
            files[0],
            tmp_path / "run",
            local.reward.target,
            [first, second],
            max_steps=1,
            agents={"target": agent_target},
        )
        GATEWAYS.clear()
        result = run_job(parse_config(raw))
    assert result.state is RunState.COMPLETED, result.message
    assert_agent_steps(read_metrics(result.output_dir / "metrics.jsonl"), 1)
    assert sorted(GATEWAYS) == sorted([first_url, second_url])


def test_a_replica_without_a_gateway_fails_the_run_saying_so(tiny_models, files, agent_target, tmp_path):
    settings = RolloutSettings(model=str(tiny_models["policy"]), engine="hf", max_model_len=512)
    with rollout_server_thread(settings) as rollout:
        raw = run_config(
            tiny_models,
            files[0],
            tmp_path / "run",
            "unused",
            rollout.server.address,
            max_steps=1,
            agents={"target": agent_target},
        )
        raw["services"].pop("reward")  # a local reward service; the rollout service is the one above
        with pytest.raises(
            FailedPreconditionError, match=r"no OpenAI-compatible gateway \(start it with --openai-port"
        ):
            run_job(parse_config(raw))
