"""reasoning_gym:<task> rewards: the task's score_answer on the answer taken from the completion."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import reasoning_gym

from reward_service.core.types import Message, Sample
from reward_service.rewards.base import ThreadRunner
from reward_service.rewards.params import resolve_params
from reward_service.rewards.reasoning_gym import (
    PARAMS,
    ReasoningGymReward,
    extract_answer,
    offered_tasks,
    reasoning_gym_rewards,
)


def entry_sample(task: str, completion: str, *, index: int = 0, as_text: bool = True) -> Sample:
    entry = reasoning_gym.create_dataset(task, size=index + 1, seed=7)[index]
    metadata = json.dumps(entry["metadata"]) if as_text else entry["metadata"]
    return Sample(
        id=f"{task}-{index}",
        completion=completion,
        prompt=(Message("user", entry["question"]),),
        metadata={"answer": entry["answer"], "reasoning_gym": metadata},
    )


def gold(task: str, index: int = 0) -> str:
    return reasoning_gym.create_dataset(task, size=index + 1, seed=7)[index]["answer"]


def score(task: str, samples: list[Sample], runner: ThreadRunner | None = None, **params) -> list:
    reward = ReasoningGymReward(task, runner or ThreadRunner())
    resolved = resolve_params(PARAMS, params, "rewards[0].params")
    return asyncio.run(reward.score(samples, resolved))


@pytest.mark.parametrize("task", ["leg_counting", "spell_backward", "chain_sum", "word_sorting"])
def test_correct_answers_score_one_and_wrong_ones_less(task):
    right = entry_sample(task, f"<think>\ncounting\n</think>\n<answer>{gold(task)}</answer>")
    wrong = entry_sample(task, "<answer>definitely not it</answer>")
    untagged = entry_sample(task, gold(task))  # the gold outside any <answer> tag
    values = [r.value for r in score(task, [right, wrong, untagged])]
    assert values[0] == 1.0
    assert values[1] < 1.0 and values[2] == 0.0


def test_entry_metadata_as_object_and_as_json_text_score_alike():
    task = "leg_counting"
    completion = f"<answer>{gold(task, 1)}</answer>"
    results = score(
        task,
        [entry_sample(task, completion, index=1), entry_sample(task, completion, index=1, as_text=False)],
    )
    assert [r.value for r in results] == [1.0, 1.0]


def test_answer_formats():
    assert extract_answer("a <answer> x </answer> b <answer>y</answer>", "answer_tag") == "y"
    assert extract_answer("no tag", "answer_tag") is None
    assert extract_answer("reasoning\n42\n\n", "last_line") == "42"
    assert extract_answer("  42 ", "full") == "42"
    task = "chain_sum"
    last_line = entry_sample(task, f"I add them up.\n{gold(task)}")
    assert score(task, [last_line], answer_format="last_line")[0].value == 1.0


def test_hostile_metadata_and_answers_are_sample_errors_or_zero():
    task = "leg_counting"
    good = entry_sample(task, "<answer>1</answer>")
    other_task = entry_sample("spell_backward", f"<answer>{gold(task)}</answer>")
    broken = Sample(id="b", completion="<answer>1</answer>", metadata={"answer": "1", "reasoning_gym": "{"})
    wrong_type = Sample(id="t", completion="<answer>1</answer>", metadata={"reasoning_gym": 5})
    missing = Sample(id="m", completion="<answer>1</answer>")
    huge = entry_sample(task, "<answer>" + "1" * 20_000 + "</answer>")
    # Linear extraction: a megabyte of unclosed tags is answered at once.
    flood = entry_sample(task, "<answer>" * 200_000)
    results = score(task, [good, other_task, broken, wrong_type, missing, huge, flood])
    assert results[0].value is not None and not results[0].error
    assert "spell_backward" in results[1].error and results[1].value is None
    assert "not JSON" in results[2].error
    assert "must be an object" in results[3].error
    assert "'reasoning_gym' is required" in results[4].error
    assert results[5].value == 0.0  # longer than max_answer_chars
    assert results[6].value == 0.0


def test_a_stuck_score_answer_costs_its_sample_the_deadline():
    reward = ReasoningGymReward("leg_counting", ThreadRunner(deadline_s=0.2, budget_s=0.5))

    class Stuck:
        def score_answer(self, answer, entry):
            time.sleep(1.0)
            return 1.0

    reward._dataset = Stuck()
    samples = [entry_sample("leg_counting", "<answer>1</answer>", index=0)] * 4
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        reward._runner = ThreadRunner(deadline_s=0.2, budget_s=0.5, executor=pool)
        results = asyncio.run(reward.score(samples, resolve_params(PARAMS, {}, "p")))
        elapsed = time.monotonic() - started
    assert elapsed < 5  # did not wait for the stuck calls
    assert all(r.value is None for r in results)
    assert "text_deadline_s" in results[0].error
    assert "text_budget_s" in results[-1].error


def test_tasks_whose_scoring_evaluates_text_are_not_offered():
    offered = offered_tasks()
    # countdown/puzzle24 parse the answer with sympy (eval), number_sorting evals the gold, codeio execs code.
    for refused in ("countdown", "puzzle24", "number_sorting", "codeio", "composite"):
        assert refused not in offered
    assert {"leg_counting", "spell_backward", "chain_sum"} <= set(offered)
    names = [r.description.name for r in reasoning_gym_rewards(ThreadRunner())]
    assert "reasoning_gym:leg_counting" in names and len(names) == len(offered)
