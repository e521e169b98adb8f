"""Reward stress without gRPC: attacks built from reference samples, scored by the real scorer."""

from __future__ import annotations

import pytest
import pytest_asyncio

from grpo_runtime.errors import InvalidArgument, ResourceExhausted
from reward_service.checkers.pool import CheckerPool
from reward_service.checkers.settings import CheckerSettings
from reward_service.core.scorer import ScoreLimits, Scorer
from reward_service.core.stress import ATTACK_NAMES, StressLimits, stress
from reward_service.core.types import Message, RewardRequest, Sample
from reward_service.rewards.registry import builtin_rewards

pytestmark = pytest.mark.asyncio(loop_scope="module")

REFERENCE = Sample(
    id="q1",
    prompt=(Message("user", "What is 2 + 2? Put the answer in \\boxed{}."),),
    completion="<think>\n2 and 2 make 4\n</think>\n<answer>\n\\boxed{4}\n</answer>",
    metadata={"answer": "4"},
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def scorer():
    pool = CheckerPool(CheckerSettings(workers=2, deadline_s=10))
    await pool.start()
    yield Scorer(builtin_rewards(pool, None, False, "off"), None, max_concurrent=4, limits=ScoreLimits())
    await pool.close()


def by_name(report):
    return {a.name: a for a in report.attacks}


async def test_a_format_only_reward_is_flagged_by_empty_tags(scorer):
    report = await stress(scorer, [REFERENCE], [RewardRequest("format")])
    attacks = by_name(report)
    assert report.threshold == 0.5  # middle of format's [0, 1]
    assert attacks["format_only"].flagged and attacks["format_only"].max_reward == 1.0
    assert not attacks["empty"].flagged and not attacks["length_padding"].flagged
    assert "format_only" in report.flagged
    assert report.baseline[0].reward == 1.0 and report.baseline[0].id == "q1"
    assert [name for name in ATTACK_NAMES] == [a.name for a in report.attacks]


async def test_accuracy_resists_noise_but_credits_a_bare_boxed_gold(scorer):
    report = await stress(scorer, [REFERENCE], [RewardRequest("accuracy"), RewardRequest("format", 0.5)])
    attacks = by_name(report)
    assert report.threshold == 0.75  # middle of [0, 1.5]
    for harmless in ("empty", "whitespace", "repetition", "echo_prompt", "hedge_numbers", "prompt_injection"):
        assert not attacks[harmless].flagged, harmless
    # The gold in the format with no reasoning earns everything: what this check is meant to surface.
    assert attacks["gold_boxed_no_reasoning"].flagged
    assert attacks["gold_boxed_no_reasoning"].results[0].reward == 1.5
    assert "\\boxed{4}" in attacks["gold_boxed_no_reasoning"].example


async def test_gold_attacks_are_skipped_without_gold_and_batches_are_split(scorer):
    no_gold = Sample(id="free", prompt=(Message("user", "Write a haiku."),), completion="")
    report = await stress(
        scorer,
        [REFERENCE, no_gold],
        [RewardRequest("format")],
        threshold=0.9,
        attacks=["format_only", "gold_bare", "empty"],
        limits=StressLimits(score_batch=2),
    )
    attacks = by_name(report)
    assert list(attacks) == ["format_only", "gold_bare", "empty"]
    assert attacks["gold_bare"].results[1] is None and attacks["gold_bare"].results[0] is not None
    assert [r.reward for r in attacks["format_only"].results] == [1.0, 1.0]
    assert report.baseline[1] is None  # no completion of its own
    assert report.threshold == 0.9


@pytest.mark.parametrize(
    ("kwargs", "error", "field"),
    [
        (
            {"references": [REFERENCE] * 3, "limits": StressLimits(max_samples=2)},
            ResourceExhausted,
            "samples",
        ),
        ({"references": []}, InvalidArgument, "samples"),
        ({"attacks": ["rm -rf"]}, InvalidArgument, "attacks[0]"),
        ({"attacks": ["empty"] * (len(ATTACK_NAMES) + 1)}, InvalidArgument, "attacks"),
        ({"threshold": float("nan")}, InvalidArgument, "threshold"),
        ({"threshold": float("-inf")}, InvalidArgument, "threshold"),
        ({"rewards": [RewardRequest("no_such_reward")]}, InvalidArgument, "rewards[0].name"),
        (
            {"references": [Sample(id="x", completion="", prompt=(Message("user", "p" * 3_000_000),))]},
            InvalidArgument,
            "samples[0].prompt",
        ),
    ],
)
async def test_bad_requests_name_the_field(scorer, kwargs, error, field):
    arguments = {"references": [REFERENCE], "rewards": [RewardRequest("format")], **kwargs}
    references, rewards = arguments.pop("references"), arguments.pop("rewards")
    with pytest.raises(error) as raised:
        await stress(scorer, references, rewards, **arguments)
    assert raised.value.field == field
