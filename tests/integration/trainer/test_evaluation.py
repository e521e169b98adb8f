"""Held-out evaluation during a run, against REAL reward and rollout services on loopback.

The demo policy (``models/demo``, ~0.5 greedy accuracy on its arithmetic) makes accuracy a number that can
move. The evaluation at step 0 must equal greedy decoding of the untrained policy scored by the reward service
directly, and the one after the last step the same done with the weights the service holds when the run has
ended: the rows measure the policy the trainer trains, at every evaluated step.
"""

from __future__ import annotations

import json

import pytest

from reward_service.client import RewardClient, trl_samples
from rollout_service.client import RolloutClient
from tests.integration.trainer.fixtures import DEMO_DATA, DEMO_MODEL
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import RunState
from trainer_service.local.launcher import LocalServices
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow

EVAL_PROMPTS = 24
MAX_TOKENS = 8


def greedy_accuracy(services: LocalServices, rows: list[dict]) -> float:
    """Greedy completions of ``rows`` from the rollout service as it is now, scored by the reward service."""
    prompts = [row["prompt"] for row in rows]
    with RolloutClient(services.rollout.target) as rollout:
        results = rollout.generate(prompts, n=1, sampling={"temperature": 0.0, "max_tokens": MAX_TOKENS})
    completions = [[{"role": "assistant", "content": r.text}] for r in results]
    samples = trl_samples(prompts, completions, None, {"answer": [row["answer"] for row in rows]})
    with RewardClient(services.reward.target) as reward:
        scored = reward.score(samples, [("accuracy", 1.0, {"mode": "numeric"})])
    return sum(result.reward for result in scored) / len(scored)


def test_evaluations_measure_the_trained_policy_at_each_step(demo_services, tmp_path):
    eval_rows = [
        json.loads(line) for line in (DEMO_DATA / "test.jsonl").read_text().splitlines()[:EVAL_PROMPTS]
    ]
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps(row) + "\n" for row in eval_rows))
    before = greedy_accuracy(demo_services, eval_rows)
    config = parse_config(
        {
            "base": str(DEMO_MODEL),
            "output": str(tmp_path / "run"),
            "data": {"train": str(DEMO_DATA / "train.jsonl"), "eval": str(eval_file)},
            "training": {
                "max_steps": 3,
                "seed": 0,
                "optimizer": {"per_device_train_batch_size": 16, "learning_rate": 3e-3},
                "generation": {"num_generations": 4, "max_completion_length": MAX_TOKENS},
                "rewards": {"reward_fn": "accuracy", "params": {"accuracy": {"mode": "numeric"}}},
                "model": {"lora": {"r": 8, "alpha": 16}},
                "evaluation": {"eval_steps": 2, "num_generations_eval": 3},
            },
            "services": {"reward": demo_services.reward.target, "rollout": demo_services.rollout.target},
        }
    )
    result = run_job(config)
    assert result.state is RunState.COMPLETED
    after = greedy_accuracy(demo_services, eval_rows)
    rows = read_metrics(result.output_dir / "eval_metrics.jsonl")
    # Step 0, every eval_steps, and after the last step.
    assert [row["step"] for row in rows] == [0, 2, 3]
    assert rows[0]["accuracy_greedy"] == pytest.approx(before)
    assert rows[-1]["accuracy_greedy"] == pytest.approx(after)
    for row in rows:
        assert set(row) >= {"accuracy_greedy", "avg@3", "pass@1", "pass@2", "pass@3", "pass@3/accuracy"}
        # A 0/1 reward: pass@1 is the sampled accuracy, and more samples never pass less often.
        assert row["pass@1"] == pytest.approx(row["avg@3"])
        assert row["pass@1"] <= row["pass@2"] <= row["pass@3"]
    assert (result.output_dir / "reward_curve.png").exists()
