"""A reward server running on its own event loop in a background thread.

Tests can then use blocking clients (RewardClient, as TRL calls it) as well as aio channels on their own
loop without deadlocking the server's loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from grpo_runtime.config import ServerConfig
from grpo_runtime.server import GrpcServer
from reward_service.server import start_reward_service
from reward_service.settings import RewardSettings


@contextmanager
def reward_server_thread(settings: dict[str, Any]) -> Iterator[GrpcServer]:
    """Starts the reward service (math-verify pool, sandbox probe, gRPC server) in a thread."""
    loop = asyncio.new_event_loop()
    started: dict[str, Any] = {}
    ready = threading.Event()
    stop: asyncio.Event | None = None

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        try:
            service = await start_reward_service(RewardSettings.model_validate(settings))
            config = ServerConfig(host="127.0.0.1", port=0, grace_period_s=1)
            async with GrpcServer(config, service.bindings(), on_shutdown=service.close) as server:
                started["server"] = server
                ready.set()
                await stop.wait()
        except BaseException as exc:
            started["error"] = exc
            ready.set()
            raise

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    ready.wait(120)
    if "error" in started:
        raise started["error"]
    try:
        yield started["server"]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


SECRET = "grpo-integration-secret-41c7"
SETTINGS = {
    "max_samples": 8,
    "max_concurrent_requests": 3,
    "max_completion_chars": 2_000_000,
    "text_deadline_s": 1,
    "mathverify": {"workers": 2, "deadline_s": 5},
    "sandbox": {"wall_timeout_s": 2, "cpu_time_s": 2, "memory_mb": 256, "concurrency": 4},
}


@pytest.fixture(scope="package")
def reward_server() -> Iterator[GrpcServer]:
    """One reward server for this package's RewardService tests; a secret sits in its environment."""
    os.environ["GRPO_TEST_SECRET"] = SECRET  # must never reach a sandboxed program
    try:
        with reward_server_thread(SETTINGS) as running:
            yield running
    finally:
        os.environ.pop("GRPO_TEST_SECRET", None)
