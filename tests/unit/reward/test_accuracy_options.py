"""accuracy's math-verify params (presets and single options, checked in the worker) and reasoning_accuracy,
against math-verify and TRL themselves."""

from __future__ import annotations

import pytest
import pytest_asyncio
from latex2sympy2_extended import NormalizationConfig
from math_verify import LatexExtractionConfig, parse, verify
from trl.rewards import reasoning_accuracy_reward

from grpo_runtime.errors import InvalidArgument
from reward_service.checkers.options import MATH_VERIFY, TRL
from reward_service.checkers.pool import CheckerPool
from reward_service.checkers.settings import CheckerSettings
from reward_service.core.types import Sample
from reward_service.rewards.accuracy import (
    Accuracy,
    CosineReward,
    LengthReward,
    ReasoningAccuracy,
    final_answer,
    math_options,
)
from reward_service.rewards.base import ThreadRunner
from reward_service.rewards.params import resolve_params

# (gold, completion): malformed operators, answers without \boxed, plain expressions, several answers.
CASES = [
    (r"$\sqrt{2}$", r"The answer is $\sqrt 2$"),
    (r"$\sqrt{2}$", r"\boxed{\sqrt 2}"),
    (r"$\frac{9}{4}$", r"\boxed{\frac94}"),
    (r"$\frac{9}{4}$", r"so $x = \frac94$"),
    ("42", "The answer is 42."),
    ("42", "I think it is 42"),
    ("42", r"$41$ or rather \boxed{42}"),
    ("42", r"\boxed{41} and later $42$"),
    (r"$\frac{1}{3}$", r"My answer is \boxed{\frac{1}{3}}"),
    ("1/2", "0.5"),
    (r"$x \in [-2, 7]$", r"$-2 \le x \le 7$"),
    ("3", "no number here"),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool():
    p = CheckerPool(CheckerSettings(workers=2, deadline_s=20))
    await p.start()
    yield p
    await p.close()


def _samples(pairs):
    return [Sample(id=str(i), completion=c, metadata={"answer": g}) for i, (g, c) in enumerate(pairs)]


async def _accuracy(pool, pairs, **given):
    reward = Accuracy(pool, ThreadRunner())
    results = await reward.score(_samples(pairs), resolve_params(reward.description.params, given, "p"))
    return [r.value for r in results]


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_math_verify_defaults_are_parse_and_verify_defaults(pool):
    ours = await _accuracy(pool, CASES, defaults="math_verify")
    theirs = [float(verify(parse(g), parse(c))) for g, c in CASES]
    assert ours == theirs
    # The point of the switch: malformed operators repaired, answers without \boxed accepted.
    assert ours[:6] == [1.0] * 6
    trl = await _accuracy(pool, CASES)
    assert trl[:6] != ours[:6] and trl[1:3] == [0.0, 0.0] and trl[4:6] == [0.0, 0.0]


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_single_options_reach_the_worker(pool):
    frac = [(r"$\frac{9}{4}$", r"\boxed{\frac94}")]
    assert await _accuracy(pool, frac) == [0.0]
    assert await _accuracy(pool, frac, normalize_malformed_operators=True) == [1.0]
    plain = [("42", "I think it is 42")]
    assert await _accuracy(pool, plain, extraction=["latex", "expr"]) == [0.0]  # still needs an anchor
    assert await _accuracy(pool, plain, extraction=["latex", "expr"], try_extract_without_anchor=True) == [
        1.0
    ]
    two = [("42", r"$41$ or rather \boxed{42}")]
    assert await _accuracy(pool, two, defaults="math_verify", boxed_match_priority=0) == [1.0]
    assert await _accuracy(pool, two, boxed_match_priority=-1, try_extract_without_anchor=True) == [0.0]
    relation = [(r"$x \in [-2, 7]$", r"\boxed{-2 \le x \le 7}")]
    assert await _accuracy(pool, relation) == [0.0]
    assert await _accuracy(pool, relation, allow_set_relation_comp=True) == [1.0]
    rounded = [("3.14159", r"\boxed{3.14}")]
    assert await _accuracy(pool, rounded) == [0.0]
    assert await _accuracy(pool, rounded, float_rounding=2) == [1.0]
    variables = [("$f(x)$", r"\boxed{f(y)}")]
    assert await _accuracy(pool, variables, strict=False) == [1.0]
    assert await _accuracy(pool, variables) == [0.0]


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_gold_extraction_answer_parses_the_gold_as_the_answer(pool):
    # The gold "$x$ is 7, not \boxed{8}" reads 8 with the answer's \boxed-first extraction, x with parse()'s.
    gold = [(r"$7$, not \boxed{8}", r"\boxed{8}")]
    assert await _accuracy(pool, gold) == [float(verify(parse(gold[0][0]), parse(r"\boxed{8}")))]
    assert await _accuracy(pool, gold, gold_extraction="answer") == [1.0]


def test_options_map_onto_the_presets_and_trl_config():
    reward = Accuracy(None, ThreadRunner())  # type: ignore[arg-type]  # params only
    resolve = lambda **given: math_options(resolve_params(reward.description.params, given, "p"))  # noqa: E731
    assert resolve() == TRL and resolve(defaults="math_verify") == MATH_VERIFY
    tuned = resolve(defaults="math_verify", extraction=["expr"], normalize_nits=False, float_rounding=3)
    assert (
        tuned.targets == ("expr",)
        and not tuned.nits
        and tuned.float_rounding == 3
        and tuned.malformed_operators
    )
    # TRL's own answer config, field for field.
    trl = LatexExtractionConfig(
        normalization_config=NormalizationConfig(units=True),
        boxed_match_priority=0,
        try_extract_without_anchor=False,
    )
    assert (TRL.boxed_match_priority, TRL.try_extract_without_anchor) == (0, False)
    n = trl.normalization_config
    assert (TRL.basic_latex, TRL.units, TRL.malformed_operators, TRL.nits, TRL.boxed, TRL.equations) == (
        n.basic_latex,
        n.units,
        n.malformed_operators,
        n.nits,
        n.boxed,
        n.equations,
    )
    default = LatexExtractionConfig().normalization_config
    assert (MATH_VERIFY.malformed_operators, MATH_VERIFY.nits) == (default.malformed_operators, default.nits)


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_length_and_cosine_judge_correctness_with_the_same_params(pool):
    # "I think it is 42" is right for math-verify's defaults, unreadable (wrong) for TRL's.
    samples = [
        Sample(id="a", completion="I think it is 42", metadata={"answer": "42"}, group="g"),
        Sample(id="b", completion="I think it is 42, surely", metadata={"answer": "42"}, group="g"),
    ]
    cosine, length = CosineReward(pool), LengthReward(pool)
    for reward, trl_values, math_verify_values in (
        (cosine, lambda v: all(x < 0 for x in v), lambda v: all(x > 0 for x in v)),
        (length, lambda v: v == [0.0, -0.5], lambda v: v == [0.5, -0.5]),
    ):
        for given, check in (({}, trl_values), ({"defaults": "math_verify"}, math_verify_values)):
            params = resolve_params(reward.description.params, given, "p")
            values = [r.value for r in await reward.score(samples, params)]
            assert check(values), (reward.description.name, given, values)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"defaults": "sympy"}, "p.defaults"),
        ({"extraction": ["latex", "string"]}, "p.extraction[1]"),
        ({"extraction": ["latex", "latex"]}, "p.extraction[1]"),
        ({"extraction": []}, "p.extraction"),
        ({"extraction": "latex"}, "p.extraction"),
        ({"boxed_match_priority": -2}, "p.boxed_match_priority"),
        ({"normalize_boxed": "first"}, "p.normalize_boxed"),
        ({"normalize_units": "yes"}, "p.normalize_units"),
        ({"float_rounding": 1.5}, "p.float_rounding"),
        ({"normalise_nits": True}, "p.normalise_nits"),
    ],
)
def test_bad_math_params_name_the_field(given, field):
    reward = Accuracy(None, ThreadRunner())  # type: ignore[arg-type]  # params only
    with pytest.raises(InvalidArgument) as err:
        resolve_params(reward.description.params, given, "p")
    assert err.value.field == field


REASONING = [
    (r"\frac{1}{3}", r"<think> Reasoning </think> The final answer is \boxed{\frac{1}{3}}"),
    (r"\frac{1}{3}", r"<think> Reasoning </think> The final answer is \boxed{\frac{1}{2}}"),
    (r"\frac{1}{3}", r"<think> Partial answers \boxed{\frac{1}{3}} but no final answer"),
    (r"\frac{1}{3}", r"<think> \boxed{\frac{1}{3}} </think> so \boxed{\frac{1}{2}}"),
    (r"\frac{1}{3}", r"<think> a </think> b </think> \boxed{\frac{1}{3}}"),
    ("forty two", r"<think> x </think> \boxed{42}"),
    ("forty two", r"no reasoning \boxed{42}"),
    (r"\frac{1}{3}", r"\boxed{\frac{1}{3}}"),
]


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_reasoning_accuracy_matches_trl(pool):
    reward = ReasoningAccuracy(pool)
    for delimiters in (None, ["</think>"], ["</reasoning>", "</think>"], ["</think>", " b "]):
        given = {} if delimiters is None else {"reasoning_delimiters": delimiters}
        params = resolve_params(reward.description.params, given, "p")
        ours = [r.value for r in await reward.score(_samples(REASONING), params)]
        trl = reasoning_accuracy_reward(
            [[{"role": "assistant", "content": c}] for _, c in REASONING],
            [g for g, _ in REASONING],
            reasoning_delimiters=delimiters,
        )
        assert ours == trl, delimiters
    assert trl == [1.0, 0.0, 0.0, 0.0, 1.0, None, 0.0, 0.0]  # the set covers every outcome


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_reasoning_accuracy_takes_the_math_params_and_checks_its_own(pool):
    reward = ReasoningAccuracy(pool)
    params = resolve_params(reward.description.params, {"defaults": "math_verify"}, "p")
    [result] = await reward.score(_samples([("42", "<think>hmm</think> It is 42")]), params)
    assert result.value == 1.0
    [missing] = await reward.score([Sample(id="m", completion="</think> 1")], params)
    assert missing.value is None and "answer" in missing.error
    for bad, field in (
        ([""], "p.reasoning_delimiters[0]"),
        ([], "p.reasoning_delimiters"),
        ([3], "p.reasoning_delimiters[0]"),
    ):
        with pytest.raises(InvalidArgument) as err:
            resolve_params(reward.description.params, {"reasoning_delimiters": bad}, "p")
        assert err.value.field == field


def test_final_answer_split():
    assert final_answer("a </think> b </think> c", ["</think>"]) == " c"
    assert final_answer("a </x> b </think> c", ["</think>", "</x>"]) == " c"  # list order first
    assert final_answer("no delimiter", ["</think>"]) is None
