"""TRL environment classes: the same tools, schemas and reset/get_reward semantics as TRL's GRPOTrainer, and
loading only from the server's settings."""

from __future__ import annotations

import inspect
from concurrent.futures import ThreadPoolExecutor

import pytest
from pydantic import ValidationError
from transformers.utils import get_json_schema

from grpo_runtime.config import ConfigError
from reward_service.environments.settings import EnvironmentSettings
from reward_service.environments.trl_class import TrlEnvironment, tool_names
from reward_service.settings import load_settings
from tests.support.trl_envs import Counter, Misbehaving

THREADS = ThreadPoolExecutor(2)


def trl_tools(instance) -> list:
    """What GRPOTrainer exposes as tools of an environment instance (trl/trainer/grpo_trainer.py)."""
    return [
        getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


@pytest.mark.parametrize("cls", [Counter, Misbehaving])
def test_tools_and_schemas_match_trl(cls):
    env = TrlEnvironment("e", f"{cls.__module__}:{cls.__name__}", THREADS)
    expected = [get_json_schema(method)["function"] for method in trl_tools(cls())]
    assert tool_names(cls) == [f["name"] for f in expected]
    assert [(t.name, t.description, t.parameters) for t in env._tools] == [
        (f["name"], f["description"], f["parameters"]) for f in expected
    ]


async def test_reset_receives_the_columns_and_returns_the_prompt_suffix():
    env = TrlEnvironment("counter", "tests.support.trl_envs:Counter", THREADS)
    session = await env.open({"target": 7, "answer": "7"})
    assert session.prompt_suffix == "\nReach exactly 7."
    assert await session.call("increment", {"by": 7}) == "count=7"
    assert await session.call("peek", {}) == "7"  # an async tool; str() of its value, as TRL
    assert await session.reward() == 1.0


async def test_without_get_reward_there_is_no_reward():
    session = await TrlEnvironment("echo", "tests.support.trl_envs:Echo", THREADS).open({"prompt": "p"})
    assert session.prompt_suffix == ""
    assert await session.call("echo", {"text": "hi"}) == "hi"
    assert await session.reward() is None


def test_tools_without_type_hints_stop_the_start():
    with pytest.raises(ConfigError, match=r"environments\.trl\.u: tools of .*missing a type hint"):
        TrlEnvironment("u", "tests.support.trl_envs:Untyped", THREADS)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.support.no_such_module:X", "cannot load"),
        ("tests.support.trl_envs:Nope", "cannot load"),
        ("tests.support.trl_envs:annotations", "is not a class"),
        ("tests.support.trl_envs:NoReset", "has no callable `reset`"),
    ],
)
def test_bad_classes_stop_the_start(path, message):
    with pytest.raises(ConfigError, match=message) as info:
        TrlEnvironment("bad", path, THREADS)
    assert str(info.value).startswith("environments.trl.bad: ")


@pytest.mark.parametrize(
    ("environments", "message"),
    [
        ({"trl": {"game": "not an import path"}}, "is not 'module:Class'"),
        ({"trl": {"calculator": "tests.support.trl_envs:Counter"}}, "used twice"),
        ({"trl": {"x": "a:B"}, "mcp": {"x": {"command": "true"}}}, "used twice"),
        ({"mcp": {"bad name!": {"command": "true"}}}, "letters, digits"),
        ({"mcp": {"m": {"command": ""}}}, "at least 1 character"),
        ({"max_open_episodes": 0}, "greater than or equal to 1"),
        ({"tool_timeout": 3}, "unknown key|Extra inputs"),
    ],
)
def test_settings_name_the_bad_key(environments, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_settings({"environments": environments})
    assert "environments" in str(info.value)
    with pytest.raises(ValidationError):
        EnvironmentSettings.model_validate(environments)
