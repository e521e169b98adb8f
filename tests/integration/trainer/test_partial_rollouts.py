"""Async rollout with partial rollouts against REAL services on loopback: prefetches continue across the
weight pushes, nothing is discarded for staleness, and the bound holds per token (read back from
metrics.jsonl)."""

from __future__ import annotations

import pytest

from tests.integration.trainer.fixtures import run_config
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import RunState
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow


def test_partial_rollouts_discard_nothing_and_train_no_token_beyond_the_bound(
    tiny_models, services, train_file, tmp_path
):
    steps = 4
    config = run_config(
        tiny_models,
        train_file,
        tmp_path / "partial",
        services.reward.target,
        services.rollout.target,
        retry_timeout_s=120,
        max_steps=steps,
        rollout={
            "async_rollout": True,
            # Every token sampled before the push the batch trains against is out of the loss.
            "max_staleness": 0,
        },
    )
    result = run_job(parse_config(config))

    assert result.state is RunState.COMPLETED and result.step == steps
    records = read_metrics(result.metrics_path)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for record in records:
        assert record["async/discarded"] == 0, record
        assert record["async/max_trained_token_lag"] <= 0, record  # no token with lag > 0 has loss weight
        assert record["async/tokens_lag0"] + record["async/tokens_lag1"] == pytest.approx(1.0)
    last = records[-1]
    # The prefetches were trained on (with max_staleness 0 the batch-level rule drops every one of them):
    # their tokens sampled before the push masked out, or their groups sampled again where nothing of a
    # completion was left to train.
    assert last["async/prefetch_hits"] >= 1
    assert last["async/max_token_staleness"] == 1
    assert last["async/masked_tokens"] + last["async/regenerated"] > 0
