"""reasoning_gym:<task> rewards: the task's score_answer on the answer taken from the completion, run in the
checker pool's worker processes (deadline, memory limit) with the entry's metadata bounded."""

from __future__ import annotations

import asyncio
import json
import operator

import pytest
import pytest_asyncio
import reasoning_gym

from reward_service.checkers.pool import CheckerPool
from reward_service.checkers.reasoning_gym import score_entry
from reward_service.checkers.reasoning_gym_tasks import offered_tasks
from reward_service.checkers.settings import CheckerSettings
from reward_service.core.types import Message, Sample
from reward_service.rewards.params import resolve_params
from reward_service.rewards.reasoning_gym import (
    PARAMS,
    ReasoningGymReward,
    extract_answer,
    reasoning_gym_rewards,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

DEADLINE_S = 5.0
# An answer that makes rush_hour's score_answer step a car 10**15 times, one blocked step at a time: hours.
ENDLESS_RUSH_HOUR = "<answer>A+1000000000000000</answer>"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool():
    p = CheckerPool(CheckerSettings(workers=2, deadline_s=DEADLINE_S, memory_mb=128))
    await p.start()
    yield p
    await p.close()


def entry_sample(task: str, completion: str, *, index: int = 0, as_text: bool = True, **changes) -> Sample:
    entry = reasoning_gym.create_dataset(task, size=index + 1, seed=7)[index]
    metadata = {**entry["metadata"], **changes}
    return Sample(
        id=f"{task}-{index}",
        completion=completion,
        prompt=(Message("user", entry["question"]),),
        metadata={"answer": entry["answer"], "reasoning_gym": json.dumps(metadata) if as_text else metadata},
    )


def gold(task: str, index: int = 0) -> str:
    return reasoning_gym.create_dataset(task, size=index + 1, seed=7)[index]["answer"]


async def score(task: str, samples: list[Sample], pool: CheckerPool, **params) -> list:
    reward = ReasoningGymReward(task, pool)
    return await reward.score(samples, resolve_params(PARAMS, params, "rewards[0].params"))


@pytest.mark.parametrize("task", ["leg_counting", "spell_backward", "chain_sum", "word_sorting"])
async def test_correct_answers_score_one_and_wrong_ones_less(pool, task):
    right = entry_sample(task, f"<think>\ncounting\n</think>\n<answer>{gold(task)}</answer>")
    wrong = entry_sample(task, "<answer>definitely not it</answer>")
    untagged = entry_sample(task, gold(task))  # the gold outside any <answer> tag
    values = [r.value for r in await score(task, [right, wrong, untagged], pool)]
    assert values[0] == 1.0
    assert values[1] < 1.0 and values[2] == 0.0


async def test_a_worker_imports_reasoning_gym_at_its_first_job_outside_its_deadline_and_memory_limit():
    # A 1 s deadline and a 64 MiB budget: the import (about 1.3 s and 200 MiB) fits in neither.
    small = CheckerPool(CheckerSettings(workers=1, deadline_s=1.0, memory_mb=64, standby=False))
    await small.start()
    try:
        task = "leg_counting"
        results = await score(task, [entry_sample(task, f"<answer>{gold(task)}</answer>")], small)
        assert results[0].value == 1.0 and small.replaced == 0
    finally:
        await small.close()


async def test_entry_metadata_as_object_and_as_json_text_score_alike(pool):
    task = "leg_counting"
    completion = f"<answer>{gold(task, 1)}</answer>"
    results = await score(
        task,
        [entry_sample(task, completion, index=1), entry_sample(task, completion, index=1, as_text=False)],
        pool,
    )
    assert [r.value for r in results] == [1.0, 1.0]


async def test_answer_formats(pool):
    assert extract_answer("a <answer> x </answer> b <answer>y</answer>", "answer_tag") == "y"
    assert extract_answer("no tag", "answer_tag") is None
    assert extract_answer("reasoning\n42\n\n", "last_line") == "42"
    assert extract_answer("  42 ", "full") == "42"
    task = "chain_sum"
    last_line = entry_sample(task, f"I add them up.\n{gold(task)}")
    assert (await score(task, [last_line], pool, answer_format="last_line"))[0].value == 1.0


async def test_hostile_metadata_and_answers_are_sample_errors_or_zero(pool):
    task = "leg_counting"
    good = entry_sample(task, "<answer>1</answer>")
    other_task = entry_sample("spell_backward", f"<answer>{gold(task)}</answer>")
    broken = Sample(id="b", completion="<answer>1</answer>", metadata={"answer": "1", "reasoning_gym": "{"})
    wrong_type = Sample(id="t", completion="<answer>1</answer>", metadata={"reasoning_gym": 5})
    missing = Sample(id="m", completion="<answer>1</answer>")
    huge = entry_sample(task, "<answer>" + "1" * 20_000 + "</answer>")
    # Linear extraction: a megabyte of unclosed tags is answered at once.
    flood = entry_sample(task, "<answer>" * 200_000)
    # More digits than int() converts, and nesting deeper than the parser recurses.
    digits = Sample(
        id="d", completion="<answer>1</answer>", metadata={"reasoning_gym": '{"n": ' + "9" * 5000 + "}"}
    )
    nested = Sample(id="n", completion="<answer>1</answer>", metadata={"reasoning_gym": "[" * 100_000})
    results = await score(
        task, [good, other_task, broken, wrong_type, missing, huge, flood, digits, nested], pool
    )
    assert results[0].value is not None and not results[0].error
    assert "spell_backward" in results[1].error and results[1].value is None
    assert "not JSON" in results[2].error
    assert "must be an object" in results[3].error
    assert "'reasoning_gym' is required" in results[4].error
    assert results[5].value == 0.0  # longer than max_answer_chars
    assert results[6].value == 0.0
    assert results[7].value is None and "not JSON" in results[7].error
    assert results[8].value is None and "nested too deeply" in results[8].error


async def test_metadata_that_sizes_the_work_is_bounded_and_named(pool):
    """tower_of_hanoi's score_answer builds num_pegs pegs and num_disks disks from the metadata: 10**9 of
    either is gigabytes. Past the task's hardest curriculum level it is the sample's error naming the field;
    within it, it scores."""
    task = "tower_of_hanoi"
    answer = f"<answer>{gold(task)}</answer>"
    pegs = entry_sample(task, answer, num_pegs=10**9)
    disks = entry_sample(task, answer, as_text=False, num_disks=1e9)
    nan = entry_sample(task, answer, num_disks=float("nan"))
    fine = entry_sample(task, answer)
    results = await score(task, [pegs, disks, nan, fine], pool)
    assert results[0].value is None and "reasoning_gym.num_pegs is 1000000000" in results[0].error
    assert results[1].value is None and "reasoning_gym.num_disks" in results[1].error
    assert results[2].value is None and "reasoning_gym.num_disks is nan" in results[2].error
    assert results[3].value == 1.0, results[3].error


async def test_a_job_past_the_memory_limit_is_an_error_naming_it_and_the_worker_stays(pool):
    replaced = pool.replaced
    value, error = await pool.run(operator.mul, "x", 1 << 30, key="memory")  # a GiB string
    assert value is None and "memory limit of 128 MiB (checkers.memory_mb)" in error
    assert pool.replaced == replaced  # MemoryError unwinds; nothing had to be killed
    task = "leg_counting"
    results = await score(task, [entry_sample(task, f"<answer>{gold(task)}</answer>")], pool)
    assert results[0].value == 1.0


async def test_an_endless_score_answer_is_killed_and_replaced_while_other_samples_score(pool):
    replaced = pool.replaced
    endless = entry_sample("rush_hour", ENDLESS_RUSH_HOUR)
    task = "leg_counting"
    right = entry_sample(task, f"<answer>{gold(task)}</answer>")
    stuck = asyncio.ensure_future(score("rush_hour", [endless], pool))
    # A sample queued at the same moment could be pipelined behind it (and wait for the kill): let a worker
    # take it alone first. The other worker keeps scoring while that one grinds on the endless answer.
    await asyncio.sleep(0.5)
    for _ in range(5):
        assert [r.value for r in await score(task, [right] * 4, pool)] == [1.0] * 4
    assert not stuck.done()
    (result,) = await stuck
    assert result.value is None
    assert f"per-sample deadline of {DEADLINE_S:g}s (checkers.deadline_s)" in result.error
    assert pool.replaced == replaced + 1
    for _ in range(600):
        if pool.alive == pool.size:
            break
        await asyncio.sleep(0.1)
    assert [r.value for r in await score(task, [right] * 4, pool)] == [1.0] * 4


async def test_tasks_whose_scoring_evaluates_text_are_not_offered(pool):
    offered = offered_tasks()
    # countdown/puzzle24 parse the answer with sympy (eval), number_sorting evals the gold, codeio execs code.
    for refused in ("countdown", "puzzle24", "number_sorting", "codeio", "composite"):
        assert refused not in offered
        value, error = score_entry(refused, "1", "", "1", {})
        assert value is None and f"task {refused!r} is withheld" in error
    assert {"leg_counting", "spell_backward", "chain_sum"} <= set(offered)
    names = [r.description.name for r in reasoning_gym_rewards(pool)]
    assert "reasoning_gym:leg_counting" in names and len(names) == len(offered)
