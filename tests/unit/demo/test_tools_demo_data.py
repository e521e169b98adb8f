"""The tool-calling demo: dataset shape, the call format, and the shipped warm-started policy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from reward_service.environments.calculator import Calculator, CalculatorSettings
from rollout_service.core.tool_calls import parse_tool_calls
from tiny_models.demo import read_jsonl
from tiny_models.tools_demo import CALL_CLOSE, CALL_OPEN, evaluate, expression_of, tool_call_text

ROOT = Path(__file__).resolve().parents[3]
MODEL_DIR = ROOT / "models" / "tools"
DATA_DIR = ROOT / "data" / "tools"
QUESTION = re.compile(r"What is (\d{3}) ([+-]) (\d{3})\?")


@pytest.fixture(scope="module")
def splits() -> dict[str, list[dict]]:
    return {name: read_jsonl(DATA_DIR / f"{name}.jsonl") for name in ("train", "test")}


@pytest.fixture(scope="module")
def shipped() -> tuple:
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()
    return model, tokenizer


def test_rows_are_three_digit_questions_with_their_answers(splits):
    for name, rows in splits.items():
        assert len(rows) >= 100, name
        for row in rows:
            assert set(row) == {"prompt", "answer"}
            (message,) = row["prompt"]
            a, op, b = QUESTION.fullmatch(message["content"]).groups()
            assert row["answer"] == str(int(a) + int(b) if op == "+" else int(a) - int(b))
    assert not {r["prompt"][0]["content"] for r in splits["train"]} & {
        r["prompt"][0]["content"] for r in splits["test"]
    }


def test_the_call_is_hermes_json_the_calculator_evaluates(splits):
    row = splits["test"][0]
    (parsed,) = parse_tool_calls(tool_call_text(expression_of(row)))
    assert parsed.error == "" and parsed.call.name == "calculator"
    expression = json.loads(parsed.call.arguments_json)["expression"]
    assert str(Calculator(CalculatorSettings()).evaluate(expression)) == row["answer"]


def test_the_call_is_the_questions_tokens_between_fixed_tokens(splits, shipped):
    _, tokenizer = shipped
    row = splits["test"][0]
    question = tokenizer.tokenize(row["prompt"][0]["content"])
    call = tokenizer.tokenize(tool_call_text(expression_of(row)))
    assert call[:2] == ["<tool_call>", CALL_OPEN] and call[-2:] == [CALL_CLOSE, "</tool_call>"]
    assert call[2:-2] == question[2:-1]  # "What", "Ġis" ... "?"


def test_the_shipped_policy_calls_sometimes_copies_well_and_cannot_answer_alone(splits, shipped):
    model, tokenizer = shipped
    stats = evaluate(model, tokenizer, splits["test"][:50])
    assert 0.15 <= stats["sampled_call_probability"] <= 0.5, stats
    assert stats["forced_call_copy_accuracy"] >= 0.6, stats
    assert stats["success"] <= 0.1, stats  # greedy answers directly, and three-digit sums are beyond it
