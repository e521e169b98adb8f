"""What a job derives from its run config before it builds anything: settings and service endpoints."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_runtime.client import ChannelConfig
from trainer_service.config.reward_terms import RewardTerm
from trainer_service.config.run_config import RunConfig
from trainer_service.training.builders import Device, resolve_device


@dataclass(frozen=True)
class JobSettings:
    """What a job derives from its run config, computed once at its start.

    ``device``: where the trainer computes and in which precision; ``reward_terms``: the rewards it scores
    with (``rewards.prm`` replaces ``rewards.reward_fn``); ``admin_token``: the services' admin token (read
    from ``services.admin_token_file`` once).
    """

    device: Device
    reward_terms: tuple[RewardTerm, ...]
    admin_token: str | None

    @classmethod
    def of(cls, config: RunConfig) -> JobSettings:
        return cls(
            device=resolve_device(config),
            reward_terms=tuple(config.training.rewards.reward_terms),
            admin_token=config.services.resolved_admin_token(),
        )


@dataclass(frozen=True)
class Endpoints:
    """Channel configs of the reward and rollout services a job talks to.

    ``rollout`` holds the settings every rollout replica's channel copies (its target is the first entry);
    ``rollout_targets`` are the ``services.rollout`` entries (:mod:`trainer_service.rollout.replicas`).
    """

    reward: ChannelConfig
    rollout: ChannelConfig
    rollout_targets: tuple[str, ...]
