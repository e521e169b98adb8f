"""Training guards in real runs against REAL reward and rollout services on loopback.

- an eval gate with a baseline file no policy can reach rolls the run back: the adapter it ends with is the
  last good checkpoint's, the checkpoint of the rejected step is never written, and the learning rate is
  halved;
- an echo trap set to halt stops the run at the step it fires, with a checkpoint (the detectors' own
  thresholds on real repeated text, loss spikes and length trends are unit-tested in
  tests/unit/trainer/test_guards.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.integration.trainer.fixtures import run_config
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import RunState
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow

ADAPTER = "adapter_model.safetensors"


def test_eval_gate_rollback_restores_the_last_good_checkpoint(tiny_models, services, train_file, tmp_path):
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(train_file.read_text().splitlines(keepends=True)[:4]))
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"accuracy_greedy": 2.0}))  # above any accuracy
    config = run_config(
        tiny_models,
        train_file,
        tmp_path / "gate",
        services.reward.target,
        services.rollout.target,
        max_steps=2,
        save_steps=1,
        guards={
            "eval_gate": {"action": "rollback", "baseline_file": str(baseline)},
            "rollback": {"max_attempts": 1, "lr_factor": 0.5},
        },
        evaluation={"eval_steps": 2, "num_generations_eval": 2},
    )
    config["data"]["eval"] = str(eval_file)
    result = run_job(parse_config(config))
    assert result.state is RunState.COMPLETED
    rows = read_metrics(result.output_dir / "guards.jsonl")
    assert [(row["step"], row["action"]) for row in rows] == [(1, "none"), (2, "rollback")]
    assert rows[1]["restored"] == "checkpoint-1" and rows[1]["findings"][0]["guard"] == "eval_gate"
    assert rows[0]["lr"] == pytest.approx(1e-3) and rows[1]["lr"] == pytest.approx(5e-4)
    # The rejected step's weights are gone: the final adapter is checkpoint-1's, and no checkpoint-2 exists.
    final, good = (
        load_file(Path(d) / ADAPTER) for d in (result.output_dir, result.output_dir / "checkpoint-1")
    )
    assert final.keys() == good.keys() and all(torch.equal(final[k], good[k]) for k in final)
    assert not (result.output_dir / "checkpoint-2").exists()


def test_echo_trap_halts_the_run_at_the_step_it_fires(tiny_models, services, train_file, tmp_path):
    config = run_config(
        tiny_models,
        train_file,
        tmp_path / "halt",
        services.reward.target,
        services.rollout.target,
        max_steps=4,
        # Every completion counts as an echo (a repeat ratio >= 0): the trap fires at the first step.
        guards={"echo_trap": {"action": "halt", "ngram": 1, "max_repeat_ratio": 0.0, "max_fraction": 0.5}},
    )
    result = run_job(parse_config(config))
    assert result.state is RunState.STOPPED and result.step == 1
    [row] = read_metrics(result.output_dir / "guards.jsonl")
    assert row["step"] == 1 and row["action"] == "halt"
    assert row["findings"][0]["guard"] == "echo_trap" and row["findings"][0]["value"] == 1.0
    assert (result.output_dir / "checkpoint-1").is_dir()  # halting saves a checkpoint to resume from


def test_reward_without_spread_trips_reward_hacking_and_halts_without_a_good_checkpoint(
    tiny_models, services, train_file, tmp_path
):
    """The tiny policy never answers a doubling right, so accuracy alone gives every group the same reward
    (TRL's frac_reward_zero_std = 1): the signal fires at step 1, before any checkpoint exists, and the
    rollback it asks for becomes a halt."""
    config = run_config(
        tiny_models,
        train_file,
        tmp_path / "flat",
        services.reward.target,
        services.rollout.target,
        max_steps=3,
        save_steps=1,
        guards={
            "reward_hacking": {"action": "rollback", "max_length_growth": None, "max_frac_zero_std": 0.5}
        },
        rewards={"reward_fn": "accuracy"},
    )
    result = run_job(parse_config(config))
    assert result.state is RunState.STOPPED and result.step == 1
    [row] = read_metrics(result.output_dir / "guards.jsonl")
    assert row["action"] == "halt" and row["rollbacks"] == 0 and "restored" not in row
    [finding] = row["findings"]
    assert finding["signal"] == "frac_reward_zero_std" and finding["value"] == 1.0
