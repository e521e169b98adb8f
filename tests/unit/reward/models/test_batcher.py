"""Dynamic batcher: merging, flush rules, routing, failures, cancellation; then with a real PRM."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_runtime.errors import Unavailable
from reward_service.core.types import Message, Sample
from reward_service.models.batcher import DynamicBatcher, padded_cost, plan_batches, split_by_cost
from reward_service.models.engine import Encoded, Prefix
from reward_service.models.registry import ModelRegistry
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import ModelKind, ModelSpec


class SumForward:
    """A real forward for tests: each sequence's output is the sum of its ids; records batch shapes."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.batches: list[list[Encoded]] = []

    def __call__(self, batch: list[Encoded]) -> list[int]:
        if any(-1 in item.input_ids for item in batch):
            raise RuntimeError("poisoned sequence")
        self.batches.append(batch)
        time.sleep(self.seconds)
        return [sum(item.input_ids) for item in batch]


def _request(index: int, size: int = 8, length: int = 5) -> list[Encoded]:
    return [Encoded(input_ids=[index * 100 + j] * length) for j in range(size)]


def test_split_by_cost_respects_padded_size():
    items = [Encoded(input_ids=[1] * n) for n in (3, 5, 2, 9, 1, 1)]
    chunks = split_by_cost(items, 12)
    assert [len(c) for c in chunks] == [2, 1, 1, 2]  # 2x5, then 9 alone (2x9 > 12), ...
    assert all(padded_cost(c) <= 12 or len(c) == 1 for c in chunks)
    assert [i for c in chunks for i in c] == items
    # A sequence longer than the budget still forms a batch of its own.
    assert split_by_cost([Encoded(input_ids=[1] * 50)], 12) == [[Encoded(input_ids=[1] * 50)]]


async def test_concurrent_requests_are_merged_and_routed():
    forward = SumForward(seconds=0.01)
    batcher = DynamicBatcher(forward, max_batch_tokens=10_000, max_wait_ms=20)
    requests = [_request(i) for i in range(16)]
    results = await asyncio.gather(*(batcher.submit(r) for r in requests))
    await batcher.close()
    for request, result in zip(requests, results, strict=True):
        assert result == [sum(item.input_ids) for item in request]
    assert batcher.sequences == 128
    assert batcher.forward_calls <= 2 < 16  # 16 requests, merged into one or two forwards
    assert batcher.largest_batch >= 64
    assert batcher.forward_calls == len(forward.batches)


async def test_max_batch_tokens_bounds_each_forward():
    forward = SumForward()
    batcher = DynamicBatcher(forward, max_batch_tokens=40, max_wait_ms=50)
    results = await asyncio.gather(*(batcher.submit(_request(i, size=3, length=10)) for i in range(4)))
    await batcher.close()
    assert [len(r) for r in results] == [3, 3, 3, 3]
    assert all(padded_cost(b) <= 40 for b in forward.batches)
    assert [len(b) for b in forward.batches] == [4, 4, 4]


async def test_full_batch_flushes_without_waiting():
    batcher = DynamicBatcher(SumForward(), max_batch_tokens=20, max_wait_ms=60_000)
    started = time.monotonic()
    assert await batcher.submit(_request(1, size=2, length=10)) == [1000, 1010]
    assert time.monotonic() - started < 5.0
    await batcher.close()


async def test_max_wait_flushes_a_partial_batch():
    batcher = DynamicBatcher(SumForward(), max_batch_tokens=1_000_000, max_wait_ms=30)
    started = time.monotonic()
    assert await batcher.submit(_request(2, size=1)) == [1000]
    elapsed = time.monotonic() - started
    assert 0.025 <= elapsed < 5.0
    assert batcher.forward_calls == 1
    await batcher.close()


async def test_disabled_batching_runs_one_forward_per_request():
    forward = SumForward(seconds=0.005)
    batcher = DynamicBatcher(forward, max_batch_tokens=10_000, max_wait_ms=20, dynamic=False)
    results = await asyncio.gather(*(batcher.submit(_request(i)) for i in range(6)))
    await batcher.close()
    assert batcher.forward_calls == 6 and [len(b) for b in forward.batches] == [8] * 6
    assert results[3] == [sum(item.input_ids) for item in _request(3)]


async def test_failed_forward_fails_its_requests_only():
    batcher = DynamicBatcher(SumForward(), max_batch_tokens=10_000, max_wait_ms=1)
    with pytest.raises(RuntimeError, match="poisoned"):
        await batcher.submit([Encoded(input_ids=[-1, 2])])
    assert await batcher.submit([Encoded(input_ids=[4, 2])]) == [6]
    await batcher.close()


async def test_cancelled_request_is_dropped():
    forward = SumForward()
    batcher = DynamicBatcher(forward, max_batch_tokens=10_000, max_wait_ms=100)
    doomed = asyncio.create_task(batcher.submit([Encoded(input_ids=[7] * 4)]))
    await asyncio.sleep(0.01)
    doomed.cancel()
    assert await batcher.submit([Encoded(input_ids=[5])]) == [5]
    assert all(item.input_ids != [7] * 4 for batch in forward.batches for item in batch)
    await batcher.close()


async def test_close_fails_waiting_requests_and_refuses_new_ones():
    batcher = DynamicBatcher(SumForward(), max_batch_tokens=10_000, max_wait_ms=60_000)
    waiting = asyncio.create_task(batcher.submit([Encoded(input_ids=[1])]))
    await asyncio.sleep(0.01)
    await batcher.close()
    with pytest.raises(Unavailable):
        await waiting
    with pytest.raises(Unavailable):
        await batcher.submit([Encoded(input_ids=[1])])


async def test_real_prm_requests_are_merged_with_unchanged_scores(tiny_models):
    registry = ModelRegistry(ModelSettings(max_wait_ms=50))
    await registry.load(ModelSpec(name="p", path=str(tiny_models["prm-token"]), kind=ModelKind.PRM))
    prompt = (Message("user", "Compute 3 * 4 - 5."),)
    requests = [
        [
            Sample(id=f"{r}-{s}", prompt=prompt, completion=f"Step 1: 3 * 4 = {r + s}.\n\nThe answer is {s}.")
            for s in range(2)
        ]
        for r in range(8)
    ]
    try:
        together = await asyncio.gather(*(registry.score("prm:p", samples, {}) for samples in requests))
        merged = registry.batcher_stats("p")
        alone = [await registry.score("prm:p", samples, {}) for samples in requests]
    finally:
        await registry.close()
    assert merged["forward_calls"] < 8 and merged["largest_batch"] > 2
    assert merged["sequences"] == 16
    for batch_results, alone_results in zip(together, alone, strict=True):
        for a, b in zip(batch_results, alone_results, strict=True):
            assert a.step_scores == pytest.approx(b.step_scores, abs=1e-5)


async def test_close_during_a_forward_fails_its_requests_instead_of_hanging():
    batcher = DynamicBatcher(SumForward(seconds=0.3), max_batch_tokens=10_000, max_wait_ms=0)
    running = asyncio.create_task(batcher.submit([Encoded(input_ids=[1, 2])]))
    await asyncio.sleep(0.05)  # the forward is running in the worker thread
    await batcher.close()
    with pytest.raises(Unavailable):
        await asyncio.wait_for(running, 5)


def _set_partitions(items: list[int]):
    """Every partition of ``items`` into non-empty groups (Bell(n) of them)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in _set_partitions(rest):
        yield [[first], *partition]
        for index in range(len(partition)):
            yield [*partition[:index], [first, *partition[index]], *partition[index + 1 :]]


def _cost(groups: list[list[int]], overhead: int) -> int:
    return sum(len(g) * max(g) + overhead for g in groups)


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=7),
    budget=st.integers(1, 200),
    overhead=st.integers(0, 80),
)
def test_plan_batches_is_optimal_over_every_split(lengths, budget, overhead):
    """The plan over sorted lengths costs no more than any partition of the set that respects the
    budget (brute force), so in particular no more than one forward per request."""
    ordered = sorted(lengths)
    sizes = plan_batches(ordered, budget, overhead)
    assert sum(sizes) == len(ordered) and all(size >= 1 for size in sizes)
    groups, start = [], 0
    for size in sizes:
        groups.append(ordered[start : start + size])
        start += size
    assert all(len(g) == 1 or len(g) * max(g) <= budget for g in groups)
    feasible = [
        _cost(p, overhead)
        for p in _set_partitions(list(lengths))
        if all(len(g) == 1 or len(g) * max(g) <= budget for g in p)
    ]
    assert _cost(groups, overhead) == min(feasible)


def test_plan_batches_trades_padding_for_forwards():
    # No overhead: never pad (every distinct length its own batch); large overhead: one batch.
    assert plan_batches([2, 2, 3, 9], 1000, 0) == [2, 1, 1]
    assert plan_batches([2, 2, 3, 9], 1000, 100) == [4]
    assert sorted(plan_batches([5] * 6, 20, 1000)) == [2, 4]  # the budget allows 4 per forward


async def test_flush_batches_by_suffix_length_with_prefixes():
    """Sequences with a shared prefix cost their suffix only: the batcher sizes batches on that."""
    prefix = Prefix(input_ids=tuple(range(50)))
    long_shared = [Encoded(input_ids=[*range(50), 1, 2], prefix=prefix) for _ in range(4)]
    forward = SumForward()
    batcher = DynamicBatcher(forward, max_batch_tokens=8, max_wait_ms=20, forward_overhead_tokens=1)
    await batcher.submit(long_shared)
    await batcher.close()
    assert [len(b) for b in forward.batches] == [4]  # 4 x 2 suffix tokens fit in 8
    assert batcher.padded_tokens == 8
