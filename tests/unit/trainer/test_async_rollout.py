"""Async rollout pieces: the staleness rule, the recording sampler, the next-batch lookahead, and how a
prefetch is ordered with the weight push and the trainer's threads."""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future

import pytest
import torch
from torch.utils.data import SequentialSampler

from grpo_runtime.prompt_groups import prompt_key
from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.rollout.async_rollout import (
    AsyncServiceRollout,
    RecordingSampler,
    judge_staleness,
)
from trainer_service.rollout.core_borrowing import CoreBorrowing
from trainer_service.rollout.replicas import RolloutUnavailable
from trainer_service.rollout.service_rollout import SamplingConfig, ServiceRollout
from trainer_service.rollout.weight_sync import WeightSync
from trainer_service.training.job import run_job


@pytest.mark.parametrize(
    ("versions", "current", "bound", "accept", "staleness"),
    [
        ([5, 5], 5, 0, True, 0),  # fresh
        ([4, 4], 5, 0, False, 1),  # one push behind, bound 0
        ([4, 5], 5, 1, True, 1),  # mixed batch (a push landed mid-generation): judged by its oldest
        ([3, 5], 5, 1, False, 2),
        ([6], 5, 3, False, -1),  # newer than anything the trainer pushed: foreign weights
        ([0], 7, 7, True, 7),
    ],
)
def test_staleness_bound(versions, current, bound, accept, staleness):
    decision = judge_staleness(versions, current, bound)
    assert decision.accept is accept and decision.staleness == staleness


def test_staleness_needs_a_version():
    with pytest.raises(ValueError):
        judge_staleness([], 1, 1)


def test_recording_sampler_yields_unchanged_and_records_in_order():
    issued: deque[int] = deque()
    sampler = RecordingSampler(SequentialSampler(range(5)), issued)
    assert len(sampler) == 5
    iterator = iter(sampler)
    assert [next(iterator), next(iterator)] == [0, 1]
    assert list(issued) == [0, 1]
    assert list(iterator) == [2, 3, 4] and list(issued) == [0, 1, 2, 3, 4]


def make_async(prompts: list[str]) -> AsyncServiceRollout:
    inner = ServiceRollout(
        client=None,
        sync=WeightSync(client=None),
        sampling=SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=4),
        num_generations=2,
    )
    rollout = AsyncServiceRollout(inner, max_staleness=1)
    rollout._prompt_of = prompts.__getitem__
    return rollout


def test_lookahead_returns_the_batch_after_the_current_one():
    rollout = make_async(["a", "b", "c", "d", "e", "f"])
    # The dataloader has issued batches [0,0,1,1] (being generated) and [2,2,3,3] (prefetched by accelerate).
    rollout.issued.extend([0, 0, 1, 1, 2, 2, 3, 3])
    current = [prompt_key(p) for p in ["a", "a", "b", "b"]]
    assert rollout._next_prompts(current) == ["c", "c", "d", "d"]
    assert list(rollout.issued) == [2, 2, 3, 3]


def test_lookahead_skips_batches_consumed_without_generation_and_gives_up_when_unknown():
    rollout = make_async(["a", "b", "c", "d", "e", "f"])
    # Resume: the trainer skipped batch [0,0,1,1] without calling the rollout.
    rollout.issued.extend([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5])
    assert rollout._next_prompts([prompt_key(p) for p in ["c", "c", "d", "d"]]) == ["e", "e", "f", "f"]
    # The next batch is not issued yet (last batch of the epoch): no prefetch.
    assert rollout._next_prompts([prompt_key(p) for p in ["e", "e", "f", "f"]]) is None
    # Prompts the sampler never issued: no prefetch, nothing guessed.
    rollout.issued.extend([0, 0])
    assert rollout._next_prompts([prompt_key("zzz")]) is None


def test_negative_bound_is_refused():
    inner = make_async([]).inner
    with pytest.raises(ValueError):
        AsyncServiceRollout(inner, max_staleness=-1)


def test_async_rollout_is_refused_for_multi_process_runs(tmp_path, monkeypatch):
    # The lookahead reads this process's sampler; other ranks would prefetch other prompts.
    monkeypatch.setenv("WORLD_SIZE", "2")
    config = parse_config(
        {
            "base": "tests/assets/models/policy",
            "output": str(tmp_path),
            "data": {"train": "t.jsonl"},
            "training": {"rollout": {"async_rollout": True}},
        }
    )
    with pytest.raises(ConfigError) as caught:
        run_job(config)
    assert caught.value.key == "training.rollout.async_rollout"


def prefetching(rollout: AsyncServiceRollout, release: threading.Event, seen: list) -> None:
    """Issue batches [a,a,b,b] and [c,c,d,d] and start the prefetch of the second; its generation records the
    sync state it started from, then waits for ``release``."""

    def generate(prompts, step, partial=False):
        seen.append((list(prompts), torch.get_num_threads()))
        assert release.wait(timeout=10)
        return []

    rollout.inner.generate = generate
    rollout._prompt_of = ["a", "b", "c", "d"].__getitem__
    rollout.issued.extend([0, 0, 1, 1, 2, 2, 3, 3])
    rollout._start_prefetch([prompt_key(p) for p in ["a", "a", "b", "b"]], step=1)


def test_prefetch_lends_the_cores_back_until_its_generation_ends():
    threads = torch.get_num_threads()
    try:
        rollout = make_async([])
        rollout.cores = CoreBorrowing(share=1, total=2)
        rollout.inner.sync.push_pending = False
        torch.set_num_threads(2)
        release, seen = threading.Event(), []
        prefetching(rollout, release, seen)
        assert torch.get_num_threads() == 1  # lent before the generation started
        assert not rollout.cores._idle.is_set()
        release.set()
        rollout._pending[1].result(timeout=10)
        assert rollout.cores._idle.is_set()
        assert seen[0][0] == ["c", "c", "d", "d"]
    finally:
        torch.set_num_threads(threads)


def test_prefetch_waits_for_the_weights_streaming_and_fails_when_they_did_not_arrive():
    rollout = make_async([])
    sync = rollout.inner.sync
    transfer: Future = Future()
    sync._transfer = transfer  # a background push in flight
    release, seen = threading.Event(), []
    release.set()
    prefetching(rollout, release, seen)
    time.sleep(0.2)
    assert seen == []  # not generating before the weights reached the replicas
    transfer.set_exception(RolloutUnavailable("replica down"))  # they did not: push_pending stays True
    with pytest.raises(RolloutUnavailable, match="did not reach the replicas"):
        rollout._pending[1].result(timeout=10)
    assert seen == []
