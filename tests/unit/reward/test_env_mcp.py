"""MCP servers as environments, against a real MCP server (tests/support/mcp_server.py) over stdio."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from grpo_runtime.env_types import ToolCall
from grpo_runtime.errors import FailedPrecondition, ResourceExhausted
from reward_service.environments.catalog import build_environments
from reward_service.environments.episodes import EpisodeRegistry
from reward_service.environments.settings import EnvironmentSettings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SECRET = "mcp-env-secret-77a1"


def registry(**overrides) -> EpisodeRegistry:
    notes = {"command": sys.executable, "args": ["-m", "tests.support.mcp_server"], "cwd": ROOT}
    broken = {"command": sys.executable, "args": ["-c", "raise SystemExit(1)"], "max_episodes": 1}
    settings = EnvironmentSettings.model_validate(
        {"python": {"enabled": False}, "mcp": {"notes": notes, "broken": broken}, **overrides}
    )
    return EpisodeRegistry(build_environments(settings, None, "", ThreadPoolExecutor(1)), settings)


def call(tool: str, **arguments) -> ToolCall:
    return ToolCall(tool, json.dumps(arguments), f"id-{tool}")


def running(marker: str) -> list[psutil.Process]:
    """Live child processes of this test whose command line contains ``marker``."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if marker in " ".join(process.cmdline()) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:  # exited meanwhile
            pass
    return found


def servers() -> list[psutil.Process]:
    return running("tests.support.mcp_server")


async def test_tools_calls_and_isolation():
    episodes = registry()
    a, b = await asyncio.gather(episodes.open("notes", {}, {}), episodes.open("notes", {}, {}))
    names = [t.name for t in a.tools]
    assert names == ["add_note", "list_notes", "add", "environment_variable", "crash"]
    add = next(t for t in a.tools if t.name == "add")
    assert add.parameters["required"] == ["a", "b"] and add.description == "Adds two integers."
    outcome = await episodes.step(a.episode_id, [call("add_note", text="first"), call("add", a=2, b=40)])
    assert [(r.call_id, r.content, r.error) for r in outcome.results] == [
        ("id-add_note", "1 notes", False),
        ("id-add", "42", False),
    ]
    await episodes.step(a.episode_id, [call("add_note", text="second")])
    (listed,) = (await episodes.step(a.episode_id, [call("list_notes")])).results
    assert listed.content == "first\nsecond"
    (other,) = (await episodes.step(b.episode_id, [call("list_notes")])).results
    assert other.content == ""  # its own server process: nothing of episode a
    # Checked against the tool's schema before the server sees it.
    (typed,) = (await episodes.step(a.episode_id, [call("add", a="two", b=1)])).results
    assert typed.error and "'two' is not of type 'integer'" in typed.content
    assert len(servers()) == 2
    await asyncio.gather(episodes.close(a.episode_id), episodes.close(b.episode_id))
    assert not servers()  # closing an episode ends its server


async def test_the_server_gets_no_secret_from_the_service():
    os.environ["GRPO_TEST_SECRET"] = SECRET
    try:
        episodes = registry()
        episode = await episodes.open("notes", {}, {})
    finally:
        del os.environ["GRPO_TEST_SECRET"]
    (secret,) = (
        await episodes.step(episode.episode_id, [call("environment_variable", name="GRPO_TEST_SECRET")])
    ).results
    (path,) = (await episodes.step(episode.episode_id, [call("environment_variable", name="PATH")])).results
    assert (secret.content, secret.error) == ("", False)
    assert path.content  # the SDK's safe variables are passed
    await episodes.close_all()


async def test_a_server_that_dies_mid_episode():
    episodes = registry()
    episode = await episodes.open("notes", {}, {})
    outcome = await episodes.step(
        episode.episode_id, [call("add_note", text="x"), call("crash"), call("list_notes")]
    )
    ok, crashed, after = outcome.results
    assert not ok.error
    assert crashed.error and "MCP server has stopped" in crashed.content
    assert after.error and "the episode has ended" in after.content
    assert outcome.done
    assert await episodes.close(episode.episode_id)
    assert not servers()


async def test_episodes_per_server_are_bounded():
    notes = EnvironmentSettings.model_validate(
        {
            "mcp": {
                "notes": {
                    "command": sys.executable,
                    "args": ["-m", "tests.support.mcp_server"],
                    "cwd": ROOT,
                    "max_episodes": 1,
                }
            }
        }
    )
    episodes = EpisodeRegistry(build_environments(notes, None, "", ThreadPoolExecutor(1)), notes)
    first = await episodes.open("notes", {}, {})
    with pytest.raises(ResourceExhausted, match=r"environments\.mcp\.notes\.max_episodes") as info:
        await episodes.open("notes", {}, {})
    assert info.value.retry_after_s is not None
    await episodes.close(first.episode_id)
    second = await episodes.open("notes", {}, {})  # the closed one's place is free again
    await episodes.close(second.episode_id)


async def test_a_server_that_does_not_start_is_failed_precondition():
    episodes = registry(open_timeout_s=30)
    for _ in range(2):  # a failed start frees its place (max_episodes: 1)
        with pytest.raises(FailedPrecondition, match="could not open an episode: MCP server did not start"):
            await episodes.open("broken", {}, {})
    assert episodes.open_count == 0


async def test_a_hanging_server_start_times_out():
    silent = {"command": sys.executable, "args": ["-c", "import time; time.sleep(60)"]}
    settings = EnvironmentSettings.model_validate({"open_timeout_s": 1, "mcp": {"silent": silent}})
    episodes = EpisodeRegistry(build_environments(settings, None, "", ThreadPoolExecutor(1)), settings)
    with pytest.raises(FailedPrecondition, match="did not open an episode within 1s"):
        await episodes.open("silent", {}, {})
    assert not running("time.sleep(60)")
