"""A tiny judge: a Qwen2 causal LM trained to a checked criterion to answer a judge's yes/no question.

Task: "What is a + b?" with a reference answer and a response (three phrasings) that states its final
answer either as ``\\boxed{x}`` or as plain ``x``; the judge's first answer token is ``Yes`` for a boxed
final answer and ``No`` otherwise, right or wrong (spotting a token is learnt in seconds; comparing two
numbers is not). Trained on the short ``POINTWISE_TEMPLATE`` and ``GROUP_TEMPLATE`` below (groups of 2-4
responses asking about one of them) through the shared ChatML template, with cross-entropy on the verdict
token only. The tokenizer is the shared one plus the whole words ``Yes`` and ``No`` appended (every shared
id keeps its meaning).

Float results depend on the CPU's kernels (AVX2, AVX-512, ...), so a fixed number of steps gives a
different judge on each machine. Training therefore runs to a criterion, checked on every pointwise
question of the task (a, b in 0..10, each phrasing, every stated value in 0..20, boxed or not):

    margin = logit(expected verdict) - max(logit of every other token) >= log(9)

which makes the expected verdict the greedy first token and gives ``p(Yes) / (p(Yes) + p(No))`` of at
least ``VERDICT_PROBABILITY`` = 0.9 for a boxed answer and at most 0.1 for a plain one. A judge that has
not met it after ``max_steps`` is an error naming the figure, never a saved model. Tests rely on exactly
this guarantee; group questions are seen in training but not guaranteed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast, Qwen2ForCausalLM

from grpo_runtime.tokenizing import token_id
from reward_service.core.types import Message, Sample
from reward_service.judges.template import judge_templates, numbered, prompt_text
from tiny_models.tokenizer import build_tokenizer

VERDICTS = ("Yes", "No")
VERDICT_PROBABILITY = 0.9
MIN_MARGIN = math.log(VERDICT_PROBABILITY / (1 - VERDICT_PROBABILITY))
LEARNING_RATE = 2e-3
OPERANDS = range(11)
STATED_VALUES = range(21)
RESPONSES = (
    "The answer is {final}.",
    "{a} + {b} = {final}",
    "First, add {a} and {b}. The answer is {final}.",
)
# Short templates keep the training sequences short (about 30 tokens): a few seconds of CPU.
POINTWISE_TEMPLATE = "Answer: {answer}\nResponse: {completion}\nCorrect?"
GROUP_TEMPLATE = "Answer: {answer}\n{completions}\nIs [{index}] correct?"

Example = tuple[list[int], int]  # (input ids of the chat-templated question, expected verdict id)


class CriterionNotMet(RuntimeError):
    """The judge did not reach its criterion within its step budget."""


@dataclass(frozen=True)
class JudgeReport:
    """How training ended: ``min_margin`` in logits over ``questions`` pointwise questions."""

    steps: int
    min_margin: float
    questions: int


def judge_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(list(VERDICTS))
    return tokenizer


def _final(value: int, boxed: bool) -> str:
    return f"\\boxed{{{value}}}" if boxed else str(value)


def _problem(rng: random.Random) -> tuple[Sample, list[str], list[bool]]:
    """A question with its answer and 1-4 responses, each boxing its final answer or not (about half each)."""
    a, b = rng.choice(OPERANDS), rng.choice(OPERANDS)
    responses, boxed = [], []
    for _ in range(rng.randint(1, 4)):
        value = rng.choice([a + b, rng.choice(STATED_VALUES)])
        box = rng.random() < 0.5
        responses.append(rng.choice(RESPONSES).format(a=a, b=b, final=_final(value, box)))
        boxed.append(box)
    sample = Sample(
        id="",
        completion="",
        prompt=(Message("user", f"What is {a} + {b}?"),),
        metadata={"answer": str(a + b)},
    )
    return sample, responses, boxed


def _encode(tokenizer: PreTrainedTokenizerBase, questions: list[str]) -> list[list[int]]:
    chats = tokenizer.apply_chat_template(
        [[{"role": "user", "content": q}] for q in questions], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(chats, add_special_tokens=False)["input_ids"]


def _verdict_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    return [token_id(tokenizer, v) for v in VERDICTS]


def example_batches(
    tokenizer: PreTrainedTokenizerBase, batch_size: int, seed: int
) -> Iterator[list[Example]]:
    """Endless batches of ``batch_size`` random training questions, pointwise (one response) or group (2-4
    responses), drawn from one seeded stream and encoded as they are needed."""
    pointwise, group = judge_templates(POINTWISE_TEMPLATE, GROUP_TEMPLATE)
    yes, no = _verdict_ids(tokenizer)
    rng = random.Random(seed)
    while True:
        questions, verdicts = [], []
        for _ in range(batch_size):
            sample, responses, boxed = _problem(rng)
            values = {"prompt": prompt_text(sample), "answer": sample.metadata["answer"]}
            k = rng.randrange(len(responses))
            if len(responses) == 1:
                questions.append(pointwise.fill({**values, "completion": responses[0]}))
            else:
                questions.append(
                    group.fill({**values, "completions": numbered(responses), "index": str(k + 1)})
                )
            verdicts.append(boxed[k])
        encoded = _encode(tokenizer, questions)
        yield [(ids, yes if box else no) for ids, box in zip(encoded, verdicts, strict=True)]


def pointwise_questions(tokenizer: PreTrainedTokenizerBase) -> list[Example]:
    """Every distinct pointwise question of the task, the set the criterion is checked on."""
    pointwise, _ = judge_templates(POINTWISE_TEMPLATE, GROUP_TEMPLATE)
    questions: dict[str, bool] = {}
    for a in OPERANDS:
        for b in OPERANDS:
            for response in RESPONSES:
                for value in STATED_VALUES:
                    for box in (True, False):
                        completion = response.format(a=a, b=b, final=_final(value, box))
                        questions[pointwise.fill({"answer": str(a + b), "completion": completion})] = box
    yes, no = _verdict_ids(tokenizer)
    ids = _encode(tokenizer, list(questions))
    return [(row, yes if box else no) for row, box in zip(ids, questions.values(), strict=True)]


def _batch(
    items: list[Example], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids and mask (B, T), each row's last position (B,) and its verdict id (B,)."""
    width = max(len(ids) for ids, _ in items)
    input_ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, (ids, _) in enumerate(items):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
    last = torch.tensor([len(ids) - 1 for ids, _ in items])
    targets = torch.tensor([verdict for _, verdict in items])
    return input_ids, mask, last, targets


def _verdict_logits(
    model: Qwen2ForCausalLM, items: list[Example], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token logits at each question's end (B, V) and the expected verdict ids (B,)."""
    input_ids, mask, last, targets = _batch(items, pad_id)
    logits = model(input_ids=input_ids, attention_mask=mask).logits
    return logits[torch.arange(len(items)), last], targets


def verdict_margins(
    model: Qwen2ForCausalLM, items: list[Example], pad_id: int, batch: int = 1024
) -> torch.Tensor:
    """Per question: logit of the expected verdict minus the largest logit of any other token (B,)."""
    margins = []
    with torch.inference_mode():
        for start in range(0, len(items), batch):
            logits, targets = _verdict_logits(model, items[start : start + batch], pad_id)
            expected = logits.gather(1, targets[:, None])[:, 0]
            others = logits.scatter(1, targets[:, None], float("-inf")).amax(-1)
            margins.append(expected - others)
    return torch.cat(margins)


def _train_step(
    model: Qwen2ForCausalLM, optimizer: torch.optim.Optimizer, chunk: list[Example], pad_id: int
) -> None:
    """One step of cross-entropy on the verdict token of each question in ``chunk``."""
    model.train()
    logits, targets = _verdict_logits(model, chunk, pad_id)
    loss = torch.nn.functional.cross_entropy(logits, targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def train_judge(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    seed: int = 0,
    max_steps: int = 1500,
    batch_size: int = 32,
    check_every: int = 25,
) -> tuple[Qwen2ForCausalLM, JudgeReport]:
    """Train the fresh ``model`` as the tiny judge until every pointwise question clears ``MIN_MARGIN``
    (module docstring); in eval mode when done. Every ``check_every`` steps a fixed sample of 256
    questions is checked, and once it clears the bound with a logit to spare, all of them are.
    Raises ``CriterionNotMet`` naming the figure when ``max_steps`` pass first."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: on one machine, the same float sums and so the same weights
    try:
        torch.manual_seed(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
        batches = example_batches(tokenizer, batch_size, seed)
        questions = pointwise_questions(tokenizer)
        sample = random.Random(seed + 1).sample(questions, 256)
        worst = float("-inf")
        for step in range(1, max_steps + 1):
            _train_step(model, optimizer, next(batches), tokenizer.pad_token_id)
            if step % check_every:
                continue
            if verdict_margins(model.eval(), sample, tokenizer.pad_token_id).min() < MIN_MARGIN + 1:
                continue
            worst = float(verdict_margins(model, questions, tokenizer.pad_token_id).min())
            if worst >= MIN_MARGIN:
                return model.eval(), JudgeReport(step, worst, len(questions))
        worst = float(verdict_margins(model.eval(), questions, tokenizer.pad_token_id).min())
        raise CriterionNotMet(
            f"tiny model 'judge': min verdict margin {worst:.3f} < {MIN_MARGIN:.3f} "
            f"(p {VERDICT_PROBABILITY}) on {len(questions)} pointwise questions after {max_steps} steps"
        )
    finally:
        torch.set_num_threads(threads)
