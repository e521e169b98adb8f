"""A run with ``training.tools.functions`` (TRL's ``tools=``, plain functions): trainer → rollout service →
the reward service's functions environment. A random tiny policy never writes a tool call, so the rollout
service's engine is scripted (tests.support.episodes' ScriptedEngine) to call ``multiply`` once and then
answer with its result; everything else is the real path. A reward service that does not list the functions is
refused before training, with the key named."""

from __future__ import annotations

import json
import re

import pytest

from grpo_runtime.client import ChannelConfig
from grpo_runtime.config import ConfigError
from tests.integration.reward.fixtures import SETTINGS, reward_server_thread
from tests.integration.trainer.fixtures import run_config
from tests.support.episodes import scripted_rollout_server
from trainer_service.config.run_config import local_reward_settings, parse_config
from trainer_service.core.types import RunState
from trainer_service.local.launcher import start_local_services
from trainer_service.rollout.function_tools import check_served_tools
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow

TOOLS = ["tests.support.tool_functions:multiply", "tests.support.tool_functions:shout"]
QUESTION = re.compile(r"What is (\d+) \+ \d+\?")
RESULT = re.compile(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", re.DOTALL)


def double_with_multiply(prompt: str) -> str:
    """First turn: call multiply(i, 2) for "What is i + i?"; second turn: answer with the tool's result."""
    results = RESULT.findall(prompt)
    if results:
        return results[-1].strip()
    number = int(QUESTION.findall(prompt)[-1])
    body = json.dumps({"name": "multiply", "arguments": {"a": number, "b": 2}})
    return f"<tool_call>\n{body}\n</tool_call>"


def test_a_run_trains_with_function_tools(tiny_models, train_file, tmp_path):
    functions = {**SETTINGS, "environments": {"functions": {"tools": TOOLS}}}
    with reward_server_thread(functions) as reward:
        engine, rollout = scripted_rollout_server(
            tiny_models["policy"], double_with_multiply, {"default": reward.address}
        )
        with rollout as server:
            raw = run_config(
                tiny_models,
                train_file,
                tmp_path / "run",
                reward.address,
                server.address,
                max_steps=2,
                tools={"functions": TOOLS, "max_tool_calling_iterations": 2},
                generation={"max_completion_length": 64},
            )
            result = run_job(parse_config(raw))
    assert result.state is RunState.COMPLETED, result.message
    rows = [row for row in read_metrics(result.output_dir / "metrics.jsonl") if "tools/call_frequency" in row]
    assert [row["step"] for row in rows] == [1, 2], rows
    for row in rows:
        # One multiply call per episode, none failed, no environment reward term (function tools have none).
        assert row["tools/call_frequency"] == 1.0, row
        assert row["tools/failure_frequency"] == 0.0 and row["tools/episode_error_frequency"] == 0.0
        assert not any(key.startswith("rewards/env_reward") for key in row)
    assert (
        engine.turns_generated > 0 and engine.turns_generated % 2 == 0
    )  # each episode: the call, the answer


def test_a_reward_service_without_the_functions_is_refused(tiny_models, train_file, tmp_path):
    listed_other = {**SETTINGS, "environments": {"functions": {"tools": TOOLS[:1]}}}
    with reward_server_thread(listed_other) as reward:
        raw = run_config(
            tiny_models,
            train_file,
            tmp_path / "run",
            reward.address,
            "127.0.0.1:1",
            tools={"functions": TOOLS},
        )
        with pytest.raises(ConfigError) as info:
            run_job(parse_config(raw))
    message = str(info.value)
    assert message.startswith("training.tools.functions: ") and "environments.functions.tools" in message


def test_a_locally_started_reward_service_gets_the_functions_in_its_settings(tmp_path):
    c = parse_config({"base": "m", "data": {"train": "t.jsonl"}, "training": {"tools": {"functions": TOOLS}}})
    with start_local_services(
        need_reward=True,
        need_rollout=False,
        model="m",
        log_dir=tmp_path,
        reward_settings=local_reward_settings(c),
    ) as local:
        check_served_tools(TOOLS, ChannelConfig(target=local.reward.target), timeout_s=30)  # raises if not
        with pytest.raises(ConfigError, match="does not serve these functions"):
            check_served_tools(TOOLS[::-1], ChannelConfig(target=local.reward.target), timeout_s=30)
