"""The rollout service on a background thread, with its live core for tests that read the engine's state."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from grpo_runtime.config import ServerConfig
from grpo_runtime.server import GrpcServer
from rollout_service.core.rollout import RolloutCore
from rollout_service.server import binding, build_core
from rollout_service.settings import RolloutSettings
from tests.support.server_thread import server_thread

# Loading an engine (vLLM above all) on a loaded machine takes minutes, not the helper's default two.
STARTUP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RunningRollout:
    """A started rollout server and the RolloutCore it serves (its engine, its counters)."""

    server: GrpcServer
    core: RolloutCore

    @property
    def address(self) -> str:
        return self.server.address


@contextmanager
def rollout_server_thread(
    settings: RolloutSettings, config: ServerConfig | None = None
) -> Iterator[RunningRollout]:
    """Builds the engine and core as the service does (``server.build_core``) and serves them in a thread."""
    built: list[RolloutCore] = []

    async def build():
        core = await build_core(settings)
        built.append(core)
        return [binding(core)], core.close

    with server_thread(build, config=config, startup_timeout_s=STARTUP_TIMEOUT_S) as server:
        yield RunningRollout(server, built[0])
