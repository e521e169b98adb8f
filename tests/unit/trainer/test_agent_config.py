"""The ``training.agents`` block: its addresses checked, the agent's reward a weighted term, and what agent
runs do not support yet refused naming the key."""

from __future__ import annotations

import pytest

from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.rollout.agent_episodes import uses_agent_reward
from trainer_service.training.builders import _reward_weights

AGENTS = {"target": "127.0.0.1:50060", "gateway_url": "http://127.0.0.1:8000"}


def config(agents=None, services=None, **training):
    return {
        "base": "m",
        "data": {"train": "t.jsonl"},
        "training": {"agents": {**AGENTS, **(agents or {})}, **training},
        "services": services if services is not None else {"rollout": "127.0.0.1:50052"},
    }


def test_the_agents_reward_is_a_term_weighted_after_reward_fn():
    parsed = parse_config(config({"reward_weight": 0.5}, rewards={"reward_fn": "accuracy"}))
    assert uses_agent_reward(parsed)
    assert _reward_weights(parsed) == [1.0, 0.5]
    assert not uses_agent_reward(parse_config(config({"reward_weight": 0.0})))


@pytest.mark.parametrize(
    ("agents", "key"),
    [
        ({"gateway_url": "http://127.0.0.1:8000/v1"}, "training.agents.gateway_url"),
        ({"gateway_url": "ftp://host:1"}, "training.agents.gateway_url"),
        ({"target": "dns:///"}, "training.agents.target"),
        ({"max_concurrent_episodes": 0}, "training.agents.max_concurrent_episodes"),
        ({"episode_timeout_s": float("nan")}, "training.agents.episode_timeout_s"),
        ({"max_episode_retries": -1}, "training.agents.max_episode_retries"),
    ],
)
def test_bad_values_name_their_key(agents, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_config(config(agents))


@pytest.mark.parametrize(
    ("training", "services", "key"),
    [
        ({"rollout": {"async_rollout": True}}, None, "training.rollout.async_rollout"),
        ({"sampling": {"dynamic_sampling": {}}}, None, "training.sampling.dynamic_sampling"),
        ({"tools": {"environment": "calculator"}}, None, "training.agents"),
        ({}, {}, "services.rollout"),
        ({}, {"rollout": ["127.0.0.1:1", "127.0.0.1:2"]}, "services.rollout"),
    ],
)
def test_what_agent_runs_do_not_support_is_refused(training, services, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_config(config(services=services, **training))
