"""training.tools (TRL's tools=): the functions become the episodes' environment in a locally spawned reward
service's settings, and a run whose reward service is remote is refused with the key named."""

from __future__ import annotations

import pytest

from trainer_service.config.run_config import ConfigError, local_reward_settings, parse_config
from trainer_service.rollout.episodes import uses_env_reward

MULTIPLY = "tests.support.tool_functions:multiply"


def config(services=None, **training):
    raw = {"base": "m", "data": {"train": "t.jsonl"}, "training": training}
    if services is not None:
        raw["services"] = services
    return parse_config(raw)


def test_tools_become_the_environment_of_the_spawned_reward_service():
    c = config(tools=[MULTIPLY], max_tool_calling_iterations=2)
    assert [(e.name, e.params) for e in c.training.episode_environments] == [("tools", {})]
    assert local_reward_settings(c) == {"environments": {"functions": {"tools": [MULTIPLY]}}}
    assert not uses_env_reward(c)  # function tools have no environment reward, as in TRL
    assert local_reward_settings(config(environment="calculator")) is None


@pytest.mark.parametrize("tools", [["multiply"], ["a b:c"], []])
def test_a_tool_that_is_not_an_import_path_is_refused(tools):
    with pytest.raises(ConfigError, match=r"training\.tools"):
        config(tools=tools)


def test_tools_and_environments_together_are_refused():
    with pytest.raises(ConfigError, match=r"tools or environment\(s\), not both.*environments\.functions"):
        config(tools=[MULTIPLY], environment="calculator")


@pytest.mark.parametrize(
    ("services", "named"),
    [
        ({"reward": "10.0.0.1:50051"}, "services.reward"),
        ({"environment": "10.0.0.1:50061"}, "services.environment"),
        ({"rollout": "10.0.0.1:50052"}, "services.rollout"),
    ],
)
def test_remote_services_refuse_tools_and_point_at_the_reward_settings(services, named):
    with pytest.raises(ConfigError) as info:
        config(services=services, tools=[MULTIPLY])
    message = str(info.value)
    assert message.startswith("training.tools: ") and named in message
    assert "environments.functions" in message
