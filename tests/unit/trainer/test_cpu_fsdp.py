"""FSDP1 on CPU is refused naming the key (accelerate's FSDP1 plugin cannot start without an accelerator);
FSDP2 on two CPU processes is tested end to end in tests/integration/trainer/test_training_fsdp.py."""

from __future__ import annotations

import pytest
from datasets import Dataset
from transformers import AutoModelForCausalLM

from tests.unit.trainer.fixtures import length_reward
from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.training.builders import Device, build_grpo_config
from trainer_service.training.variant_trainer import make_variant_trainer


def test_fsdp1_on_cpu_is_refused_naming_the_key(policy_dir, tokenizer, tmp_path):
    fsdp = {"version": 1, "transformer_layer_cls_to_wrap": ["Qwen2DecoderLayer"]}
    config = parse_config(
        {
            "base": str(policy_dir),
            "output": str(tmp_path),
            "data": {"train": "train.jsonl"},
            "training": {
                "optimizer": {"per_device_train_batch_size": 4},
                "generation": {"num_generations": 4},
                "model": {"fsdp_config": fsdp},
            },
        }
    )
    args = build_grpo_config(config, Device.named("cpu"))
    with pytest.raises(ConfigError) as refused:
        make_variant_trainer(config.training.loss.variant)(
            model=AutoModelForCausalLM.from_pretrained(policy_dir),
            args=args,
            reward_funcs=length_reward,
            train_dataset=Dataset.from_dict({"prompt": ["one plus one", "hello there"] * 2}),
            processing_class=tokenizer,
        )
    assert refused.value.key == "training.model.fsdp_config"
    assert "FSDP2" in str(refused.value)
