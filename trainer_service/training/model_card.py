"""The model card (``README.md``) a run writes into its output directory.

TRL's own card names the base model only when it is a Hub id: for a local directory (``models/demo``) it
writes "a fine-tuned version of [None]" and a quick start that loads ``model="None"``. This card names the
base as the run's config gave it and loads what the run actually writes: a PEFT adapter or a full model, with
the tokenizer, in the output directory.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from accelerate.utils import is_peft_model
from datasets import Dataset
from huggingface_hub import ModelCard, ModelCardData

from trainer_service.training.trainer_host import GRPOTrainerHost

README_FILE = "README.md"
DEFAULT_MESSAGES = ({"role": "user", "content": "What is 7 + 4?"},)
# A training prompt is caller-written text placed inside a Markdown code fence: short, and no backquotes.
MAX_EXAMPLE_CHARS = 300
GRPO_PAPER = "https://huggingface.co/papers/2402.03300"
# PEFT adds its own line under this heading when it saves an adapter.
FRAMEWORKS = ("trl", "transformers", "torch")


def base_model_reference(base_model: str) -> str:
    """Markdown naming the base: a Hub link for a Hub id, the path in code for a local directory."""
    if os.path.isdir(base_model):
        return f"`{base_model}` (a local directory)"
    return f"[{base_model}](https://huggingface.co/{base_model})"


def example_messages(rows: Any) -> list[dict[str, str]]:
    """The first training prompt when it is a short plain-text chat, else `DEFAULT_MESSAGES`."""
    if not isinstance(rows, Dataset) or len(rows) == 0 or "prompt" not in rows.column_names:
        return list(DEFAULT_MESSAGES)
    prompt = rows[0]["prompt"]
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    plain = isinstance(prompt, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in prompt
    )
    if not plain or not prompt:
        return list(DEFAULT_MESSAGES)
    messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
    text = repr(messages)
    if len(text) > MAX_EXAMPLE_CHARS or "`" in text:
        return list(DEFAULT_MESSAGES)
    return messages


def quick_start(output_dir: str, *, adapter: bool, messages: Sequence[dict[str, str]]) -> str:
    """Python that loads the run's output (adapter or full model, and tokenizer) and answers one prompt."""
    loader = (
        "from peft import AutoPeftModelForCausalLM as ModelClass"
        if adapter
        else "from transformers import AutoModelForCausalLM as ModelClass"
    )
    return "\n".join(
        [
            loader,
            "from transformers import AutoTokenizer",
            "",
            f"output_dir = {output_dir!r}",
            "model = ModelClass.from_pretrained(output_dir)",
            "tokenizer = AutoTokenizer.from_pretrained(output_dir)",
            f"messages = {list(messages)!r}",
            "inputs = tokenizer.apply_chat_template(",
            '    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True',
            ")",
            "output = model.generate(**inputs, max_new_tokens=32)",
            'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))',
        ]
    )


def build_model_card(
    *,
    model_name: str,
    base_model: str,
    output_dir: str,
    adapter: bool,
    messages: Sequence[dict[str, str]] = DEFAULT_MESSAGES,
    tags: Sequence[str] = (),
) -> ModelCard:
    """The card for a run's output: what it was trained from, how to load it, how it was trained."""
    data = ModelCardData(
        base_model=base_model,
        library_name="peft" if adapter else "transformers",
        model_name=model_name,
        pipeline_tag="text-generation",
        tags=sorted({"generated_from_trainer", "grpo", "trl", *tags}),
    )
    kind = "a LoRA adapter for" if adapter else "a fine-tuned version of"
    local_base = os.path.isdir(base_model)
    relative = not Path(output_dir).is_absolute() or (local_base and not Path(base_model).is_absolute())
    where = " Run it from the directory the run started in: its paths are relative." if relative else ""
    checkpoints = "a checkpoint loads the same way from its `checkpoint-N` directory"
    body = "\n\n".join(
        [
            f"---\n{data.to_yaml()}\n---",
            f"# Model card for {model_name}",
            f"This model is {kind} {base_model_reference(base_model)}, trained with GRPO by grpo-services "
            "(TRL's `GRPOTrainer`, generating through the rollout service and scoring through the reward "
            "service).",
            "## Quick start",
            f"The run writes its {'adapter' if adapter else 'model'} and tokenizer to `{output_dir}` when it "
            f"completes; {checkpoints}.{where}",
            f"```python\n{quick_start(output_dir, adapter=adapter, messages=messages)}\n```",
            "## Training procedure",
            f"GRPO, introduced in [DeepSeekMath]({GRPO_PAPER}). Each step's metrics are in "
            "`metrics.jsonl` beside this card, and the reward curve in `reward_curve.png`.",
            "### Framework versions",
            "\n".join(f"- {name} {version(name)}" for name in FRAMEWORKS),
        ]
    )
    return ModelCard(body + "\n")


class ModelCardMixin(GRPOTrainerHost):
    """Replaces TRL's `create_model_card` (called at every checkpoint and on push) with `build_model_card`.

    The base is the path or Hub id the policy was loaded from (the run config's ``base``).
    """

    def create_model_card(self, model_name: str | None = None, tags: Any = None, **_: Any) -> None:
        if not self.is_world_process_zero():
            return
        output_dir = str(self.args.output_dir)
        card = build_model_card(
            model_name=model_name or Path(output_dir).name,
            base_model=getattr(self.model.config, "_name_or_path", "") or "unknown",
            output_dir=output_dir,
            adapter=is_peft_model(self.model),
            messages=example_messages(self.train_dataset),
            tags=[tags] if isinstance(tags, str) else list(tags or ()),
        )
        card.save(os.path.join(output_dir, README_FILE))


@functools.cache
def with_model_card(trainer_cls: type) -> type:
    """The cached subclass of a `trl.GRPOTrainer` class that writes `build_model_card`'s card."""
    return type(
        trainer_cls.__name__,
        (ModelCardMixin, trainer_cls),
        {"__doc__": trainer_cls.__doc__, "__module__": trainer_cls.__module__},
    )
