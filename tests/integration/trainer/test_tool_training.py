"""A tool-using run end to end: the trainer spawns its services, the rollout service is configured to dial the
reward service's EnvironmentService, and the run trains on episodes in sync and in async mode."""

from __future__ import annotations

import pytest

from tests.integration.trainer.fixtures import run_config
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import RunState
from trainer_service.local.launcher import start_local_services
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tool_services(tiny_models, tmp_path_factory):
    with start_local_services(
        need_reward=True,
        need_rollout=True,
        model=tiny_models["policy"],
        log_dir=tmp_path_factory.mktemp("service-logs"),
        environment="reward",
    ) as local:
        yield local


@pytest.mark.parametrize("async_rollout", [False, True])
def test_a_run_trains_on_calculator_episodes(tiny_models, train_file, tool_services, tmp_path, async_rollout):
    raw = run_config(
        tiny_models,
        train_file,
        tmp_path / "run",
        tool_services.reward.target,
        tool_services.rollout.target,
        max_steps=2,
        generation={"max_completion_length": 24},
        tools={"environment": "calculator", "max_tool_calling_iterations": 2},
        rollout={"async_rollout": async_rollout},
    )
    raw["data"]["eval"] = str(train_file)
    raw["training"]["evaluation"] = {"eval_steps": 2, "num_generations_eval": 2}
    result = run_job(parse_config(raw))
    assert result.state is RunState.COMPLETED, result.message
    rows = read_metrics(result.output_dir / "metrics.jsonl")
    trained = [row for row in rows if "tools/call_frequency" in row]
    assert trained, rows
    for row in trained:
        assert row["tools/call_frequency"] >= 0 and row["tools/episode_error_frequency"] == 0.0
    evaluations = read_metrics(result.output_dir / "eval_metrics.jsonl")
    assert [row["step"] for row in evaluations] == [0, 2]  # held-out evaluation runs on episodes too
