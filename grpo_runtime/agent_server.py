"""Serve ``grpo.agent.v1.AgentService`` from any Python agent: give it one async function that plays an
episode, get a gRPC server the trainer can dial (``training.agents.target``).

    async def run_episode(task, base_url, deadline):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused")
        reply = await client.chat.completions.create(model="policy", messages=task["prompt"])
        return None, {"answer": reply.choices[0].message.content}

    server = await serve_agent(run_episode, port=50060)   # or: asyncio.run(run_agent(run_episode, 50060))

``run_episode(task, base_url, deadline)``: ``task`` is the data row (JSON values), ``base_url`` the episode's
OpenAI base URL, ``deadline`` the episode's deadline in seconds since the Unix epoch (None = none); it
returns ``(reward, metadata)``: the agent's own reward (None = let the trainer's reward functions judge
alone) and JSON values about the episode. The server cancels a call still running at its deadline
(DEADLINE_EXCEEDED); an exception becomes INTERNAL with its text, a reward that is not finite
INVALID_ARGUMENT naming ``reward``: each fails the episode on the trainer's side.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc
from grpo.agent.v1 import agent_pb2, agent_pb2_grpc

from grpo_runtime import agent_codec
from grpo_runtime.agent_codec import EpisodeReport
from grpo_runtime.errors import MAX_DETAILS_CHARS, ServiceError
from grpo_runtime.health import SERVING, HealthServicer

log = logging.getLogger(__name__)

# (task, base_url, deadline in Unix seconds or None) -> (reward or None, metadata)
RunEpisode = Callable[[dict[str, Any], str, float | None], Awaitable[tuple[float | None, Mapping[str, Any]]]]
SERVICE_NAME = "grpo.agent.v1.AgentService"


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    """RunEpisode over one ``run_episode`` function; errors mapped to status codes here, in one place."""

    def __init__(self, run_episode: RunEpisode) -> None:
        self._run_episode = run_episode

    async def RunEpisode(
        self, request: agent_pb2.RunEpisodeRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.RunEpisodeResponse:
        try:
            return agent_codec.encode_run_episode_response(await self._play(request))
        except ServiceError as error:
            await context.abort(error.code, error.details)
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the episode did not end by its deadline")
        except Exception as error:  # the agent's own failure: reported, never a hung call
            log.exception("episode %s failed", request.episode_id)
            details = f"agent failed: {type(error).__name__}: {error}"
            await context.abort(grpc.StatusCode.INTERNAL, details[:MAX_DETAILS_CHARS])
        raise AssertionError("context.abort raises")

    async def _play(self, request: agent_pb2.RunEpisodeRequest) -> EpisodeReport:
        task = agent_codec.decode_run_episode_request(request)
        seconds_left = task.seconds_left(time.time())
        if seconds_left is not None and seconds_left <= 0:
            raise TimeoutError
        reward, metadata = await asyncio.wait_for(
            self._run_episode(task.task, task.base_url, task.deadline_unix_s), timeout=seconds_left
        )
        return EpisodeReport(reward=None if reward is None else float(reward), metadata=dict(metadata))


async def serve_agent(
    run_episode: RunEpisode, port: int = 0, host: str = "127.0.0.1"
) -> tuple[grpc.aio.Server, int]:
    """A started server of AgentService (and grpc.health.v1) on ``host:port`` (0 = any free port); returns
    the server and its bound port. Stop it with ``await server.stop(grace)``."""
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentServicer(run_episode), server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    await health.set("", SERVING)
    await health.set(SERVICE_NAME, SERVING)
    return server, bound


async def run_agent(run_episode: RunEpisode, port: int, host: str = "127.0.0.1") -> None:
    """Serve ``run_episode`` on ``host:port`` until the process is stopped."""
    server, bound = await serve_agent(run_episode, port, host)
    log.info("agent service listening on %s:%d", host, bound)
    await server.wait_for_termination()
