"""``batch_size: auto``: the arithmetic by hand, TRL's divisibility rule, the shipped tiny policy on CPU."""

from __future__ import annotations

import pytest
from trl import GRPOConfig

from tests.support.run_configs import merged
from trainer_service.config.auto_batch import (
    MAX_AUTO_BATCH_SIZE,
    AutoBatchError,
    BatchSizingInputs,
    choose_batch_size,
    divisibility_unit,
)
from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.training.batch_sizing import model_shape, resolve_batch_size
from trainer_service.training.builders import Device, build_grpo_config, build_model

CPU = Device.named("cpu")
MiB = 2**20


def inputs(**overrides) -> BatchSizingInputs:
    fields = {
        "available_bytes": 1000 * MiB,
        "parameters": 10_000_000,
        "trainable_parameters": 100_000,
        "weight_bytes": 4,
        "hidden_size": 256,
        "num_layers": 4,
        "vocab_size": 1000,
        "prompt_tokens": 96,
        "completion_tokens": 32,
        "num_generations": 4,
    }
    return BatchSizingInputs(**{**fields, **overrides})


def test_choice_follows_the_formula():
    choice = choose_batch_size(inputs())
    fixed = 10_000_000 * 4 + 100_000 * (4 + 8)
    per_completion = (96 + 32) * 4 * 17 * 4 * 256 + 32 * 1000 * (4 + 8)  # activations + logits
    assert (choice.fixed_bytes, choice.per_completion_bytes) == (fixed, per_completion)
    assert choice.fits == (500 * MiB - fixed) // per_completion == 51
    assert choice.batch_size == 48 and choice.unit == 4  # rounded down to a multiple of G


def test_checkpointing_reference_copy_and_memory_move_the_choice():
    base = choose_batch_size(inputs()).batch_size
    assert choose_batch_size(inputs(gradient_checkpointing=True)).batch_size == MAX_AUTO_BATCH_SIZE
    assert choose_batch_size(inputs(available_bytes=500 * MiB)).batch_size < base
    assert (
        choose_batch_size(inputs(reference_copy=True)).fixed_bytes > choose_batch_size(inputs()).fixed_bytes
    )
    with pytest.raises(AutoBatchError, match="multiple of 4"):
        choose_batch_size(inputs(available_bytes=100 * MiB))


@pytest.mark.parametrize(("g", "processes", "accumulation"), [(4, 1, 1), (4, 1, 2), (6, 2, 2), (8, 1, 3)])
def test_rounding_satisfies_trls_divisibility_rule(g, processes, accumulation):
    unit = divisibility_unit(g, processes, accumulation)
    choice = choose_batch_size(
        inputs(num_generations=g, processes=processes, gradient_accumulation_steps=accumulation)
    )
    assert choice.batch_size % unit == 0
    assert (choice.batch_size * processes * accumulation) % g == 0
    if processes == 1:
        GRPOConfig(
            output_dir="unused",
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=choice.batch_size,
            gradient_accumulation_steps=accumulation,
            num_generations=g,
        )  # TRL's own checks accept it


def run(tmp_path, **training):
    return parse_config(
        {
            "base": "tests/assets/models/policy",
            "output": str(tmp_path),
            "data": {"train": "t.jsonl", "max_prompt_length": 48},
            "training": merged({"generation": {"max_completion_length": 16, "num_generations": 4}}, training),
        }
    )


def test_tiny_policy_on_cpu(tmp_path):
    config = run(
        tmp_path, optimizer={"per_device_train_batch_size": "auto", "gradient_accumulation_steps": 2}
    )
    resolved, choice = resolve_batch_size(config, CPU)
    assert choice is not None and resolved.training.optimizer.per_device_train_batch_size == choice.batch_size
    assert choice.batch_size % 2 == 0  # G / gcd(G, GA) = 2
    assert build_grpo_config(resolved, CPU).per_device_train_batch_size == choice.batch_size
    # 60 MiB of room: the memory, not the cap, decides.
    _, small_choice = resolve_batch_size(config, CPU, available_bytes=120 * MiB)
    assert small_choice.batch_size < choice.batch_size
    with pytest.raises(ConfigError) as caught:
        resolve_batch_size(config, CPU, available_bytes=4 * MiB)
    assert caught.value.key == "training.optimizer.per_device_train_batch_size"
    fixed = run(tmp_path, optimizer={"per_device_train_batch_size": 8})
    assert resolve_batch_size(fixed, CPU) == (fixed, None)


@pytest.mark.parametrize(
    "lora", [{"r": 4, "alpha": 8}, {"r": 2, "target_modules": ["q_proj", "v_proj"]}, {"r": 0}]
)
def test_model_shape_counts_what_peft_trains(tmp_path, lora):
    config = run(tmp_path, model={"lora": lora})
    model = build_model(config, CPU)
    shape = model_shape(config)
    assert shape.trainable_parameters == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert shape.parameters == sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)


@pytest.mark.parametrize("value", [0, "big", True])
def test_bad_batch_size_names_the_key(tmp_path, value):
    with pytest.raises(ConfigError) as caught:
        run(tmp_path, optimizer={"per_device_train_batch_size": value})
    assert caught.value.key == "training.optimizer.per_device_train_batch_size"
