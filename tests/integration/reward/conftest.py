"""Fixtures of the reward service's integration tests: one server shared by the package."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from grpo_runtime.server import GrpcServer
from tests.integration.reward.fixtures import SECRET, SETTINGS, reward_server_thread


@pytest.fixture(scope="package")
def reward_server() -> Iterator[GrpcServer]:
    """One reward server for this package's RewardService tests; a secret sits in its environment."""
    os.environ["GRPO_TEST_SECRET"] = SECRET  # must never reach a sandboxed program
    try:
        with reward_server_thread(SETTINGS) as running:
            yield running
    finally:
        os.environ.pop("GRPO_TEST_SECRET", None)
