"""json_schema: jsonschema validation and the seed's partial credit."""

from __future__ import annotations

import json

import pytest

from reward_service.rewards.json_schema import JsonSchemaReward, extract_json, partial_credit
from reward_service.rewards.params import resolve_params
from reward_service.types import Sample

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
}


def _score(completions, schema=SCHEMA, **given):
    reward = JsonSchemaReward()
    params = resolve_params(reward.description.params, given, "p")
    samples = [
        Sample(id=str(i), completion=c, metadata={"schema": schema}) for i, c in enumerate(completions)
    ]
    return reward.score(samples, params)


async def test_validation():
    results = await _score(
        [
            '{"name": "a", "age": 3, "ok": true}',
            'Sure:\n```json\n{"name": "a", "age": 3, "ok": false}\n```',
            '{"name": "a", "age": -1, "ok": true}',
            '{"name": "a", "age": "3"}',
            "not json",
        ]
    )
    assert [r.value for r in results] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert results[0].error == "" and "age" in results[2].error
    assert "not valid JSON" in results[4].error


async def test_schema_as_text_and_bad_schema_and_missing():
    ok = await _score(['{"name": "a", "age": 3, "ok": true}'], schema=json.dumps(SCHEMA))
    assert ok[0].value == 1.0
    bad = await _score(["{}"], schema={"type": 12})
    assert bad[0].value is None and "schema" in bad[0].error
    reward = JsonSchemaReward()
    missing = await reward.score(
        [Sample(id="", completion="{}")], resolve_params(reward.description.params, {}, "p")
    )
    assert missing[0].value is None and "schema" in missing[0].error


@pytest.mark.parametrize(
    ("instance", "expected"),
    [
        ({"name": "a", "age": 3, "ok": True}, 1.0),
        ({"name": "a", "age": "3", "ok": True}, 2 / 3),
        ({"name": "a", "age": True, "ok": 1}, 1 / 3),
        ({"age": 1}, 1 / 3),
        ([1, 2], 0.0),
    ],
)
def test_partial_credit_fraction(instance, expected):
    assert partial_credit(instance, SCHEMA) == pytest.approx(expected)


async def test_partial_credit_option():
    results = await _score(['{"name": "a", "age": "x", "ok": true}'], partial_credit=True)
    assert results[0].value == pytest.approx(2 / 3)
    assert extract_json(" [1, 2] ") == [1, 2]
