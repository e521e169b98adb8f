"""json_schema: jsonschema validation and the seed's partial credit."""

from __future__ import annotations

import json
import time

import pytest
import pytest_asyncio

from reward_service.checkers.json_schema import extract_json, partial_credit
from reward_service.checkers.pool import CheckerPool
from reward_service.checkers.settings import CheckerSettings
from reward_service.core.types import Sample
from reward_service.rewards.json_schema import JsonSchemaReward
from reward_service.rewards.params import resolve_params

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool():
    p = CheckerPool(CheckerSettings(workers=1, deadline_s=2))
    await p.start()
    yield p
    await p.close()


def _score(pool, completions, schema=SCHEMA, **given):
    reward = JsonSchemaReward(pool)
    params = resolve_params(reward.description.params, given, "p")
    samples = [
        Sample(id=str(i), completion=c, metadata={"schema": schema}) for i, c in enumerate(completions)
    ]
    return reward.score(samples, params)


@pytest.mark.asyncio(loop_scope="module")
async def test_validation(pool):
    results = await _score(
        pool,
        [
            '{"name": "a", "age": 3, "ok": true}',
            'Sure:\n```json\n{"name": "a", "age": 3, "ok": false}\n```',
            '{"name": "a", "age": -1, "ok": true}',
            '{"name": "a", "age": "3"}',
            "not json",
        ],
    )
    assert [r.value for r in results] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert results[0].error == "" and "age" in results[2].error
    assert "not valid JSON" in results[4].error


@pytest.mark.asyncio(loop_scope="module")
async def test_schema_as_text_and_bad_schema_and_missing(pool):
    ok = await _score(pool, ['{"name": "a", "age": 3, "ok": true}'], schema=json.dumps(SCHEMA))
    assert ok[0].value == 1.0
    bad = await _score(pool, ["{}"], schema={"type": 12})
    assert bad[0].value is None and "schema" in bad[0].error
    reward = JsonSchemaReward(pool)
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


@pytest.mark.asyncio(loop_scope="module")
async def test_partial_credit_option(pool):
    results = await _score(pool, ['{"name": "a", "age": "x", "ok": true}'], partial_credit=True)
    assert results[0].value == pytest.approx(2 / 3)
    assert extract_json(" [1, 2] ") == [1, 2]


@pytest.mark.asyncio(loop_scope="module")
async def test_a_catastrophic_user_pattern_costs_one_sample_a_deadline_error_not_the_process(pool):
    # `re` backtracks on (a|aa)+$ for ~1.6^n steps and never releases the GIL; the check runs in a worker
    # process that is killed at the deadline and replaced.
    hostile = {"type": "string", "pattern": "^(a|aa)+$"}
    keyed = {"type": "object", "patternProperties": {"^(a|aa)+$": {"type": "integer"}}}
    started = time.monotonic()
    results = await _score(pool, [json.dumps("a" * 60 + "b")], schema=hostile)
    keys = await _score(pool, [json.dumps({"a" * 60 + "b": 1})], schema=keyed)
    assert time.monotonic() - started < 15
    for result in (results[0], keys[0]):
        assert result.value is None
        assert "exceeded the per-sample deadline of 2s" in result.error
    # The replaced worker answers the next sample.
    ok = await _score(pool, ['{"name": "a", "age": 3, "ok": true}'])
    assert ok[0].value == 1.0


@pytest.mark.asyncio(loop_scope="module")
async def test_json_nested_past_the_recursion_limit_is_an_error_not_a_crash(pool):
    results = await _score(pool, ["[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000])
    assert all(r.value == 0.0 and "nested too deeply" in r.error for r in results)
    deep_schema = await _score(pool, ["{}"], schema="[" * 100_000)
    assert deep_schema[0].value is None and deep_schema[0].error
