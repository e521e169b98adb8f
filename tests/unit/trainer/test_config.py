"""Run config: every bad value is an error naming its dotted key; reward_fn parses into TRL weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_runtime.config import ConfigError as RuntimeConfigError
from trainer_service.config.reward_terms import parse_reward_fn
from trainer_service.config.run_config import ConfigError, load_config, parse_config

MINIMAL = {"base": "models/policy", "data": {"train": "train.jsonl"}}


def with_training(**training) -> dict:
    return {**MINIMAL, "training": training}


def error_of(source) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_config(source)
    return caught.value


def test_minimal_config_gets_defaults():
    config = parse_config(MINIMAL)
    assert config.training.generation.num_generations == 4
    assert config.training.model.lora.r == 16
    assert config.training.generation.max_completion_length == 512
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
        (with_training(optimizer={"learning_rate": 0}), "training.optimizer.learning_rate", "greater than 0"),
        (with_training(optimizer={"learning_rate": "fast"}), "training.optimizer.learning_rate", "number"),
        (with_training(num_train_epochs=0), "training.num_train_epochs", "greater than 0"),
        (
            with_training(optimizer={"per_device_train_batch_size": 0}),
            "training.optimizer.per_device_train_batch_size",
            "greater than or equal to 1",
        ),
        (
            with_training(generation={"num_generations": 1}),
            "training.generation.num_generations",
            "greater than or equal to 2",
        ),
        (with_training(loss={"beta": -0.1}), "training.loss.beta", "greater than or equal to 0"),
        (with_training(generation={"top_p": 1.5}), "training.generation.top_p", "less than or equal to 1"),
        (
            with_training(generation={"temperature": 0}),
            "training.generation.temperature",
            "greater than or equal to 0.01",
        ),
        (with_training(model={"lora": {"r": -1}}), "training.model.lora.r", "greater than or equal to 0"),
        (with_training(model={"lora": {"rank": 8}}), "training.model.lora.rank", "unknown key"),
        (with_training(model={"lora": {"dropout": 1.0}}), "training.model.lora.dropout", "less than 1"),
        (
            with_training(model={"quantization": "3bit"}),
            "training.model.quantization",
            "'none', '4bit' or '8bit'",
        ),
        (with_training(rewards={"prm_aggregate": "max"}), "training.rewards.prm_aggregate", "'min'"),
        (
            with_training(rewards={"reward_fn": "accuracy,,format"}),
            "training.rewards.reward_fn",
            "entry 1 is empty",
        ),
        (
            with_training(rewards={"reward_fn": "accuracy,accuracy:2"}),
            "training.rewards.reward_fn",
            "listed twice",
        ),
        (with_training(rewards={"reward_fn": ":2.0"}), "training.rewards.reward_fn", "no reward name"),
        (
            with_training(rewards={"reward_fn": "accuracy:inf"}),
            "training.rewards.reward_fn",
            "needs a finite weight",
        ),
        (with_training(save_steps=-1), "training.save_steps", "greater than or equal to 0"),
        (
            with_training(rollout={"max_staleness": -1}),
            "training.rollout.max_staleness",
            "greater than or equal to 0",
        ),
        (with_training(report_to=[]), "training.report_to", "at least one"),
        (with_training(model={"device": "tpu"}), "training.model.device", "'cpu' or 'cuda'"),
        (with_training(rollout={"weight_transport": "nccl"}), "training.rollout.weight_transport", "'auto'"),
        (
            with_training(rollout={"weight_bucket_mb": 0}),
            "training.rollout.weight_bucket_mb",
            "greater than or equal to 1",
        ),
        (
            with_training(optimizer={"per_device_train_batch_size": 6}, generation={"num_generations": 4}),
            "training.optimizer.per_device_train_batch_size",
            "multiple of",
        ),
        (with_training(loss={"variant": "nonsense"}), "training.loss.variant", "unknown variant"),
        (with_training(loss={"variant": "two_sided"}), "training.loss.delta", "two_sided needs"),
        (with_training(loss={"variant": "two_sided", "delta": 2.0}), "training.loss.delta", "(0, 1]"),
        (with_training(loss={"variant": "cispo", "delta": 4.0}), "training.loss.delta", "not used"),
        (with_training(loss={"params": {"k": 1}}), "training.loss.params.k", "unknown parameter"),
        (
            with_training(rollout={"vllm_enable_sleep_mode": True, "async_rollout": True}),
            "training.rollout.vllm_enable_sleep_mode",
            "async_rollout",
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
        "base: m\ndata:\n  train: t.jsonl\ntraining:\n  optimizer:\n    learning_rate: 0.001\n"
        "  rewards:\n    reward_fn: accuracy:2,format\n"
    )
    config = load_config(path)
    assert config.training.optimizer.learning_rate == 0.001
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
        with_training(rewards={"reward_fn": "accuracy:2.0,length:0.5", "params": {"length": {"max_len": 32}}})
    )
    terms = config.training.rewards.reward_terms
    assert [(t.name, t.weight, t.params) for t in terms] == [
        ("accuracy", 2.0, {}),
        ("length", 0.5, {"max_len": 32}),
    ]


def test_prm_reward_replaces_reward_fn():
    config = parse_config(
        with_training(rewards={"reward_fn": "accuracy,format", "prm": "math", "prm_aggregate": "last"})
    )
    [term] = config.training.rewards.reward_terms
    assert term.name == "prm:math"
    assert term.params == {"aggregate": "last"}


def test_admin_token_file(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    config = parse_config({**MINIMAL, "services": {"admin_token_file": str(token)}})
    assert config.services.resolved_admin_token() == "s3cret"


def test_a_run_config_error_is_the_runtime_config_error_with_its_key():
    with pytest.raises(RuntimeConfigError) as caught:
        parse_config(
            {"base": "m", "data": {"train": "t.jsonl"}, "training": {"optimizer": {"learning_rate": 0}}}
        )
    assert isinstance(caught.value, ConfigError) and caught.value.key == "training.optimizer.learning_rate"
    assert str(caught.value).startswith("training.optimizer.learning_rate: ")
