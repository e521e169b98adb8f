"""Guards provoked by real training, through REAL reward and rollout services on loopback (the demo policy).

The demo policy answers its arithmetic in 3 tokens at temperature 1. Sampled at temperature 1.8 its lengths
spread, and a reward that pays for length (``cosine`` with the longest completion scoring highest, right or
wrong) grows them from ~5 to ~7 of the 8 allowed tokens within one step at lr 3e-2. That provokes:

- the length trend of ``reward_hacking``, whose rollback restores the newest checkpoint older than the
  weights that sampled the long batch, and halves the lr;
- the divergence between reward terms: ``cosine`` rises while ``soft_overlong`` (the DAPO penalty on the
  same lengths) falls;
- the loss watchdog: with ``grpo_beta > 0`` and lr 1.0 the policy leaves the reference model and the KL term
  lifts the loss (on-policy GRPO without KL logs a loss of ~0) past the threshold.

The same thresholds on the plain demo config (accuracy only, temperature 1, lr 1e-3) fire nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.integration.trainer.fixtures import DEMO_DATA, DEMO_MODEL
from tests.support.run_configs import merged
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import RunState
from trainer_service.local.launcher import LocalServices
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow

ADAPTER = "adapter_model.safetensors"
# cosine over tokens with max_len = max_completion_length: 0 at length 0, 1 at length 8, right or wrong.
PAYS_FOR_LENGTH = {
    "unit": "tokens",
    "max_len": 8,
    "min_value_wrong": 0.0,
    "max_value_wrong": 1.0,
    "min_value_correct": 1.0,
    "max_value_correct": 0.0,
}
LENGTH_TREND = {"window": 2, "max_length_growth": 0.25}
DIVERGENCE = {"window": 2, "max_length_growth": None, "max_term_divergence": 0.5}
LOSS = {"threshold": 0.1}


def demo_config(services: LocalServices, output: Path, **training) -> dict:
    """A few steps of the demo config (16 completions per step: 4 prompts x 4); ``training`` overrides."""
    return {
        "base": str(DEMO_MODEL),
        "output": str(output),
        "data": {"train": str(DEMO_DATA / "train.jsonl")},
        "training": merged(
            {
                "max_steps": 2,
                "logging_steps": 1,
                "seed": 0,
                "optimizer": {
                    "learning_rate": 1e-3,
                    "lr_scheduler_type": "constant",
                    "per_device_train_batch_size": 16,
                },
                "generation": {
                    "num_generations": 4,
                    "max_completion_length": 8,
                    "temperature": 1.0,
                    "generation_seed": 0,  # the same samples whatever ran on the service before
                },
                "loss": {"beta": 0.0},
                "rewards": {"reward_fn": "accuracy", "params": {"accuracy": {"mode": "numeric"}}},
                "model": {"lora": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}},
            },
            training,
        ),
        "services": {"reward": services.reward.target, "rollout": services.rollout.target},
    }


def lengthening(**training) -> dict:
    """Overrides under which a length-paying reward lengthens the completions."""
    return merged(
        {
            "generation": {"temperature": 1.8},
            "optimizer": {"learning_rate": 3e-2},
            "rewards": {"reward_fn": "cosine", "params": {"cosine": PAYS_FOR_LENGTH}},
        },
        training,
    )


def test_length_paying_reward_trips_the_length_trend_and_rollback_restores(demo_services, tmp_path):
    # Warm-up makes step 1's lr 0: checkpoint-1 holds the base weights, which sampled steps 1 and 2. Step 2's
    # update (lr 3e-2) lengthens step 3's batch; the guard fires there, rules out the weights that sampled it
    # (checkpoint-2's) and restores checkpoint-1.
    config = demo_config(
        demo_services,
        tmp_path / "length",
        save_steps=1,
        **lengthening(
            max_steps=3,
            guards={
                "reward_hacking": {"action": "rollback", **LENGTH_TREND},
                "rollback": {"max_attempts": 1, "lr_factor": 0.5},
            },
            optimizer={
                "learning_rate": 6e-2,
                "lr_scheduler_type": "constant_with_warmup",
                "warmup_ratio": 0.5,
            },
        ),
    )
    result = run_job(parse_config(config))
    assert result.state is RunState.COMPLETED
    steps = read_metrics(result.output_dir / "metrics.jsonl")
    lengths = [row["completions/mean_length"] for row in steps]
    assert lengths[2] > 1.25 * lengths[1], lengths
    rows = read_metrics(result.output_dir / "guards.jsonl")
    assert [(row["step"], row["action"]) for row in rows] == [(1, "none"), (2, "none"), (3, "rollback")]
    [finding] = rows[2]["findings"]
    assert finding["signal"] == "length_growth"
    assert finding["value"] == pytest.approx(lengths[2] / lengths[1] - 1)
    assert rows[2]["restored"] == "checkpoint-1" and rows[2]["rollbacks"] == 1
    # checkpoint-1's schedule resumes at half the peak (warm-up step 2 of 2), and the rollback halves that.
    assert rows[2]["lr"] == pytest.approx(0.5 * 0.5 * 6e-2)
    # The rejected steps' updates are undone: the run ends with checkpoint-1's adapter; no checkpoint-3.
    final, good = (
        load_file(Path(d) / ADAPTER) for d in (result.output_dir, result.output_dir / "checkpoint-1")
    )
    assert final.keys() == good.keys() and all(torch.equal(final[k], good[k]) for k in final)
    assert not (result.output_dir / "checkpoint-3").exists()


def test_one_reward_term_bought_with_another_trips_the_divergence(demo_services, tmp_path):
    config = demo_config(
        demo_services,
        tmp_path / "diverge",
        max_steps=3,
        **lengthening(
            guards={"reward_hacking": {"action": "halt", **DIVERGENCE}},
            rewards={"reward_fn": "cosine:1.0,soft_overlong:0.1"},
        ),
    )
    result = run_job(parse_config(config))
    assert result.state is RunState.STOPPED and result.step == 2
    first, second = read_metrics(result.output_dir / "metrics.jsonl")
    rise = second["rewards/cosine/mean"] - first["rewards/cosine/mean"]
    fall = second["rewards/soft_overlong/mean"] - first["rewards/soft_overlong/mean"]
    assert rise > 0 > fall
    rows = read_metrics(result.output_dir / "guards.jsonl")
    assert [(row["step"], row["action"]) for row in rows] == [(1, "none"), (2, "halt")]
    [finding] = rows[1]["findings"]
    assert finding["signal"] == "term_divergence" and finding["value"] == pytest.approx(rise - fall)


def test_kl_blow_up_trips_the_loss_watchdog(demo_services, tmp_path):
    config = demo_config(
        demo_services,
        tmp_path / "loss",
        max_steps=3,
        guards={"loss_watchdog": {"action": "halt", **LOSS}},
        optimizer={"learning_rate": 1.0},
        loss={"beta": 0.1},
    )
    result = run_job(parse_config(config))
    assert result.state is RunState.STOPPED and result.step == 2
    first, second = read_metrics(result.output_dir / "metrics.jsonl")
    assert first["kl"] == 0.0 and second["kl"] > 1.0  # the reference is the step-0 policy
    rows = read_metrics(result.output_dir / "guards.jsonl")
    assert [(row["step"], row["action"]) for row in rows] == [(1, "none"), (2, "halt")]
    [finding] = rows[1]["findings"]
    assert finding["signal"] == "loss_spike" and finding["value"] == pytest.approx(abs(second["loss"]))


def test_the_plain_demo_config_fires_none_of_them(demo_services, tmp_path):
    guards = {
        "reward_hacking": {"action": "warn", **LENGTH_TREND, "max_term_divergence": 0.5},
        "loss_watchdog": {"action": "warn", **LOSS},
    }
    config = demo_config(demo_services, tmp_path / "plain", max_steps=4, guards=guards)
    result = run_job(parse_config(config))
    assert result.state is RunState.COMPLETED and result.step == 4
    rows = read_metrics(result.output_dir / "guards.jsonl")
    assert [(row["step"], row["action"], row["findings"]) for row in rows] == [
        (step, "none", []) for step in range(1, 5)
    ]
