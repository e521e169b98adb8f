"""The embedded demo task and its briefly pre-trained tiny policy (the default for ``make run``).

``python -m tiny_models.demo --out models/demo --data data/demo`` writes:

- ``data/demo/train.jsonl`` and ``data/demo/test.jsonl``: addition and subtraction of a one-digit
  number to or from a number up to 99 (1,955 distinct questions: 1,355 train, 300 validation that are
  not written, 300 test), one row ``{"prompt": [{"role": "user", "content": "What is 57 + 8?"}],
  "answer": "65"}`` each. Answers are plain non-negative integers, checked by an exact-match or numeric
  accuracy reward. The test questions never occur in the train split (nor among the validation
  questions used to stop pre-training);
- ``models/demo``: a Qwen2 causal LM in the shared tiny shape (hidden 128, 2 heads of head_dim 64 so vLLM
  CPU serves it, 2 layers, about 0.4M parameters, fp32 safetensors of about 1.6 MB) with the shared
  tokenizer and ChatML template, trained with supervised next-token loss on the answer tokens of
  ``chat_template(prompt) + answer + <|im_end|>`` until its greedy accuracy on validation questions
  reaches ``--target`` (default 0.45; the shipped model stopped at step 375 with 0.49 greedy and 0.40
  sampled at temperature 1.0 on the test split): it clearly conditions on the prompt, but sampling
  still mixes right and wrong answers in a group, which is what GRPO needs to learn from.

Deterministic for a given seed on one CPU thread.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    GenerationMixin,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2ForCausalLM,
)

from grpo_runtime.tokenizing import chat_token_ids
from tiny_models.make import _save, qwen2_config, served_tokenizer
from tiny_models.tokenizer import build_tokenizer
from tiny_models.warm_start import train_until

# a op b with a up to two digits and b one digit: the tiny model reaches one half in about 400 steps
# (with both operands up to 99 it was still below 0.4 after 1,300, too long for a build step on 2 cores).
MAX_LEFT = 99
MAX_RIGHT = 9
# Answers have at most three digits; two spare tokens leave room for <|im_end|> and a stray token.
MAX_NEW_TOKENS = 6


@dataclass(frozen=True)
class Problem:
    """One question ``left op right`` with its integer answer (subtraction keeps left >= right)."""

    left: int
    op: str
    right: int

    @property
    def question(self) -> str:
        return f"What is {self.left} {self.op} {self.right}?"

    @property
    def answer(self) -> str:
        value = self.left + self.right if self.op == "+" else self.left - self.right
        return str(value)

    def row(self) -> dict:
        """The dataset row: a chat prompt plus the gold ``answer`` column rewards read."""
        return {"prompt": [{"role": "user", "content": self.question}], "answer": self.answer}


def all_problems(max_left: int = MAX_LEFT, max_right: int = MAX_RIGHT) -> list[Problem]:
    """Every question of the task: a + b and a - b (a >= b) for a in 0..max_left, b in 0..max_right."""
    problems = []
    for left in range(max_left + 1):
        for right in range(max_right + 1):
            problems.append(Problem(left, "+", right))
            if left >= right:
                problems.append(Problem(left, "-", right))
    return problems


def split_problems(
    seed: int, n_train: int, n_val: int, n_test: int
) -> tuple[list[Problem], list[Problem], list[Problem]]:
    """Disjoint train / validation / test samples of :func:`all_problems`, shuffled with ``seed``.

    Train takes at most ``n_train`` of the questions left after the test and validation samples.
    """
    problems = all_problems()
    if n_val + n_test >= len(problems):
        raise ValueError(f"the task has only {len(problems)} distinct questions")
    random.Random(seed).shuffle(problems)
    test = problems[:n_test]
    val = problems[n_test : n_test + n_val]
    train = problems[n_test + n_val : n_test + n_val + n_train]
    return train, val, test


def write_jsonl(rows: Iterable[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def is_correct(completion: str, answer: str) -> bool:
    """True when the completion, stripped of whitespace, is exactly the gold integer ``answer``.

    Stricter than the reward service's ``accuracy`` in ``numeric`` mode (the last number in the text);
    both agree on completions that are a plain integer, which is all the demo policy writes. Its default
    ``math_verify`` mode (TRL's ``accuracy_reward``) needs a LaTeX anchor such as ``\\boxed{}`` and
    scores a plain integer 0, so the demo config selects ``numeric``.
    """
    return completion.strip() == answer.strip()


def encode_example(tokenizer: PreTrainedTokenizerBase, row: dict) -> tuple[list[int], list[int]]:
    """Token ids of ``template(prompt, generation prompt) + answer + <|im_end|>`` and labels.

    Labels are -100 on the prompt so the loss covers only what the policy will generate: the answer
    digits and the end-of-turn token that stops generation.
    """
    prompt_ids = chat_token_ids(tokenizer, row["prompt"], add_generation_prompt=True)
    answer_ids = tokenizer(row["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return list(prompt_ids) + answer_ids, [-100] * len(prompt_ids) + answer_ids


def _collate(examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids, attention_mask, labels (pad labels -100); shapes (B, T)."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (ids, labs) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(labs)] = torch.tensor(labs)
        mask[i, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


@torch.no_grad()
def generate_answers(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict],
    *,
    temperature: float | None = None,
    batch_size: int = 256,
) -> list[str]:
    """Completions for each row's prompt: greedy when ``temperature`` is None, else sampled."""
    assert isinstance(model, GenerationMixin)  # a causal LM
    tokenizer.padding_side = "left"
    texts = [
        tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows
    ]
    # top_k=0 / top_p=1 sample the full distribution, as TRL and vLLM do at their defaults.
    sampling = (
        {"do_sample": False}
        if temperature is None
        else {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    )
    completions: list[str] = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(texts[start : start + batch_size], return_tensors="pt", padding=True)
        # transformers types generate's self as a Protocol that mypy finds PreTrainedModel not to meet.
        output = model.generate(  # type: ignore[misc]
            **batch,
            max_new_tokens=MAX_NEW_TOKENS,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **sampling,
        )
        new_tokens = output[:, batch["input_ids"].shape[1] :]
        completions.extend(tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
    return completions


def accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict],
    *,
    temperature: float | None = None,
) -> float:
    """Share of rows whose completion :func:`is_correct` (greedy, or sampled at ``temperature``)."""
    was_training = model.training
    model.eval()
    completions = generate_answers(model, tokenizer, rows, temperature=temperature)
    model.train(was_training)
    return sum(is_correct(c, r["answer"]) for c, r in zip(completions, rows, strict=True)) / len(rows)


def pretrain(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train_rows: Sequence[dict],
    val_rows: Sequence[dict],
    *,
    target: float,
    max_steps: int,
    batch_size: int,
    learning_rate: float,
    eval_every: int,
    seed: int,
    log=print,
) -> list[dict]:
    """Supervised next-token training until greedy validation accuracy reaches ``target``
    (:func:`~tiny_models.warm_start.train_until`); the log's measure is ``greedy_val_accuracy``."""
    examples = [encode_example(tokenizer, row) for row in train_rows]
    rng = random.Random(seed)
    return train_until(
        model,
        lambda: _collate(rng.sample(examples, batch_size), tokenizer.pad_token_id),
        lambda: accuracy(model, tokenizer, val_rows),
        name="greedy_val_accuracy",
        target=target,
        learning_rate=learning_rate,
        max_steps=max_steps,
        eval_every=eval_every,
        log=log,
    )


def build_demo(
    out: Path,
    data: Path,
    *,
    seed: int = 0,
    n_train: int = 2000,
    n_val: int = 300,
    n_test: int = 300,
    target: float = 0.45,
    max_steps: int = 3000,
    batch_size: int = 64,
    learning_rate: float = 1e-3,
    eval_every: int = 25,
    log=print,
) -> dict:
    """Write the dataset and the pre-trained model; returns a summary (accuracies, steps)."""
    torch.manual_seed(seed)
    train, val, test = split_problems(seed, n_train, n_val, n_test)
    train_rows, val_rows, test_rows = ([p.row() for p in split] for split in (train, val, test))
    write_jsonl(train_rows, data / "train.jsonl")
    write_jsonl(test_rows, data / "test.jsonl")

    shared_tokenizer = build_tokenizer()
    config = qwen2_config(shared_tokenizer)
    tokenizer = served_tokenizer(shared_tokenizer, config, out)
    model = Qwen2ForCausalLM(config)
    history = pretrain(
        model,
        tokenizer,
        train_rows,
        val_rows,
        target=target,
        max_steps=max_steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        eval_every=eval_every,
        seed=seed,
        log=log,
    )
    _save(model, tokenizer, out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    torch.manual_seed(seed)
    summary = {
        "steps": history[-1]["step"],
        "greedy_val_accuracy": history[-1]["greedy_val_accuracy"],
        "greedy_test_accuracy": accuracy(model, tokenizer, test_rows),
        "sampled_test_accuracy_t1": accuracy(model, tokenizer, test_rows, temperature=1.0),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    log(json.dumps(summary))
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the demo dataset and pre-train the demo policy.")
    parser.add_argument("--out", type=Path, default=Path("models/demo"), help="model directory")
    parser.add_argument("--data", type=Path, default=Path("data/demo"), help="dataset directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.45, help="greedy validation accuracy to stop at")
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 = reproducible)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    build_demo(
        args.out,
        args.data,
        seed=args.seed,
        target=args.target,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
    )


if __name__ == "__main__":
    main()
