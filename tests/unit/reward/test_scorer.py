"""The Score core without gRPC: validation, Σ weight·value, concurrency bound, stream pipelining."""

from __future__ import annotations

import asyncio
import time

import pytest
import pytest_asyncio

from grpo_runtime.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from reward_service.checkers.pool import CheckerPool
from reward_service.checkers.settings import CheckerSettings
from reward_service.core.scorer import ScoreLimits, Scorer, combine
from reward_service.core.types import ComponentResult, Message, RewardRequest, Sample
from reward_service.models.registry import ModelRegistry
from reward_service.models.settings import ModelSettings
from reward_service.rewards.registry import builtin_rewards
from reward_service.sandbox.runner import SandboxRunner
from reward_service.sandbox.settings import SandboxSettings

pytestmark = pytest.mark.asyncio(loop_scope="module")

SLEEPER = "```python\nimport time\ntime.sleep(0.8)\nprint('ok')\n```"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool():
    p = CheckerPool(CheckerSettings(workers=2, deadline_s=10))
    await p.start()
    yield p
    await p.close()


def make_scorer(pool, *, max_concurrent=8, max_samples=16, code_available=True) -> Scorer:
    runner = SandboxRunner(SandboxSettings(wall_timeout_s=5, concurrency=8))
    builtins = builtin_rewards(pool, runner, code_available, "" if code_available else "refused: test")
    return Scorer(
        builtins,
        ModelRegistry(ModelSettings()),
        max_concurrent=max_concurrent,
        limits=ScoreLimits(max_samples=max_samples),
    )


async def test_combine_weighted_sum_and_unset():
    samples = [Sample(id="a", completion=""), Sample(id="b", completion="")]
    rewards = [RewardRequest("x", 2.0), RewardRequest("y", 0.5), RewardRequest("z", 0.0)]
    columns = [
        [ComponentResult(value=1.0), ComponentResult(error="no")],
        [ComponentResult(value=-1.0), ComponentResult(error="no")],
        [ComponentResult(value=7.0), ComponentResult(error="no")],
    ]
    out = combine(samples, rewards, columns)
    assert out[0].reward == pytest.approx(1.5)
    assert out[1].reward is None
    assert [name for name, _ in out[0].components] == ["x", "y", "z"]


async def test_score_mixed_rewards_with_a_bad_sample(pool):
    scorer = make_scorer(pool)
    samples = [
        Sample(
            id="good",
            completion="<think>\nx\n</think>\n<answer>\n\\boxed{2}\n</answer>",
            metadata={"answer": "2"},
        ),
        Sample(id="no-gold", completion="\\boxed{2}"),
    ]
    rewards = [RewardRequest("accuracy", 1.0), RewardRequest("format", 0.5), RewardRequest("tag_count")]
    out = await scorer.score(samples, rewards)
    assert [r.id for r in out] == ["good", "no-gold"]
    assert out[0].reward == pytest.approx(1.0 + 0.5 + 1.0)
    acc = dict(out[1].components)["accuracy"]
    assert acc.value is None and "answer" in acc.error
    assert out[1].reward == pytest.approx(0.0)  # format 0 and tag_count 0 still have values


@pytest.mark.parametrize(
    ("samples", "rewards", "field"),
    [
        (0, [RewardRequest("format")], "samples"),
        (1, [], "rewards"),
        (1, [RewardRequest("format"), RewardRequest("nope")], "rewards[1].name"),
        (
            1,
            [RewardRequest("format"), RewardRequest("tag_count"), RewardRequest("format")],
            "rewards[2].name",
        ),
        (1, [RewardRequest("prm:missing")], "rewards[0].name"),
        (1, [RewardRequest("format", params={"style": "x"})], "rewards[0].params.style"),
        (1, [RewardRequest("tag_count", params={"k": 1})], "rewards[0].params.k"),
        (1, [RewardRequest("cosine", float("inf"))], "rewards[0].weight"),
    ],
)
async def test_invalid_requests_name_the_field(pool, samples, rewards, field):
    scorer = make_scorer(pool)
    with pytest.raises(InvalidArgument) as err:
        await scorer.score([Sample(id="", completion="x")] * samples, rewards)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("samples", "rewards", "limit"),
    [
        (17, 1, "max_samples=16"),
        (1, 33, "max_rewards=32"),
    ],
)
async def test_counts_past_a_limit_are_resource_exhausted_naming_it(pool, samples, rewards, limit):
    scorer = make_scorer(pool)
    names = [RewardRequest("format")] + [RewardRequest(f"r{i}") for i in range(rewards - 1)]
    with pytest.raises(ResourceExhausted) as err:
        await scorer.score([Sample(id="", completion="x")] * samples, names)
    assert limit in err.value.message


@pytest.mark.parametrize(
    ("sample", "field"),
    [
        (Sample(id="", completion="x" * 101), "samples[1].completion"),
        (
            Sample(id="", completion="", metadata={"schema": {"k": ["y" * 50, "y" * 50]}}),
            "samples[1].metadata",
        ),
        (Sample(id="", completion="", completion_ids=tuple(range(11))), "samples[1].completion_ids"),
        (
            Sample(id="", completion="", prompt=(Message("user", "y" * 60), Message("user", "y" * 60))),
            "samples[1].prompt",
        ),
    ],
)
async def test_over_size_fields_are_invalid_argument_naming_the_field(pool, sample, field):
    scorer = Scorer(
        builtin_rewards(pool, None, False, "off"),
        None,
        max_concurrent=1,
        limits=ScoreLimits(
            max_completion_chars=100, max_completion_ids=10, max_prompt_chars=100, max_metadata_chars=100
        ),
    )
    with pytest.raises(InvalidArgument) as err:
        await scorer.score([Sample(id="", completion="ok"), sample], [RewardRequest("format")])
    assert err.value.field == field and "at most max_" in err.value.message


async def test_unavailable_code_is_refused(pool):
    scorer = make_scorer(pool, code_available=False)
    with pytest.raises(FailedPrecondition) as err:
        await scorer.score([Sample(id="", completion="x")], [RewardRequest("code")])
    assert err.value.field == "rewards[0].name" and "refused" in err.value.message
    code = next(d for d in scorer.describe() if d.name == "code")
    assert not code.available and code.status


async def test_more_concurrent_work_than_the_bound_is_refused_quickly(pool):
    scorer = make_scorer(pool, max_concurrent=1)
    sample = Sample(id="", completion=SLEEPER, metadata={"expected": "ok"})
    first = asyncio.ensure_future(scorer.score([sample], [RewardRequest("code")]))
    await asyncio.sleep(0.1)
    start = time.monotonic()
    with pytest.raises(ResourceExhausted):
        await scorer.score([sample], [RewardRequest("format")])
    assert time.monotonic() - start < 0.1
    assert (await first)[0].reward == 1.0
    assert scorer.in_flight == 0


async def test_stream_keeps_order_and_overlaps_requests(pool):
    scorer = make_scorer(pool)

    async def requests():
        for i in range(3):
            yield (
                [Sample(id=f"r{i}", completion=SLEEPER, metadata={"expected": "ok"})],
                [RewardRequest("code")],
            )
        yield [Sample(id="fast", completion="x")], [RewardRequest("format")]

    start = time.monotonic()
    got = [results[0].id async for results in scorer.score_stream(requests(), window=4)]
    elapsed = time.monotonic() - start
    assert got == ["r0", "r1", "r2", "fast"]
    assert elapsed < 2.0, elapsed  # three 0.8 s programs back to back would take 2.4 s


async def test_stream_ends_with_the_error_of_a_bad_request(pool):
    scorer = make_scorer(pool)

    async def requests():
        yield [Sample(id="ok", completion="x")], [RewardRequest("format")]
        yield [Sample(id="bad", completion="x")], [RewardRequest("nope")]
        yield [Sample(id="never", completion="x")], [RewardRequest("format")]

    seen = []
    with pytest.raises(InvalidArgument):
        async for results in scorer.score_stream(requests(), window=2):
            seen.append(results[0].id)
    assert seen == ["ok"]
