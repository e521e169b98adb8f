"""The reward codec: what the client encodes decodes on the server to the same samples and rewards and back
(through the bytes gRPC sends); reading Score requests: Struct values, non-finite numbers, nesting depth, the
metadata size limit applied while converting, and field paths that cost nothing until an error names one."""

from __future__ import annotations

import math

import pytest
from google.protobuf import struct_pb2
from grpo.common.v1 import common_pb2
from grpo.reward.v1 import reward_pb2

from grpo_runtime import struct_codec
from grpo_runtime.errors import InvalidArgument
from reward_service import codec
from reward_service.core.scorer import ScoreLimits, json_chars
from reward_service.core.types import (
    ComponentResult,
    Message,
    ParamInfo,
    RewardDescription,
    RewardRequest,
    Sample,
    SampleResult,
)
from tests.support.hostile_inputs import nested_value


def _request(metadata: dict | None = None, params: dict | None = None) -> reward_pb2.ScoreRequest:
    request = reward_pb2.ScoreRequest()
    sample = request.samples.add(id="s", completion="c")
    sample.metadata.update(metadata or {})
    spec = request.rewards.add(name="format")
    spec.params.update(params or {})
    return request


def test_struct_values_convert_as_json():
    samples, rewards = codec.decode_score_request(
        _request({"a": 3, "b": "x", "c": [True, None, {"d": 1.5}], "e": {}}, {"style": "r1"})
    )
    assert samples[0].metadata == {"a": 3.0, "b": "x", "c": [True, None, {"d": 1.5}], "e": {}}
    assert rewards[0].params == {"style": "r1"}


@pytest.mark.parametrize(
    ("metadata", "params", "field"),
    [
        ({"answer": float("nan")}, None, "samples[0].metadata.answer"),
        ({"x": [1, {"y": float("inf")}]}, None, "samples[0].metadata.x[1].y"),
        (None, {"min_steps": float("-inf")}, "rewards[0].params.min_steps"),
    ],
)
def test_non_finite_numbers_are_invalid_argument_naming_the_path(metadata, params, field):
    with pytest.raises(InvalidArgument, match="must be a finite number") as error:
        codec.decode_score_request(_request(metadata, params))
    assert error.value.field == field


def test_nesting_is_limited_naming_the_field():
    request = _request()
    request.samples[0].metadata.fields["deep"].CopyFrom(nested_value(struct_codec.MAX_STRUCT_DEPTH - 1))
    assert codec.decode_score_request(request)[0][0].metadata["deep"]  # just within the limit
    request.samples[0].metadata.fields["deep"].CopyFrom(nested_value(struct_codec.MAX_STRUCT_DEPTH))
    with pytest.raises(InvalidArgument, match="nested deeper than 32 levels") as error:
        codec.decode_score_request(request)
    assert error.value.field.startswith("samples[0].metadata.deep[0]")


LIMITS = ScoreLimits(max_metadata_chars=500, max_completion_ids=100, max_prompt_chars=50)


def _nulls(count: int) -> struct_pb2.Value:
    """A list of ``count`` nulls: ``count + 1`` characters as json_chars counts them."""
    value = struct_pb2.Value()
    for _ in range(count):
        value.list_value.values.add().null_value = struct_pb2.NULL_VALUE
    return value


def _sized_request(chars: int, tail: struct_pb2.Value | None = None) -> reward_pb2.ScoreRequest:
    """One sample whose metadata ``{"x": [null, ...]}`` is ``chars`` characters (1 + 1 for the key + the
    list), with ``tail`` appended to the list past that."""
    request = _request()
    value = _nulls(chars - 3)
    if tail is not None:
        value.list_value.values.add().CopyFrom(tail)
    request.samples[0].metadata.fields["x"].CopyFrom(value)
    return request


def test_metadata_at_the_limit_converts_and_counts_as_the_scorer_does():
    samples, _ = codec.decode_score_request(_sized_request(500), LIMITS)
    assert json_chars(samples[0].metadata) == 500


def test_metadata_past_the_limit_is_refused_before_the_rest_is_read():
    nan = struct_pb2.Value(number_value=float("nan"))
    with pytest.raises(InvalidArgument, match="more than max_metadata_chars=500 characters") as error:
        codec.decode_score_request(_sized_request(501, tail=nan), LIMITS)
    # The NaN after the limit was never reached: the error is about size, naming the whole Struct.
    assert error.value.field == "samples[0].metadata"
    samples, _ = codec.decode_score_request(_sized_request(501))  # no limit: the same metadata converts
    assert json_chars(samples[0].metadata) == 501


def test_field_paths_are_built_only_for_the_error_and_cut_long_keys():
    """A long key above many values: each value used to get its own copy of the path (quadratic); now
    the path exists only in the error, and a key in it is cut to PATH_KEY_CHARS."""
    request = _request()
    key = "k" * 2_000_000
    inner = request.samples[0].metadata.fields[key].struct_value
    for i in range(100_000):  # 100k copies of a 2 MB path would be 200 GB
        inner.fields[str(i)].null_value = struct_pb2.NULL_VALUE
    inner.fields["bad"].list_value.values.add().number_value = float("inf")
    with pytest.raises(InvalidArgument, match="must be a finite number") as error:
        codec.decode_score_request(request)
    assert error.value.field == f"samples[0].metadata.{'k' * struct_codec.PATH_KEY_CHARS}....bad[0]"


def test_token_ids_and_prompt_messages_past_the_limits_are_refused_by_count():
    request = _request()
    request.samples[0].completion_ids.extend([7] * 100)
    for _ in range(50):
        request.samples[0].prompt.add(role="u")
    samples, _ = codec.decode_score_request(request, LIMITS)
    assert len(samples[0].completion_ids) == 100 and len(samples[0].prompt) == 50
    request.samples[0].prompt.add()  # no role: the count is checked before any message is read
    with pytest.raises(InvalidArgument, match="51 messages, more than max_prompt_chars=50") as error:
        codec.decode_score_request(request, LIMITS)
    assert error.value.field == "samples[0].prompt"
    request.samples[0].completion_ids.append(7)
    with pytest.raises(InvalidArgument, match="101 token ids, at most max_completion_ids=100") as error:
        codec.decode_score_request(request, LIMITS)
    assert error.value.field == "samples[0].completion_ids"


def wire(message):
    return type(message).FromString(message.SerializeToString())


def test_a_score_request_decodes_to_the_samples_and_rewards_the_client_sent():
    samples = [
        Sample(
            id="0",
            completion="<think>4</think>",
            prompt=(Message("system", "be brief"), Message("user", "2 + 2?")),
            completion_ids=(5, 6),
            metadata={"answer": "4", "tests": [{"in": "x"}]},
            group="g0",
        ),
        Sample(id="1", completion=""),
    ]
    rewards = [RewardRequest("accuracy"), RewardRequest("format", 0.5, {"style": "think"})]
    request = wire(codec.encode_score_request(samples, rewards))
    assert codec.decode_score_request(request) == (samples, rewards)


def test_scores_decode_to_what_the_server_encoded_and_a_non_finite_value_becomes_an_error():
    results = [
        SampleResult(
            "0", 0.75, [("accuracy", ComponentResult(1.0)), ("format", ComponentResult(0.5, [0.1, 0.2]))]
        ),
        SampleResult("1", None, [("accuracy", ComponentResult(None, error="no answer"))]),
    ]
    assert codec.decode_score_response(wire(codec.encode_score_response(results))) == results
    (poisoned,) = codec.decode_score_response(
        codec.encode_score_response([SampleResult("2", math.inf, [("judge", ComponentResult(math.nan))])])
    )
    assert poisoned == SampleResult(
        "2", None, [("judge", ComponentResult(None, error="non-finite value nan"))]
    )


def test_reward_descriptions_decode_to_what_the_server_encoded():
    descriptions = [
        RewardDescription(
            name="cosine",
            description="length-scaled correctness",
            params=(
                ParamInfo("max_len", "integer", 1000.0, "length cap"),
                ParamInfo("note", "string", None, ""),
            ),
            required_metadata=("answer",),
            min_value=-1.0,
            max_value=1.0,
            group_aware=True,
            available=False,
            status="needs math-verify",
        ),
        RewardDescription(name="format", description="tags"),
    ]
    response = wire(codec.encode_list_rewards_response(descriptions))
    assert codec.decode_list_rewards_response(response) == descriptions


def test_prompt_text_parts_are_joined_and_an_image_part_is_refused_naming_it():
    message = reward_pb2.Sample(completion="4")
    message.prompt.add(role="user").parts.add(text="What is")
    message.prompt[0].parts.add(text="2 + 2?")
    assert codec.decode_sample(message, 0).prompt[0].content == "What is\n2 + 2?"
    message.prompt[0].parts.add(image=common_pb2.Image(data=b"\x89PNG", media_type="image/png"))
    with pytest.raises(InvalidArgument) as error:
        codec.decode_sample(message, 5)
    assert error.value.field == "samples[5].prompt[0].parts[2].image"
