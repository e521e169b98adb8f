"""Tool-episode benchmark, prefix reuse: tokens the HF engine computes for multi-turn episodes when it keeps
each episode's KV cache between turns vs recomputing the whole prefix every turn.

    python bench/tools_bench.py [--model tests/assets/models/policy] [--out bench/results/tools.json]

Workload: ``--episodes`` episodes batched together, each a 30-token prompt and ``--turns`` model turns of
``--turn-tokens`` sampled tokens, a 10-token tool message appended after every turn but the last (what the
episode loop appends). The same seeds in both modes, so both sample the same tokens. ``prefill_tokens``:
positions run through the model at the start of a turn (the decode steps are the same in both modes);
``wall_s``: median of alternating rounds (noisy on a shared machine; the token counts are exact).
The trio against TRL's own tool-calling GRPO step: ``tools_e2e_bench.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from e2e_bench import source_commit

from rollout_service.engines.hf import HFEngine
from rollout_service.types import GenerationJob, SamplingSpec

TOOL_MESSAGE = [1, 40, 41, 42, 43, 44, 45, 2, 1, 46]


def run(engine: HFEngine, reuse: bool, episodes: int, turns: int, turn_tokens: int, tag: str) -> dict:
    prompts = [
        [1, 405, 202, 505, 307, 224, 20, 21, 22, 23, 24, 25, 26, 27] + [30 + i] * 16 for i in range(episodes)
    ]
    before = engine.prefill_tokens, engine.reused_tokens
    start = time.perf_counter()
    for turn in range(turns):
        sampling = [
            SamplingSpec(temperature=1.0, max_tokens=turn_tokens, min_tokens=turn_tokens, seed=i * 131 + turn)
            for i in range(episodes)
        ]
        jobs = [
            GenerationJob([p], 1, s, session=f"{tag}-{i}" if reuse else None)
            for i, (p, s) in enumerate(zip(prompts, sampling, strict=True))
        ]
        engine.generate(jobs)
        tail = TOOL_MESSAGE if turn < turns - 1 else []
        prompts = [p + j.results[0].token_ids + tail for p, j in zip(prompts, jobs, strict=True)]
    wall = time.perf_counter() - start
    for i in range(episodes):
        engine.release_session(f"{tag}-{i}")
    return {
        "prefill_tokens": engine.prefill_tokens - before[0],
        "reused_tokens": engine.reused_tokens - before[1],
        "wall_s": wall,
        "completions": [p[30:] for p in prompts],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tests/assets/models/policy")
    parser.add_argument("--out", type=Path, default=Path("bench/results/tools.json"))
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--turn-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]
    engine = HFEngine(args.model)
    results: dict[str, list[dict]] = {"reuse": [], "recompute": []}
    for r in range(args.rounds):
        for mode in ("reuse", "recompute"):
            results[mode].append(
                run(engine, mode == "reuse", args.episodes, args.turns, args.turn_tokens, f"{mode}{r}")
            )
    same = results["reuse"][0]["completions"] == results["recompute"][0]["completions"]
    reuse, recompute = results["reuse"][0], results["recompute"][0]
    summary = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "commit": source_commit(),
        "model": args.model,
        "workload": {"episodes": args.episodes, "turns": args.turns, "turn_tokens": args.turn_tokens},
        "prefill_tokens": {"reuse": reuse["prefill_tokens"], "recompute": recompute["prefill_tokens"]},
        "reused_tokens": reuse["reused_tokens"],
        "prefill_ratio": recompute["prefill_tokens"] / reuse["prefill_tokens"],
        "same_tokens_sampled": same,
        "wall_s_median": {m: statistics.median(x["wall_s"] for x in v) for m, v in results.items()},
        "wall_s_per_round": {m: [x["wall_s"] for x in v] for m, v in results.items()},
        "load_average_1m_at_start": load_at_start,
        "load_average_1m_at_end": os.getloadavg()[0],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
