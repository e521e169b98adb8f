"""`training.loss.importance_sampling`: how auto resolves, the config rules, and the trainer's "verify" mode.

The trainers are real `trl.GRPOTrainer` subclasses on the tiny policy with a real `rollout_func` that samples
random completions and reports the log-probs of the trainer's own model (exact, like the fp32 HF engine) or
shifted by a constant (a sampler with other numerics, like vLLM in bf16).
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import GRPOConfig

from tests.unit.trainer.fixtures import length_reward, offset_rollout
from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.config.variants import grpo_config_overrides
from trainer_service.training.builders import Device, build_grpo_config
from trainer_service.training.importance_sampling import (
    EXACT_RATIO_TOLERANCE,
    EXACTNESS_RECHECK_BATCHES,
    ImportanceSamplingPlan,
    importance_ratio_deviation,
    resolve_importance_sampling,
)
from trainer_service.training.variant_loss import MissingLossInputError
from trainer_service.training.variant_trainer import make_variant_trainer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

B = 4
MINIMAL = {"base": "models/policy", "data": {"train": "train.jsonl"}}
# The conditions under which auto may skip the correction (sync, pushed every step, fp32 HF engine + trainer).
EXACT = {"async_rollout": False, "weight_sync": True, "rollout_engine": "hf", "trainer_fp32": True}


@pytest.mark.parametrize(
    ("change", "mode", "reason"),
    [
        ({}, "verify", "sync rollout"),
        ({"async_rollout": True}, "on", "async"),
        ({"weight_sync": False}, "on", "weight sync is off"),
        ({"rollout_engine": "vllm"}, "on", "'vllm'"),
        ({"rollout_engine": None}, "on", "unknown"),
        ({"trainer_fp32": False}, "on", "bf16/fp16"),
    ],
)
def test_auto_resolves_as_documented(change, mode, reason):
    plan = resolve_importance_sampling("auto", **{**EXACT, **change})
    assert plan.mode == mode
    assert reason in plan.reason


@pytest.mark.parametrize("conditions", [EXACT, {**EXACT, "rollout_engine": "vllm", "trainer_fp32": False}])
def test_on_and_off_are_taken_as_given_in_sync_mode(conditions):
    assert resolve_importance_sampling("on", **conditions).mode == "on"
    assert resolve_importance_sampling("off", **conditions).mode == "off"


def test_off_is_refused_in_async_mode():
    with pytest.raises(ConfigError) as caught:
        resolve_importance_sampling("off", **{**EXACT, "async_rollout": True})
    assert caught.value.key == "training.loss.importance_sampling"
    assert resolve_importance_sampling("on", **{**EXACT, "async_rollout": True}).mode == "on"


def test_config_key_defaults_to_auto_and_refuses_off_with_async():
    assert parse_config(MINIMAL).training.loss.importance_sampling == "auto"
    assert parse_config(
        {**MINIMAL, "training": {"loss": {"importance_sampling": "off"}}}
    ).training.loss.importance_sampling == ("off")
    with pytest.raises(ConfigError) as caught:
        parse_config(
            {
                **MINIMAL,
                "training": {
                    "rollout": {"async_rollout": True},
                    "loss": {"importance_sampling": "off"},
                },
            }
        )
    assert caught.value.key == "training.loss.importance_sampling"
    with pytest.raises(ConfigError) as caught:
        parse_config({**MINIMAL, "training": {"loss": {"importance_sampling": "sometimes"}}})
    assert caught.value.key == "training.loss.importance_sampling"


@pytest.mark.parametrize(("setting", "flag"), [("auto", True), ("on", True), ("off", False)])
def test_grpo_config_computes_the_correction_unless_off(tmp_path, setting, flag):
    config = parse_config(
        {**MINIMAL, "output": str(tmp_path), "training": {"loss": {"importance_sampling": setting}}}
    )
    assert build_grpo_config(config, Device.named("cpu")).vllm_importance_sampling_correction is flag


def test_ratio_deviation_counts_active_tokens_or_sequences_and_nan_as_infinite():
    ratio = torch.tensor([[1.0, 1.5], [0.999, 7.0]])
    mask = torch.tensor([[1, 0], [1, 0]])
    assert importance_ratio_deviation(ratio, mask) == pytest.approx(1e-3, abs=1e-7)
    assert importance_ratio_deviation(torch.tensor([[1.0], [0.0]]), mask) == 1.0
    assert importance_ratio_deviation(torch.tensor([[float("nan"), 1.0]]), torch.tensor([[1, 1]])) == math.inf
    assert importance_ratio_deviation(ratio, torch.zeros_like(mask)) == 0.0


# ----------------------------------------------------------------------------------- the trainer's plan
@pytest.fixture
def make_trainer(policy_dir, tokenizer, tmp_path):
    def _make(plan: ImportanceSamplingPlan | None, *, offset: float = 0.0, correction: bool = True):
        args = GRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            report_to=[],
            bf16=False,
            per_device_train_batch_size=B,
            num_generations=4,
            max_completion_length=8,
            vllm_importance_sampling_correction=correction,
            vllm_importance_sampling_mode="token_truncate",
            **grpo_config_overrides("grpo"),
        )
        trainer = make_variant_trainer("grpo")(
            model=AutoModelForCausalLM.from_pretrained(policy_dir),
            args=args,
            reward_funcs=length_reward,
            train_dataset=Dataset.from_dict({"prompt": ["one plus one", "hello there"] * 2}),
            processing_class=tokenizer,
            rollout_func=offset_rollout(tokenizer, offset),
            importance_sampling=plan,
        )
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        return trainer

    return _make


def step(trainer) -> dict[str, Any]:
    """One generation batch and its loss (where the deferred ratio is computed and checked)."""
    batch = trainer._generate_and_score_completions([{"prompt": "one plus one"}] * B)
    assert "importance_sampling_ratio" not in batch and "old_per_token_logps" not in batch
    assert torch.isfinite(trainer.compute_loss(trainer.model, batch))
    return batch


def metric(trainer, name: str) -> list[float]:
    return trainer._metrics["train"].get(f"sampling/{name}", [])


VERIFY = ImportanceSamplingPlan("verify", "test")


def test_verify_skips_the_correction_after_an_exact_first_batch_and_rechecks(make_trainer):
    trainer = make_trainer(VERIFY)
    step(trainer)
    (mean,) = metric(trainer, "importance_sampling_ratio/mean")
    assert abs(mean - 1) < 1e-5 and metric(trainer, "importance_sampling_ratio/max")[0] - 1 < 1e-5
    assert trainer.importance_sampling_plan.mode == "verify"

    step(trainer)  # skipped: on-policy, ratio ≡ 1, and the loss does not ask for it
    assert metric(trainer, "importance_sampling_applied") == [1.0, 0.0]
    assert len(metric(trainer, "importance_sampling_ratio/mean")) == 1

    for _ in range(EXACTNESS_RECHECK_BATCHES - 2):
        step(trainer)
    step(trainer)  # batch 50: checked again
    applied = metric(trainer, "importance_sampling_applied")
    assert sum(applied) == 2 and len(applied) == EXACTNESS_RECHECK_BATCHES + 1 and applied[-1] == 1.0
    assert len(metric(trainer, "importance_sampling_ratio/mean")) == 2
    assert trainer.importance_sampling_plan.mode == "verify"


def test_verify_turns_the_correction_on_when_the_sampler_differs(make_trainer):
    trainer = make_trainer(VERIFY, offset=0.05)
    step(trainer)
    assert 1 - metric(trainer, "importance_sampling_ratio/min")[0] > EXACT_RATIO_TOLERANCE
    assert trainer.importance_sampling_plan.mode == "on"
    batch = step(trainer)
    assert metric(trainer, "importance_sampling_applied") == [1.0, 1.0]
    assert metric(trainer, "importance_sampling_ratio/mean")[1] == pytest.approx(math.exp(-0.05), abs=1e-5)
    without = {k: v for k, v in batch.items() if k != "sampling_per_token_logps"}
    with pytest.raises(MissingLossInputError, match="sampling_per_token_logps"):
        trainer.compute_loss(trainer.model, without)


def test_on_corrects_every_batch_and_off_none(make_trainer):
    on = make_trainer(ImportanceSamplingPlan("on", "test"))
    step(on)
    step(on)
    assert metric(on, "importance_sampling_applied") == [1.0, 1.0]
    assert len(metric(on, "importance_sampling_ratio/mean")) == 2
    off = make_trainer(ImportanceSamplingPlan("off", "test"), correction=False)
    step(off)
    assert (
        metric(off, "importance_sampling_ratio/mean") == []
        and metric(off, "importance_sampling_applied") == []
    )


def test_a_plan_that_contradicts_the_grpo_config_is_refused(make_trainer):
    with pytest.raises(ConfigError) as caught:
        make_trainer(ImportanceSamplingPlan("off", "test"), correction=True)
    assert caught.value.key == "GRPOConfig.vllm_importance_sampling_correction"
    with pytest.raises(ConfigError):
        make_trainer(VERIFY, correction=False)
