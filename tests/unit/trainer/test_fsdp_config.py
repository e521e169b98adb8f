"""``training.model.fsdp_config`` becomes GRPOConfig ``fsdp=True`` plus ``fsdp_config``: the ``fsdp`` strategy
string (or list) of the run config is translated into the entries transformers reads, so transformers never
sees the string or list it deprecates; a strategy it cannot run is refused naming the key."""

from __future__ import annotations

import logging

import pytest

from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.training.builders import Device, build_grpo_config

WRAP = {"transformer_layer_cls_to_wrap": ["Qwen2DecoderLayer"]}
WRAPPED = {"transformer_cls_names_to_wrap": "Qwen2DecoderLayer"}  # what accelerate's plugin gets for WRAP


@pytest.fixture
def transformers_log(caplog):
    """Warnings of transformers (its loggers do not propagate to the root logger)."""
    logger = logging.getLogger("transformers")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def _grpo_config(policy_dir, tmp_path, fsdp_config):
    config = parse_config(
        {
            "base": str(policy_dir),
            "output": str(tmp_path),
            "data": {"train": "train.jsonl"},
            "training": {
                "optimizer": {"per_device_train_batch_size": 4},
                "generation": {"num_generations": 4},
                "model": {"fsdp_config": fsdp_config},
            },
        }
    )
    return build_grpo_config(config, Device.named("cpu"))


@pytest.mark.parametrize(
    ("fsdp_config", "plugin"),
    [
        (WRAP, {"fsdp_version": 2, "reshard_after_forward": True, **WRAPPED}),
        ({"fsdp": "full_shard auto_wrap", **WRAP}, {"reshard_after_forward": True, **WRAPPED}),
        ({"fsdp": "shard_grad_op offload"}, {"reshard_after_forward": False, "cpu_offload": True}),
        ({"fsdp": ["shard_grad_op", "auto_wrap"]}, {"reshard_after_forward": False}),
        # What fsdp_config states outright wins over the strategy string.
        ({"fsdp": "shard_grad_op", "reshard_after_forward": True}, {"reshard_after_forward": True}),
        ({"fsdp": "offload", "fsdp_cpu_offload": False}, {"reshard_after_forward": True}),
        (
            {"fsdp": "hybrid_shard", "version": 1, **WRAP},
            {"fsdp_version": 1, "reshard_after_forward": "hybrid_shard"},
        ),
    ],
)
def test_the_strategy_string_becomes_fsdp_config_entries(
    policy_dir, tmp_path, transformers_log, fsdp_config, plugin
):
    args = _grpo_config(policy_dir, tmp_path, fsdp_config)
    assert args.fsdp is True
    assert plugin.items() <= args.fsdp_plugin_args.items()
    assert args.fsdp_plugin_args.get("cpu_offload", False) == plugin.get("cpu_offload", False)
    assert not [r.message for r in transformers_log.records if "Passing `fsdp`" in r.getMessage()]


@pytest.mark.parametrize(
    ("fsdp", "message"),
    [
        ("hybrid_shard auto_wrap", "needs FSDP1"),
        ("full_shrad", "unknown FSDP option 'full_shrad'"),
        (3, "a string of FSDP options"),
    ],
)
def test_a_strategy_that_cannot_run_is_refused_naming_the_key(policy_dir, tmp_path, fsdp, message):
    with pytest.raises(ConfigError) as refused:
        _grpo_config(policy_dir, tmp_path, {"fsdp": fsdp})
    assert refused.value.key == "training.model.fsdp_config.fsdp"
    assert message in str(refused.value)
