"""The ``training.agents`` block: agents as rollout workers over ``grpo.agent.v1.AgentService``.

For each prompt row and each of its G samples the trainer opens a session of the rollout service's
OpenAI-compatible gateway, asks the agent at ``target`` to play the row in it, and trains on the session's
recorded tokens (``trainer_service.rollout.agent_episodes``; ``docs/agents.md``, "Bring your own agent").
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from trainer_service.config.fields import StrictModel
from trainer_service.config.rollout_targets import TargetList

# Placeholders of training.agents.command, replaced when the command line starts the agent.
PORT_PLACEHOLDER = "{port}"
PYTHON_PLACEHOLDER = "{python}"
# Placeholder of training.agents.gateway_url: the host of the replica an episode's session is on.
HOST_PLACEHOLDER = "{host}"


def _gateway_url(text: str) -> str:
    if not re.fullmatch(r"https?://[^/\s?#]+", text):
        raise ValueError(f"{text!r} is not http(s)://HOST:PORT (no path: sessions add /sessions/<id>/v1)")
    return text


def replica_host(replica_address: str) -> str:
    """The host of a replica's gRPC address (``HOST:PORT`` or ``[IPV6]:PORT``, brackets kept)."""
    return replica_address.rsplit(":", 1)[0] if ":" in replica_address else replica_address


def gateway_base_url(gateway_url: str, replica_address: str) -> str:
    """``gateway_url`` with ``{host}`` replaced by the host of the replica's gRPC address: where the agent
    reaches the gateway of the replica its session is on."""
    return gateway_url.replace(HOST_PLACEHOLDER, replica_host(replica_address))


def _agent_command(argv: list[str]) -> list[str]:
    if not any(PORT_PLACEHOLDER in arg for arg in argv):
        raise ValueError(f"no argument holds {PORT_PLACEHOLDER} (the port the agent must serve on)")
    return argv


class AgentsConfig(StrictModel):
    """Agents that play episodes against the policy through the rollout service's OpenAI-compatible gateway;
    the trainer trains on the tokens the gateway recorded (mask 1 on sampled tokens only)."""

    target: TargetList = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="The AgentService address: HOST:PORT, or another gRPC target (unix:PATH, inside the "
        "trainer service's socket_roots for a run started over StartRun), dialled as services.* are; "
        "dns:///NAME:PORT spreads RunEpisode calls over every address the name resolves to (round robin: "
        "a Kubernetes headless Service of agent pods). A list: several agent servers, the run's episodes "
        "dealt to them in turn, an episode's retry to the next one. Exactly one of target and command.",
    )
    command: (
        Annotated[
            list[Annotated[str, Field(min_length=1, max_length=4096)]],
            Field(min_length=1, max_length=256),
            AfterValidator(_agent_command),
        ]
        | None
    ) = Field(
        default=None,
        description="An agent the trainer's command line (train, demo) starts for the run and stops after "
        f"it: argv, where {PORT_PLACEHOLDER} is a free loopback port it must serve AgentService on and "
        f"{PYTHON_PLACEHOLDER} the trainer's Python, e.g. [{PYTHON_PLACEHOLDER}, -m, "
        f"examples.agents.openai_sdk_agent, --port, {PORT_PLACEHOLDER}]. A run started over StartRun may not "
        "set it (the service runs no command a caller names).",
    )
    gateway_url: Annotated[str, AfterValidator(_gateway_url)] | None = Field(
        default=None,
        description="The rollout service's OpenAI gateway as the agent reaches it, http://HOST:PORT (its "
        "--openai-port); an episode's base URL is this + /sessions/<id>/v1. With several rollout replicas, "
        f"{HOST_PLACEHOLDER} stands for the host of the replica an episode's session is on "
        f"(http://{HOST_PLACEHOLDER}:8000). Unset: each replica's host at the port of its gateway, which "
        "the replica names when it opens a session (https with services.tls_ca_file); a rollout service "
        "the run starts itself serves one on a free loopback port.",
    )
    max_concurrent_episodes: int = Field(
        default=8,
        ge=1,
        le=1024,
        description="Episodes running at once, over all rows and samples of a batch.",
    )
    episode_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=86400,
        description="Deadline of one episode, seconds: RunEpisode's deadline; the gateway session lives a "
        "little longer.",
    )
    max_episode_retries: int = Field(
        default=1,
        ge=0,
        le=10,
        description="A failed episode (agent error, timeout, a reward that is not finite, no model call) is "
        "played again as a new episode up to this many times; then it stays out of the loss and is counted "
        "in agents/failed_episodes.",
    )
    max_completion_tokens: int | None = Field(
        default=None,
        ge=1,
        le=1 << 20,
        description="Tokens an episode's completion may hold in all (from its first sampled token on; the "
        "model's and the agent's, such as tool results, alike), as generation.max_completion_length bounds "
        "the rollout service's own episodes. The gateway caps each call at what is left and answers a call "
        "made once it is spent with an empty reply (finish_reason length) without generating; a longer "
        "completion is cut back to its last sampled token within the budget and finishes with length. "
        "None: each call is capped at generation.max_completion_length and the session at the model's "
        "context only.",
    )
    reward_weight: float = Field(
        default=1.0,
        ge=0.0,
        description="Weight of the agent's own reward (RunEpisodeResponse.reward) beside "
        "training.rewards.reward_fn's terms, which score the decoded completion; 0 = not a reward term.",
    )

    @model_validator(mode="after")
    def _one_agent(self) -> AgentsConfig:
        if (self.target is None) == (self.command is None):
            raise ValueError("set exactly one of target (a running agent) and command (one to start)")
        return self
