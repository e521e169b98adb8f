"""Settings validation, the model checks at startup and the engine choice."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest
from pydantic import ValidationError
from transformers import AutoConfig

from grpo_runtime.config import ConfigError
from rollout_service.engines.registry import check_model_dir, resolve_engine_name, vllm_unusable_reason
from rollout_service.server import settings_from
from rollout_service.settings import RolloutSettings


def test_settings_reject_unknown_keys_and_bad_values():
    with pytest.raises(ValidationError, match="bogus"):
        RolloutSettings.model_validate({"bogus": 1})
    with pytest.raises(ValidationError, match="max_batch_size"):
        RolloutSettings.model_validate({"max_batch_size": 0})
    with pytest.raises(ValidationError, match=r"vllm\.gpu_memory_utilization"):
        RolloutSettings.model_validate({"vllm": {"gpu_memory_utilization": 2}})


def test_command_line_flags_override_the_config_file():
    args = argparse.Namespace(model="/m", engine="hf", device=None)
    settings = settings_from(args, {"engine": "vllm", "device": "cpu", "max_batch_size": 8})
    assert (settings.model, settings.engine, settings.device, settings.max_batch_size) == (
        "/m",
        "hf",
        "cpu",
        8,
    )
    assert settings.resolved_dtype() == "float32"


def test_model_checks_give_one_line_reasons(tiny_models, tmp_path):
    assert check_model_dir(str(tiny_models["policy"])).model_type == "qwen2"
    for bad, reason in [
        (None, "no model directory"),
        (str(tmp_path / "missing"), "is not a directory"),
        (str(tmp_path), "has no config.json"),
        (str(tiny_models["orm"]), "is neither a causal language model nor a vision-language model"),
    ]:
        with pytest.raises(ConfigError, match=reason) as info:
            check_model_dir(bad)
        assert "\n" not in str(info.value) and str(info.value).startswith("model: ")
    no_weights = tmp_path / "config-only"
    no_weights.mkdir()
    shutil.copy(tiny_models["policy"] / "config.json", no_weights / "config.json")
    with pytest.raises(ConfigError, match="no weight files"):
        check_model_dir(str(no_weights))


def test_auto_picks_vllm_when_it_can_run(tiny_models, tmp_path):
    config = AutoConfig.from_pretrained(tiny_models["policy"])
    assert vllm_unusable_reason(config, "cpu") is None
    assert resolve_engine_name(RolloutSettings(device="cpu"), config) == "vllm"
    assert resolve_engine_name(RolloutSettings(device="cpu", engine="hf"), config) == "hf"
    narrow = json.loads((tiny_models["policy"] / "config.json").read_text())
    narrow["head_dim"] = 16
    (tmp_path / "config.json").write_text(json.dumps(narrow))
    narrow_config = AutoConfig.from_pretrained(tmp_path)
    assert "head_dim 16" in vllm_unusable_reason(narrow_config, "cpu")
    assert resolve_engine_name(RolloutSettings(device="cpu"), narrow_config) == "hf"
    with pytest.raises(ConfigError, match="engine: vllm cannot run here"):
        resolve_engine_name(RolloutSettings(device="cpu", engine="vllm"), narrow_config)
