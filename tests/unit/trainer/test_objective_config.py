"""Objective keys of the run config: refused combinations name the key, accepted ones change what TRL
trains."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM

from tests.support.run_configs import merged
from tests.unit.trainer.fixtures import offset_rollout
from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.training.builders import Device, build_grpo_config
from trainer_service.training.variant_trainer import make_variant_trainer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def config(tmp_path=None, **training: Any):
    return parse_config(
        {
            "base": "tests/assets/models/policy",
            "output": str(tmp_path or "runs"),
            "data": {"train": "t.jsonl"},
            "training": merged({"generation": {"max_completion_length": 64}}, training),
        }
    )


def error_key(**training: Any) -> tuple[str | None, str]:
    with pytest.raises(ConfigError) as caught:
        config(**training)
    return caught.value.key, str(caught.value)


@pytest.mark.parametrize(
    ("training", "key", "fragment"),
    [
        ({"loss": {"scale_rewards": "median"}}, "training.loss.scale_rewards", "group"),
        ({"loss": {"scale_rewards": False}}, "training.loss.scale_rewards", "group"),
        (
            {"sampling": {"dynamic_sampling": {"max_gen_batches": 1}}},
            "training.sampling.dynamic_sampling.max_gen_batches",
            "2",
        ),
        (
            {"sampling": {"dynamic_sampling": {"filter": "accuracy"}}},
            "training.sampling.dynamic_sampling.filter",
            "zero_std",
        ),
        (
            {"sampling": {"dynamic_sampling": {"max_gen": 3}}},
            "training.sampling.dynamic_sampling.max_gen",
            "unknown",
        ),
        ({"loss": {"variant": "cispo"}}, "training.loss.epsilon_high", "scales the gradient down"),
        ({"loss": {"variant": "cispo", "epsilon_high": 1.0}}, "training.loss.epsilon_high", "> 1"),
        ({"model": {"lora": {"use_dora": True}}}, "training.model.lora.use_dora", "LoRA adapters only"),
    ],
)
def test_refused_objective_settings_name_the_key(training, key, fragment):
    found, message = error_key(**training)
    assert found == key
    assert fragment in message


def test_accepted_objective_settings():
    assert config(loss={"variant": "cispo", "epsilon_high": 5.0}).training.loss.epsilon_high == 5.0
    assert config(
        model={"lora": {"use_dora": True}}, rollout={"weight_sync": False}
    ).training.model.lora.use_dora  # nothing is pushed
    sampling = config(
        sampling={"dynamic_sampling": {"max_gen_batches": 8}}
    ).training.sampling.dynamic_sampling
    assert sampling is not None and (sampling.filter, sampling.max_gen_batches) == ("zero_std", 8)
    assert config(sampling={"dynamic_sampling": {}}).training.sampling.dynamic_sampling.max_gen_batches == 4


def test_gspo_takes_its_papers_clip_range_unless_one_is_set():
    t = config(loss={"variant": "gspo"}).training
    assert (t.loss.epsilon, t.loss.epsilon_high) == (3e-4, 4e-4)
    t = config(loss={"variant": "gspo", "epsilon": 0.1}).training
    assert (t.loss.epsilon, t.loss.epsilon_high) == (0.1, None)
    t = config(loss={"variant": "grpo"}).training
    assert (t.loss.epsilon, t.loss.epsilon_high) == (0.2, None)
    args = build_grpo_config(config(loss={"variant": "gspo"}), Device.named("cpu"))
    assert (args.epsilon, args.epsilon_high) == (3e-4, 4e-4)


def completion_length(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
    return [float(len(c)) for c in completions]


def first_batch(tmp_path, policy_dir, tokenizer, **training: Any) -> dict[str, Any]:
    """The first generation batch a trainer built from the run config's GRPOConfig trains on."""
    defaults = {
        "optimizer": {"per_device_train_batch_size": 4},
        "generation": {"num_generations": 4, "max_completion_length": 5},
    }
    run = config(tmp_path, **merged(defaults, training))
    args = build_grpo_config(run, Device.named("cpu"))
    trainer = make_variant_trainer(run.training.loss.variant)(
        model=AutoModelForCausalLM.from_pretrained(policy_dir),
        args=args,
        reward_funcs=completion_length,
        train_dataset=Dataset.from_dict({"prompt": ["one plus one"] * 4}),
        processing_class=tokenizer,
        rollout_func=offset_rollout(tokenizer, offset=0.0),
    )
    trainer.model.train()
    return trainer._generate_and_score_completions([{"prompt": "one plus one"} for _ in range(4)])


def test_mask_truncated_completions_and_scale_rewards_change_the_batch(tmp_path, policy_dir, tokenizer):
    default = first_batch(tmp_path / "a", policy_dir, tokenizer)
    changed = first_batch(
        tmp_path / "b",
        policy_dir,
        tokenizer,
        loss={"mask_truncated_completions": True, "scale_rewards": "none"},
    )
    # The sampler's 5 random tokens never end in EOS: every completion is truncated and leaves the loss.
    assert int(default["num_items_in_batch"]) == 20 and int(changed["num_items_in_batch"]) == 0
    assert torch.all(changed["completion_mask"] == 0)
    # scale_rewards none: A = R − mean (no division by the group std), so the scales differ.
    ratio = changed["advantages"] / default["advantages"]
    assert not torch.allclose(changed["advantages"], default["advantages"])
    assert torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-3)
