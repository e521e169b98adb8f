"""The embedded agent task: three-digit arithmetic with a calculator tool, and its warm-started tiny policy.

``python -m tiny_models.tools_demo --out models/tools --data data/tools`` writes:

- ``data/tools/train.jsonl`` / ``test.jsonl``: ``What is 347 + 582?`` (a, b in 100..999, + or - with a >= b),
  rows ``{"prompt": [...], "answer": "929"}``; test questions never occur in train. A tiny model cannot do
  this arithmetic itself; the calculator can.
- ``models/tools``: the shared tiny Qwen2 shape (four 32-wide heads, RoPE theta 100) with the shared tokenizer
  (digits are single tokens) plus ``<tool_call>`` / ``</tool_call>`` and the call's fixed JSON around the
  expression as one token each side, and a chat template that lists the tools it is given. A call is then
  ``<tool_call>{"name": "calculator", "arguments": {"expression": " 347 + 582"}}</tool_call>`` in 11 tokens,
  the question's own expression tokens between fixed ones. Warm-started with supervised next-token loss on
  two kinds of trajectories: with probability ``tool_share`` that call, the calculator's result (not trained
  on: it is the environment's text), and ``#### <result>``; otherwise ``#### <answer>`` written directly. So
  the policy calls the calculator some of the time and, when it does, copies the question and the result;
  GRPO with the calculator then learns to call it more (configs/tools.yaml).

Deterministic for a given seed on one CPU thread; the default 700 steps take about 2.5 CPU-minutes.
``evaluate`` reports greedy episode success, the sampled probability of starting with a call, and how often a
call forced as the first token copies the question's expression exactly (measured numbers: README).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Qwen2ForCausalLM

from grpo_runtime.env_types import ToolDefinition, ToolResult
from grpo_runtime.tokenizing import chat_token_ids, decode_text, token_id
from rollout_service.core.tool_calls import ToolSuffixer, parse_tool_calls
from tiny_models.demo import _collate, write_jsonl
from tiny_models.make import _save, qwen2_config, served_tokenizer
from tiny_models.tokenizer import build_tokenizer

# The calculator call's fixed JSON around the expression is one token each side, so a call is the question's
# expression between four fixed tokens and copying it is a short, fixed-offset copy a 2-layer model learns.
CALL_OPEN = '{"name": "calculator", "arguments": {"expression": "'
CALL_CLOSE = '"}}'
TOOL_TOKENS = ["<tool_call>", "</tool_call>", CALL_OPEN, CALL_CLOSE]
# ChatML with a one-line tool list (the full JSON schemas would be most of a tiny model's context).
TOOLS_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\nTools: ' }}"
    "{% for tool in tools %}{{ tool['function']['name'] if tool['function'] is defined else tool['name'] }}"
    "{% if not loop.last %}{{ ', ' }}{% endif %}{% endfor %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CALCULATOR = ToolDefinition("calculator", "Evaluates an arithmetic expression.")
TOOLS = [CALCULATOR.chat_template_form()]
ANSWER = re.compile(r"####\s*(-?\d+)")


def question(a: int, op: str, b: int) -> dict:
    value = a + b if op == "+" else a - b
    return {"prompt": [{"role": "user", "content": f"What is {a} {op} {b}?"}], "answer": str(value)}


def problems(seed: int, n_train: int, n_test: int) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    seen: set[tuple[int, str, int]] = set()
    rows: list[dict] = []
    while len(rows) < n_train + n_test:
        a, b, op = rng.randint(100, 999), rng.randint(100, 999), rng.choice("+-")
        if op == "-" and a < b:
            a, b = b, a
        if (a, op, b) not in seen:
            seen.add((a, op, b))
            rows.append(question(a, op, b))
    return rows[n_test:], rows[:n_test]


def expression_of(row: dict) -> str:
    """The question's expression with its leading space (`` 347 + 582``): the question's own tokens."""
    return row["prompt"][0]["content"].removeprefix("What is").removesuffix("?")


def tool_call_text(expression: str) -> str:
    """The Hermes call ``<tool_call>{"name": "calculator", "arguments": {"expression": ...}}</tool_call>``."""
    body = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    assert body == CALL_OPEN + expression + CALL_CLOSE
    return f"<tool_call>{body}</tool_call>"


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_ids(tokenizer: PreTrainedTokenizerBase, row: dict) -> list[int]:
    return chat_token_ids(tokenizer, row["prompt"], add_generation_prompt=True, tools=TOOLS)


def encode(tokenizer: PreTrainedTokenizerBase, row: dict, use_tool: bool) -> tuple[list[int], list[int]]:
    """(ids, labels) of one trajectory; labels -100 on the prompt and on the tool's result tokens."""
    eos = tokenizer.eos_token_id
    prompt = prompt_ids(tokenizer, row)
    answer = [*_ids(tokenizer, f"#### {row['answer']}"), eos]
    if not use_tool:
        return prompt + answer, [-100] * len(prompt) + answer
    expression = expression_of(row)
    call = [*_ids(tokenizer, tool_call_text(expression)), eos]
    result = ToolSuffixer(tokenizer).suffix_ids([ToolResult("", "calculator", row["answer"])])
    ids = prompt + call + result + answer
    return ids, [-100] * len(prompt) + call + [-100] * len(result) + answer


def _left_padded(sequences: Sequence[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        ids[i, width - len(s) :] = torch.tensor(s)
        mask[i, width - len(s) :] = 1
    return ids, mask


@torch.no_grad()
def _turn(model, tokenizer, sequences: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    ids, mask = _left_padded(sequences, tokenizer.pad_token_id)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    new = out[:, ids.shape[1] :].tolist()
    return [
        row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row for row in new
    ]


def evaluate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict]) -> dict:
    """Greedy episodes with a local calculator: the share of rows answered right (``success``) and of rows
    with a call (``call_frequency``); the mean probability of a call as the first sampled token; and the share
    of rows whose call, forced as the first token, holds exactly the question's expression."""
    model.eval()
    prompts = [prompt_ids(tokenizer, row) for row in rows]
    first = _turn(model, tokenizer, prompts, 48)
    texts = [decode_text(tokenizer, t) for t in first]
    finals = list(texts)
    called = [i for i, t in enumerate(texts) if parse_tool_calls(t)]
    if called:
        grown = []
        for i in called:
            call = parse_tool_calls(texts[i])[0].call
            try:
                sum_or_difference = re.fullmatch(
                    r"\s*(\d+)\s*([+-])\s*(\d+)\s*", json.loads(call.arguments_json)["expression"]
                )
                if sum_or_difference is None:
                    raise ValueError("not a sum or difference of two integers")
                a, op, b = sum_or_difference.groups()
                result = str(int(a) + int(b) if op == "+" else int(a) - int(b))
            except (AttributeError, KeyError, TypeError, ValueError):
                result = "error"
            suffix = ToolSuffixer(tokenizer).suffix_ids([ToolResult("", "calculator", result)])
            grown.append(prompts[i] + first[i] + suffix)
        for i, second in zip(called, _turn(model, tokenizer, grown, 12), strict=True):
            finals[i] = decode_text(tokenizer, second)
    right = 0
    for text, row in zip(finals, rows, strict=True):
        found = ANSWER.findall(text)
        right += bool(found) and found[-1] == row["answer"]
    call_id = token_id(tokenizer, "<tool_call>")
    logits = model(*_left_padded(prompts, tokenizer.pad_token_id)).logits[:, -1]
    # A call forced as the first token: does the model copy the question's expression into it?
    forced = _turn(model, tokenizer, [[*p, call_id] for p in prompts], 16)
    copied = 0
    for turn, row in zip(forced, rows, strict=True):
        calls = parse_tool_calls("<tool_call>" + decode_text(tokenizer, turn))
        expected = json.dumps({"expression": expression_of(row)})
        copied += bool(calls) and calls[0].call.arguments_json == expected
    model.train()
    return {
        "success": right / len(rows),
        "call_frequency": len(called) / len(rows),
        "sampled_call_probability": logits.softmax(-1)[:, call_id].mean().item(),
        "forced_call_copy_accuracy": copied / len(rows),
    }


def build_tools_demo(
    out: Path,
    data: Path,
    *,
    seed: int = 0,
    n_train: int = 4000,
    n_test: int = 200,
    tool_share: float = 0.3,
    steps: int = 700,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    shape: str = "small",
    log=print,
) -> dict:
    """Write the task's train/test rows under ``data`` and a policy of ``tiny_models.make`` shape ``shape``
    warm-started on them to ``out``; returns the final evaluation (``evaluate``) and the parameter count."""
    torch.manual_seed(seed)
    train, test = problems(seed, n_train, n_test)
    write_jsonl(train, data / "train.jsonl")
    write_jsonl(test, data / "test.jsonl")
    shared = build_tokenizer()
    shared.add_tokens(TOOL_TOKENS)
    shared.chat_template = TOOLS_TEMPLATE
    config = qwen2_config(shared, shape)
    # Four 32-wide heads and a short RoPE wavelength make attention by relative position sharp enough that the
    # fixed-offset copy of the expression is learned in a few hundred steps (two 64-wide heads at theta 1e4
    # stay on the plateau for more than 600).
    config.num_attention_heads = config.num_key_value_heads = 4
    config.head_dim = config.hidden_size // 4
    config.rope_theta = 100.0
    tokenizer = served_tokenizer(shared, config, out)
    model = Qwen2ForCausalLM(config)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    model.train()
    for step in range(1, steps + 1):
        batch = [encode(tokenizer, row, rng.random() < tool_share) for row in rng.sample(train, batch_size)]
        loss = model(**_collate(batch, tokenizer.pad_token_id)).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 200 == 0:
            progress = evaluate(model, tokenizer, test[:50])
            log(json.dumps({"step": step, "loss": round(loss.item(), 4), **progress}))
    _save(model.eval(), tokenizer, out)
    summary = {"steps": steps, **evaluate(model, tokenizer, test), "parameters": model.num_parameters()}
    log(json.dumps(summary))
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the tool-use dataset and warm-start its tiny policy.")
    parser.add_argument("--out", type=Path, default=Path("models/tools"))
    parser.add_argument("--data", type=Path, default=Path("data/tools"))
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    build_tools_demo(args.out, args.data, steps=args.steps, seed=args.seed)


if __name__ == "__main__":
    main()
