"""The ``rollout_func`` of a run whose episodes are played by an agent (``training.agents``).

It is :class:`~trainer_service.rollout.service_rollout.ServiceRollout` with another source of completions:
the weight sync around each generation, the version check and the retry of a step whose rollout service is
down are the same; the completions come from
:class:`~trainer_service.rollout.agent_episodes.AgentEpisodes` on the one replica serving the gateway, and
reach TRL on the tool episodes' path (``env_mask``, ``env_reward``).
"""

from __future__ import annotations

from typing import Any

from trainer_service.rollout.agent_episodes import AgentEpisodes, agent_metrics
from trainer_service.rollout.episodes import episode_fields, fill_empty_completions
from trainer_service.rollout.replicas import RolloutReplicas, RolloutUnavailable
from trainer_service.rollout.service_rollout import SamplingConfig, ServiceRollout
from trainer_service.rollout.weight_sync import WeightSync


class AgentRollout(ServiceRollout):
    """``rollout_func(prompts, trainer)`` whose completions are agent episodes (one per prompt, in order);
    ``last_tool_metrics`` holds the batch's ``agents/*`` metrics."""

    def __init__(
        self,
        client: RolloutReplicas,
        sync: WeightSync,
        sampling: SamplingConfig,
        num_generations: int,
        agents: AgentEpisodes,
        *,
        retry_timeout_s: float = 300.0,
    ) -> None:
        super().__init__(client, sync, sampling, num_generations, retry_timeout_s=retry_timeout_s)
        self.agents = agents

    def generate(self, prompts: list[Any], step: int, *, partial: bool = False) -> list[Any]:
        """The episodes of ``prompts`` on the first replica serving the trainer's version (the config
        allows exactly one: the gateway's); ``partial`` has no meaning for agent calls and is ignored."""
        replicas = list(self.sync.ready)
        if not replicas:
            raise RolloutUnavailable(f"no rollout replica serves policy version {self.sync.current_version}")
        assert self.client is not None
        version = self.sync.current_version or 0
        return self.agents.play(prompts, self.client.client(replicas[0].address), step, version)

    def to_trl(
        self,
        completions: list[Any],
        expected_version: int | None,
        token_keep: list[list[int]] | None = None,
    ) -> dict[str, list]:
        """ServiceRollout's dict plus ``env_mask`` (the gateway's loss mask) and ``env_reward`` (the agent's
        reward); ``token_keep`` (partial async rollouts) is refused by the config before a run starts."""
        if token_keep is not None:
            raise ValueError("agent episodes do not support partial rollouts")
        out = super().to_trl(completions, expected_version)
        out.update(episode_fields(completions))
        fill_empty_completions(out, self.agents.end_token_id)
        self.last_tool_metrics = agent_metrics(completions)
        return out
