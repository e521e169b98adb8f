"""Training data: file types, soup-cli's row layouts, metadata kept, errors naming split/row/column."""

from __future__ import annotations

import json

import datasets
import pytest
from transformers import AutoTokenizer

from trainer_service.config.reward_terms import RewardTerm
from trainer_service.config.run_config import DataConfig
from trainer_service.training.data import (
    DataError,
    check_prompt_lengths,
    detect_format,
    prepare_rows,
    read_rows,
    read_split,
    to_dataset,
    to_grpo_row,
    validate_reward_metadata,
)

ROWS = [
    {"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}], "level": 1},
    {"prompt": "2+2?", "answer": "4"},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("suffix", ["jsonl", "json", "parquet", "dir", "dict_dir"])
def test_read_rows_every_source(tmp_path, suffix):
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]
    if suffix == "jsonl":
        path = write_jsonl(tmp_path / "d.jsonl", rows)
    elif suffix == "json":
        path = tmp_path / "d.json"
        path.write_text(json.dumps(rows))
    elif suffix == "parquet":
        path = tmp_path / "d.parquet"
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    elif suffix == "dir":
        path = tmp_path / "ds"
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    else:
        path = tmp_path / "dd"
        datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(path))
    assert read_rows(path, split="train") == rows


def test_read_rows_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_rows(tmp_path / "nope.jsonl", split="train")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(DataError, match="line 2: not valid JSON"):
        read_rows(bad, split="train")
    csv = tmp_path / "d.csv"
    csv.write_text("prompt\na\n")
    with pytest.raises(DataError, match=r"unsupported file type '\.csv'"):
        read_rows(csv, split="train")
    not_objects = tmp_path / "list.json"
    not_objects.write_text("[1, 2]")
    with pytest.raises(DataError, match=r"eval row 0 of list\.json: expected a JSON object"):
        read_rows(not_objects, split="eval")
    dd = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list([{"prompt": "a"}])}).save_to_disk(str(dd))
    with pytest.raises(DataError, match="without a test or validation or eval split"):
        read_rows(dd, split="eval")


def test_messages_final_assistant_turn_becomes_answer():
    row = to_grpo_row(ROWS[0])
    assert row == {"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2", "level": 1}


def test_messages_multi_turn_keeps_earlier_assistant_turns():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "3*3?"},
    ]
    row = to_grpo_row({"messages": messages, "answer": "9"})
    assert row["prompt"] == messages
    assert row["answer"] == "9"


def test_explicit_answer_wins_over_assistant_turn():
    row = to_grpo_row({"messages": ROWS[0]["messages"], "answer": "two"})
    assert row["answer"] == "two"


def test_prompt_string_and_message_list():
    assert to_grpo_row({"prompt": "hi", "answer": "x"}) == {
        "prompt": [{"role": "user", "content": "hi"}],
        "answer": "x",
    }
    messages = [{"role": "user", "content": "hi"}]
    assert to_grpo_row({"prompt": messages})["prompt"] == messages


def test_dpo_chosen_becomes_answer():
    row = to_grpo_row({"prompt": "q", "chosen": "good", "rejected": "bad"})
    assert detect_format({"prompt": "q", "chosen": "good"}) == "dpo"
    assert row["answer"] == "good"
    assert row["rejected"] == "bad"
    chat = to_grpo_row({"prompt": "q", "chosen": [{"role": "assistant", "content": "ok"}], "rejected": "no"})
    assert chat["answer"] == "ok"


def test_alpaca_instruction_input_output():
    row = to_grpo_row({"instruction": "Add", "input": "2 and 3", "output": "5", "id": 7})
    assert row == {"prompt": [{"role": "user", "content": "Add\n\n2 and 3"}], "answer": "5", "id": 7}
    assert to_grpo_row({"instruction": "Say hi", "input": ""})["prompt"][0]["content"] == "Say hi"


def test_forced_format_mismatch_names_column():
    with pytest.raises(ValueError, match="column 'messages' is missing"):
        to_grpo_row({"prompt": "x"}, "messages")


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ({"text": "no prompt"}, "row 1: no prompt column"),
        ({"messages": []}, "row 1: column 'messages' must be a non-empty list"),
        ({"messages": [{"content": "x"}]}, "row 1: column 'messages' message 0 needs a non-empty 'role'"),
        ({"messages": [{"role": "user", "content": 5}]}, "message 0 needs a string 'content'"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "only an assistant turn"),
        ({"prompt": "   "}, "row 1: column 'prompt' is empty"),
        ({"instruction": ""}, "row 1: column 'instruction' is missing or empty"),
    ],
)
def test_bad_rows_name_split_row_and_column(row, fragment):
    with pytest.raises(DataError, match=r"^eval ") as caught:
        prepare_rows([{"prompt": "fine"}, row], fmt="auto", split="eval")
    assert fragment in str(caught.value)


def test_empty_dataset_is_an_error():
    with pytest.raises(DataError, match="train data has no rows"):
        prepare_rows([], fmt="auto", split="train")


ACCURACY = [RewardTerm(name="accuracy")]


def test_metadata_validation_passes_with_answers():
    validate_reward_metadata(prepare_rows(ROWS, fmt="auto", split="train"), ACCURACY, split="train")


@pytest.mark.parametrize("missing", [None, "", "   ", "absent"])
def test_metadata_validation_names_split_row_column(missing):
    rows = [{"prompt": [{"role": "user", "content": "q"}], "answer": "1"}, {"prompt": [], "answer": missing}]
    if missing == "absent":
        del rows[1]["answer"]
    with pytest.raises(DataError) as caught:
        validate_reward_metadata(rows, ACCURACY, split="validation")
    assert str(caught.value).startswith(
        "validation row 1 is missing or empty 'answer', required by reward 'accuracy'"
    )


def test_metadata_alternatives_and_rewards_without_needs():
    code = [RewardTerm(name="code"), RewardTerm(name="format")]
    validate_reward_metadata([{"expected": "42"}, {"tests": ["assert f()"]}], code, split="train")
    with pytest.raises(DataError, match="train row 0 is missing or empty 'tests' or 'expected'"):
        validate_reward_metadata([{"tests": []}], code, split="train")
    with pytest.raises(DataError, match="'schema', required by reward 'json_schema'"):
        validate_reward_metadata([{"answer": "1"}], [RewardTerm(name="json_schema")], split="train")
    # format/length need nothing.
    validate_reward_metadata([{}], [RewardTerm(name="format"), RewardTerm(name="length")], split="train")


def load_split(config: DataConfig, split: str):
    return to_dataset(read_split(config, split=split), ACCURACY, split=split)


def test_read_split_then_to_dataset_converts_and_validates(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", ROWS)
    dataset = load_split(DataConfig(train=str(path)), split="train")
    assert dataset.num_rows == 2
    assert dataset["answer"] == ["2", "4"]
    assert dataset["level"] == [1, None]
    assert load_split(DataConfig(train=str(path)), split="eval") is None
    bad = write_jsonl(tmp_path / "bad.jsonl", [*ROWS, {"prompt": "no answer"}])
    with pytest.raises(DataError, match="train row 2 is missing or empty 'answer'"):
        load_split(DataConfig(train=str(bad)), split="train")


def test_service_style_requirements_all_entries_required():
    requirements = {"mine": ("a|b", "c")}
    terms = [RewardTerm(name="mine")]
    validate_reward_metadata([{"b": 1, "c": "x"}], terms, split="train", requirements=requirements)
    with pytest.raises(DataError, match="train row 0 is missing or empty 'c', required by reward 'mine'"):
        validate_reward_metadata([{"a": 1}], terms, split="train", requirements=requirements)


def test_prompt_length_check_uses_the_chat_template(tiny_models):
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["policy"])
    dataset = datasets.Dataset.from_list(
        prepare_rows([{"prompt": "hi"}, {"prompt": "1 2 3 4 5 6 7 8 9 " * 20}], fmt="auto", split="t")
    )
    check_prompt_lengths(dataset.select([0]), tokenizer, 64, split="train")
    with pytest.raises(
        DataError, match=r"train row 1: column 'prompt' is \d+ tokens after the chat template"
    ):
        check_prompt_lengths(dataset, tokenizer, 64, split="train")
