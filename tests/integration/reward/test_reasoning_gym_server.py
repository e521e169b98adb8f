"""reasoning_gym:<task> rewards through a real reward server's RewardService on loopback."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import reasoning_gym

from reward_service.client import RewardClient
from reward_service.core.types import Message, Sample
from tests.integration.reward.fixtures import SETTINGS


@pytest.fixture(scope="module")
def client(reward_server):
    with RewardClient(reward_server.address, retry_budget_s=0) as running:
        yield running


def test_list_rewards_offers_the_tasks(client):
    by_name = {d.name: d for d in client.list_rewards()}
    leg_counting = by_name["reasoning_gym:leg_counting"]
    assert leg_counting.required_metadata == ("reasoning_gym",)
    assert leg_counting.min_value == 0.0 and leg_counting.max_value == 1.0
    assert "reasoning_gym:countdown" not in by_name  # its scoring evaluates the answer with sympy


def test_score_correct_and_wrong_answers(client):
    entries = reasoning_gym.create_dataset("spell_backward", size=2, seed=5)
    samples = []
    for i, entry in enumerate(entries):
        answer = entry["answer"] if i == 0 else "wrong"
        samples.append(
            Sample(
                id=str(i),
                completion=f"<think>\nreverse it\n</think>\n<answer>\n{answer}\n</answer>",
                prompt=(Message("user", entry["question"]),),
                # As an object here; the trainer's data source sends the JSON text. Both are accepted.
                metadata={
                    "answer": entry["answer"],
                    "reasoning_gym": json.loads(json.dumps(entry["metadata"])),
                },
            )
        )
    results = client.score(samples, ["reasoning_gym:spell_backward", ("format", 0.5)])
    assert [r.reward for r in results] == [1.5, 0.5]
    assert dict(results[1].components)["reasoning_gym:spell_backward"].value == 0.0


def test_unknown_and_refused_tasks_are_invalid_argument(client):
    sample = Sample(id="0", completion="<answer>1</answer>", metadata={"reasoning_gym": "{}"})
    for name in ("reasoning_gym:no_such_task", "reasoning_gym:countdown"):
        with pytest.raises(Exception) as error:
            client.score([sample], [name])
        assert getattr(error.value, "code", None) == grpc.StatusCode.INVALID_ARGUMENT, error.value
        assert "rewards[0].name" in str(error.value)


def entry_sample(task: str, completion: str, sample_id: str = "0", **changes) -> Sample:
    entry = reasoning_gym.create_dataset(task, size=1, seed=5)[0]
    return Sample(
        id=sample_id,
        completion=completion,
        prompt=(Message("user", entry["question"]),),
        metadata={"answer": entry["answer"], "reasoning_gym": json.dumps({**entry["metadata"], **changes})},
    )


def right_answer(task: str) -> str:
    return f"<answer>{reasoning_gym.create_dataset(task, size=1, seed=5)[0]['answer']}</answer>"


def test_metadata_that_would_take_gigabytes_is_the_samples_error_naming_the_field(client):
    """tower_of_hanoi's score_answer builds num_pegs pegs from the metadata: 10**9 of them is refused before
    any work, with the field's name; the request's other samples score."""
    task = "tower_of_hanoi"
    hungry = entry_sample(task, right_answer(task), "0", num_pegs=10**9)
    fine = entry_sample(task, right_answer(task), "1")
    results = client.score([hungry, fine], [f"reasoning_gym:{task}"])
    component = dict(results[0].components)[f"reasoning_gym:{task}"]
    assert component.value is None and "reasoning_gym.num_pegs is 1000000000" in component.error
    assert results[1].reward == 1.0


@pytest.mark.slow
def test_an_endless_score_is_killed_while_other_scores_succeed(client, reward_server):
    """An answer that makes rush_hour's score_answer loop for hours costs one worker the pool's deadline:
    the worker is killed and replaced, the sample gets an error naming the deadline, and other callers'
    Scores succeed meanwhile and afterwards."""
    endless = entry_sample("rush_hour", "<answer>A+1000000000000000</answer>")
    task = "leg_counting"
    quick = [entry_sample(task, right_answer(task), str(i)) for i in range(4)]
    with (
        RewardClient(reward_server.address, retry_budget_s=0) as other,
        ThreadPoolExecutor(1) as background,
    ):
        stuck = background.submit(other.score, [endless], ["reasoning_gym:rush_hour"])
        # A sample queued in the same instant could be pipelined behind the endless one (and wait for the
        # kill): give a worker a moment to take it alone.
        time.sleep(1.0)
        scored_meanwhile = 0
        while not stuck.done() and scored_meanwhile < 5:
            assert [r.reward for r in client.score(quick, [f"reasoning_gym:{task}"])] == [1.0] * 4
            scored_meanwhile += 1
        (result,) = stuck.result()
    assert scored_meanwhile == 5  # every quick Score ran while the endless one was still being scored
    component = dict(result.components)["reasoning_gym:rush_hour"]
    deadline = SETTINGS["checkers"]["deadline_s"]
    assert component.value is None
    assert f"per-sample deadline of {deadline:g}s (checkers.deadline_s)" in component.error
    assert [r.reward for r in client.score(quick, [f"reasoning_gym:{task}"])] == [1.0] * 4
