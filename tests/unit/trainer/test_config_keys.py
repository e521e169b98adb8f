"""Run-config keys: an old key is refused naming its new place, every error is reported at once, and an
unknown key's message names the nearest valid key."""

from __future__ import annotations

import pytest

from trainer_service.config.key_paths import config_keys, nearest_key
from trainer_service.config.retired_keys import RETIRED_KEYS, RETIRED_TOOLS_LIST
from trainer_service.config.run_config import ConfigError, RunConfig, parse_config

MINIMAL = {"base": "models/policy", "data": {"train": "train.jsonl"}}


def errors_of(source: dict) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(source)
    return caught.value.lines()


def with_key(dotted: str, value: object) -> dict:
    block, key = dotted.split(".")
    return {**MINIMAL, block: {**MINIMAL.get(block, {}), key: value}}


@pytest.mark.parametrize(("old", "new"), RETIRED_KEYS.items())
def test_every_old_key_is_refused_naming_its_new_place(old, new):
    assert errors_of(with_key(old, 1)) == [f"{old}: moved to {new}"]


def test_every_new_place_is_a_key_of_the_config():
    keys = {key.path for key in config_keys(RunConfig)}
    for new in [*RETIRED_KEYS.values(), RETIRED_TOOLS_LIST]:
        assert new.split(" ")[0] in keys, new


def test_the_old_list_of_tools_is_refused_and_the_new_block_accepted():
    tool = "tests.support.tool_functions:multiply"
    assert errors_of(with_key("training.tools", [tool])) == [
        f"training.tools: a list of functions moved to {RETIRED_TOOLS_LIST}"
    ]
    config = parse_config(with_key("training.tools", {"functions": [tool]}))
    assert config.training.tools.functions == [tool]


def test_every_error_is_reported_at_once():
    source = {
        **MINIMAL,
        "data": {"train": "t.jsonl", "max_length": 64},
        "training": {
            "lr": 1e-3,
            "num_generation": 4,
            "optimizer": {"learning_rate": 0},
            "generation": {"top_p": 2.0},
        },
    }
    lines = errors_of(source)
    assert lines == [
        "data.max_length: moved to training.generation.max_completion_length (completion tokens; prompts are "
        "bounded by data.max_prompt_length)",
        "training.lr: moved to training.optimizer.learning_rate",
        "training.optimizer.learning_rate: Input should be greater than 0",
        "training.generation.top_p: Input should be less than or equal to 1",
        "training.num_generation: unknown key; did you mean training.generation.num_generations?",
    ]
    with pytest.raises(ConfigError) as caught:
        parse_config(source)
    assert caught.value.key == "data.max_length" and str(caught.value) == "; ".join(lines)


def test_cross_key_rules_are_all_reported_once_every_key_is_valid():
    source = {
        **MINIMAL,
        "training": {
            "optimizer": {"per_device_train_batch_size": 3},
            "evaluation": {"eval_steps": 10},
            "loss": {"variant": "nonsense"},
        },
    }
    assert [line.split(":")[0] for line in errors_of(source)] == [
        "training.optimizer.per_device_train_batch_size",
        "training.loss.variant",
        "training.evaluation.eval_steps",
    ]


def test_limited_lines_count_the_rest():
    error = ConfigError.collected([(f"k{i}", "bad") for i in range(25)])
    assert error.lines(limit=20)[-1] == "and 5 more" and len(error.lines(limit=20)) == 21
    assert ConfigError("bad", key="k").lines() == ["k: bad"]


@pytest.mark.parametrize(
    ("unknown", "nearest"),
    [
        ("training.num_generation", "training.generation.num_generations"),  # a key of another block
        ("training.optimizer.learning_rat", "training.optimizer.learning_rate"),  # a sibling
        ("training.optimiser", "training.optimizer"),  # a block
        ("data.trian", "data.train"),
        ("services.rollout_engin", "services.rollout_engine"),
        ("training.tools.environments[0].nme", "training.tools.environments[].name"),
        ("training.zzzz", None),
    ],
)
def test_an_unknown_key_names_the_nearest_valid_one(unknown, nearest):
    assert nearest_key(unknown, RunConfig) == nearest


def test_every_key_has_a_description():
    assert [key.path for key in config_keys(RunConfig) if not key.field.description] == []
