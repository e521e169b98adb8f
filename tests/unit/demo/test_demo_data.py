"""The embedded demo: dataset shape, verifiable answers, and the shipped pre-trained policy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from reward_service.rewards.accuracy import numeric_value
from tiny_models.demo import (
    accuracy,
    build_demo,
    encode_example,
    generate_answers,
    is_correct,
    read_jsonl,
    split_problems,
)

ROOT = Path(__file__).resolve().parents[3]
MODEL_DIR = ROOT / "models" / "demo"
DATA_DIR = ROOT / "data" / "demo"
QUESTION = re.compile(r"What is (\d+) ([+-]) (\d+)\?")
# Greedy accuracy the shipped model is pre-trained to (see tiny_models/demo.py): about one half.
GREEDY_BAND = (0.35, 0.65)


@pytest.fixture(scope="module")
def splits() -> dict[str, list[dict]]:
    return {name: read_jsonl(DATA_DIR / f"{name}.jsonl") for name in ("train", "test")}


@pytest.fixture(scope="module")
def shipped() -> tuple:
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()
    return model, tokenizer


def test_rows_are_chat_prompts_with_integer_answers(splits):
    for name, rows in splits.items():
        assert len(rows) >= 300, name
        for row in rows:
            assert set(row) == {"prompt", "answer"}
            (message,) = row["prompt"]
            assert message["role"] == "user"
            left, op, right = QUESTION.fullmatch(message["content"]).groups()
            expected = int(left) + int(right) if op == "+" else int(left) - int(right)
            assert re.fullmatch(r"\d+", row["answer"])
            assert int(row["answer"]) == expected


def test_test_split_is_held_out(splits):
    questions = {name: [r["prompt"][0]["content"] for r in rows] for name, rows in splits.items()}
    assert len(set(questions["train"])) == len(questions["train"])
    assert len(set(questions["test"])) == len(questions["test"])
    assert not set(questions["train"]) & set(questions["test"])


def test_committed_data_is_what_the_script_writes(splits):
    train, _, test = split_problems(
        seed=0, n_train=len(splits["train"]), n_val=300, n_test=len(splits["test"])
    )
    assert [p.row() for p in test] == splits["test"]
    assert [p.row() for p in train] == splits["train"]


def test_answers_are_verified_by_the_numeric_accuracy_reward(splits):
    for row in splits["test"]:
        gold = row["answer"]
        wrong = str(int(gold) + 1)
        assert is_correct(gold, gold) and is_correct(f" {gold}\n", gold)
        assert not is_correct(wrong, gold)
        assert numeric_value(gold, gold).value == 1.0
        assert numeric_value(gold, wrong).value == 0.0


def test_encode_example_trains_only_on_answer_and_end_of_turn(shipped):
    _, tokenizer = shipped
    ids, labels = encode_example(
        tokenizer, {"prompt": [{"role": "user", "content": "What is 2 + 3?"}], "answer": "5"}
    )
    trained = [label for label in labels if label != -100]
    assert trained == [*tokenizer("5", add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    assert ids[-len(trained) :] == trained
    assert tokenizer.decode(ids[: len(ids) - len(trained)]).endswith("<|im_start|>assistant\n")


def test_shipped_model_shape_and_size():
    config = json.loads((MODEL_DIR / "config.json").read_text())
    assert config["head_dim"] == 64
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert (MODEL_DIR / "tokenizer.json").exists()
    weights = sum(p.stat().st_size for p in MODEL_DIR.glob("*.safetensors"))
    assert 0 < weights < 5_000_000


def test_shipped_model_greedy_accuracy_is_about_one_half(shipped, splits):
    model, tokenizer = shipped
    greedy = accuracy(model, tokenizer, splits["test"])
    assert GREEDY_BAND[0] <= greedy <= GREEDY_BAND[1]
    completions = generate_answers(model, tokenizer, splits["test"][:50])
    # Every greedy completion is a plain integer, so numeric and exact-match rewards agree on it.
    assert all(re.fullmatch(r"\d+", c.strip()) for c in completions)


def test_sampling_at_temperature_one_mixes_right_and_wrong(shipped, splits):
    model, tokenizer = shipped
    torch.manual_seed(0)
    rows = [row for row in splits["test"][:64] for _ in range(8)]
    completions = generate_answers(model, tokenizer, rows, temperature=1.0)
    rewards = [float(is_correct(c, r["answer"])) for c, r in zip(completions, rows, strict=True)]
    groups = [rewards[i : i + 8] for i in range(0, len(rewards), 8)]
    mixed = sum(0.0 < sum(g) < 8.0 for g in groups)
    # GRPO learns only from groups whose 8 samples disagree.
    assert mixed >= len(groups) // 4
    assert 0.1 <= sum(rewards) / len(rewards) <= 0.7


def test_build_demo_writes_data_and_a_loadable_model(tmp_path):
    summary = build_demo(
        tmp_path / "model",
        tmp_path / "data",
        n_train=200,
        n_val=20,
        n_test=20,
        max_steps=4,
        batch_size=8,
        eval_every=2,
        log=lambda _: None,
    )
    assert summary["steps"] == 4
    assert len(read_jsonl(tmp_path / "data" / "train.jsonl")) == 200
    assert len(read_jsonl(tmp_path / "data" / "test.jsonl")) == 20
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert model.config.head_dim == 64
