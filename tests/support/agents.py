"""Agents as rollout workers on loopback, for the tests: a rollout service with its OpenAI gateway in this
process, a Python agent function served over grpo.agent.v1 from its own event loop thread, and the Node.js
agent (examples/node/agent_server.ts, compiled to dist/) as a real ``node`` process."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from grpo_runtime.agent_server import RunEpisode, serve_agent
from rollout_service.server import binding, build_core, build_gateway
from rollout_service.settings import GatewaySettings, RolloutSettings
from tests.support.node_env import node_server
from tests.support.server_thread import server_thread


@contextmanager
def rollout_with_gateway(model: Path, max_tokens: int = 32) -> Iterator[tuple[str, str]]:
    """A rollout service (HF engine) of ``model`` with its gateway; yields (gRPC address, gateway URL)."""
    gateway = GatewaySettings(port=0, max_tokens=max_tokens, session_ttl_s=600)
    settings = RolloutSettings(model=str(model), engine="hf", max_model_len=512, gateway=gateway)
    built = {}

    async def build():
        core = await build_core(settings)
        served = binding(core, build_gateway(core, settings))
        built.update(endpoint=served.companions[0])
        return [served], core.close

    with server_thread(build) as server:
        yield server.address, f"http://127.0.0.1:{built['endpoint'].port}"


@contextmanager
def python_agent(run_episode: RunEpisode) -> Iterator[str]:
    """``run_episode`` served on a free loopback port from its own event loop thread; yields its address."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server, port = asyncio.run_coroutine_threadsafe(serve_agent(run_episode), loop).result(30)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@contextmanager
def node_agent(*args: str) -> Iterator[str]:
    """``node dist/agent_server.js --port 0 *args`` as users start it; yields its address."""
    with node_server("dist/agent_server.js", *args) as server:
        yield server.address
