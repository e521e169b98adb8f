"""Job setup without services: GRPOConfig mapping, precision, quantization/checkpoint errors, CLI exits."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.run_configs import merged
from trainer_service.__main__ import main
from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.training.builders import Device, build_grpo_config, build_model, quantization_config
from trainer_service.training.job import resolve_checkpoint

CPU = Device.named("cpu")


def config(tmp_path, **training):
    return parse_config(
        {
            "base": "tests/assets/models/policy",
            "output": str(tmp_path / "out"),
            "experiment_name": "exp",
            "data": {"train": "t.jsonl"},
            "training": merged({"generation": {"max_completion_length": 64}}, training),
        }
    )


def test_grpo_config_on_cpu(tmp_path):
    args = build_grpo_config(
        config(
            tmp_path,
            save_steps=5,
            max_steps=7,
            report_to="none",
            seed=3,
            rewards={"reward_fn": "accuracy:2.0,format:0.5"},
            optimizer={"per_device_train_batch_size": 8},
            generation={"num_generations": 4},
            loss={"variant": "gspo", "beta": 0.04},
        ),
        CPU,
    )
    assert args.use_cpu and not args.bf16 and not args.fp16
    assert args.output_dir == str(tmp_path / "out" / "exp")
    assert args.per_device_train_batch_size == 8 and args.num_generations == 4
    assert args.reward_weights == [2.0, 0.5]
    assert args.remove_unused_columns is False
    assert args.importance_sampling_level == "sequence" and args.loss_type == "grpo"
    assert args.beta == 0.04 and args.seed == 3 and args.max_steps == 7
    assert args.save_strategy == "steps" and args.save_steps == 5
    assert args.max_completion_length == 64


def test_equal_weights_leave_reward_weights_unset_and_no_saves(tmp_path):
    args = build_grpo_config(config(tmp_path, rewards={"reward_fn": "accuracy,format"}), CPU)
    assert args.reward_weights is None
    assert args.save_strategy == "no"


def test_precision_on_cpu_is_fp32():
    assert Device.named("cpu") == Device("cpu", bf16=False, fp16=False) and Device.named("cpu").fp32


@pytest.mark.parametrize("mode", ["4bit", "8bit"])
def test_quantization_on_cpu_is_a_clear_error(tmp_path, mode):
    with pytest.raises(ConfigError) as caught:
        quantization_config(config(tmp_path, model={"quantization": mode}), CPU, torch.float16)
    assert caught.value.key == "training.model.quantization"
    assert "needs a CUDA GPU" in str(caught.value)
    assert quantization_config(config(tmp_path), CPU, torch.float16) is None


def test_lora_variants_and_full_finetune(tmp_path, tiny_models):
    lora = {"r": 4, "alpha": 8, "use_dora": True, "use_rslora": True}
    # DoRA trains only without weight sync (the rollout service loads plain LoRA adapters).
    dora = build_model(config(tmp_path, model={"lora": lora}, rollout={"weight_sync": False}), CPU)
    peft_config = dora.peft_config["default"]
    assert peft_config.use_dora and peft_config.use_rslora and peft_config.r == 4
    trainable = [name for name, p in dora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    full = build_model(config(tmp_path, model={"lora": {"r": 0}}), CPU)
    assert not hasattr(full, "peft_config")
    assert all(p.dtype == torch.float32 for p in full.parameters())


def saved_checkpoint(output_dir, step):
    """A checkpoint directory as the HF Trainer leaves it once saving finished (its state file last)."""
    checkpoint = output_dir / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return checkpoint


def test_resolve_checkpoint(tmp_path):
    cfg = config(tmp_path)
    assert resolve_checkpoint(cfg, resume=True) is None  # nothing saved yet: start fresh
    saved_checkpoint(cfg.output_dir, 2)
    saved_checkpoint(cfg.output_dir, 10)
    assert resolve_checkpoint(cfg, resume=True).endswith("checkpoint-10")
    assert resolve_checkpoint(cfg, resume=False) is None
    with pytest.raises(ConfigError) as caught:
        resolve_checkpoint(config(tmp_path, resume_from_checkpoint=str(tmp_path / "nope")), resume=False)
    assert caught.value.key == "training.resume_from_checkpoint"


def test_a_checkpoint_cut_short_while_saving_is_passed_over(tmp_path):
    """A kill mid-save leaves a directory without trainer_state.json, or with a torn one: resume takes the
    newest complete checkpoint instead, and naming an incomplete one is a config error."""
    cfg = config(tmp_path)
    saved_checkpoint(cfg.output_dir, 2)
    weights_only = cfg.output_dir / "checkpoint-4"
    weights_only.mkdir()
    (weights_only / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    torn = saved_checkpoint(cfg.output_dir, 6)
    (torn / "trainer_state.json").write_text('{"global_step": 6, "log_hist')
    (cfg.output_dir / "checkpoint-8").write_text("a file, not a checkpoint")
    assert resolve_checkpoint(cfg, resume=True) == str(cfg.output_dir / "checkpoint-2")
    newest = resolve_checkpoint(config(tmp_path, resume_from_checkpoint=True), resume=False)
    assert newest == str(cfg.output_dir / "checkpoint-2")
    with pytest.raises(ConfigError, match=r"trainer_state\.json") as caught:
        resolve_checkpoint(config(tmp_path, resume_from_checkpoint=str(weights_only)), resume=False)
    assert caught.value.key == "training.resume_from_checkpoint"


def test_cli_train_config_error_exits_2_naming_key(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(
        json.dumps({"base": "m", "data": {"train": "t"}, "training": {"model": {"lora": {"r": -2}}}})
    )
    assert main(["train", str(path)]) == 2
    assert "training.model.lora.r" in capsys.readouterr().err
