"""The ``training.agents`` block: its addresses checked, the agent's reward a weighted term, and what agent
runs cannot do refused naming the key."""

from __future__ import annotations

import re

import pytest

from rollout_service.client import RolloutClient, SessionTicket
from trainer_service.config.agents import gateway_base_url
from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.rollout.agent_episodes import Placement, uses_agent_reward
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
        ({"target": []}, "training.agents.target"),
        ({"target": ["127.0.0.1:1", "127.0.0.1:1"]}, "training.agents.target"),
        ({"target": ["127.0.0.1:1"] * 65}, "training.agents.target"),
        ({"max_concurrent_episodes": 0}, "training.agents.max_concurrent_episodes"),
        ({"episode_timeout_s": float("nan")}, "training.agents.episode_timeout_s"),
        ({"max_episode_retries": -1}, "training.agents.max_episode_retries"),
    ],
)
def test_bad_values_name_their_key(agents, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_config(config(agents))


def test_a_target_is_one_agent_server_or_a_list_of_them():
    assert parse_config(config()).training.agents.target == ["127.0.0.1:50060"]
    servers = ["127.0.0.1:50060", "dns:///agents.ns:50060", "unix:/run/agent.sock"]
    assert parse_config(config({"target": servers})).training.agents.target == servers
    with pytest.raises(ConfigError, match=re.escape("training.agents.target[1]: 'no-port' is not HOST:PORT")):
        parse_config(config({"target": ["127.0.0.1:50060", "no-port"]}))


@pytest.mark.parametrize(
    ("agents", "training", "services", "key"),
    [
        ({}, {"tools": {"environment": "calculator"}}, None, "training.agents"),
        # A locally started rollout service serves its own gateway on a free port.
        ({}, {}, {}, "training.agents.gateway_url"),
        ({}, {}, {"rollout": ["127.0.0.1:1", "127.0.0.1:2"]}, "training.agents.gateway_url"),
        ({}, {}, {"rollout": "dns:///rollout.ns:50052"}, "training.agents.gateway_url"),
        # A unix-socket replica has no host to reach its gateway at: the URL must be given whole.
        ({"gateway_url": None}, {}, {"rollout": "unix:/run/rollout.sock"}, "training.agents.gateway_url"),
        (
            {"gateway_url": "http://{host}:8000"},
            {},
            {"rollout": "unix:/run/rollout.sock"},
            "training.agents.gateway_url",
        ),
        ({"command": ["agent", "--port", "{port}"]}, {}, None, "training.agents"),
        ({"target": None, "command": ["agent", "--port", "50060"]}, {}, None, "training.agents.command"),
        ({"target": None}, {}, None, "training.agents"),
    ],
)
def test_what_agent_runs_cannot_do_is_refused(agents, training, services, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_config(config(agents, services=services, **training))


@pytest.mark.parametrize(
    ("agents", "services"),
    [
        ({"target": None, "command": ["{python}", "agent.py", "--port={port}"], "gateway_url": None}, {}),
        ({"gateway_url": "http://{host}:8000"}, {"rollout": ["10.0.0.1:50052", "10.0.0.2:50052"]}),
        ({"gateway_url": "http://{host}:8000"}, {"rollout": "dns:///rollout.ns:50052"}),
        # Each replica's host, at the gateway port its GetStatus reports.
        ({"gateway_url": None}, {"rollout": ["10.0.0.1:50052", "10.0.0.2:50052"]}),
    ],
)
def test_local_agents_and_several_replicas_are_accepted(agents, services):
    parse_config(config(agents, services=services))


def test_each_replica_has_its_gateway_on_its_own_host():
    assert gateway_base_url("http://{host}:8000", "10.0.0.2:50052") == "http://10.0.0.2:8000"
    assert gateway_base_url("http://{host}:8000", "[fd00::1]:50052") == "http://[fd00::1]:8000"
    assert gateway_base_url("http://gw.local:8000", "10.0.0.2:50052") == "http://gw.local:8000"


def test_without_a_gateway_url_the_agent_goes_to_the_port_its_sessions_ticket_names():
    rollout = RolloutClient("10.0.0.2:50052")  # never dialled: the channel opens at the first call
    ticket = SessionTicket("abc", 0, openai_port=8123)
    by_ticket = Placement(rollout, host="[fd00::1]", scheme="https")
    assert by_ticket.base_url(ticket) == "https://[fd00::1]:8123/sessions/abc/v1"
    assert (
        Placement(rollout, "http://gw.local:8000").base_url(ticket) == "http://gw.local:8000/sessions/abc/v1"
    )
    with pytest.raises(ValueError, match="named no gateway port for its session: set training"):
        by_ticket.base_url(SessionTicket("abc", 0))
