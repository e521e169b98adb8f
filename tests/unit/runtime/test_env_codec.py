"""The environment codec: what one side encodes decodes on the other to the same plain values (through the
bytes gRPC sends), and OpenEpisode requests are read strictly: NaN, nesting and the metadata size refused
with InvalidArgument naming the field."""

from __future__ import annotations

import pytest
from google.protobuf import struct_pb2

from grpo_runtime import env_codec, struct_codec
from grpo_runtime.env_types import (
    EnvironmentInfo,
    Episode,
    EpisodeReward,
    StepOutcome,
    ToolCall,
    ToolDefinition,
    ToolResult,
)
from grpo_runtime.errors import InvalidArgument
from tests.support.hostile_inputs import nested_value


def wire(message):
    return type(message).FromString(message.SerializeToString())


def test_open_episode_request_round_trips():
    params = {"max_turns": 3.0, "mode": "strict"}
    metadata = {"answer": "42", "steps": [1.0, None, {"ok": True}], "empty": {}}
    message = wire(env_codec.encode_open_episode_request("calculator", params, metadata))
    assert message.environment == "calculator"
    assert env_codec.decode_open_episode_request(message) == (params, metadata)


def test_open_episode_request_without_params_or_metadata_reads_as_empty():
    message = wire(env_codec.encode_open_episode_request("calculator"))
    assert env_codec.decode_open_episode_request(message) == ({}, {})


def test_open_episode_response_round_trips():
    schema = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
    episode = Episode(
        episode_id="e1",
        tools=(ToolDefinition("calculator", "evaluates", schema), ToolDefinition("noop", "")),
        prompt_suffix="Use the tools.",
    )
    assert (
        env_codec.decode_open_episode_response(wire(env_codec.encode_open_episode_response(episode)))
        == episode
    )


def test_step_request_and_response_round_trip():
    calls = [ToolCall("calculator", '{"expression": "6*7"}', id="c1"), ToolCall("noop")]
    message = wire(env_codec.encode_step_request("e1", calls))
    assert message.episode_id == "e1"
    assert env_codec.decode_step_request(message) == calls
    outcome = StepOutcome(
        results=(
            ToolResult("c1", "calculator", "42"),
            ToolResult("", "noop", "bad", error=True, truncated=True),
        ),
        done=True,
    )
    assert env_codec.decode_step_response(wire(env_codec.encode_step_response(outcome))) == outcome


@pytest.mark.parametrize("reward", [EpisodeReward(0.0), EpisodeReward(1.5), EpisodeReward(None, "failed")])
def test_get_reward_response_round_trips_keeping_none_apart_from_zero(reward):
    assert env_codec.decode_get_reward_response(wire(env_codec.encode_get_reward_response(reward))) == reward


def test_list_environments_response_round_trips_in_order():
    environments = [
        EnvironmentInfo(
            name="python", description="runs code", kind="sandbox", available=False, status="no runsc"
        ),
        EnvironmentInfo(name="calculator", description="arithmetic", kind="functions", available=True),
    ]
    message = wire(env_codec.encode_list_environments_response(environments))
    assert env_codec.decode_list_environments_response(message) == environments


@pytest.mark.parametrize(
    ("params", "metadata", "field"),
    [
        ({"turns": float("nan")}, None, "params.turns"),
        (None, {"x": [1, {"y": float("inf")}]}, "metadata.x[1].y"),
    ],
)
def test_non_finite_numbers_are_invalid_argument_naming_the_path(params, metadata, field):
    message = wire(env_codec.encode_open_episode_request("calculator", params, metadata))
    with pytest.raises(InvalidArgument, match="must be a finite number") as error:
        env_codec.decode_open_episode_request(message)
    assert error.value.field == field


def test_nesting_is_limited_naming_the_field():
    message = env_codec.encode_open_episode_request("calculator")
    message.metadata.fields["deep"].CopyFrom(nested_value(struct_codec.MAX_STRUCT_DEPTH - 1))
    assert env_codec.decode_open_episode_request(message)[1]["deep"]  # just within the limit
    message.params.fields["deep"].CopyFrom(nested_value(struct_codec.MAX_STRUCT_DEPTH))
    with pytest.raises(InvalidArgument, match="nested deeper than 32 levels") as error:
        env_codec.decode_open_episode_request(message)
    assert error.value.field.startswith("params.deep[0]")


def test_metadata_past_its_limit_is_refused_before_the_rest_is_read():
    metadata = {"x": [None] * 97}  # 1 + 1 for the key + 1 + 97 characters, as json_chars counts them
    message = env_codec.encode_open_episode_request("calculator", metadata=metadata)
    assert env_codec.decode_open_episode_request(message, max_metadata_chars=100)[1] == metadata
    message.metadata.fields["x"].list_value.values.add().number_value = float("nan")  # past the limit
    with pytest.raises(InvalidArgument, match="more than max_metadata_chars=100 characters") as error:
        env_codec.decode_open_episode_request(message, max_metadata_chars=100)
    assert error.value.field == "metadata"  # the NaN after the limit was never reached


def test_params_have_no_size_limit_of_their_own():
    """Their count is the registry's check (check_open, before conversion); the size limit is metadata's."""
    message = env_codec.encode_open_episode_request("calculator", params={"x": "y" * 1000})
    assert env_codec.decode_open_episode_request(message, max_metadata_chars=10) == ({"x": "y" * 1000}, {})


def test_an_unset_value_reads_as_json_null():
    message = env_codec.encode_open_episode_request("calculator")
    message.metadata.fields["unset"].CopyFrom(struct_pb2.Value())
    assert env_codec.decode_open_episode_request(message)[1] == {"unset": None}
