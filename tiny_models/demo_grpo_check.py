"""Evidence that TRL GRPO learns on the embedded demo task (an experiment, not a test).

``python -m tiny_models.demo_grpo_check --model models/demo --data data/demo --out runs/demo-grpo-check``
trains the shipped demo policy in-process with ``trl.GRPOTrainer`` on CPU (no services): LoRA through
peft (or ``--full`` fine-tuning), 8 generations per prompt at temperature 1.0, an exact-answer accuracy
reward computed in-process. It writes ``metrics.jsonl`` (``step``, ``reward`` and TRL's other logged
values per step) and ``summary.json``: the mean reward of the first and last fifth of logged steps,
their difference, and greedy / sampled (T = 1.0) accuracy on the held-out test split before and after.

Defaults (16 prompts x 8 generations per step, LoRA r 16, lr 1e-3 constant, 200 steps) raised the
reward by +0.170 (seed 0) and +0.143 (seed 1); 4 prompts per step stays below +0.1 and lr 3e-3
collapses the reward.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from datasets import Dataset
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from trl import GRPOConfig, GRPOTrainer

from tiny_models.demo import accuracy, is_correct, read_jsonl


def accuracy_reward(completions: list, answer: list[str], **_: object) -> list[float | None]:
    """1.0 when a completion is exactly the gold integer answer, else 0.0 (one value per completion).

    ``completions`` are message lists (``[{"role": "assistant", "content": ...}]``) for chat prompts.
    """
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(is_correct(text, gold)) for text, gold in zip(texts, answer, strict=True)]


def fifth_means(rewards: list[float]) -> tuple[float, float]:
    """Mean of the first and of the last fifth (at least one value each) of a per-step series."""
    k = max(1, len(rewards) // 5)
    return sum(rewards[:k]) / k, sum(rewards[-k:]) / k


def run_check(args: argparse.Namespace) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    train_rows = read_jsonl(args.data / "train.jsonl")
    test_rows = read_jsonl(args.data / "test.jsonl")

    before = {
        "greedy_test_accuracy": accuracy(model, tokenizer, test_rows),
        "sampled_test_accuracy_t1": accuracy(model, tokenizer, test_rows, temperature=1.0),
    }
    print(json.dumps({"before": before}), flush=True)

    config = GRPOConfig(
        output_dir=str(args.out / "trainer"),
        use_cpu=True,
        seed=args.seed,
        max_steps=args.steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        temperature=1.0,
        beta=args.beta,
        loss_type=args.loss_type,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        generation_kwargs={"min_new_tokens": 1},
    )
    peft_config = (
        None
        if args.full
        else LoraConfig(
            r=args.lora_r,
            lora_alpha=2 * args.lora_r,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            task_type="CAUSAL_LM",
        )
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=accuracy_reward,
        args=config,
        train_dataset=Dataset.from_list(train_rows),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    started = time.monotonic()
    trainer.train()
    train_seconds = time.monotonic() - started

    steps = [entry for entry in trainer.state.log_history if "reward" in entry]
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "metrics.jsonl").open("w") as handle:
        for entry in steps:
            handle.write(json.dumps(entry) + "\n")
    rewards = [entry["reward"] for entry in steps]
    step_times = [entry["step_time"] for entry in steps if "step_time" in entry]
    first, last = fifth_means(rewards)

    policy = trainer.model
    if isinstance(policy, PeftModel):  # trained with LoRA: fold the adapter in
        policy = policy.merge_and_unload()
    assert isinstance(policy, PreTrainedModel)
    torch.manual_seed(args.seed)
    after = {
        "greedy_test_accuracy": accuracy(policy, tokenizer, test_rows),
        "sampled_test_accuracy_t1": accuracy(policy, tokenizer, test_rows, temperature=1.0),
    }
    summary = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "logged_steps": len(rewards),
        "train_seconds": round(train_seconds, 1),
        "median_step_seconds": round(statistics.median(step_times), 3) if step_times else None,
        "reward_first_fifth": round(first, 4),
        "reward_last_fifth": round(last, 4),
        "reward_gain": round(last - first, 4),
        "before": before,
        "after": after,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary), flush=True)
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run TRL GRPO on the demo task and report the reward gain.")
    parser.add_argument("--model", type=Path, default=Path("models/demo"))
    parser.add_argument("--data", type=Path, default=Path("data/demo"))
    parser.add_argument("--out", type=Path, default=Path("runs/demo-grpo-check"))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0 = no reference model)")
    parser.add_argument("--loss-type", default="dapo")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    run_check(parser.parse_args(argv))


if __name__ == "__main__":
    main()
