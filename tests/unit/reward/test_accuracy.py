"""accuracy / length / cosine through the math-verify worker pool, against TRL and open-r1 formulas."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
import pytest_asyncio
from trl.rewards import accuracy_reward, get_cosine_scaled_reward

from reward_service.checkers.pool import MAX_JOB_ITEMS, CheckerPool
from reward_service.checkers.settings import CheckerSettings
from reward_service.core.types import Sample
from reward_service.rewards.accuracy import (
    Accuracy,
    CosineReward,
    LengthReward,
    extract_number,
    numeric_value,
)
from reward_service.rewards.base import ThreadRunner
from reward_service.rewards.params import resolve_params

pytestmark = pytest.mark.asyncio(loop_scope="module")

# (gold, completion): LaTeX, fractions, intervals, percentages, sets, units, wrong answers, unparseable golds.
CASES = [
    (r"\frac{1}{3}", r"My answer is \boxed{\frac{1}{3}}"),
    (r"\frac{1}{3}", r"My answer is \boxed{\frac{1}{2}}"),
    (r"\frac{1}{3}", r"So it is \boxed{\frac{2}{6}}."),
    (r"$\frac{1}{3}$", r"The answer is $0.3333333$"),
    ("0.5", r"\boxed{\frac{1}{2}}"),
    ("42", r"The answer is \boxed{42}."),
    ("42", r"The answer is 42."),
    ("42", r"\boxed{43}"),
    (r"$(1, 2]$", r"The interval is $\boxed{(1,2]}$"),
    (r"$(1, 2]$", r"The interval is $\boxed{[1,2]}$"),
    (r"$[-\infty, 3)$", r"\boxed{(-\infty, 3)}"),
    (r"$50\%$", r"\boxed{50\%}"),
    (r"$50\%$", r"\boxed{0.5}"),
    (r"$\{1, 2, 3\}$", r"\boxed{\{3, 2, 1\}}"),
    (r"$\{1, 2, 3\}$", r"\boxed{\{1, 2\}}"),
    (r"$x^2 + 2x + 1$", r"\boxed{(x+1)^2}"),
    (r"$\sqrt{2}$", r"\boxed{\frac{2}{\sqrt{2}}}"),
    (r"$10\text{ cm}$", r"\boxed{10 \text{ cm}}"),
    (r"$x = 5$", r"Therefore $\boxed{5}$"),
    (r"$2\pi$", r"\boxed{6.283185307}"),
    (r"$\begin{pmatrix} 1 \\ 2 \end{pmatrix}$", r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}"),
    ("-3", r"\boxed{-3}"),
    ("1,000", r"\boxed{1000}"),
    ("hello world", r"\boxed{1}"),
    ("", r"\boxed{1}"),
    (r"\frac{1}{3}", "no answer here"),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool():
    p = CheckerPool(CheckerSettings(workers=2, deadline_s=10))
    await p.start()
    yield p
    await p.close()


def _samples(pairs, **kw):
    return [Sample(id=str(i), completion=c, metadata={"answer": g}, **kw) for i, (g, c) in enumerate(pairs)]


@pytest.mark.slow
async def test_accuracy_agrees_with_trl(pool):
    reward = Accuracy(pool, ThreadRunner())
    params = resolve_params(reward.description.params, {}, "p")
    ours = await reward.score(_samples(CASES), params)
    trl = accuracy_reward([[{"role": "assistant", "content": c}] for _, c in CASES], [g for g, _ in CASES])
    assert [r.value for r in ours] == trl
    for r, expected in zip(ours, trl, strict=True):
        assert bool(r.error) == (expected is None)
    assert {1.0, 0.0, None} <= set(trl)  # the set exercises every outcome


async def test_accuracy_missing_metadata_and_answer_key(pool):
    reward = Accuracy(pool, ThreadRunner())
    samples = [
        Sample(id="a", completion=r"\boxed{2}"),
        Sample(id="b", completion=r"\boxed{2}", metadata={"solution": "2"}),
    ]
    default = await reward.score(samples, resolve_params(reward.description.params, {}, "p"))
    assert default[0].value is None and "answer" in default[0].error
    keyed = await reward.score(
        samples, resolve_params(reward.description.params, {"answer_key": "solution"}, "p")
    )
    assert keyed[1].value == 1.0 and keyed[0].value is None


async def test_numeric_mode_tolerances(pool):
    assert extract_number("reasoning #### 1,234.5") == 1234.5
    assert extract_number(r"so \boxed{-3} and later 7") == -3.0
    assert extract_number("the total is 12 apples") == 12.0
    assert numeric_value("10", "#### 10.00005").value == 1.0
    assert numeric_value("10", "#### 10.005").value == 0.6
    assert numeric_value("10", "#### 10.5").value == 0.0
    assert numeric_value("10", "no number").value == 0.0
    assert numeric_value("ten", "10").value is None
    reward = Accuracy(pool, ThreadRunner())
    params = resolve_params(reward.description.params, {"mode": "numeric"}, "p")
    got = await reward.score(_samples([("3.14159", "#### 3.1416"), ("2", r"\boxed{2.009}")]), params)
    assert [r.value for r in got] == [1.0, 0.6]


async def test_cosine_matches_trl_with_tokens(pool):
    reward = CosineReward(pool)
    params = resolve_params(reward.description.params, {"max_len": 100, "unit": "tokens"}, "p")
    pairs = [(r"\frac{1}{3}", r"\boxed{\frac{1}{3}}"), (r"\frac{1}{3}", r"\boxed{\frac{1}{2}}")] * 2
    lengths = [50, 50, 10, 150]
    samples = [
        Sample(id="", completion=c, completion_ids=(1,) * n, metadata={"answer": g})
        for (g, c), n in zip(pairs, lengths, strict=True)
    ]
    ours = [r.value for r in await reward.score(samples, params)]
    trl = get_cosine_scaled_reward(max_len=100)(
        [[{"content": c}] for _, c in pairs], [g for g, _ in pairs], [[1] * n for n in lengths]
    )
    assert ours == pytest.approx(trl)
    assert ours[:2] == pytest.approx([0.75, -0.75])  # TRL's golden values


async def test_cosine_chars_without_clamp_is_open_r1(pool):
    reward = CosineReward(pool)
    params = resolve_params(reward.description.params, {"max_len": 20, "clamp": False}, "p")
    text = r"\boxed{\frac{1}{3}}" + " " * 11  # 30 chars, past max_len
    got = (await reward.score(_samples([(r"\frac{1}{3}", text)]), params))[0].value
    expected = 0.5 + 0.5 * (1.0 - 0.5) * (1 + math.cos(math.pi * 30 / 20))
    assert got == pytest.approx(expected)


async def test_length_reward_kimi_per_group(pool):
    reward = LengthReward(pool)
    params = resolve_params(reward.description.params, {}, "p")
    right, wrong = r"\boxed{2}", r"\boxed{3}"
    group_a = [right, right + " padding padding", wrong + " pad", wrong]
    group_b = [right + "x" * 10, right]
    samples = [Sample(id="", completion=c, metadata={"answer": "2"}, group="a") for c in group_a]
    samples += [Sample(id="", completion=c, metadata={"answer": "2"}, group="b") for c in group_b]
    got = [r.value for r in await reward.score(samples, params)]

    def kimi(texts, correct):
        lens = [len(t) for t in texts]
        lo, hi = min(lens), max(lens)
        lams = [0.5 - (n - lo) / (hi - lo) for n in lens]
        return [lam if ok else min(0.0, lam) for lam, ok in zip(lams, correct, strict=True)]

    assert got[:4] == pytest.approx(kimi(group_a, [True, True, False, False]))
    assert got[4:] == pytest.approx(kimi(group_b, [True, True]))
    same = await reward.score(_samples([("2", right), ("2", right)]), params)
    assert [r.value for r in same] == [0.0, 0.0]
    unparseable = await reward.score(_samples([("nonsense words", right), ("2", wrong)]), params)
    assert unparseable[0].value is None and unparseable[0].error


async def test_hanging_verification_is_killed_replaced_and_reported(pool):
    replaced = pool.replaced
    start = time.monotonic()
    value, error = await pool.check("1", r"\boxed{9^{9^{9^{9}}}}", deadline_s=1.0)
    assert value is None and error.startswith("exceeded the per-sample deadline of 1s (checkers.deadline_s)")
    assert time.monotonic() - start < 5
    # The killed worker is replaced: the pool keeps its size and keeps answering.
    for _ in range(100):
        if pool.replaced > replaced and pool.alive == pool.size:
            break
        await asyncio.sleep(0.1)
    assert pool.replaced == replaced + 1
    assert await pool.check("2", r"\boxed{2}") == (1.0, "")


async def test_a_hanging_answer_in_a_group_costs_the_others_of_its_job_only_a_retry(pool):
    # One job carries the group; the answers before the hanging one keep their results, the ones after it
    # run again on the replacement worker.
    replaced = pool.replaced
    completions = [r"\boxed{1}", r"\boxed{2}", r"\boxed{9^{9^{9^{9}}}}", r"\boxed{1}", r"\boxed{3}"]
    results = await pool.check_many("1", completions, deadline_s=2.0)
    assert results[:2] == [(1.0, ""), (0.0, "")]
    assert results[2][0] is None and "per-sample deadline of 2s" in results[2][1]
    assert results[3:] == [(1.0, ""), (0.0, "")]
    assert pool.replaced == replaced + 1


async def test_a_group_larger_than_a_job_is_checked_in_order(pool):
    completions = [rf"\boxed{{{n % 3}}}" for n in range(3 * MAX_JOB_ITEMS + 1)]
    results = await pool.check_many("1", completions)
    assert results == [(1.0 if n % 3 == 1 else 0.0, "") for n in range(len(completions))]


async def test_batch_runs_in_parallel_over_workers(pool):
    # While one worker hangs on a sample, the other keeps verifying the rest of the batch.
    hang = pool.check("1", r"\boxed{9^{9^{9^{9}}}}", deadline_s=3.0)
    quick = [pool.check("2", r"\boxed{2}") for _ in range(20)]
    start = time.monotonic()
    results = await asyncio.gather(hang, *quick)
    assert results[0][0] is None and "deadline" in results[0][1]
    assert all(r == (1.0, "") for r in results[1:])
    assert time.monotonic() - start < 6


@pytest.mark.slow
async def test_math_verify_own_timeout_in_the_worker_is_an_error_not_a_zero():
    # SIGALRM works in the worker's main thread: math-verify's 1 s comparison timeout fires well before the
    # hard deadline, and the sample reports it instead of TRL's silent False.
    small = CheckerPool(CheckerSettings(workers=1, parse_timeout_s=1, verify_timeout_s=1, deadline_s=30))
    await small.start()
    try:
        start = time.monotonic()
        value, error = await small.check("1", r"\boxed{9^{9^{9^{9}}}}")
        assert value is None and "timed out" in error and "comparison" in error
        assert time.monotonic() - start < 10
        assert small.replaced == 0  # no kill needed
    finally:
        await small.close()


async def test_a_cancelled_caller_frees_its_worker_within_the_grace_not_the_deadline(pool):
    replaced = pool.replaced
    hang = asyncio.ensure_future(pool.check("1", r"\boxed{9^{9^{9^{9}}}}", deadline_s=60.0))
    await asyncio.sleep(1.0)  # the worker is busy on it
    cancelled = time.monotonic()
    hang.cancel()
    for _ in range(100):
        if pool.replaced > replaced:
            break
        await asyncio.sleep(0.1)
    # Killed after ABANDONED_GRACE_S (1 s), not after the 60 s deadline.
    assert pool.replaced == replaced + 1 and time.monotonic() - cancelled < 8
    for _ in range(300):
        if pool.alive == pool.size:
            break
        await asyncio.sleep(0.1)
    assert pool.alive == pool.size
    assert await pool.check("3", r"\boxed{3}") == (1.0, "")


async def test_a_configured_timeout_value_is_given_with_the_deadline_error():
    small = CheckerPool(CheckerSettings(workers=1, deadline_s=1.0, timeout_value=0.0))
    await small.start()
    try:
        value, error = await small.check("1", r"\boxed{9^{9^{9^{9}}}}")
        assert value == 0.0 and "per-sample deadline of 1s" in error
    finally:
        await small.close()


async def test_the_standby_worker_takes_a_killed_workers_place_at_once():
    single = CheckerPool(CheckerSettings(workers=1, deadline_s=1.0))
    await single.start()
    try:
        for _ in range(600):
            if single.standby_ready:
                break
            await asyncio.sleep(0.1)
        assert single.standby_ready
        value, error = await single.check("1", r"\boxed{9^{9^{9^{9}}}}")
        assert value is None and "deadline" in error
        started = time.monotonic()
        # The only worker was killed; the standby answers without a spawn and import (seconds).
        assert await single.check("2", r"\boxed{2}") == (1.0, "")
        assert time.monotonic() - started < 2 and single.alive == single.size
    finally:
        await single.close()
