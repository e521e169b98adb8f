"""training.tools.functions (TRL's tools=): the functions become the episodes' environment in a locally
spawned reward service's settings; a service the run did not start must already list exactly those
functions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from grpo_runtime.env_types import EnvironmentInfo
from trainer_service.config.run_config import ConfigError, local_reward_settings, parse_config
from trainer_service.rollout.episodes import uses_env_reward
from trainer_service.rollout.function_tools import functions_status, serves_tools

MULTIPLY = "tests.support.tool_functions:multiply"


def config(**training):
    return parse_config({"base": "m", "data": {"train": "t.jsonl"}, "training": training})


def test_tools_become_the_environment_of_the_spawned_reward_service():
    c = config(tools={"functions": [MULTIPLY], "max_tool_calling_iterations": 2})
    assert [(e.name, e.params) for e in c.training.tools.episode_environments] == [("tools", {})]
    assert local_reward_settings(c) == {"environments": {"functions": {"tools": [MULTIPLY]}}}
    assert not uses_env_reward(c)  # function tools have no environment reward, as in TRL
    assert local_reward_settings(config(tools={"environment": "calculator"})) is None


@pytest.mark.parametrize("tools", [["multiply"], ["a b:c"], []])
def test_a_tool_that_is_not_an_import_path_is_refused(tools):
    with pytest.raises(ConfigError, match=r"training\.tools\.functions"):
        config(tools={"functions": tools})


def test_tools_and_environments_together_are_refused():
    with pytest.raises(
        ConfigError, match=r"functions or environment\(s\), not both.*environments\.functions"
    ):
        config(tools={"functions": [MULTIPLY], "environment": "calculator"})


def test_a_remote_service_must_list_exactly_these_functions_as_the_tools_environment():
    paths = [MULTIPLY, "tests.support.tool_functions:shout"]
    served = EnvironmentInfo("tools", "Tools: multiply, shout", "functions", True, functions_status(paths))
    assert (
        served.status == "functions tests.support.tool_functions:multiply, tests.support.tool_functions:shout"
    )
    assert serves_tools([EnvironmentInfo("calculator", "", "calculator"), served], paths)
    assert not serves_tools([served], paths[:1])  # a different list
    assert not serves_tools([served], paths[::-1])  # order is the tools' order
    assert not serves_tools([replace(served, name="other")], paths)
    assert not serves_tools([replace(served, kind="trl")], paths)
    assert not serves_tools([replace(served, available=False)], paths)
