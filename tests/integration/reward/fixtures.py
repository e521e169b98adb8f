"""The reward service on a background thread, with the settings this package's tests share.

Tests use blocking clients (RewardClient, as TRL calls it) as well as aio channels on their own loop without
deadlocking the server's loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from grpo_runtime.server import GrpcServer
from reward_service.server import build
from reward_service.settings import RewardSettings
from tests.support.server_thread import server_thread


@contextmanager
def reward_server_thread(settings: dict[str, Any]) -> Iterator[GrpcServer]:
    """Starts the reward service (math-verify pool, sandbox probe, gRPC server) in a thread."""
    with server_thread(lambda: build(RewardSettings.model_validate(settings))) as server:
        yield server


SECRET = "grpo-integration-secret-41c7"
SETTINGS = {
    "max_samples": 8,
    "max_concurrent_requests": 3,
    "max_completion_chars": 2_000_000,
    "text_deadline_s": 1,
    "checkers": {"workers": 2, "deadline_s": 5},
    "sandbox": {"wall_timeout_s": 2, "cpu_time_s": 2, "memory_mb": 256, "concurrency": 4},
}
