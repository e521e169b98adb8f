"""The per-token staleness bound of partial rollouts: the keep mask, the batch summary, and what an async
prefetch that spanned weight updates hands to TRL."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from trainer_service.rollout.async_rollout import AsyncServiceRollout
from trainer_service.rollout.service_rollout import SamplingConfig, ServiceRollout
from trainer_service.rollout.token_staleness import bound_tokens, token_keep_mask
from trainer_service.rollout.weight_sync import WeightSync


@pytest.mark.parametrize(
    ("versions", "current", "bound", "keep"),
    [
        ([3, 3, 4, 4], 4, 1, [1, 1, 1, 1]),
        ([3, 3, 4, 4], 4, 0, [0, 0, 1, 1]),
        ([2, 3, 4], 4, 1, [0, 1, 1]),
        ([4, 5], 4, 3, [1, 0]),  # newer than the trainer's weights: foreign, never trained on
        ([], 4, 1, []),
    ],
)
def test_keep_mask_bounds_every_token(versions, current, bound, keep):
    assert token_keep_mask(versions, current, bound) == keep


def test_summary_counts_lags_masked_tokens_and_completions_that_spanned_an_update():
    masks, summary = bound_tokens([[3, 3, 4], [4, 4], [2, 3]], current=4, max_staleness=1)
    assert masks == [[1, 1, 1], [1, 1], [0, 1]]
    assert summary.lag_counts == {1: 3, 0: 3, 2: 1} and summary.tokens == 7
    assert summary.masked == 1 and summary.partial_completions == 2
    assert summary.max_lag == 2 and summary.max_trained_lag == 1
    assert sum(summary.lag_fractions().values()) == pytest.approx(1.0)


def completion(versions: list[int]) -> SimpleNamespace:
    return SimpleNamespace(
        prompt_token_ids=[1, 2],
        token_ids=list(range(10, 10 + len(versions))),
        logprobs=[-0.5] * len(versions),
        policy_version=min(versions),
        token_versions=versions,
    )


def make_rollout(max_staleness: int) -> AsyncServiceRollout:
    inner = ServiceRollout(
        client=None,
        sync=WeightSync(client=None),
        sampling=SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=4),
        num_generations=2,
    )
    return AsyncServiceRollout(inner, max_staleness=max_staleness)


def test_a_prefetch_spanning_an_update_trains_whole_with_stale_tokens_masked():
    rollout = make_rollout(max_staleness=0)
    batch = [completion([6, 6, 7, 7]), completion([7, 7, 7])]
    out = rollout._bounded_per_token(batch, current=7, prompts=["a", "a"], trainer=None)
    assert out["env_mask"] == [[0, 0, 1, 1], [1, 1, 1]]  # zero loss weight on the stale head, nothing dropped
    assert out["completion_ids"] == [[10, 11, 12, 13], [10, 11, 12]]
    metrics = rollout.metrics()
    assert metrics["async/discarded"] == 0 and metrics["async/prefetch_hits"] == 1
    assert metrics["async/partial_completions"] == 1 and metrics["async/masked_tokens"] == 2
    assert metrics["async/tokens_lag0"] == pytest.approx(5 / 7)
    assert metrics["async/tokens_lag1"] == pytest.approx(2 / 7)
    assert metrics["async/max_token_staleness"] == 1 and metrics["async/max_trained_token_lag"] == 0


class VersionedSync:
    """The part of WeightSync a regeneration uses: a generation context yielding the trainer's version."""

    def __init__(self, version: int):
        self.version = version
        self.generations = 0

    @contextmanager
    def generation(self, trainer):
        self.generations += 1
        yield self.version


def test_a_group_with_a_completion_that_keeps_no_token_is_sampled_again():
    rollout = make_rollout(max_staleness=0)
    rollout.inner.sync = VersionedSync(7)
    asked: list[list[str]] = []

    def generate(prompts, step, partial=False):
        asked.append(list(prompts))
        return [completion([7, 7]) for _ in prompts]

    rollout.inner.generate = generate
    batch = [completion([6, 7]), completion([7, 7]), completion([6, 6]), completion([7])]
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=3))
    out = rollout._bounded_per_token(batch, current=7, prompts=["a", "a", "b", "b"], trainer=trainer)
    assert asked == [["b", "b"]]  # group b had a completion of only stale tokens; group a trains its tail
    assert out["env_mask"] == [[0, 1], [1, 1], [1, 1], [1, 1]]
    metrics = rollout.metrics()
    assert metrics["async/regenerated"] == 2 and metrics["async/discarded"] == 0
    assert metrics["async/max_token_staleness"] == 1 and metrics["async/max_trained_token_lag"] == 0


def test_versions_that_do_not_match_the_tokens_are_refused():
    broken = completion([7, 7, 7])
    broken.token_versions = [7, 7]
    with pytest.raises(RuntimeError, match="3 tokens but 2 token versions"):
        make_rollout(max_staleness=1)._bounded_per_token([broken], current=7, prompts=["a"], trainer=None)


def test_a_synchronous_batch_after_a_partial_one_reports_every_token_fresh(monkeypatch):
    rollout = make_rollout(max_staleness=1)
    rollout._bounded_per_token([completion([6, 7])], current=7, prompts=["a"], trainer=None)
    assert rollout.metrics()["async/tokens_lag1"] == pytest.approx(0.5)

    class SynchronousRollout:  # the inner rollout's call: the batch generated at the trainer's version
        sync = SimpleNamespace(current_version=8)

        def __call__(self, prompts, trainer):
            return {"completion_ids": [[10]]}

    rollout.inner = SynchronousRollout()
    monkeypatch.setattr(rollout, "_start_prefetch", lambda keys, step: None)
    rollout(["a"], SimpleNamespace(state=SimpleNamespace(global_step=4)))  # no prefetch pending: a miss
    metrics = rollout.metrics()
    assert metrics["async/tokens_lag0"] == 1.0 and metrics["async/tokens_lag1"] == 0.0
    assert metrics["async/max_trained_token_lag"] == 0
