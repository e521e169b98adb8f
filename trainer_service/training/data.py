"""Training data: load local files, turn each row into a GRPO prompt, check the metadata rewards need.

Accepted row layouts (those of soup-cli's GRPO trainer), detected per row with ``format: auto``:

- ``messages``: ``{"messages": [{"role": ..., "content": ...}, ...]}``; a final ``assistant`` turn is the
  reference answer (kept as ``answer`` unless the row has one) and is removed from the prompt; earlier
  assistant turns stay (multi-turn prompts).
- ``prompt``: ``{"prompt": "text"}`` or ``{"prompt": [messages]}``.
- ``dpo``: ``{"prompt": ..., "chosen": ..., "rejected": ...}``; ``chosen`` becomes ``answer`` when absent.
- ``alpaca``: ``{"instruction": ..., "input": ..., "output": ...}``; instruction and input (joined by a blank
  line) are the user turn, ``output`` becomes ``answer``.

Every other column (``answer``, ``tests``, ``schema``, ...) is kept: TRL forwards dataset columns to the
reward functions, which send them to the reward service as sample metadata. Prompts are always chat message
lists.

``reasoning_gym:<task>`` generates the rows instead (:func:`generate_rows`): the entry's question as the
user turn (after the configured system prompt), ``answer`` its gold answer and ``reasoning_gym`` its metadata
as JSON text — what the reward service's ``reasoning_gym:<task>`` rewards rebuild the entry from. The reward
service's policy (``reward_service.checkers.reasoning_gym_tasks``) applies here too, before any generation: a
task it withholds (its code evaluates text) is refused, and so is a task config value past its bound (the
run's config is hostile input, and generation runs in the trainer's process).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import pyarrow  # type: ignore[import-untyped]

from trainer_service.config.reward_terms import RewardTerm
from trainer_service.config.run_config import DataConfig, GeneratedData, generated_task
from trainer_service.training.row_images import ImageColumnError, load_row_images

Row = dict[str, Any]

# Metadata each built-in reward reads, in the reward service's ListRewards notation: every entry is required,
# and "a|b" means column a or column b. The trainer prefers the running service's own list; this table is the
# same for the built-ins (DESIGN.md) and serves when no service is asked.
REWARD_METADATA: dict[str, tuple[str, ...]] = {
    "accuracy": ("answer",),
    "code": ("tests|expected",),
    "json_schema": ("schema",),
}

_PROMPT_COLUMNS = {"messages", "prompt", "instruction", "input"}


class DataError(ValueError):
    """A dataset that cannot be trained on; the message names the split, row and column."""


def read_rows(path: str | Path, *, split: str) -> list[Row]:
    """Read raw rows from a JSONL/JSON/Parquet file or a ``save_to_disk`` directory.

    A ``DatasetDict`` directory gives its ``train`` split for ``split="train"`` and ``test``/``validation``
    (the first present) for ``split="eval"``.
    """
    source = Path(path)
    if not source.exists():
        raise DataError(f"{split} data {str(source)!r} does not exist")
    if source.is_dir():
        loaded = datasets.load_from_disk(str(source))
        if isinstance(loaded, datasets.DatasetDict):
            wanted = ["train"] if split == "train" else ["test", "validation", "eval"]
            name = next((candidate for candidate in wanted if candidate in loaded), None)
            if name is None:
                raise DataError(
                    f"{split} data {str(source)!r} is a DatasetDict without a {' or '.join(wanted)} split "
                    f"(has {sorted(loaded)})"
                )
            loaded = loaded[name]
        return [dict(row) for row in loaded]
    suffix = source.suffix.lower()
    if suffix == ".jsonl":
        rows = []
        for number, line in enumerate(source.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"{split} data {source.name} line {number}: not valid JSON ({exc.msg})"
                ) from exc
        return _require_objects(rows, source, split)
    if suffix == ".json":
        try:
            loaded_json = json.loads(source.read_text())
        except json.JSONDecodeError as exc:
            raise DataError(f"{split} data {source.name}: not valid JSON ({exc.msg})") from exc
        if isinstance(loaded_json, dict) and isinstance(loaded_json.get("data"), list):
            loaded_json = loaded_json["data"]
        if not isinstance(loaded_json, list):
            raise DataError(f"{split} data {source.name}: expected a JSON list of rows")
        return _require_objects(loaded_json, source, split)
    if suffix == ".parquet":
        return [dict(row) for row in datasets.Dataset.from_parquet(str(source))]
    raise DataError(
        f"{split} data {source.name}: unsupported file type {suffix or '(none)'!r} "
        "(use .jsonl, .json, .parquet or a datasets save_to_disk directory)"
    )


def _require_objects(rows: list[Any], source: Path, split: str) -> list[Row]:
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(
                f"{split} row {index} of {source.name}: expected a JSON object, got {type(row).__name__}"
            )
    return rows


def detect_format(row: Mapping[str, Any]) -> str:
    """The layout of one row: ``messages``, ``dpo``, ``prompt`` or ``alpaca``."""
    if "messages" in row:
        return "messages"
    if "prompt" in row and "chosen" in row:
        return "dpo"
    if "prompt" in row:
        return "prompt"
    if "instruction" in row:
        return "alpaca"
    raise ValueError("no prompt column: expected 'messages', 'prompt' or 'instruction'")


def _check_messages(messages: Any, *, column: str) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"column {column!r} must be a non-empty list of messages")
    checked = []
    for index, message in enumerate(messages):
        if (
            not isinstance(message, Mapping)
            or not isinstance(message.get("role"), str)
            or not message["role"]
        ):
            raise ValueError(f"column {column!r} message {index} needs a non-empty 'role'")
        checked.append({"role": message["role"], "content": _content(message.get("content"), column, index)})
    return checked


def _content(content: Any, column: str, index: int) -> str | list[dict[str, str]]:
    """A message's content: a string, or (a vision row) a list of ``{"type": "text", "text": ...}`` parts and
    ``{"type": "image"}`` placeholders, filled with the row's images in order."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise ValueError(f"column {column!r} message {index} needs a string 'content' or a list of parts")
    parts: list[dict[str, str]] = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image":
            parts.append({"type": "image"})
        else:
            raise ValueError(
                f"column {column!r} message {index} part {k}: expected {{'type': 'text', 'text': ...}} or "
                "{'type': 'image'}"
            )
    return parts


def _prompt_messages(value: Any, *, column: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"column {column!r} is empty")
        return [{"role": "user", "content": value}]
    return _check_messages(value, column=column)


def to_grpo_row(row: Mapping[str, Any], fmt: str = "auto") -> Row:
    """One raw row → ``{"prompt": [messages], **metadata}``; raises ValueError naming the column."""
    layout = detect_format(row) if fmt == "auto" else fmt
    metadata = {key: value for key, value in row.items() if key not in _PROMPT_COLUMNS}
    if layout == "messages":
        if "messages" not in row:
            raise ValueError("column 'messages' is missing")
        messages = _check_messages(row["messages"], column="messages")
        if messages[-1]["role"] == "assistant":
            metadata.setdefault("answer", messages[-1]["content"])
            messages = messages[:-1]
        if not messages:
            raise ValueError("column 'messages' holds only an assistant turn: there is no prompt")
        return {"prompt": messages, **metadata}
    if layout in ("prompt", "dpo"):
        if "prompt" not in row:
            raise ValueError("column 'prompt' is missing")
        prompt = _prompt_messages(row["prompt"], column="prompt")
        if layout == "dpo" and "chosen" in row and "answer" not in metadata:
            chosen = row["chosen"]
            if isinstance(chosen, list) and chosen and isinstance(chosen[-1], Mapping):
                chosen = chosen[-1].get("content")
            metadata["answer"] = chosen
        return {"prompt": prompt, **metadata}
    if layout == "alpaca":
        instruction = row.get("instruction")
        if not isinstance(instruction, str) or not instruction.strip():
            raise ValueError("column 'instruction' is missing or empty")
        extra = row.get("input")
        text = f"{instruction}\n\n{extra}" if isinstance(extra, str) and extra.strip() else instruction
        if "output" in metadata:
            metadata.setdefault("answer", metadata.pop("output"))
        return {"prompt": [{"role": "user", "content": text}], **metadata}
    raise ValueError(f"unknown data format {layout!r}")


def prepare_rows(rows: Iterable[Mapping[str, Any]], *, fmt: str, split: str) -> list[Row]:
    """Convert every row; the error names the split and row index."""
    prepared = []
    for index, row in enumerate(rows):
        try:
            prepared.append(to_grpo_row(row, fmt))
        except ValueError as exc:
            raise DataError(f"{split} row {index}: {exc}") from exc
    if not prepared:
        raise DataError(f"{split} data has no rows")
    return prepared


def has_usable_value(value: Any) -> bool:
    """Whether a metadata value can serve as a reward's gold target (None and blank strings cannot)."""
    if value is None:
        return False
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, (list, dict)):
        return bool(value)
    return True


def validate_reward_metadata(
    rows: Sequence[Mapping[str, Any]],
    rewards: Sequence[RewardTerm],
    *,
    split: str,
    requirements: Mapping[str, Sequence[str]] = REWARD_METADATA,
) -> None:
    """Fail before any generation when a row lacks the metadata one of its rewards reads.

    The error names the split, the row index, the column(s) and the reward, e.g.
    ``train row 3 is missing or empty 'answer', required by reward 'accuracy'``.
    """
    needs = [
        (term.name, tuple(entry.split("|"))) for term in rewards for entry in requirements.get(term.name, ())
    ]
    for index, row in enumerate(rows):
        for reward, columns in needs:
            if any(has_usable_value(row.get(column)) for column in columns):
                continue
            wanted = " or ".join(repr(column) for column in columns)
            raise DataError(
                f"{split} row {index} is missing or empty {wanted}, required by reward {reward!r}; keep that "
                "column in the dataset or end 'messages' with an assistant turn that holds the answer"
            )


def generate_rows(task: str, generated: GeneratedData, *, split: str) -> list[Row]:
    """``generated.size`` rows of reasoning-gym's ``task`` for ``train`` (seed ``generated.seed``), or
    ``generated.eval_size`` for ``eval`` (seed + size, see GeneratedData), in the module docstring's
    layout."""
    # reasoning-gym (and sympy under it) takes about a second to import: only runs that use it pay.
    reasoning_gym = importlib.import_module("reasoning_gym")
    policy = importlib.import_module("reward_service.checkers.reasoning_gym_tasks")
    if task not in reasoning_gym.factory.DATASETS:
        known = ", ".join(policy.offered_tasks())
        raise DataError(f"{split} data: unknown reasoning-gym task {task[:80]!r} (tasks: {known})")
    withheld = policy.withheld_reason(task)
    if withheld is not None:
        raise DataError(f"{split} data: reasoning-gym task {task!r} is withheld: {withheld}")
    try:
        policy.check_config(task, generated.config, where="data.reasoning_gym.config")
    except policy.BoundsError as exc:
        raise DataError(f"{split} data: {exc}") from exc
    if split == "train":
        size, seed = generated.size, generated.seed
    else:
        size, seed = generated.eval_size, generated.seed + generated.size
    try:
        dataset = reasoning_gym.create_dataset(task, size=size, seed=seed, **generated.config)
    except (TypeError, ValueError, AssertionError) as exc:  # an unknown or out-of-range config field
        raise DataError(f"{split} data: data.reasoning_gym.config does not fit task {task!r}: {exc}") from exc
    system: list[dict[str, str]] = []
    if generated.system_prompt is not None:
        prompts = reasoning_gym.utils.SYSTEM_PROMPTS
        if generated.system_prompt not in prompts:
            raise DataError(
                f"{split} data: data.reasoning_gym.system_prompt {generated.system_prompt!r} is not one of "
                f"{sorted(prompts)}"
            )
        system = [{"role": "system", "content": prompts[generated.system_prompt]}]
    return [
        {
            "prompt": [*system, {"role": "user", "content": entry["question"]}],
            "answer": entry["answer"],
            "reasoning_gym": json.dumps(entry["metadata"], default=str),
        }
        for entry in dataset
    ]


def read_split(config: DataConfig, *, split: str) -> list[Row] | None:
    """Read and convert (or generate) one split (``train`` or ``eval``); None when it is not configured."""
    path = config.train if split == "train" else config.eval
    if path is None:
        return None
    task = generated_task(path)
    if task is not None:
        return generate_rows(task, config.reasoning_gym, split=split)
    rows = prepare_rows(read_rows(path, split=split), fmt=config.format, split=split)
    source = Path(path)
    directory = source if source.is_dir() else source.parent
    for index, row in enumerate(rows):
        try:
            load_row_images(row, directory, config.images)
        except ImageColumnError as exc:
            raise DataError(f"{split} row {index}: {exc}") from exc
    return rows


def to_dataset(
    rows: list[Row] | None,
    rewards: Sequence[RewardTerm],
    *,
    split: str,
    requirements: Mapping[str, Sequence[str]] = REWARD_METADATA,
) -> datasets.Dataset | None:
    """Check the rows carry their rewards' metadata, then build the ``datasets.Dataset`` TRL trains on."""
    if rows is None:
        return None
    validate_reward_metadata(rows, rewards, split=split, requirements=requirements)
    try:
        return datasets.Dataset.from_list(rows)
    except (pyarrow.ArrowInvalid, pyarrow.ArrowTypeError) as exc:
        raise DataError(
            f"{split} rows mix column types Arrow cannot hold in one column (for example message contents "
            f"that are text in some rows and lists of parts in others): {exc}"
        ) from exc


def check_prompt_lengths(
    dataset: datasets.Dataset, tokenizer: Any, max_prompt_length: int, *, split: str
) -> None:
    """Reject prompts longer than ``max_prompt_length`` tokens after the chat template (names the row)."""
    for index, prompt in enumerate(dataset["prompt"]):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):
            ids = ids["input_ids"]
        if len(ids) > max_prompt_length:
            raise DataError(
                f"{split} row {index}: column 'prompt' is {len(ids)} tokens after the chat template, over "
                f"data.max_prompt_length ({max_prompt_length})"
            )


__all__ = [
    "REWARD_METADATA",
    "DataError",
    "check_prompt_lengths",
    "detect_format",
    "generate_rows",
    "has_usable_value",
    "prepare_rows",
    "read_rows",
    "read_split",
    "to_dataset",
    "to_grpo_row",
    "validate_reward_metadata",
]
