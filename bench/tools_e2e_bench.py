"""Tool-calling GRPO step: the trio on loopback vs TRL's own tool-calling ``GRPOTrainer(tools=[calculator])``.

The trio: trainer + reward + rollout services, episodes through the reward service's calculator environment.

    python bench/tools_e2e_bench.py [--steps 8] [--rounds 2] [--shape small]
                                    [--out bench/results/tools_e2e.json]

Task and model: the embedded agent task of ``tiny_models.tools_demo`` (``What is 347 + 582?``, numeric
accuracy of the last number), with its tiny policy warm-started here into a temp dir for ``--warm-steps``
steps with mostly tool-call trajectories, so the policy emits Hermes ``<tool_call>`` calls from the first
step. ``--shape``: the policy's ``tiny_models.make`` shape (``small``: 0.4M parameters, the shipped tools
policy's; ``large``: 21M, where the fixed cost per turn and per step weighs less; warm-started on every
core, e.g. ``--warm-steps 100 --warm-batch 8``; the file's ``warm_start`` says how often it then calls
the tool).

One run config (``build_grpo_config``) for all three, ``max_tool_calling_iterations`` the same:

- ``trl``: ``trl.GRPOTrainer(tools=[calculator])`` in one process: TRL generates with ``model.generate``,
  parses the calls with the tokenizer's response template (Qwen3's: the same Hermes format), runs the tool
  function and regenerates; the tool function evaluates with the reward service's own ``Calculator`` (same
  semantics, same result text; an error becomes TRL's ``{"error": ...}`` message, the trio's its tool-error
  text);
- ``sync``: ``run_job`` with ``tools: {environment: calculator}`` against a reward service (the environment)
  and an HF-engine rollout service that runs the episodes and dials the reward service per tool call;
- ``async``: the same with ``rollout: {async_rollout: true, max_staleness: 1}`` against its own rollout
  service with the core split of ``make run`` on CPU (as in ``e2e_bench.py``).

Step time = median gap between consecutive optimizer-step ends, pooled over rounds (first step of each run
not counted; ``step_s_mean`` their mean, ``gaps_s`` all of them); episodes/s = episodes per step / mean gap;
``tool_calls_per_episode`` = mean of the logged ``tools/call_frequency`` (calls / episodes, the same
definition on both sides) and ``completion_tokens_per_episode`` of ``completions/mean_length`` (tool result
tokens included), so the reader sees both did comparable work. Ratios are trio / TRL (targets: sync <= 1.1,
async <= 0.8).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from e2e_bench import StepClock, numeric_accuracy, step_gaps, trio_run
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.chat_template_utils import qwen3_template

from reward_service.environments.calculator import Calculator, format_number
from reward_service.environments.settings import CalculatorSettings
from tiny_models.tools_demo import TOOLS_TEMPLATE, build_tools_demo
from trainer_service.config.run_config import RunConfig, parse_config
from trainer_service.local.launcher import start_local_services
from trainer_service.rollout.cpu_placement import cpu_cores, overlap_threads
from trainer_service.training.builders import Device, build_grpo_config, build_model, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
CALCULATOR = Calculator(CalculatorSettings())
# The demo's template with assistant tool calls rendered in Hermes form, which TRL requires of a template it
# trains tools with (the trio never renders past turns: it appends token ids). Prompts and the tool message
# render exactly as in the demo's template, so both sides see the same tokens.
TRL_TEMPLATE = TOOLS_TEMPLATE.replace(
    "message['content'] + '<|im_end|>' + '\n' }}",
    "message['content'] }}"
    "{% if message.tool_calls is defined and message.tool_calls %}{% for call in message.tool_calls %}"
    "{{ '<tool_call>' + ({'name': call['function']['name'], 'arguments': call['function']['arguments']} "
    "| tojson) + '</tool_call>' }}{% endfor %}{% endif %}{{ '<|im_end|>' + '\n' }}",
)


def calculator(expression: str) -> str:
    """Evaluates an arithmetic expression.

    Args:
        expression: The arithmetic expression to evaluate, e.g. "347 + 582".
    """
    return format_number(CALCULATOR.evaluate(expression))


WORK = ("tools/call_frequency", "completions/mean_length")


class WorkLog(TrainerCallback):
    """TRL's logged ``WORK`` metrics, one value per logging step each."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {key: [] for key in WORK}

    def on_log(self, args, state, control, logs=None, **kwargs):
        for key in WORK:
            if logs and key in logs:
                self.values[key].append(float(logs[key]))


def run_config(model: Path, data: Path, output: Path, args: argparse.Namespace, **blocks: Any) -> dict:
    """The trio's run config; ``blocks``: further ``training`` blocks (``rollout``)."""
    return {
        "base": str(model),
        "output": str(output),
        "data": {"train": str(data)},
        "training": {
            "max_steps": args.steps,
            "logging_steps": 1,
            "seed": 0,
            "optimizer": {"learning_rate": 1e-4, "per_device_train_batch_size": args.batch_size},
            "generation": {
                "num_generations": args.num_generations,
                "max_completion_length": args.max_completion_length,
                "temperature": 1.0,
            },
            "rewards": {
                "reward_fn": "accuracy",
                "params": {"accuracy": {"mode": "numeric"}},
                # The calculator has no episode reward: the accuracy term alone, as on the TRL side.
                "environment_weight": 0.0,
            },
            "tools": {
                "environment": "calculator",
                "max_tool_calling_iterations": args.max_tool_calling_iterations,
            },
            "model": {"lora": {"r": 16, "alpha": 32}},
            **blocks,
        },
    }


def bench_trl(config: RunConfig, data: Path, iterations: int) -> dict:
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    tokenizer = load_tokenizer(config)
    # The demo's template is not one TRL knows; its calls are Qwen3's Hermes format.
    tokenizer.chat_template = TRL_TEMPLATE
    tokenizer.response_template = qwen3_template
    grpo_config = build_grpo_config(config, Device.named("cpu"))
    grpo_config.max_tool_calling_iterations = iterations
    clock, work = StepClock(), WorkLog()
    trainer = GRPOTrainer(
        model=build_model(config, Device.named("cpu")),
        args=grpo_config,
        reward_funcs=[numeric_accuracy],
        train_dataset=dataset,
        processing_class=tokenizer,
        tools=[calculator],
        callbacks=[clock, work],
    )
    trainer.train()
    return {"gaps": step_gaps(clock.times), **work.values}


def bench_trio(config: dict, services) -> dict:
    config = {**config, "services": {"reward": services.reward.target, "rollout": services.rollout.target}}
    gaps, records = trio_run(config)
    out = {"gaps": gaps, **{key: [r[key] for r in records if key in r] for key in WORK}}
    if "async/prefetch_hits" in records[-1]:
        out |= {
            "prefetch_hits": records[-1]["async/prefetch_hits"],
            "stale_dropped": records[-1]["async/stale_dropped"],
        }
    return out


def summarize(runs: list[dict], episodes_per_step: int) -> dict:
    gaps = [g for run in runs for g in run["gaps"]]
    step = statistics.median(gaps)
    work = {key: [v for run in runs for v in run[key]] for key in WORK}
    mean = statistics.fmean(gaps)
    out = {
        "step_s": step,
        "step_s_mean": mean,
        # Throughput over the timed steps: a burst of step ends can shorten a median gap, not the mean.
        "episodes_per_s": episodes_per_step / mean,
        "step_s_per_round": [statistics.median(run["gaps"]) for run in runs],
        "steps_timed": len(gaps),
        "gaps_s": [[round(g, 3) for g in run["gaps"]] for run in runs],
        "tool_calls_per_episode": statistics.fmean(work["tools/call_frequency"]),
        "completion_tokens_per_episode": statistics.fmean(work["completions/mean_length"]),
    }
    for key in ("prefetch_hits", "stale_dropped"):
        if key in runs[0]:
            out[key] = [run[key] for run in runs]
    return out


def warm_start_tools_policy(model: Path, data: Path, args: argparse.Namespace) -> dict:
    """The task's rows under ``data`` and a ``--shape`` policy in ``model`` warm-started on them for
    ``--warm-steps`` steps of ``--warm-batch`` rows, 90 % of them tool-call trajectories; returns
    ``build_tools_demo``'s record (its evaluation and parameter count)."""
    return build_tools_demo(
        model,
        data,
        steps=args.warm_steps,
        batch_size=args.warm_batch,
        tool_share=0.9,
        n_train=1000,
        n_test=64,
        shape=args.shape,
        log=lambda _: None,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--max-completion-length", type=int, default=96)
    parser.add_argument("--max-tool-calling-iterations", type=int, default=1)
    parser.add_argument("--warm-steps", type=int, default=150, help="warm-start steps of the tool policy")
    parser.add_argument("--warm-batch", type=int, default=32, help="warm-start batch size")
    parser.add_argument("--shape", choices=("small", "large"), default="small", help="the policy's shape")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/tools_e2e.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    load_at_start = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"trl": [], "sync": [], "async": []}
    trainer_threads, rollout_threads = overlap_threads()
    with tempfile.TemporaryDirectory() as scratch, ExitStack() as stack:
        root = Path(scratch)
        model, data = root / "model", root / "data"
        threads = torch.get_num_threads()
        # The small policy's warm start is deterministic on one thread; the large one takes every core.
        torch.set_num_threads(1 if args.shape == "small" else threads)
        warm = warm_start_tools_policy(model, data, args)
        torch.set_num_threads(threads)
        train = data / "train.jsonl"

        def services(name: str, rollout_threads: int | None):
            return stack.enter_context(
                start_local_services(
                    need_reward=True,
                    need_rollout=True,
                    model=model,
                    engine="hf",
                    log_dir=root / name,
                    rollout_threads=rollout_threads,
                    environment="reward",
                )
            )

        sync_services = services("sync-logs", None)
        async_services = services("async-logs", rollout_threads)
        for round_ in range(args.rounds):
            out = root / f"round{round_}"
            torch.manual_seed(0)
            base = parse_config(run_config(model, train, out / "trl", args))
            runs["trl"].append(bench_trl(base, train, args.max_tool_calling_iterations))
            runs["sync"].append(bench_trio(run_config(model, train, out / "sync", args), sync_services))
            async_config = run_config(
                model, train, out / "async", args, rollout={"async_rollout": True, "max_staleness": 1}
            )
            runs["async"].append(bench_trio(async_config, async_services))
    trl, sync, async_ = (summarize(runs[mode], args.batch_size) for mode in ("trl", "sync", "async"))
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "setup": {
            "task": "tiny_models.tools_demo arithmetic with a calculator tool",
            "warm_start": {
                "steps": args.warm_steps,
                "batch_size": args.warm_batch,
                "tool_share": 0.9,
                "shape": args.shape,
                **warm,
            },
            "steps": args.steps,
            "rounds": args.rounds,
            "episodes_per_step": args.batch_size,
            "num_generations": args.num_generations,
            "max_completion_length": args.max_completion_length,
            "max_tool_calling_iterations": args.max_tool_calling_iterations,
            "lora_r": 16,
            "rollout_engine": "hf",
            "threads": {
                "cores": cpu_cores(),
                "trl": torch.get_num_threads(),
                "async": {"trainer": trainer_threads, "rollout": rollout_threads},
            },
        },
        "trl": trl,
        "sync": sync,
        "async": async_,
        "ratio_sync": sync["step_s"] / trl["step_s"],
        "ratio_async": async_["step_s"] / trl["step_s"],
        "ratio_sync_mean": sync["step_s_mean"] / trl["step_s_mean"],
        "ratio_async_mean": async_["step_s_mean"] / trl["step_s_mean"],
        "load_average_1m_at_start": load_at_start,
        "load_average_1m_at_end": os.getloadavg()[0],
        "targets": {"ratio_sync": 1.1, "ratio_async": 0.8},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
