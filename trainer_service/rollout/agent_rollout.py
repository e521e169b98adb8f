"""The ``rollout_func`` of a run whose episodes are played by an agent (``training.agents``).

It is :class:`~trainer_service.rollout.service_rollout.ServiceRollout` with another source of completions:
the weight sync around each generation, the version check and the retry of a step whose rollout service is
down are the same; the completions come from
:class:`~trainer_service.rollout.agent_episodes.AgentEpisodes`, each group's sessions on one replica (the
agent dials that replica's gateway: ``training.agents.gateway_url``, ``{host}`` its host), and reach TRL on
the tool episodes' path (``env_mask``, ``env_reward``).
"""

from __future__ import annotations

from typing import Any

from rollout_service.client import RolloutClient
from trainer_service.config.agents import gateway_base_url, replica_host
from trainer_service.rollout.agent_episodes import AgentEpisodes, Placement, agent_metrics
from trainer_service.rollout.episodes import episode_fields, fill_empty_completions
from trainer_service.rollout.replicas import RolloutReplicas, RolloutUnavailable, shard_bounds
from trainer_service.rollout.service_rollout import (
    SamplingConfig,
    ServiceRollout,
    group_runs,
    keep_fresh_tokens,
)
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
        name: str = "step",
    ) -> None:
        super().__init__(client, sync, sampling, num_generations, retry_timeout_s=retry_timeout_s)
        self.agents = agents
        self.name = name  # episode ids are NAME<step>-<index>-try<attempt>

    def generate(
        self, prompts: list[Any], step: int, *, partial: bool = False, min_version: int | None = None
    ) -> list[Any]:
        """The episodes of ``prompts``, each group's sessions on one replica serving the trainer's version
        (contiguous shards of near-equal size, as for Generate), pinned to this rollout's sampling.
        ``partial`` has no meaning here: each model call is one request, and a weight push between an
        episode's calls already makes its tokens span versions (``token_versions``). Every session waits for
        ``min_version`` (default: the trainer's current version, whose push may be streaming)."""
        replicas = list(self.sync.ready)
        if not replicas:
            raise RolloutUnavailable(f"no rollout replica serves policy version {self.sync.current_version}")
        assert self.client is not None
        runs = group_runs(prompts, self.num_generations)
        placements: list[Placement] = []
        bounds = shard_bounds([count for _, count in runs], len(replicas))
        scheme = "https" if self.client.channel.tls_ca_file is not None else "http"
        # Fewer groups than replicas leave the extra replicas idle.
        for replica, (start, end) in zip(replicas[: len(bounds)], bounds, strict=True):
            place = self._placement(self.client.client(replica.address), replica.address, scheme)
            placements += [place] * sum(count for _, count in runs[start:end])
        sampling = self.sampling.for_step(step, self.calls).as_dict()
        self.calls += 1
        version = min_version if min_version is not None else self.sync.current_version or 0
        return self.agents.play(prompts, placements, sampling, f"{self.name}{step}", version)

    def _placement(self, client: RolloutClient, address: str, scheme: str) -> Placement:
        """Where the agent reaches the gateway of the replica at ``address``: ``training.agents.gateway_url``
        (``{host}`` its host), or unset, ``scheme`` (https when the services' TLS is verified) at the
        replica's host and the port each session's ticket names."""
        template = self.agents.config.gateway_url
        if template is not None:
            return Placement(client, gateway_base_url(template, address))
        return Placement(client, host=replica_host(address), scheme=scheme)

    def to_trl(
        self,
        completions: list[Any],
        expected_version: int | None,
        token_keep: list[list[int]] | None = None,
    ) -> dict[str, list]:
        """ServiceRollout's dict plus ``env_mask`` (the gateway's loss mask, times ``token_keep``: the async
        per-token staleness bound) and ``env_reward`` (the agent's reward)."""
        out = super().to_trl(completions, expected_version)
        out.update(episode_fields(completions))
        fill_empty_completions(out, self.agents.end_token_id)
        if token_keep is not None:
            keep_fresh_tokens(out, token_keep)
        self.last_tool_metrics = agent_metrics(completions)
        return out
