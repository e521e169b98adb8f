"""Curriculum in real runs against REAL reward and rollout services on loopback: every step's groups are
counted, the counts are saved in each checkpoint, and a resumed run continues from them."""

from __future__ import annotations

import json

import pytest

from tests.integration.trainer.fixtures import run_config
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import RunState
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow


def counts(checkpoint) -> dict:
    return json.loads((checkpoint / "curriculum.json").read_text())


def test_pass_counts_are_checkpointed_and_kept_on_resume(tiny_models, services, train_file, tmp_path):
    config = run_config(
        tiny_models,
        train_file,
        tmp_path / "curriculum",
        services.reward.target,
        services.rollout.target,
        max_steps=2,
        save_steps=1,
        sampling={"curriculum": {"hard_weight": 0.5}},
    )
    result = run_job(parse_config(config))
    assert result.state is RunState.COMPLETED
    # 4 completions per step (2 prompts × G = 2), each counted once.
    first, second = (counts(result.output_dir / f"checkpoint-{step}") for step in (1, 2))
    assert sum(first["attempts"].values()) == 4 and sum(second["attempts"].values()) == 8
    records = read_metrics(result.metrics_path)
    assert all(sum(r[f"curriculum/{pool}"] for pool in ("easy", "normal", "hard")) == 16 for r in records)

    config["training"]["max_steps"] = 3
    resumed = run_job(parse_config(config), resume=True)
    assert resumed.state is RunState.COMPLETED and resumed.step == 3
    third = counts(resumed.output_dir / "checkpoint-3")
    # The resumed run started from checkpoint-2's counts (8) and added its one step (4).
    assert sum(third["attempts"].values()) == 12
    assert all(third["attempts"][key] >= count for key, count in second["attempts"].items())
