"""Run config: every bad value is an error naming its dotted key; reward_fn parses into TRL weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_runtime.config import ConfigError as RuntimeConfigError
from trainer_service.config.run_config import ConfigError, load_config, parse_config, parse_reward_fn

MINIMAL = {"base": "models/policy", "data": {"train": "train.jsonl"}}


def with_training(**training) -> dict:
    return {**MINIMAL, "training": training}


def error_of(source) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_config(source)
    return caught.value


def test_minimal_config_gets_defaults():
    config = parse_config(MINIMAL)
    assert config.training.num_generations == 4
    assert config.training.lora.r == 16
    assert config.max_completion_length == config.data.max_length
    assert config.output_dir == Path("runs")


def test_output_dir_joins_experiment_name():
    config = parse_config({**MINIMAL, "output": "out", "experiment_name": "exp1"})
    assert config.output_dir == Path("out/exp1")


@pytest.mark.parametrize(
    ("source", "key", "fragment"),
    [
        ({"data": {"train": "t.jsonl"}}, "base", "required"),
        ({"base": "m"}, "data", "required"),
        ({**MINIMAL, "bogus": 1}, "bogus", "unknown key"),
        ({**MINIMAL, "data": {"train": "t", "colour": "red"}}, "data.colour", "unknown key"),
        (with_training(lr=0), "training.lr", "greater than 0"),
        (with_training(lr="fast"), "training.lr", "number"),
        (with_training(epochs=0), "training.epochs", "greater than 0"),
        (with_training(batch_size=0), "training.batch_size", "greater than or equal to 1"),
        (with_training(num_generations=1), "training.num_generations", "greater than or equal to 2"),
        (with_training(grpo_beta=-0.1), "training.grpo_beta", "greater than or equal to 0"),
        (with_training(top_p=1.5), "training.top_p", "less than or equal to 1"),
        (with_training(temperature=0), "training.temperature", "greater than or equal to 0.01"),
        (with_training(lora={"r": -1}), "training.lora.r", "greater than or equal to 0"),
        (with_training(lora={"rank": 8}), "training.lora.rank", "unknown key"),
        (with_training(lora={"dropout": 1.0}), "training.lora.dropout", "less than 1"),
        (with_training(quantization="3bit"), "training.quantization", "'none', '4bit' or '8bit'"),
        (with_training(prm_aggregate="max"), "training.prm_aggregate", "'min'"),
        (with_training(reward_fn="accuracy,,format"), "training.reward_fn", "entry 1 is empty"),
        (with_training(reward_fn="accuracy,accuracy:2"), "training.reward_fn", "listed twice"),
        (with_training(reward_fn=":2.0"), "training.reward_fn", "no reward name"),
        (with_training(reward_fn="accuracy:inf"), "training.reward_fn", "needs a finite weight"),
        (with_training(save_steps=-1), "training.save_steps", "greater than or equal to 0"),
        (with_training(max_staleness=-1), "training.max_staleness", "greater than or equal to 0"),
        (with_training(report_to=[]), "training.report_to", "at least one"),
        (with_training(device="tpu"), "training.device", "'cpu' or 'cuda'"),
        (with_training(weight_transport="nccl"), "training.weight_transport", "'auto'"),
        (with_training(weight_bucket_mb=0), "training.weight_bucket_mb", "greater than or equal to 1"),
        (with_training(batch_size=6, num_generations=4), "training.batch_size", "multiple of"),
        (with_training(grpo_variant="nonsense"), "training.grpo_variant", "unknown variant"),
        (with_training(grpo_variant="two_sided"), "training.grpo_delta", "two_sided needs"),
        (with_training(grpo_variant="two_sided", grpo_delta=2.0), "training.grpo_delta", "(0, 1]"),
        (with_training(grpo_variant="cispo", grpo_delta=4.0), "training.grpo_delta", "not used"),
        (with_training(variant_params={"k": 1}), "training.variant_params.k", "unknown parameter"),
        (
            with_training(vllm_sleep_mode=True, async_rollout=True),
            "training.vllm_sleep_mode",
            "async_rollout",
        ),
        (
            {**MINIMAL, "data": {"train": "t", "max_length": 64, "max_prompt_length": 64}},
            "data.max_prompt_length",
            "< data.max_length",
        ),
        ({**MINIMAL, "data": {"train": "t", "format": "csv"}}, "data.format", "'auto'"),
        ({**MINIMAL, "services": {"admin_token": "a", "admin_token_file": "f"}}, "services", "not both"),
        ({**MINIMAL, "services": {"rollout_engine": "tgi"}}, "services.rollout_engine", "'hf' or 'vllm'"),
        ({**MINIMAL, "services": {"retry": 3}}, "services.retry", "unknown key"),
    ],
)
def test_bad_config_names_the_key(source, key, fragment):
    error = error_of(source)
    assert error.key == key
    assert str(error).startswith(f"{key}: ")
    assert fragment in str(error)


def test_not_a_mapping_and_bad_yaml():
    assert "mapping" in str(error_of("- a\n- b\n"))
    assert "invalid YAML" in str(error_of("base: [unclosed\n"))


def test_load_config_reads_yaml_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "base: m\ndata:\n  train: t.jsonl\ntraining:\n  lr: 0.001\n  reward_fn: accuracy:2,format\n"
    )
    config = load_config(path)
    assert config.training.lr == 0.001
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("accuracy", [("accuracy", 1.0)]),
        ("accuracy,format", [("accuracy", 1.0), ("format", 1.0)]),
        ("accuracy:2.0, format:0.5", [("accuracy", 2.0), ("format", 0.5)]),
        ("accuracy:-1", [("accuracy", -1.0)]),
        ("prm:math", [("prm:math", 1.0)]),
        ("prm:math:0.5,length", [("prm:math", 0.5), ("length", 1.0)]),
    ],
)
def test_parse_reward_fn(spec, expected):
    assert parse_reward_fn(spec) == expected


def test_reward_terms_carry_weights_and_params():
    config = parse_config(
        with_training(reward_fn="accuracy:2.0,length:0.5", reward_params={"length": {"max_len": 32}})
    )
    terms = config.training.reward_terms
    assert [(t.name, t.weight, t.params) for t in terms] == [
        ("accuracy", 2.0, {}),
        ("length", 0.5, {"max_len": 32}),
    ]


def test_prm_reward_replaces_reward_fn():
    config = parse_config(with_training(reward_fn="accuracy,format", prm_reward="math", prm_aggregate="last"))
    [term] = config.training.reward_terms
    assert term.name == "prm:math"
    assert term.params == {"aggregate": "last"}


def test_admin_token_file(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    config = parse_config({**MINIMAL, "services": {"admin_token_file": str(token)}})
    assert config.services.resolved_admin_token() == "s3cret"


def test_a_run_config_error_is_the_runtime_config_error_with_its_key():
    with pytest.raises(RuntimeConfigError) as caught:
        parse_config({"base": "m", "data": {"train": "t.jsonl"}, "training": {"lr": 0}})
    assert isinstance(caught.value, ConfigError) and caught.value.key == "training.lr"
    assert str(caught.value).startswith("training.lr: ")
