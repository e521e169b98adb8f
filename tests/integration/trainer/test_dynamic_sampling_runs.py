"""DAPO dynamic sampling in real runs: the demo policy on its arithmetic (about half of its 2-completion
groups answer alike, so have no reward spread) against REAL reward and rollout services on loopback, sync and
async. Groups are filtered, replacement batches are generated, and every step still trains on a full batch
of groups with spread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from trainer_service.config.run_config import parse_config
from trainer_service.core.types import RunState
from trainer_service.local.launcher import LocalServices, start_local_services
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow

DEMO_MODEL = Path("models/demo")
DEMO_DATA = Path("data/demo/train.jsonl")


@pytest.fixture(scope="module")
def demo_services(tmp_path_factory) -> Iterator[LocalServices]:
    with start_local_services(
        need_reward=True,
        need_rollout=True,
        model=DEMO_MODEL,
        engine="hf",
        log_dir=tmp_path_factory.mktemp("service-logs"),
    ) as local:
        yield local


@pytest.mark.parametrize("async_rollout", [False, True])
def test_zero_spread_groups_are_replaced_in_a_real_run(demo_services, tmp_path, async_rollout):
    config = parse_config(
        {
            "base": str(DEMO_MODEL),
            "output": str(tmp_path / "run"),
            "data": {"train": str(DEMO_DATA)},
            "training": {
                "max_steps": 3,
                "seed": 3,
                "optimizer": {"per_device_train_batch_size": 8, "learning_rate": 1e-3},  # 4 groups of G = 2
                "generation": {"num_generations": 2, "max_completion_length": 8, "generation_seed": 11},
                "rewards": {"reward_fn": "accuracy", "params": {"accuracy": {"mode": "numeric"}}},
                "model": {"lora": {"r": 4, "alpha": 8}},
                "rollout": {"async_rollout": async_rollout},
                "sampling": {"dynamic_sampling": {"max_gen_batches": 6}},
            },
            "services": {"reward": demo_services.reward.target, "rollout": demo_services.rollout.target},
        }
    )
    result = run_job(config)
    assert result.state is RunState.COMPLETED and result.step == 3
    records = read_metrics(result.metrics_path)
    assert len(records) == 3
    filtered = sum(r["dynamic_sampling/filtered_groups"] for r in records)
    assert filtered > 0, "no group without spread in 3 steps: the test no longer exercises the filter"
    assert all(r["dynamic_sampling/generation_batches"] >= 1 for r in records)
    assert any(r["dynamic_sampling/generation_batches"] > 1 for r in records)
    # The batch stayed full of groups with spread: no padding was needed, so no group trained on A = 0 ...
    assert all(r["dynamic_sampling/padded_groups"] == 0 for r in records)
    # ... and TRL's own count over everything generated shows the filter had work to do.
    assert any(r["frac_reward_zero_std"] > 0 for r in records)
