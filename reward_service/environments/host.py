"""The environment side of a reward service process: its episode registry and what it owns."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from reward_service.environments.catalog import build_environments
from reward_service.environments.episodes import EpisodeRegistry
from reward_service.environments.settings import EnvironmentSettings
from reward_service.sandbox.runner import SandboxRunner


@dataclass
class EnvironmentHost:
    """The registry of open episodes and the thread pool of TRL environment methods."""

    episodes: EpisodeRegistry
    threads: ThreadPoolExecutor

    async def close(self) -> None:
        await self.episodes.close_all()
        self.threads.shutdown(wait=False, cancel_futures=True)


def start_environments(
    settings: EnvironmentSettings, sandbox: SandboxRunner | None, sandbox_status: str
) -> EnvironmentHost:
    """The configured environments behind a started registry (call with the event loop running)."""
    threads = ThreadPoolExecutor(settings.trl_threads, thread_name_prefix="trl-env")
    try:
        episodes = EpisodeRegistry(build_environments(settings, sandbox, sandbox_status, threads), settings)
    except BaseException:
        threads.shutdown(wait=False)
        raise
    episodes.start()
    return EnvironmentHost(episodes, threads)
