"""A tiny judge: a Qwen2 causal LM trained for a few seconds to answer a judge's yes/no question.

Task: "What is a + b?" with a reference answer and a response (three phrasings) that states its final
answer either as ``\\boxed{x}`` or as plain ``x``; the judge's first answer token is ``Yes`` for a boxed
final answer and ``No`` otherwise, right or wrong (spotting a token is learnt in seconds; comparing two
numbers is not). Trained on the short ``POINTWISE_TEMPLATE`` and ``GROUP_TEMPLATE`` below (groups of 2-4
responses asking about one of them) through the shared ChatML template, with cross-entropy on the verdict
token only, so a test can check that a judge discriminates: p(Yes) is high for boxed answers and low for
the others (pointwise; the group question is seen in training but not learnt that fast). The tokenizer is
the shared one plus the whole words ``Yes`` and ``No`` appended (every shared id keeps its meaning).
Seeded, on one thread: the same weights every run.
"""

from __future__ import annotations

import random

import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from reward_service.core.types import Message, Sample
from reward_service.judges.template import judge_templates, numbered, prompt_text
from tiny_models.tokenizer import build_tokenizer

VERDICTS = ("Yes", "No")
LEARNING_RATE = 1e-2
RESPONSES = (
    "The answer is {final}.",
    "{a} + {b} = {final}",
    "First, add {a} and {b}. The answer is {final}.",
)
# Short templates keep the training sequences short (about 30 tokens): a few seconds of CPU.
POINTWISE_TEMPLATE = "Answer: {answer}\nResponse: {completion}\nCorrect?"
GROUP_TEMPLATE = "Answer: {answer}\n{completions}\nIs [{index}] correct?"


def judge_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(list(VERDICTS))
    return tokenizer


def _problem(rng: random.Random) -> tuple[Sample, list[str], list[bool]]:
    """A question with its answer and 1-4 responses, each boxing its final answer or not (about half each)."""
    a, b = rng.randint(0, 10), rng.randint(0, 10)
    responses, boxed = [], []
    for _ in range(rng.randint(1, 4)):
        value = rng.choice([a + b, rng.randint(0, 20)])
        final = f"\\boxed{{{value}}}" if (box := rng.random() < 0.5) else str(value)
        responses.append(rng.choice(RESPONSES).format(a=a, b=b, final=final))
        boxed.append(box)
    sample = Sample(
        id="",
        completion="",
        prompt=(Message("user", f"What is {a} + {b}?"),),
        metadata={"answer": str(a + b)},
    )
    return sample, responses, boxed


def examples(tokenizer: PreTrainedTokenizerFast, count: int, seed: int) -> list[tuple[list[int], int]]:
    """(input ids, verdict id) pairs: ids of the chat-templated judge question, then the verdict expected."""
    pointwise, group = judge_templates(POINTWISE_TEMPLATE, GROUP_TEMPLATE)
    verdict_ids = [tokenizer.convert_tokens_to_ids(v) for v in VERDICTS]
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        sample, responses, boxed = _problem(rng)
        values = {"prompt": prompt_text(sample), "answer": sample.metadata["answer"]}
        k = rng.randrange(len(responses))
        if len(responses) == 1:
            text = pointwise.fill({**values, "completion": responses[0]})
        else:
            text = group.fill(
                {
                    **values,
                    "completions": numbered(responses),
                    "index": str(k + 1),
                }
            )
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(chat, add_special_tokens=False)["input_ids"]
        out.append((ids, verdict_ids[0 if boxed[k] else 1]))
    return out


def _batch(
    items: list[tuple[list[int], int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in items)
    input_ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, (ids, _) in enumerate(items):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
    last = torch.tensor([len(ids) - 1 for ids, _ in items])
    targets = torch.tensor([verdict for _, verdict in items])
    return input_ids, mask, last, targets


def verdict_accuracy(model: Qwen2ForCausalLM, items: list[tuple[list[int], int]], pad_id: int) -> float:
    """Share of ``items`` whose verdict token is the likelier of the two verdicts."""
    input_ids, mask, last, targets = _batch(items, pad_id)
    with torch.inference_mode():
        logits = model(input_ids=input_ids, attention_mask=mask).logits[torch.arange(len(items)), last]
    pair = sorted(set(targets.tolist()))
    chosen = torch.tensor(pair)[logits[:, pair].argmax(-1)]
    return float((chosen == targets).float().mean())


def train_judge(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    seed: int = 0,
    steps: int = 150,
    batch_size: int = 32,
) -> Qwen2ForCausalLM:
    """Train the fresh ``model`` as the tiny judge (see the module docstring); in eval
    mode when done."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same float sums, so the same weights, every run
    try:
        torch.manual_seed(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
        data = examples(tokenizer, steps * batch_size, seed)
        model.train()
        for step in range(steps):
            chunk = data[step * batch_size : (step + 1) * batch_size]
            input_ids, mask, last, targets = _batch(chunk, tokenizer.pad_token_id)
            logits = model(input_ids=input_ids, attention_mask=mask).logits[torch.arange(len(targets)), last]
            loss = torch.nn.functional.cross_entropy(logits, targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return model.eval()
    finally:
        torch.set_num_threads(threads)
