"""A run trains against the Node.js environment server (examples/node/env_server.js, a real ``node``
process): trainer → rollout service → Node server over grpo.env.v1. A random tiny policy never writes a tool
call, so the rollout service's engine plays the number game by bisection (tests.support.episodes'
ScriptedEngine); everything else is the real path: the trainer's episodes, the rollout service's loop,
the Node server's tools and rewards, TRL's step on the returned tokens."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_service.client import RolloutClient
from tests.integration.reward.fixtures import SETTINGS, reward_server_thread
from tests.integration.trainer.fixtures import run_config
from tests.support.episodes import scripted_rollout_server
from tests.support.node_env import node_env_server
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import RunState
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow

SECRETS = (50, 25, 75, 12)  # bisection from 1..100 finds them in 1, 2, 2 and 3 guesses
RESULT = re.compile(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", re.DOTALL)
GUESS = re.compile(r'"number": (\d+)')


def bisect(prompt: str) -> str:
    """The next turn of a player who bisects 1..100 on the results so far; an answer once one is correct."""
    results = RESULT.findall(prompt)
    if results and results[-1].startswith("correct"):
        return "Found it."
    low, high = 1, 100
    for number, result in zip(GUESS.findall(prompt), results, strict=False):
        low, high = (int(number) + 1, high) if result == "higher" else (low, int(number) - 1)
    body = json.dumps({"name": "guess", "arguments": {"number": (low + high) // 2}})
    return f"<tool_call>\n{body}\n</tool_call>"


@pytest.fixture(scope="module")
def node_env() -> Iterator[str]:
    with node_env_server() as server:
        yield server.address


@pytest.fixture
def secrets_file(tmp_path) -> Path:
    """Questions with a ``secret`` column (sent to the Node server as episode metadata)."""
    path = tmp_path / "secrets.jsonl"
    rows = [
        {
            "messages": [
                {"role": "user", "content": "Find the secret number with the guess tool."},
                {"role": "assistant", "content": str(secret)},
            ],
            "secret": secret,
        }
        for secret in SECRETS * 2
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_run_trains_against_the_node_environment(tiny_models, secrets_file, node_env, tmp_path):
    engine, rollout = scripted_rollout_server(tiny_models["policy"], bisect, {"default": node_env})
    with reward_server_thread(SETTINGS) as reward, rollout as server:
        raw = run_config(
            tiny_models,
            secrets_file,
            tmp_path / "run",
            reward.address,
            server.address,
            max_steps=2,
            generation={"max_completion_length": 160},
            tools={"environment": "guess-number", "max_tool_calling_iterations": 4},
        )
        result = run_job(parse_config(raw))
    assert result.state is RunState.COMPLETED, result.message
    rows = [row for row in read_metrics(result.output_dir / "metrics.jsonl") if "tools/call_frequency" in row]
    assert [row["step"] for row in rows] == [1, 2], rows
    for row in rows:
        # Every episode guessed at least once through the Node server, none failed, and the Node server's
        # reward (1 - 0.1 per extra guess: 0.8..1.0 for these secrets) is the env_reward term.
        assert row["tools/call_frequency"] >= 1.0
        assert row["tools/failure_frequency"] == 0.0 and row["tools/episode_error_frequency"] == 0.0
        assert 0.8 <= row["rewards/env_reward/mean"] <= 1.0, row
    assert engine.updates_applied >= 2  # the trainer synced its weights to the rollout service each step


def test_episodes_with_two_replicas_and_sleep_mode(tiny_models, secrets_file, node_env, tmp_path):
    """Each Generate call runs its episodes' whole loop on the replica it went to, so an episode's turns are
    on one replica by construction; with vllm_enable_sleep_mode each generation is wake → push → episodes →
    sleep.
    Every secret here is 50: each episode is exactly two turns (the guess, the answer)."""
    secrets_file.write_text(re.sub(r'"secret": \d+', '"secret": 50', secrets_file.read_text()))
    first, first_server = scripted_rollout_server(tiny_models["policy"], bisect, {"default": node_env})
    second, second_server = scripted_rollout_server(tiny_models["policy"], bisect, {"default": node_env})
    with reward_server_thread(SETTINGS) as reward, first_server as a, second_server as b:
        raw = run_config(
            tiny_models,
            secrets_file,
            tmp_path / "run",
            reward.address,
            [a.address, b.address],
            max_steps=2,
            generation={"max_completion_length": 160},
            tools={"environment": "guess-number", "max_tool_calling_iterations": 4},
            rollout={"vllm_enable_sleep_mode": True, "sleep_level": 1},
        )
        result = run_job(parse_config(raw))
        with RolloutClient(a.address) as client_a, RolloutClient(b.address) as client_b:
            asleep = [client_a.status().sleep_level, client_b.status().sleep_level]
    assert result.state is RunState.COMPLETED, result.message
    rows = [row for row in read_metrics(result.output_dir / "metrics.jsonl") if "tools/call_frequency" in row]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["tools/call_frequency"] == 1.0 and row["rewards/env_reward/mean"] == 1.0, row
    # 4 episodes a step, 2 turns each: both replicas served whole episodes.
    assert first.turns_generated > 0 and second.turns_generated > 0
    assert first.turns_generated % 2 == second.turns_generated % 2 == 0
    assert first.turns_generated + second.turns_generated == 2 * 4 * 2
    assert asleep == [1, 1]  # the trainer put both to sleep after the last generation
