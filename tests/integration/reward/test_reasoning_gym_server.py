"""reasoning_gym:<task> rewards through a real reward server's RewardService on loopback."""

from __future__ import annotations

import json

import grpc
import pytest
import reasoning_gym

from reward_service.client import RewardClient
from reward_service.core.types import Message, Sample


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
