"""Agents as rollout workers: one ``grpo.agent.v1`` episode per prompt the trainer samples.

For each prompt of a generation batch (TRL repeats each row G times, so each of its G samples), an episode
is: open a session of the rollout service's OpenAI-compatible gateway (``RolloutClient.open_agent_session``),
call ``RunEpisode`` on ``training.agents.target`` (with several agent servers, the next one in turn) with the
row and the session's base URL (the gateway of the session's replica, :class:`Placement`, +
``/sessions/<id>/v1``), read the session back
(``agent_trajectory(close=True)``) and turn its sequence into one completion shaped as the rollout service's
tool episodes are: ``prompt_token_ids`` the tokens before the first sampled one, ``token_ids`` the rest,
``tool_mask`` the gateway's loss mask over them (1 exactly on sampled tokens), ``logprobs`` and
``token_versions`` per token. So the trainer hands
agent episodes to TRL on the tool episodes' path (:func:`~trainer_service.rollout.episodes.episode_fields`:
``env_mask`` and ``env_reward``, the agent's reward, read by
:class:`~trainer_service.rollout.episodes.EnvironmentReward` with weight ``agents.reward_weight``).

A session with several branches (a rewritten history, a sub-agent) trains its last branch, the one holding the
final answer (its leaf is the session's latest call); the others are counted in ``agents/untrained_branches``.
``generation.max_completion_length`` caps each model call (the sessions pin it); with
``agents.max_completion_tokens`` the completion as a whole keeps a budget too, as the rollout service's own
episodes keep ``max_completion_length``: sampled and agent-written tokens alike. The sessions carry it, so the
gateway caps each call at what is left of it and answers a call made once it is spent with an empty reply
(finish ``length``) without generating: no turn is sampled only to be cut away, and the agent's reward judges
what the budget held. A longer completion (from a gateway that does not know the budget) is still cut here,
back to its last sampled token within the budget (what follows it is context for nothing the loss sees), and
finishes with LENGTH, so neither an agent's long tool results nor its number of calls grow the trainer's batch
past it (``mask_truncated_completions`` takes one that does not end with EOS out of the loss). An episode
fails when the agent's call fails (its error, or no answer by ``episode_timeout_s``), its reward is not
finite, or the session holds no sampled token; it is then played again as a new episode (a new session, on the
next agent server when there are several) up to ``max_episode_retries`` times, because dropping it would bias
its group's advantage, and after that it becomes a completion of one unsampled EOS with ``tool_mask`` 0 and no
agent reward: out of the loss, counted in ``agents/failed_episodes``. A failing rollout service is not an
episode failure: its error propagates, and the step's generation is retried as any other."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from grpo_runtime.agent_client import AgentClient, EpisodeTask
from grpo_runtime.batch_calls import Coalescer
from grpo_runtime.call_errors import ServiceCallError
from grpo_runtime.client import ChannelConfig
from grpo_runtime.loop_thread import LoopThread
from rollout_service.client import AgentTrajectory, FinishReason, RolloutClient, SessionTicket
from trainer_service.config.agents import AgentsConfig
from trainer_service.config.run_config import RunConfig
from trainer_service.rollout.episodes import jsonable, prompt_key

log = logging.getLogger(__name__)

# The gateway session outlives the episode's deadline by this much, seconds, so the trainer can still read
# the trajectory of an agent that answered at the last moment.
SESSION_GRACE_S = 30.0
# Sessions one OpenAgentSessions call opens at most.
MAX_SESSIONS_PER_OPEN = 256


class EpisodeFailed(Exception):
    """One attempt at an episode failed; the message says why (it is logged and counted)."""


@dataclass(frozen=True)
class AgentCompletion:
    """One agent episode as one training completion, with the fields the tool episodes' completions have.

    ``logprobs[i]``: log p(token i) under the sampling distribution where ``tool_mask[i]`` is 1, else 0;
    ``token_versions[i]``: the policy version that sampled token i (elsewhere the version of the call that
    fed it); ``policy_version``: the newest version that sampled a token. ``env_reward``: the agent's reward
    (None: none, or the episode failed). ``attempts``: episodes played for it (1 = no retry).
    """

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    tool_mask: list[int]
    token_versions: list[int]
    policy_version: int
    env_reward: float | None
    finish_reason: FinishReason = FinishReason.STOP
    error: str = ""
    attempts: int = 1
    retokenized_tokens: int = 0
    prefix_mismatches: int = 0
    model_calls: int = 0
    untrained_branches: int = 0


def completion_of(
    trajectory: AgentTrajectory, reward: float | None, max_tokens: int | None = None
) -> AgentCompletion:
    """The session's last branch split at its first sampled token, the completion at most ``max_tokens``
    long (module docstring; None: no bound); EpisodeFailed when nothing was sampled."""
    if not trajectory.sequences:
        raise EpisodeFailed("the agent never called the model (an empty session)")
    sequence = trajectory.sequences[-1]
    if 1 not in sequence.loss_mask:
        raise EpisodeFailed("the session's last branch holds no sampled token")
    start = sequence.loss_mask.index(1)
    end, finish = len(sequence.token_ids), FinishReason.STOP
    if max_tokens is not None and end - start > max_tokens:
        end = start + max_tokens
        while not sequence.loss_mask[end - 1]:  # stops at the latest at start, a sampled token
            end -= 1
        finish = FinishReason.LENGTH
    mask = sequence.loss_mask[start:end]
    versions = sequence.policy_versions[start:end]
    return AgentCompletion(
        prompt_token_ids=list(sequence.token_ids[:start]),
        token_ids=list(sequence.token_ids[start:end]),
        logprobs=list(sequence.logprobs[start:end]),
        tool_mask=list(mask),
        token_versions=list(versions),
        policy_version=max(v for v, m in zip(versions, mask, strict=True) if m),
        env_reward=reward,
        finish_reason=finish,
        retokenized_tokens=trajectory.retokenized_tokens,
        prefix_mismatches=trajectory.prefix_mismatches,
        model_calls=trajectory.calls,
        untrained_branches=len(trajectory.sequences) - 1,
    )


def failed_completion(end_token_id: int, version: int, reason: str, attempts: int) -> AgentCompletion:
    """An episode given up on: one unsampled EOS as prompt and completion, out of the loss (mask 0)."""
    return AgentCompletion(
        prompt_token_ids=[end_token_id],
        token_ids=[end_token_id],
        logprobs=[0.0],
        tool_mask=[0],
        token_versions=[version],
        policy_version=version,
        env_reward=None,
        finish_reason=FinishReason.ERROR,
        error=reason,
        attempts=attempts,
    )


def agent_metrics(completions: Sequence[AgentCompletion]) -> dict[str, float]:
    """``agents/*`` metrics of one generation batch: episodes given up on, extra episodes played for
    retries, model calls of the trained episodes, tokens the gateway rendered again, calls whose prefix
    did not match and branches left out of training (all but each session's last; summed)."""
    if not completions:
        return {}
    return {
        "agents/episodes": float(len(completions)),
        "agents/failed_episodes": float(sum(c.finish_reason == FinishReason.ERROR for c in completions)),
        "agents/retried_episodes": float(sum(c.attempts - 1 for c in completions)),
        "agents/retokenized_tokens": float(sum(c.retokenized_tokens for c in completions)),
        "agents/prefix_mismatches": float(sum(c.prefix_mismatches for c in completions)),
        "agents/model_calls": float(sum(c.model_calls for c in completions)),
        "agents/untrained_branches": float(sum(c.untrained_branches for c in completions)),
    }


@dataclass(frozen=True)
class Placement:
    """Where an episode's session lives: a rollout replica, and its gateway as the agent reaches it:
    ``gateway_url`` (``http://HOST:PORT``), or None: ``scheme://host`` at the port the session's ticket names
    (the one the replica's gateway listens on, so a restarted replica's new port is followed)."""

    rollout: RolloutClient
    gateway_url: str | None = None
    host: str = "127.0.0.1"
    scheme: str = "http"

    def base_url(self, ticket: SessionTicket) -> str:
        """The base URL the agent's SDK gets for the session of ``ticket``: the gateway +
        ``/sessions/<id>/v1``."""
        gateway = self.gateway_url
        if gateway is None:
            if not ticket.openai_port:
                raise ValueError(
                    f"the rollout replica at {self.host} named no gateway port for its session: set "
                    "training.agents.gateway_url"
                )
            gateway = f"{self.scheme}://{self.host}:{ticket.openai_port}"
        return f"{gateway}/sessions/{ticket.session_id}/v1"


class SessionOpener:
    """Opens gateway sessions of one replica for a batch's episodes: the sessions asked for within one
    event-loop turn (the episodes that got a slot together) in one ``OpenAgentSessions`` call, each alike:
    living ``ttl_s``, sampling ``sampling``, waiting for ``version``, each branch's completion within
    ``max_completion_tokens`` (None: no budget)."""

    def __init__(
        self,
        rollout: RolloutClient,
        ttl_s: float,
        sampling: Mapping[str, Any],
        version: int,
        max_completion_tokens: int | None = None,
    ):
        self._rollout = rollout
        self._ttl_s, self._sampling, self._version = ttl_s, sampling, version
        self._max_completion_tokens = max_completion_tokens
        self._calls: Coalescer[None, SessionTicket] = Coalescer(
            self._send, max_batch=MAX_SESSIONS_PER_OPEN, orphan=self._close
        )

    async def open(self) -> SessionTicket:
        return await self._calls.call(None)

    async def _send(self, items: list[None]) -> AsyncIterator[tuple[int, SessionTicket]]:
        tickets = await asyncio.to_thread(
            self._rollout.open_agent_sessions,
            len(items),
            self._ttl_s,
            sampling=self._sampling,
            min_policy_version=self._version,
            max_completion_tokens=self._max_completion_tokens,
        )
        for index, ticket in enumerate(tickets):
            yield index, ticket

    def _close(self, ticket: SessionTicket) -> None:
        """A session opened for an episode that stopped waiting: closed at once, not left to expire (a
        failure to close it is logged; it then expires)."""
        closing = asyncio.get_running_loop().run_in_executor(
            None, self._rollout.close_agent_session, ticket.session_id
        )
        closing.add_done_callback(_log_close_failure)


def _log_close_failure(closing: asyncio.Future[bool]) -> None:
    if not closing.cancelled() and closing.exception() is not None:
        log.warning("closing an orphaned agent session failed: %s", closing.exception())


@dataclass(frozen=True)
class _Table:
    """What the episodes of one batch share: the agents' channels, the session openers (one per replica) and
    the concurrency slots."""

    agents: tuple[AgentClient, ...]
    openers: dict[RolloutClient, SessionOpener]
    slots: asyncio.Semaphore


class AgentEpisodes:
    """Plays a batch's episodes, each on the replica its :class:`Placement` names, at most
    ``max_concurrent_episodes`` at a time.

    ``agents``: the agent servers' channels; the run's episodes are dealt to them in turn, and an episode's
    retry goes to the server after the one its failed attempt had.
    ``rows``: the train and eval rows; an episode's task is its prompt's row (all columns, JSON values).
    ``end_token_id``: the tokenizer's EOS, the token of a failed episode's completion.
    """

    def __init__(
        self,
        config: AgentsConfig,
        agents: Sequence[ChannelConfig],
        rows: Iterable[Mapping[str, Any]],
        *,
        end_token_id: int = 0,
    ) -> None:
        if not agents:
            raise ValueError("no agent server to play episodes on")
        self.config = config
        self.agents = tuple(agents)
        self.end_token_id = end_token_id
        self._tasks: dict[str, dict[str, Any]] = {}
        for row in rows:
            self._tasks.setdefault(prompt_key(row["prompt"]), {k: jsonable(v) for k, v in row.items()})
        # One loop for every batch, and on it one channel per agent server, connected once for the run.
        self._loop = LoopThread("agent-episodes")
        self._clients: tuple[AgentClient, ...] = ()
        self._dealt = 0  # episodes dealt to the agent servers so far

    def close(self) -> None:
        """Closes the agents' channels and stops the episodes' loop thread."""
        self._loop.close(self._close_clients())

    async def _close_clients(self) -> None:
        clients, self._clients = self._clients, ()
        for client in clients:
            await client.close()

    def task(self, prompt: Any) -> dict[str, Any]:
        """The row of ``prompt`` (just the prompt for one that is in no dataset)."""
        return self._tasks.get(prompt_key(prompt)) or {"prompt": jsonable(prompt)}

    def play(
        self,
        prompts: Sequence[Any],
        placements: Sequence[Placement],
        sampling: Mapping[str, Any],
        name: str,
        version: int,
    ) -> list[Any]:
        """One completion per prompt, in order, the episode of ``prompts[i]`` in a session on
        ``placements[i]``. ``sampling`` (SamplingParams fields): the distribution every call of the episodes
        samples from, pinned on their sessions whatever the agent asks; ``name`` prefixes the episode ids;
        ``version``: the trainer's policy version, which every call of the episodes waits for (its push may be
        streaming) and a failed episode is given."""
        if len(placements) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(placements)} placements")
        return self._loop.run(self._play_all(prompts, placements, sampling, name, version))

    async def _play_all(
        self,
        prompts: Sequence[Any],
        placements: Sequence[Placement],
        sampling: Mapping[str, Any],
        name: str,
        version: int,
    ) -> list[AgentCompletion]:
        slots = asyncio.Semaphore(self.config.max_concurrent_episodes)
        ttl_s = self.config.episode_timeout_s + SESSION_GRACE_S
        budget = self.config.max_completion_tokens
        openers = {
            place.rollout: SessionOpener(place.rollout, ttl_s, sampling, version, budget)
            for place in placements
        }
        if not self._clients:
            self._clients = tuple(AgentClient(agent) for agent in self.agents)
        table = _Table(self._clients, openers, slots)
        first, self._dealt = self._dealt, self._dealt + len(prompts)
        episodes = [
            asyncio.ensure_future(
                self._episode(table, place, self.task(prompt), f"{name}-{index}", version, first + index)
            )
            for index, (prompt, place) in enumerate(zip(prompts, placements, strict=True))
        ]
        try:
            return list(await asyncio.gather(*episodes))
        except BaseException:
            # The loop outlives this batch: the others stop here (closing their sessions), not later.
            for episode in episodes:
                episode.cancel()
            await asyncio.gather(*episodes, return_exceptions=True)
            raise

    async def _episode(
        self, table: _Table, place: Placement, task: dict[str, Any], name: str, version: int, turn: int
    ) -> AgentCompletion:
        """The first attempt that succeeds, or after ``1 + max_episode_retries`` failures a failed one;
        attempt k goes to agent server ``turn + k`` (modulo their number)."""
        attempts = 1 + self.config.max_episode_retries
        reasons = []
        for attempt in range(attempts):
            agent = table.agents[(turn + attempt) % len(table.agents)]
            async with table.slots:
                try:
                    completion = await self._attempt(agent, table, place, task, f"{name}-try{attempt}")
                    return replace(completion, attempts=attempt + 1)
                except EpisodeFailed as failure:
                    log.warning("agent episode %s-try%d failed: %s", name, attempt, failure)
                    reasons.append(str(failure))
        return failed_completion(self.end_token_id, version, "; ".join(reasons), attempts)

    async def _attempt(
        self, agent: AgentClient, table: _Table, place: Placement, task: dict[str, Any], episode_id: str
    ) -> AgentCompletion:
        timeout_s, rollout = self.config.episode_timeout_s, place.rollout
        ticket = await table.openers[rollout].open()
        read = False
        try:
            request = EpisodeTask(
                task=task,
                base_url=place.base_url(ticket),
                deadline_unix_ms=int((time.time() + timeout_s) * 1000),
                episode_id=episode_id,
            )
            try:
                report = await agent.run_episode(request, timeout_s=timeout_s)
            except ServiceCallError as error:
                raise EpisodeFailed(f"RunEpisode: {error}") from error
            if report.reward is not None and not math.isfinite(report.reward):
                raise EpisodeFailed(f"the agent's reward {report.reward!r} is not a finite number")
            trajectory = await asyncio.to_thread(rollout.agent_trajectory, ticket.session_id, close=True)
            read = True
            return completion_of(trajectory, report.reward, self.config.max_completion_tokens)
        finally:
            if not read:
                # The agent may still be calling: closing the session ends that (404 from then on).
                await asyncio.to_thread(rollout.close_agent_session, ticket.session_id)


def agent_episodes(
    config: RunConfig, *datasets: Iterable[Mapping[str, Any]] | None, end_token_id: int = 0
) -> AgentEpisodes | None:
    """The run's agent episodes over its train and eval rows, or None without ``training.agents``. The
    agents' channels verify TLS with ``services.tls_ca_file`` and never carry the admin token; each balances
    its calls round robin over the addresses its target resolves to."""
    agents = config.training.agents
    if agents is None:
        return None
    rows = [row for dataset in datasets if dataset is not None for row in dataset]
    tls_ca_file = config.services.tls_ca_file
    channels = [
        ChannelConfig(target=target, tls_ca_file=tls_ca_file, load_balancing="round_robin")
        for target in agents.target or []
    ]
    return AgentEpisodes(agents, channels, rows, end_token_id=end_token_id)


def uses_agent_reward(config: RunConfig) -> bool:
    """Whether the agent's reward is a reward term of the run (after reward_fn's terms)."""
    agents = config.training.agents
    return agents is not None and agents.reward_weight > 0
