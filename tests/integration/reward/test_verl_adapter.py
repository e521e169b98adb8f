"""verl's custom reward function (reward_service.adapters.verl) against a real reward server on loopback,
called exactly as verl's reward managers call it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reward_service.adapters import verl

GOOD = "<think>\nadd\n</think>\n<answer>\n\\boxed{4}\n</answer>"


def test_naive_reward_manager_call_returns_score_and_components(reward_server):
    # NaiveRewardManager: compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **kwargs)
    reward_kwargs = {"target": reward_server.address, "rewards": ["accuracy", ["format", 0.5]]}
    right = verl.compute_score(
        data_source="openai/gsm8k",
        solution_str=GOOD,
        ground_truth="4",
        extra_info={"index": 3},
        **reward_kwargs,
    )
    wrong = verl.compute_score(
        data_source="openai/gsm8k",
        solution_str="\\boxed{5}",
        ground_truth="4",
        extra_info=None,
        **reward_kwargs,
    )
    assert right == {"score": 1.5, "accuracy": 1.0, "format": 1.0}
    assert wrong == {"score": 0.0, "accuracy": 0.0, "format": 0.0}


def test_target_and_rewards_from_the_environment_and_extra_info(reward_server, monkeypatch):
    monkeypatch.setenv(verl.TARGET_ENV, reward_server.address)
    monkeypatch.setenv(verl.REWARDS_ENV, "accuracy")
    assert verl.compute_score("math", GOOD, "4") == {"score": 1.0, "accuracy": 1.0}
    # extra_info chooses rewards too; its other keys are metadata (an object ground truth is metadata itself).
    scored = verl.compute_score(
        "json", '{"a": 1}', {"schema": {"type": "object", "required": ["a"]}}, {"rewards": ["json_schema"]}
    )
    assert scored == {"score": 1.0, "json_schema": 1.0}


def test_missing_values_become_missing_score(reward_server):
    # No gold answer: accuracy has no value; verl needs a number.
    scored = verl.compute_score("math", GOOD, None, target=reward_server.address, missing_score=-1.0)
    assert scored == {"score": -1.0, "accuracy": -1.0}


def test_batch_reward_manager_scores_the_batch_in_one_call(reward_server):
    results = verl.compute_score_batch(
        data_sources=["math", "math", "math"],
        solution_strs=[GOOD, "\\boxed{5}", "\\boxed{7}"],
        ground_truths=["4", "4", "7"],
        extra_infos=[{"index": 0}, {"index": 1}, {"index": 2}],
        target=reward_server.address,
        rewards=["accuracy"],
    )
    assert [r["score"] for r in results] == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="differ in length"):
        verl.compute_score_batch(["math"], [GOOD, GOOD], ["4"], target=reward_server.address)


def test_adapter_imports_without_torch():
    program = 'import sys; sys.modules["torch"] = None\nimport reward_service.adapters.verl\nprint("ok")'
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
