"""Fixtures of the trainer integration tests: real reward and rollout services on loopback, a tiny dataset.

Helpers the tests import (the run config, the crash-and-restart sink) are in fixtures.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.trainer.fixtures import DEMO_MODEL
from trainer_service.local.launcher import LocalServices, start_local_services


@pytest.fixture(scope="module")
def services(tiny_models, tmp_path_factory) -> LocalServices:
    """Reward and rollout (HF engine, tiny policy) services, one pair per test module."""
    with start_local_services(
        need_reward=True,
        need_rollout=True,
        model=tiny_models["policy"],
        engine="hf",
        log_dir=tmp_path_factory.mktemp("service-logs"),
    ) as local:
        yield local


@pytest.fixture(scope="module")
def demo_services(tmp_path_factory) -> LocalServices:
    """Reward and rollout (HF engine, the demo policy) services, one pair per test module."""
    with start_local_services(
        need_reward=True,
        need_rollout=True,
        model=DEMO_MODEL,
        engine="hf",
        log_dir=tmp_path_factory.mktemp("demo-service-logs"),
    ) as local:
        yield local


@pytest.fixture(scope="module")
def train_file(tmp_path_factory) -> Path:
    """16 doubling questions in the chat `messages` format, the answer as the final assistant turn."""
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"What is {i} + {i}?"},
                {"role": "assistant", "content": str(2 * i)},
            ]
        }
        for i in range(16)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
