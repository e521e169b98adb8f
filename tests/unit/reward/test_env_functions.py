"""The functions environment (TRL's ``tools=``): the same schemas as TRL, calls, bad arguments as error
results, and loading only what the server's settings allow-list."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from pydantic import ValidationError
from transformers.utils import get_json_schema

from grpo_runtime.config import ConfigError
from grpo_runtime.env_types import ToolCall
from grpo_runtime.errors import InvalidArgument
from reward_service.environments.catalog import build_environments
from reward_service.environments.episodes import EpisodeRegistry
from reward_service.environments.functions import FunctionsEnvironment
from reward_service.environments.settings import EnvironmentSettings
from tests.support import tool_functions

THREADS = ThreadPoolExecutor(2)
PATHS = [f"tests.support.tool_functions:{name}" for name in ("multiply", "shout", "divide")]


def registry() -> EpisodeRegistry:
    settings = EnvironmentSettings.model_validate(
        {"functions": {"math": PATHS}, "python": {"enabled": False}}
    )
    return EpisodeRegistry(build_environments(settings, None, "no sandbox", THREADS), settings)


def test_schemas_are_transformers_get_json_schema_of_each_function():
    env = FunctionsEnvironment("math", PATHS, THREADS)
    expected = [
        get_json_schema(f)["function"]
        for f in (tool_functions.multiply, tool_functions.shout, tool_functions.divide)
    ]
    assert [(t.name, t.description, t.parameters) for t in env._tools] == [
        (f["name"], f["description"], f["parameters"]) for f in expected
    ]
    assert env.kind == "functions" and env.status == "functions " + ", ".join(PATHS)


async def test_calls_sync_and_async_functions_without_state_or_reward():
    episodes = registry()
    episode = await episodes.open("math", {}, {"prompt": "p"})
    assert [t["function"]["name"] for t in episode.chat_template_tools()] == ["multiply", "shout", "divide"]
    assert episode.prompt_suffix == ""
    outcome = await episodes.step(
        episode.episode_id,
        [
            ToolCall("multiply", json.dumps({"a": 347, "b": 582}), "a"),
            ToolCall("shout", json.dumps({"text": "hi"}), "b"),
        ],
    )
    assert [(r.call_id, r.content, r.error) for r in outcome.results] == [
        ("a", "201954", False),
        ("b", "HI", False),
    ]
    assert not outcome.done
    assert (await episodes.reward(episode.episode_id)).value is None


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (ToolCall("multiply", '{"a": 1'), "not valid JSON"),
        (ToolCall("multiply", '{"a": "x", "b": 2}'), "is not of type 'integer'"),
        (ToolCall("multiply", '{"a": 1}'), "'b' is a required property"),
        (ToolCall("divide", '{"a": 1, "b": 0}'), "ZeroDivisionError"),
    ],
)
async def test_bad_calls_are_error_results_and_the_episode_goes_on(call, message):
    episodes = registry()
    episode = await episodes.open("math", {}, {})
    (result,) = (await episodes.step(episode.episode_id, [call])).results
    assert result.error and message in result.content
    (ok,) = (await episodes.step(episode.episode_id, [ToolCall("multiply", '{"a": 2, "b": 3}')])).results
    assert (ok.content, ok.error) == ("6", False)


async def test_a_caller_cannot_name_code_to_load():
    """An import path in a request is only an unknown environment name; a function of the module that the
    settings do not list is an unknown tool."""
    episodes = registry()
    with pytest.raises(InvalidArgument, match="unknown environment"):
        await episodes.open("tests.support.tool_functions:reset", {}, {})
    episode = await episodes.open("math", {}, {})
    (result,) = (await episodes.step(episode.episode_id, [ToolCall("reset", '{"target": 1}')])).results
    assert result.error and "reset" in result.content


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.support.no_such_module:f", "cannot load"),
        ("tests.support.tool_functions:nope", "cannot load"),
        ("tests.support.tool_functions:NOT_A_FUNCTION", "is not a function"),
        ("tests.support.tool_functions:untyped", "missing a type hint"),
        ("tests.support.tool_functions:reset", "may not be named 'reset'"),
    ],
)
def test_bad_functions_stop_the_start(path, message):
    with pytest.raises(ConfigError, match=message) as info:
        FunctionsEnvironment("bad", [path], THREADS)
    assert str(info.value).startswith("environments.functions.bad: ")


def test_two_functions_of_one_name_stop_the_start():
    with pytest.raises(ConfigError, match="two functions are named 'multiply'"):
        FunctionsEnvironment("bad", [PATHS[0], PATHS[0]], THREADS)


@pytest.mark.parametrize(
    ("functions", "message"),
    [
        ({"f": ["not an import path"]}, "is not 'module:function'"),
        ({"f": []}, "lists no function"),
        ({"calculator": PATHS}, "used twice"),
    ],
)
def test_settings_name_the_bad_key(functions, message):
    with pytest.raises(ValidationError, match=message):
        EnvironmentSettings.model_validate({"functions": functions})
