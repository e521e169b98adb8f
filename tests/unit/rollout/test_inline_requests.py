"""Which Generate requests the servicer decodes on the event loop: only those whose decoding is bounded
small, whatever part of the request (prompts, ids, messages, parts, episode fields) is large."""

from __future__ import annotations

from google.protobuf.struct_pb2 import Struct
from grpo.common.v1 import common_pb2
from grpo.rollout.v1 import rollout_pb2

from rollout_service.api.rollout import INLINE_PROMPTS, small_request
from rollout_service.core.rollout import INLINE_TOKENS


def request(*prompts: rollout_pb2.Prompt) -> rollout_pb2.GenerateRequest:
    return rollout_pb2.GenerateRequest(prompts=prompts)


def test_a_request_is_small_only_while_every_count_is():
    text = rollout_pb2.Prompt(text="x" * 1_000_000)  # one copy, whatever its length
    assert small_request(request(text, rollout_pb2.Prompt(token_ids=range(INLINE_TOKENS - 1))))
    assert not small_request(request(*[rollout_pb2.Prompt(token_ids=[1])] * (INLINE_PROMPTS + 1)))
    assert not small_request(request(rollout_pb2.Prompt(token_ids=range(INLINE_TOKENS + 1))))
    message = common_pb2.ChatMessage(role="user", content="hi")
    assert not small_request(request(rollout_pb2.Prompt(messages=[message] * (INLINE_TOKENS + 1))))
    parts = [common_pb2.ContentPart(text="a")] * INLINE_TOKENS
    assert not small_request(request(rollout_pb2.Prompt(messages=[common_pb2.ChatMessage(parts=parts)])))
    metadata = Struct()
    metadata.update({f"column{i}": i for i in range(INLINE_TOKENS + 1)})
    episode = rollout_pb2.Episode(environment="calculator", metadata=metadata)
    assert not small_request(request(rollout_pb2.Prompt(text="q", episode=episode)))
