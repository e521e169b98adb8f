"""A run whose environment server dies mid-run keeps training: the Node.js environment server is killed
during step 2's episodes (open, mid-episode), so step 2's episodes end with FINISH_REASON_ERROR and their
tokens so far, and step 3's cannot open at all (no tokens). Per-completion errors are data: each step
completes, ``tools/episode_error_frequency`` says how many failed, their env reward is no term (None)."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from tests.integration.reward.fixtures import SETTINGS, reward_server_thread
from tests.integration.trainer.fixtures import run_config
from tests.support.episodes import scripted_rollout_server
from tests.support.node_env import node_env_server
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import JobEvent, RunState
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow

GUESS = "<tool_call>\n" + json.dumps({"name": "guess", "arguments": {"number": 50}}) + "\n</tool_call>"


@pytest.fixture
def fifty_file(tmp_path) -> Path:
    path = tmp_path / "fifty.jsonl"
    row = {
        "messages": [
            {"role": "user", "content": "Find the secret number with the guess tool."},
            {"role": "assistant", "content": "50"},
        ],
        "secret": 50,
    }
    path.write_text((json.dumps(row) + "\n") * 8)
    return path


def test_a_run_goes_on_when_its_environment_server_dies(tiny_models, fifty_file, tmp_path):
    with node_env_server() as node:
        after_step_1 = threading.Event()

        def play(prompt: str) -> str:
            if after_step_1.is_set() and node.process.poll() is None:  # step 2's first turn
                os.kill(node.process.pid, signal.SIGKILL)
                node.process.wait()
            return "Found it." if "<|im_start|>tool\ncorrect" in prompt else GUESS

        def sink(event: JobEvent) -> None:
            if event.step == 1 and event.metrics:
                after_step_1.set()

        _, rollout = scripted_rollout_server(
            tiny_models["policy"], play, {"default": node.address}, open_timeout_s=5, step_timeout_s=10
        )
        with reward_server_thread(SETTINGS) as reward, rollout as server:
            raw = run_config(
                tiny_models,
                fifty_file,
                tmp_path / "run",
                reward.address,
                server.address,
                max_steps=3,
                generation={"max_completion_length": 64},
                tools={"environment": "guess-number", "max_tool_calling_iterations": 2},
            )
            result = run_job(parse_config(raw), sink=sink)
    assert result.state is RunState.COMPLETED, result.message
    rows = {
        row["step"]: row
        for row in read_metrics(result.output_dir / "metrics.jsonl")
        if "tools/call_frequency" in row
    }
    assert sorted(rows) == [1, 2, 3], rows
    assert rows[1]["tools/episode_error_frequency"] == 0.0 and rows[1]["rewards/env_reward/mean"] == 1.0
    # Step 2: the episodes were open when the server died; their guess is a failed call.
    assert rows[2]["tools/episode_error_frequency"] == 1.0 and rows[2]["tools/failure_frequency"] == 1.0
    # Step 3: no episode could open, no call was made.
    assert rows[3]["tools/episode_error_frequency"] == 1.0 and rows[3]["tools/call_frequency"] == 0.0
