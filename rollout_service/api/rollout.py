"""The RolloutService servicer: protobuf in, one RolloutCore call, protobuf out.

The conversions are the service's codec (:mod:`rollout_service.codec`, :mod:`rollout_service.weight_codec`),
shared with the client. Errors are domain exceptions (grpo_runtime.errors) mapped to status codes by the
runtime's interceptor; a cancelled call or exceeded deadline cancels the handler task, which the core's
scheduler turns into a stop of the engine at its next decode step.
"""

from __future__ import annotations

import dataclasses

from grpo.rollout.v1 import rollout_pb2, rollout_pb2_grpc

from grpo_runtime.auth import caller_is_admin
from grpo_runtime.errors import FailedPrecondition
from grpo_runtime.off_loop import off_loop_unless
from rollout_service import codec, weight_codec
from rollout_service.core.rollout import INLINE_TOKENS, RolloutCore
from rollout_service.gateway.service import AgentGateway

# A Generate request of at most this many prompts (and INLINE_TOKENS items) is decoded on the event loop, a
# larger one in a worker thread: 4096 prompts of 256 ids take about 50 ms to decode.
INLINE_PROMPTS = 16


def small_request(request: rollout_pb2.GenerateRequest) -> bool:
    """Whether decoding ``request`` takes well under a millisecond: at most ``INLINE_PROMPTS`` prompts whose
    token ids, messages, message parts and episode fields number at most ``INLINE_TOKENS`` (a text or an
    image is one copy, whatever its length)."""
    prompts = request.prompts
    if len(prompts) > INLINE_PROMPTS:
        return False
    items = 0
    for p in prompts:
        fields = len(p.episode.params.fields) + len(p.episode.metadata.fields)
        items += len(p.token_ids) + len(p.messages) + fields
        if items > INLINE_TOKENS:  # before counting parts: at most this many messages are looked at
            return False
        items += sum(len(m.parts) for m in p.messages)
    return items <= INLINE_TOKENS


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    """``gateway``: the OpenAI-compatible gateway whose sessions the agent-session RPCs manage (None: those
    RPCs are FAILED_PRECONDITION)."""

    def __init__(self, core: RolloutCore, gateway: AgentGateway | None = None) -> None:
        self._core = core
        self._gateway = gateway

    async def Generate(self, request, context) -> rollout_pb2.GenerateResponse:
        decoded = await off_loop_unless(small_request(request), codec.decode_generate_request, request)
        results = await self._core.generate(decoded)
        small = sum(len(result.token_ids) for result in results) <= INLINE_TOKENS
        return await off_loop_unless(small, codec.encode_generate_response, results)

    async def UpdateWeights(self, request_iterator, context) -> rollout_pb2.UpdateWeightsResponse:
        payload = await weight_codec.decode_weight_chunks(request_iterator, self._core.max_weight_bytes)
        return codec.encode_update_weights_response(await self._core.update_weights(payload))

    async def LoadWeights(self, request, context) -> rollout_pb2.LoadWeightsResponse:
        applied = await self._core.load_weights(*codec.decode_load_weights_request(request))
        return codec.encode_load_weights_response(applied)

    async def Sleep(self, request, context) -> rollout_pb2.SleepResponse:
        return codec.encode_sleep_response(await self._core.sleep(request.level))

    async def WakeUp(self, request, context) -> rollout_pb2.WakeUpResponse:
        return codec.encode_wake_up_response(await self._core.wake_up(list(request.tags)))

    async def OpenWeightChannel(self, request, context) -> rollout_pb2.OpenWeightChannelResponse:
        transport = await self._core.open_weight_channel(*weight_codec.decode_open_weight_channel(request))
        return codec.encode_open_weight_channel_response(transport)

    async def UpdateWeightsFromChannel(
        self, request, context
    ) -> rollout_pb2.UpdateWeightsFromChannelResponse:
        applied = await self._core.update_weights_from_channel(weight_codec.decode_channel_manifest(request))
        return weight_codec.encode_channel_applied(applied)

    async def CloseWeightChannel(self, request, context) -> rollout_pb2.CloseWeightChannelResponse:
        await self._core.close_weight_channel()
        return rollout_pb2.CloseWeightChannelResponse()

    async def GetStatus(self, request, context) -> rollout_pb2.GetStatusResponse:
        status = self._core.status()
        if self._gateway is not None and self._gateway.port is not None:
            status = dataclasses.replace(status, openai_port=self._gateway.port)
        return codec.encode_status_response(status, admin=caller_is_admin())

    async def OpenAgentSession(self, request, context) -> rollout_pb2.OpenAgentSessionResponse:
        ticket = self._sessions().open_session(*codec.decode_open_agent_session_request(request))
        return codec.encode_open_agent_session_response(ticket)

    async def OpenAgentSessions(self, request, context) -> rollout_pb2.OpenAgentSessionsResponse:
        tickets = self._sessions().open_sessions(*codec.decode_open_agent_sessions_request(request))
        return codec.encode_open_agent_sessions_response(tickets)

    async def GetAgentTrajectory(self, request, context) -> rollout_pb2.GetAgentTrajectoryResponse:
        session_id, close = codec.decode_get_agent_trajectory_request(request)
        found = await self._sessions().trajectory(session_id, close=close)
        small = sum(len(sequence.token_ids) for sequence in found.sequences) <= INLINE_TOKENS
        return await off_loop_unless(small, codec.encode_agent_trajectory, found)

    async def CloseAgentSession(self, request, context) -> rollout_pb2.CloseAgentSessionResponse:
        closed = self._sessions().close_session(codec.decode_close_agent_session_request(request))
        return rollout_pb2.CloseAgentSessionResponse(closed=closed)

    def _sessions(self) -> AgentGateway:
        if self._gateway is None:
            raise FailedPrecondition(
                "this server runs no OpenAI-compatible gateway (start it with --openai-port)"
            )
        return self._gateway
