"""What the PRM and judge benchmarks share: reward-model batcher modes side by side on one workload.

Each mode is a ``ModelRegistry`` with its own ``ModelSettings`` switches (dynamic batching, prefix sharing)
loading the same model; every mode scores the same batches with the same tokenizer and forward code. After a
one-request warm-up per mode, ``rounds`` rounds run every mode once, in an order rotated each round, so load
drifts hit the modes alike. Per mode: median wall and process CPU seconds of a round, forwards and tokens run
per round (padded forward tokens + shared-prefix tokens, from the batcher's counters), and the largest
|difference| of its values from the baseline mode's (which must stay <= 1e-5).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from reward_service.core.types import Sample
from reward_service.models.registry import ModelRegistry
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import ModelKind, ModelSpec

ROOT = Path(__file__).resolve().parent.parent
# Scores every batch of a round in a mode's own way: (mode, registry, batches) → one result list per batch.
ScoreRound = Callable[[str, ModelRegistry, list[list[Sample]]], Awaitable[Sequence[Sequence[Any]]]]


def max_abs_diff(a: Any, b: Any) -> float:
    """Largest |a - b| over equally nested lists of numbers (0.0 for empty lists)."""
    if isinstance(a, list | tuple):
        return max((max_abs_diff(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    return abs(a - b)


def _tokens(stats: dict[str, int]) -> int:
    return stats["padded_tokens"] + stats["prefix_tokens"]


async def bench_modes(
    label: str,
    path: Path,
    kind: ModelKind,
    threads: int,
    modes: dict[str, dict[str, bool]],
    batches: list[list[Sample]],
    args: argparse.Namespace,
    *,
    baseline: str,
    score_round: ScoreRound,
    value_of: Callable[[Any], Any],
    value_name: str,
) -> dict:
    """Every mode of ``modes`` on ``batches``, rounds interleaved; ``baseline`` is the mode the speedups,
    CPU ratios and ``max_abs_<value_name>_diff_vs_<baseline>`` are taken against; ``value_of`` reads the
    compared value of one ScoreResult. ``args`` supplies ``max_batch_tokens``, ``max_wait_ms`` and the rounds
    (``large_rounds`` for the model labelled "large", else ``rounds``)."""
    rounds = args.large_rounds if label == "large" else args.rounds
    torch.set_num_threads(threads)
    registries = {}
    for mode, switches in modes.items():
        settings = ModelSettings(
            max_batch_tokens=args.max_batch_tokens, max_wait_ms=args.max_wait_ms, **switches
        )
        registries[mode] = ModelRegistry(settings)
        await registries[mode].load(ModelSpec(name="bench", path=str(path), kind=kind))
    reward = f"{kind.value}:bench"
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    values, tokens, forwards = {}, {}, {}
    try:
        for registry in registries.values():  # warm-up: first-call allocations, one request
            await registry.score(reward, batches[0], {})
        before = {mode: registry.batcher_stats("bench") for mode, registry in registries.items()}
        order = list(modes)
        for index in range(rounds):
            for mode in order[index % len(order) :] + order[: index % len(order)]:
                started, cpu_started = time.perf_counter(), time.process_time()
                results = await score_round(mode, registries[mode], batches)
                times[mode].append(time.perf_counter() - started)
                cpu[mode].append(time.process_time() - cpu_started)
                assert all(r.error == "" for batch in results for r in batch)
                values[mode] = [[value_of(r) for r in batch] for batch in results]
        for mode, registry in registries.items():
            after = registry.batcher_stats("bench")
            tokens[mode] = (_tokens(after) - _tokens(before[mode])) / rounds
            forwards[mode] = (after["forward_calls"] - before[mode]["forward_calls"]) / rounds
    finally:
        for registry in registries.values():
            await registry.close()
    summary = {}
    base, base_cpu = statistics.median(times[baseline]), statistics.median(cpu[baseline])
    diff_key = f"max_abs_{value_name}_diff_vs_{baseline}"
    for mode in modes:
        wall, cpu_s = statistics.median(times[mode]), statistics.median(cpu[mode])
        summary[mode] = {
            "median_s": wall,
            "times_s": times[mode],
            "median_cpu_s": cpu_s,
            "forwards_per_round": forwards[mode],
            "tokens_run_per_round": tokens[mode],
            "cpu_ms_per_token_run": 1000 * cpu_s / tokens[mode],
            f"speedup_vs_{baseline}": base / wall,
            f"cpu_time_ratio_vs_{baseline}": base_cpu / cpu_s,
            diff_key: max_abs_diff(values[mode], values[baseline]),
        }
        print(
            f"{label:>6} threads={threads} {mode:>21}: {wall * 1000:8.1f} ms, "
            f"{forwards[mode]:5.1f} forwards, "
            f"{tokens[mode]:7.0f} tokens, speedup {base / wall:.2f}x (CPU {base_cpu / cpu_s:.2f}x), "
            f"max |diff| {summary[mode][diff_key]:.1e}",
            flush=True,
        )
    worst = max(m[diff_key] for m in summary.values())
    assert worst <= 1e-5, f"a mode changed the {value_name}s by {worst}"
    batched = summary["batched"]
    return {
        "model": label,
        "torch_threads": threads,
        "rounds": rounds,
        "load_average_1m_after": os.getloadavg()[0],
        "path": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "modes": summary,
        "speedup": batched[f"speedup_vs_{baseline}"],
        "cpu_time_ratio": batched[f"cpu_time_ratio_vs_{baseline}"],
        f"max_abs_{value_name}_diff": worst,
    }
