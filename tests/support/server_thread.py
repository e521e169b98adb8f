"""A service's gRPC server on its own event loop in a background thread, for tests that call it with blocking
clients (RewardClient and RolloutClient block, as TRL calls them) from the test's thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from grpo_runtime.config import ServerConfig
from grpo_runtime.server import Cleanup, GrpcServer, ServiceBinding

DEFAULT_CONFIG = ServerConfig(host="127.0.0.1", port=0, grace_period_s=1)
Build = Callable[[], Awaitable[tuple[list[ServiceBinding], Cleanup | None]]]


@contextmanager
def server_thread(
    build: Build, *, config: ServerConfig | None = None, startup_timeout_s: float = 120.0
) -> Iterator[GrpcServer]:
    """Serve what ``build()`` returns (a service's ``server.build(settings)``) with ``config`` (default:
    127.0.0.1, a free port, 1 s grace); stop it (and run its cleanup) on exit."""
    loop = asyncio.new_event_loop()
    started: dict[str, Any] = {}
    ready = threading.Event()
    stop: asyncio.Event | None = None

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        try:
            bindings, cleanup = await build()
            async with GrpcServer(config or DEFAULT_CONFIG, bindings, on_shutdown=cleanup) as server:
                started["server"] = server
                ready.set()
                await stop.wait()
        except BaseException as exc:
            if ready.is_set():
                raise  # failed while serving: pytest reports the thread's exception
            started["error"] = exc  # failed to start: the caller raises it, once
            ready.set()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    if not ready.wait(startup_timeout_s):
        raise TimeoutError(f"the server did not start within {startup_timeout_s:.0f} s")
    if "error" in started:
        raise started["error"]
    try:
        yield started["server"]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()
