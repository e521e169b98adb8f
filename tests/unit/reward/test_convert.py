"""protobuf -> domain conversion of Score requests: Struct values, non-finite numbers, nesting depth."""

from __future__ import annotations

import pytest
from grpo.reward.v1 import reward_pb2

from grpo_runtime.errors import InvalidArgument
from reward_service.api import convert
from tests.support.hostile_inputs import nested_value


def _request(metadata: dict | None = None, params: dict | None = None) -> reward_pb2.ScoreRequest:
    request = reward_pb2.ScoreRequest()
    sample = request.samples.add(id="s", completion="c")
    sample.metadata.update(metadata or {})
    spec = request.rewards.add(name="format")
    spec.params.update(params or {})
    return request


def test_struct_values_convert_as_json():
    samples, rewards = convert.score_request(
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
        convert.score_request(_request(metadata, params))
    assert error.value.field == field


def test_nesting_is_limited_naming_the_field():
    request = _request()
    request.samples[0].metadata.fields["deep"].CopyFrom(nested_value(convert.MAX_STRUCT_DEPTH - 1))
    assert convert.score_request(request)[0][0].metadata["deep"]  # just within the limit
    request.samples[0].metadata.fields["deep"].CopyFrom(nested_value(convert.MAX_STRUCT_DEPTH))
    with pytest.raises(InvalidArgument, match="nested deeper than 32 levels") as error:
        convert.score_request(request)
    assert error.value.field.startswith("samples[0].metadata.deep[0]")
