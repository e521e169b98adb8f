"""End-to-end GRPO step time: the trio (trainer + reward + rollout services on loopback) vs TRL alone.

    python bench/e2e_bench.py [--model tests/assets/models/policy-large] [--steps 8]
                              [--out bench/results/e2e.json]

One run, same model, data, LoRA and GRPOConfig (built by
``trainer_service.training.builders.build_grpo_config`` from one run config) for all three:

- ``trl``: ``trl.GRPOTrainer`` in one process, generating with its own ``model.generate`` and scoring with the
  same numeric accuracy rule computed in-process (last number of the completion vs ``answer``);
- ``sync``: ``trainer_service.training.job.run_job`` against a reward and an HF-engine rollout service on
  127.0.0.1 (weights pushed after every step, generation waits for the push); ``importance_sampling: auto``
  resolves to "verify" here (exactly on-policy: the correction's extra forward runs on the first step only);
- ``async``: the same with ``async_rollout: true, max_staleness: 1`` (next batch generated during the step,
  weights pushed in the background; the correction on every step), against its own rollout service started
  as ``make run``/``train`` start one for an async run on CPU: trainer and rollout service split the cores
  while a prefetch generates (``launcher.overlap_threads``) and the trainer takes them all once it is done
  (``trainer_service.rollout.core_borrowing``).

TRL keeps torch's default threads (one per core). ``--importance-sampling on`` and ``--no-thread-split``
measure the trio without each of the two savings.

Step time = median of the wall-clock gaps between consecutive optimizer-step ends, pooled over ``--rounds``
rounds that alternate trl / sync / async (the first step of each run, which
includes warm-up, is not counted). Ratios are trio / TRL (targets: sync <= 1.15, async <= 0.85).
``push_share`` = median weight push seconds (gather + serialize + stream + apply of the LoRA adapter) / median
sync step seconds (target <= 0.05). On a shared 2-core machine the trio's three processes compete for the same
cores as the trainer, which an overlap cannot beat; the numbers are what this machine measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOTrainer

from trainer_service.config.run_config import RunConfig, parse_config
from trainer_service.core.types import JobEvent
from trainer_service.local.launcher import start_local_services
from trainer_service.rollout.cpu_placement import cpu_cores, overlap_threads
from trainer_service.training.builders import Device, build_grpo_config, build_model, load_tokenizer
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

ROOT = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def numeric_accuracy(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """1.0 when the last number of the completion equals the answer (|Δ| <= 1e-4), else 0.0 — the reward
    service's ``accuracy`` with ``mode: numeric`` for these integer answers."""
    scores = []
    for completion, gold in zip(completions, answer, strict=True):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        numbers = NUMBER.findall(text)
        scores.append(float(bool(numbers) and abs(float(numbers[-1]) - float(gold)) <= 1e-4))
    return scores


def run_config(model: Path, data: Path, output: Path, steps: int, **training: Any) -> dict:
    return {
        "base": str(model),
        "output": str(output),
        "data": {"train": str(data)},
        "training": {
            "max_steps": steps,
            "lr": 1e-4,
            "batch_size": 32,
            "num_generations": 8,
            "max_completion_length": 32,
            "temperature": 1.0,
            "reward_fn": "accuracy",
            "reward_params": {"accuracy": {"mode": "numeric"}},
            "lora": {"r": 16, "alpha": 32},
            "logging_steps": 1,
            "seed": 0,
            **training,
        },
    }


def step_gaps(times: list[float]) -> list[float]:
    """Consecutive differences of step-end times, leaving out the first step (warm-up)."""
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return gaps[1:] if len(gaps) > 2 else gaps


class StepClock(TrainerCallback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter())


def bench_trl(config: RunConfig, data: Path) -> dict:
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    clock = StepClock()
    trainer = GRPOTrainer(
        model=build_model(config, Device.named("cpu")),
        args=build_grpo_config(config, Device.named("cpu")),
        reward_funcs=[numeric_accuracy],
        train_dataset=dataset,
        processing_class=load_tokenizer(config),
        callbacks=[clock],
    )
    trainer.train()
    return {"gaps": step_gaps(clock.times), "pushes": []}


def bench_trio(config: dict, services) -> dict:
    config = {**config, "services": {"reward": services.reward.target, "rollout": services.rollout.target}}
    times: list[float] = []

    def sink(event: JobEvent) -> None:
        if event.metrics:
            times.append(time.perf_counter())

    result = run_job(parse_config(config), sink=sink)
    records = read_metrics(result.metrics_path)
    pushes = [r["weight_sync/push_seconds"] for r in records if "weight_sync/push_seconds" in r]
    applied = [r.get("sampling/importance_sampling_applied", 0.0) for r in records]
    out: dict[str, Any] = {"gaps": step_gaps(times), "pushes": pushes, "is_applied_steps": sum(applied)}
    if "async/prefetch_hits" in records[-1]:
        last = records[-1]
        out |= {
            "prefetch_hits": last["async/prefetch_hits"],
            "stale_dropped": last["async/stale_dropped"],
            "max_staleness_seen": max(r["async/staleness"] for r in records),
        }
    return out


def summarize(runs: list[dict]) -> dict:
    """Median step and push seconds pooled over rounds, plus the per-round medians."""
    gaps = [g for run in runs for g in run["gaps"]]
    pushes = [p for run in runs for p in run["pushes"]]
    out: dict[str, Any] = {
        "step_s": statistics.median(gaps),
        "step_s_per_round": [statistics.median(run["gaps"]) for run in runs],
        "steps_timed": len(gaps),
    }
    if pushes:
        out["push_s"] = statistics.median(pushes)
    for key in ("is_applied_steps", "prefetch_hits", "stale_dropped", "max_staleness_seen"):
        if key in runs[0]:
            out[key] = [run[key] for run in runs]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "tests/assets/models/policy-large")
    parser.add_argument("--data", type=Path, default=ROOT / "data/demo/train.jsonl")
    parser.add_argument("--steps", type=int, default=8)
    # Rounds alternate trl / sync / async so a change in machine load hits all three alike.
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/e2e.json")
    parser.add_argument("--importance-sampling", choices=["auto", "on"], default="auto")
    parser.add_argument(
        "--no-thread-split", action="store_true", help="async: default threads in trainer and rollout service"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    load_at_start = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"trl": [], "sync": [], "async": []}
    trainer_threads, rollout_threads = (None, None) if args.no_thread_split else overlap_threads()
    trio = {"importance_sampling": args.importance_sampling}
    with tempfile.TemporaryDirectory() as scratch, ExitStack() as stack:
        root = Path(scratch)

        def services(name: str, rollout_threads: int | None):
            return stack.enter_context(
                start_local_services(
                    need_reward=True,
                    need_rollout=True,
                    model=args.model,
                    engine="hf",
                    log_dir=root / name,
                    rollout_threads=rollout_threads,
                )
            )

        sync_services = services("sync-logs", None)
        async_services = services("async-logs", rollout_threads)
        for round_ in range(args.rounds):
            out = root / f"round{round_}"
            base = run_config(args.model, args.data, out / "trl", args.steps)
            runs["trl"].append(bench_trl(parse_config(base), args.data))
            sync = run_config(args.model, args.data, out / "sync", args.steps, **trio)
            runs["sync"].append(bench_trio(sync, sync_services))
            async_config = run_config(
                args.model,
                args.data,
                out / "async",
                args.steps,
                async_rollout=True,
                max_staleness=1,
                # Split: trainer_cpu_threads picks overlap_threads()[0] itself (loopback rollout).
                **({} if trainer_threads else {"cpu_threads": torch.get_num_threads()}),
                **trio,
            )
            runs["async"].append(bench_trio(async_config, async_services))
    trl, sync, async_ = (summarize(runs[mode]) for mode in ("trl", "sync", "async"))
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "setup": {
            "model": str(args.model.relative_to(ROOT) if args.model.is_relative_to(ROOT) else args.model),
            "steps": args.steps,
            "rounds": args.rounds,
            "completions_per_step": 32,
            "num_generations": 8,
            "max_completion_length": 32,
            "lora_r": 16,
            "rollout_engine": "hf",
            "importance_sampling": args.importance_sampling,
            "threads": {
                "cores": cpu_cores(),
                "trl": torch.get_num_threads(),
                "sync": {"trainer": torch.get_num_threads(), "rollout": "default"},
                "async": {
                    "trainer": trainer_threads or torch.get_num_threads(),
                    "rollout": rollout_threads or "default",
                },
            },
        },
        "trl": trl,
        "sync": sync,
        "async": async_,
        "ratio_sync": sync["step_s"] / trl["step_s"],
        "ratio_async": async_["step_s"] / trl["step_s"],
        "load_average_1m_at_start": load_at_start,
        "load_average_1m_at_end": os.getloadavg()[0],
        "push_share": sync["push_s"] / sync["step_s"],
        "targets": {"ratio_sync": 1.15, "ratio_async": 0.85, "push_share": 0.05},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
