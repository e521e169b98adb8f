"""The `python` environment against the real sandbox: state across calls, isolation between episodes, the
sandbox's limits as error results the model sees, no secret and nothing left behind."""

from __future__ import annotations

import asyncio
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from grpo_runtime.env_types import ToolCall
from reward_service.environments.catalog import build_environments
from reward_service.environments.episodes import EpisodeRegistry
from reward_service.environments.settings import EnvironmentSettings
from reward_service.sandbox.runner import open_runner
from reward_service.sandbox.settings import SandboxSettings

SANDBOX = SandboxSettings(
    wall_timeout_s=2.0, cpu_time_s=2, memory_mb=256, concurrency=2, max_output_bytes=4096
)
SECRET = "python-env-secret-9d2e"


@pytest.fixture
async def episodes():
    runner, status = await open_runner(SANDBOX)
    assert runner is not None, f"these tests need bubblewrap and user namespaces: {status}"
    settings = EnvironmentSettings.model_validate({"python": {"max_cells": 4}})
    registry = EpisodeRegistry(build_environments(settings, runner, status, ThreadPoolExecutor(1)), settings)
    yield registry
    await registry.close_all()


def code(source: str) -> ToolCall:
    return ToolCall("python", json.dumps({"code": source}))


async def run(episodes: EpisodeRegistry, episode_id: str, source: str):
    (result,) = (await episodes.step(episode_id, [code(source)])).results
    return result


async def test_state_is_kept_within_an_episode_and_not_across(episodes):
    a = (await episodes.open("python", {}, {})).episode_id
    b = (await episodes.open("python", {}, {})).episode_id
    first = await run(episodes, a, "x = 6\nprint('printed once')\ndef f(y):\n    return x * y")
    assert (first.content, first.error) == ("printed once", False)
    second = await run(episodes, a, "import math\nf(7)")
    assert (second.content, second.error) == ("42", False)  # earlier output is not repeated
    assert (await run(episodes, a, "math.sqrt(f(6))")).content == "6.0"
    other = await run(episodes, b, "x")
    assert other.error and "NameError: name 'x' is not defined" in other.content


async def test_a_raising_cell_shows_its_traceback_and_keeps_its_effects(episodes):
    episode = (await episodes.open("python", {}, {})).episode_id
    result = await run(episodes, episode, "items = [1]\nitems.append(2)\n1 / 0\nitems.append(3)")
    assert result.error
    assert (
        "ZeroDivisionError: division by zero" in result.content and 'File "<cell>", line 3' in result.content
    )
    assert "python_cells" not in result.content  # the driver's own frames are not shown
    assert (await run(episodes, episode, "items")).content == "[1, 2]"
    syntax = await run(episodes, episode, "def broken(:")
    assert syntax.error and "SyntaxError" in syntax.content
    assert (await run(episodes, episode, "print('no value')\nNone")).content == "no value"


async def test_sandbox_limits_are_error_results_and_the_episode_goes_on(episodes):
    episode = (await episodes.open("python", {}, {})).episode_id
    start = time.monotonic()
    # A sleeping cell: only the wall limit can end it (a spinning one races RLIMIT_CPU, equal to it here).
    hang = await run(episodes, episode, "import time\nn = 1\ntime.sleep(60)")
    assert hang.error and "timed out" in hang.content
    assert time.monotonic() - start < 15
    spin = await run(episodes, episode, "while True:\n    pass")
    assert spin.error and ("timed out" in spin.content or "SIGXCPU" in spin.content)
    flood = await run(episodes, episode, "print('y' * 100000)")
    assert flood.error and "output exceeded" in flood.content
    # Killed cells are not replayed: the episode still answers, without their effects.
    ok = await run(episodes, episode, "print('alive', 'n' in globals())")
    assert (ok.content, ok.error) == ("alive False", False)


async def test_no_secret_no_network_and_nothing_left_behind(episodes):
    # Other tests' worker pools may live on in this process; only processes started by these calls count.
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    os.environ["GRPO_TEST_SECRET"] = SECRET
    try:
        episode = (await episodes.open("python", {}, {})).episode_id
        probe = await run(
            episodes,
            episode,
            "import os, socket\n"
            "open('left_behind.txt', 'w').write('x')\n"
            "print(os.environ.get('GRPO_TEST_SECRET'), sorted(os.environ))\n"
            "try:\n    socket.create_connection(('127.0.0.1', 22), timeout=1)\n"
            "except OSError as e:\n    print('no network')",
        )
    finally:
        del os.environ["GRPO_TEST_SECRET"]
    assert SECRET not in probe.content and probe.content.startswith("None [")
    assert "no network" in probe.content
    other = (await episodes.open("python", {}, {})).episode_id
    assert (await run(episodes, other, "import os\nos.path.exists('left_behind.txt')")).content == "False"
    left = [child for child in psutil.Process().children(recursive=True) if child.pid not in before]
    assert not left  # no process of a run outlives its call


async def test_cells_per_episode_are_capped(episodes):
    episode = (await episodes.open("python", {}, {})).episode_id
    for i in range(4):
        assert not (await run(episodes, episode, f"v{i} = {i}")).error
    capped = await run(episodes, episode, "v0")
    assert capped.error and "python.max_cells" in capped.content


async def test_episodes_run_concurrently(episodes):
    ids = [(await episodes.open("python", {}, {})).episode_id for _ in range(3)]
    results = await asyncio.gather(*(run(episodes, e, f"print({i} * 11)") for i, e in enumerate(ids)))
    assert [r.content for r in results] == ["0", "11", "22"]
