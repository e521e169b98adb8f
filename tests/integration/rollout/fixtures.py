"""The rollout service on a background thread, with its live core for tests that read the engine's state."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from grpo_runtime.config import ServerConfig
from grpo_runtime.server import GrpcServer
from rollout_service.client import RolloutClient
from rollout_service.core.rollout import RolloutCore
from rollout_service.server import binding, build_core
from rollout_service.settings import RolloutSettings
from rollout_service.types import CompletionResult
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


def generate_while_pushing(
    server: RunningRollout,
    client: RolloutClient,
    push: Callable[[], object],
    prompts: list,
    sampling: dict,
    *,
    partial: bool,
    n: int = 2,
) -> list[CompletionResult]:
    """Start a long Generate of ``prompts`` in a thread, call ``push`` once its batch holds the weights lock,
    return the Generate's results."""
    lock = server.core._lock
    results: list[list[CompletionResult]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(client.generate(prompts, n=n, sampling=sampling, continue_across_updates=partial))
        except BaseException as error:  # re-raised in the test's thread
            errors.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 120
    while lock.readers == 0 and worker.is_alive():
        assert time.monotonic() < deadline, "the generation never started"
        time.sleep(0.002)
    push()
    worker.join(120)
    assert not worker.is_alive(), "the generation did not end"
    if errors:
        raise errors[0]
    return results[0]
