"""Wires the reward service: backends started before the gRPC server, then the servicer bindings."""

from __future__ import annotations

import importlib.util
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from grpo.env.v1 import env_pb2, env_pb2_grpc
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from grpo_runtime.config import ConfigError
from grpo_runtime.server import Cleanup, ServiceBinding
from reward_service.api.admin import RewardAdminServicer
from reward_service.api.environment import EnvironmentServicer
from reward_service.api.reward import RewardServicer
from reward_service.checkers.pool import CheckerPool
from reward_service.core.scorer import ScoreLimits, Scorer
from reward_service.core.stress import StressLimits
from reward_service.environments.host import EnvironmentHost, start_environments
from reward_service.http.app import HttpEndpoint
from reward_service.judges.remote import RemoteJudge, remote_judges
from reward_service.models.metrics import ModelMetrics
from reward_service.models.registry import ModelRegistry
from reward_service.rewards.base import ThreadRunner
from reward_service.rewards.registry import builtin_rewards
from reward_service.sandbox.runner import SandboxRunner, open_runner
from reward_service.settings import RewardSettings

log = logging.getLogger(__name__)


def models_installed() -> bool:
    """Whether reward models can load here: they need torch and transformers, which the slim image (extra
    `reward-slim`) leaves out; there the service scores with the built-in rewards and serves no
    RewardAdminService. Looked up, not imported: both load with the first model."""
    try:
        return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))
    except ValueError:  # a module set to None in sys.modules: as good as missing
        return False


async def open_sandbox(settings: RewardSettings) -> tuple[SandboxRunner | None, bool, str]:
    """(runner, available, status) for the `code` reward; logs what isolation is in force."""
    if not settings.sandbox.enabled:
        return None, False, "disabled by configuration (sandbox.enabled: false)"
    runner, status = await open_runner(settings.sandbox)
    if runner is None:
        status = f"refused: the sandbox cannot run here ({status})"
        log.error("code sandbox: %s", status)
        return None, False, status
    log.info("code sandbox: %s", status)
    return runner, True, status


@dataclass
class RewardService:
    """Everything a running reward service owns; ``close`` releases it."""

    scorer: Scorer
    pool: CheckerPool
    registry: ModelRegistry | None
    settings: RewardSettings
    text_threads: ThreadPoolExecutor
    environments: EnvironmentHost | None = None
    judges: dict[str, RemoteJudge] = field(default_factory=dict)

    def bindings(self) -> list[ServiceBinding]:
        # OpenRLHF's HTTP protocol, scored by the same scorer (http.port / --http-port), counted on /metrics.
        http = HttpEndpoint(self.scorer, self.settings.http) if self.settings.http.port is not None else None
        bindings = [
            ServiceBinding(
                servicer=RewardServicer(
                    self.scorer,
                    self.settings.stream_window,
                    StressLimits(
                        max_samples=self.settings.stress_max_samples, score_batch=self.settings.max_samples
                    ),
                ),
                add_to_server=reward_pb2_grpc.add_RewardServiceServicer_to_server,
                descriptor=reward_pb2.DESCRIPTOR.services_by_name["RewardService"],
                companions=(http,) if http is not None else (),
                collectors=(http.metrics,) if http is not None else (),
            )
        ]
        if self.environments is not None:
            bindings.append(
                ServiceBinding(
                    servicer=EnvironmentServicer(self.environments.episodes),
                    add_to_server=env_pb2_grpc.add_EnvironmentServiceServicer_to_server,
                    descriptor=env_pb2.DESCRIPTOR.services_by_name["EnvironmentService"],
                )
            )
        if self.registry is not None:
            bindings.append(
                ServiceBinding(
                    servicer=RewardAdminServicer(self.registry),
                    add_to_server=reward_pb2_grpc.add_RewardAdminServiceServicer_to_server,
                    descriptor=reward_pb2.DESCRIPTOR.services_by_name["RewardAdminService"],
                    collectors=(ModelMetrics(self.registry),),
                )
            )
        return bindings

    async def close(self) -> None:
        if self.environments is not None:
            await self.environments.close()
        if self.registry is not None:
            await self.registry.close()
        for judge in self.judges.values():
            await judge.close()
        await self.pool.close()
        self.text_threads.shutdown(wait=False, cancel_futures=True)


async def start_reward_service(settings: RewardSettings) -> RewardService:
    """Starts the checker workers (before any gRPC server exists: spawn, never fork), probes the
    sandbox and loads the preconfigured models."""
    judges = remote_judges(settings.judges)  # reads their API tokens: a missing one fails here
    pool = CheckerPool(settings.checkers)
    await pool.start()
    if not models_installed():
        log.warning("reward models unavailable: torch/transformers are not installed (slim image)")
        if settings.models.preload:
            raise ConfigError(
                "models.preload: reward models need torch and transformers (the `reward` extra)"
            )
        registry = None
    else:
        registry = ModelRegistry(settings.models, reserved=frozenset(judges))
    environments = None
    try:
        sandbox, available, status = await open_sandbox(settings)
        # The `python` tool runs in the same sandbox as the `code` reward.
        environments = (
            start_environments(settings.environments, sandbox, status)
            if settings.environments.enabled
            else None
        )
        if registry is not None:
            await registry.start()
    except BaseException:
        if environments is not None:
            await environments.close()
        await pool.close()
        if registry is not None:
            await registry.close()
        raise
    text_threads = ThreadPoolExecutor(settings.text_threads, thread_name_prefix="text-reward")
    runner = ThreadRunner(settings.text_deadline_s, settings.text_budget_s, text_threads)
    scorer = Scorer(
        {**builtin_rewards(pool, sandbox, available, status, runner), **judges},
        registry,
        max_concurrent=settings.max_concurrent_requests,
        limits=ScoreLimits(
            max_samples=settings.max_samples,
            max_rewards=settings.max_rewards,
            max_completion_chars=settings.max_completion_chars,
            max_completion_ids=settings.max_completion_ids,
            max_prompt_chars=settings.max_prompt_chars,
            max_metadata_chars=settings.max_metadata_chars,
        ),
    )
    return RewardService(
        scorer=scorer,
        pool=pool,
        registry=registry,
        settings=settings,
        text_threads=text_threads,
        environments=environments,
        judges=judges,
    )


async def build(settings: RewardSettings) -> tuple[list[ServiceBinding], Cleanup]:
    service = await start_reward_service(settings)
    return service.bindings(), service.close
