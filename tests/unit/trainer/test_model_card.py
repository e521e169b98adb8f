"""The run's model card names its base model and its quick start loads what the run wrote."""

from __future__ import annotations

import contextlib
import io
import os
import re

import pytest
from datasets import Dataset
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from tests.unit.trainer.fixtures import length_reward
from trainer_service.training.model_card import (
    DEFAULT_MESSAGES,
    README_FILE,
    build_model_card,
    example_messages,
    with_model_card,
)
from trainer_service.training.variant_trainer import make_variant_trainer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
QUICK_START = re.compile(r"```python\n(.*?)```", re.S)
DEMO_PROMPT = [{"role": "user", "content": "What is 7 + 4?"}]


def quick_start_code(card_text: str) -> str:
    blocks = QUICK_START.findall(card_text)
    assert len(blocks) == 1, card_text
    return blocks[0]


def test_card_names_a_local_base_and_loads_the_output_dir(policy_dir):
    text = str(
        build_model_card(model_name="demo", base_model=str(policy_dir), output_dir="runs/demo", adapter=True)
    )
    assert f"base_model: {policy_dir}" in text
    assert f"LoRA adapter for `{policy_dir}` (a local directory)" in text
    assert "None" not in text
    code = quick_start_code(text)
    assert "output_dir = 'runs/demo'" in code
    assert "AutoPeftModelForCausalLM" in code
    assert "paths are relative" in text


def test_card_links_a_hub_base_and_loads_a_full_model():
    text = str(
        build_model_card(
            model_name="m", base_model="Qwen/Qwen2.5-0.5B", output_dir="/data/runs/m", adapter=False
        )
    )
    assert "a fine-tuned version of [Qwen/Qwen2.5-0.5B](https://huggingface.co/Qwen/Qwen2.5-0.5B)" in text
    code = quick_start_code(text)
    assert "from transformers import AutoModelForCausalLM as ModelClass" in code
    assert "output_dir = '/data/runs/m'" in code
    assert "library_name: transformers" in text


@pytest.mark.parametrize(
    "prompt",
    [
        "``` [link](http://127.0.0.1/) ```",
        "x" * 400,
        [{"role": "user", "content": [{"type": "image"}]}],
        [],
    ],
    ids=["backquotes", "too-long", "content-parts", "empty"],
)
def test_training_prompts_that_do_not_fit_a_code_fence_fall_back(prompt):
    rows = Dataset.from_dict({"prompt": [prompt]})
    assert example_messages(rows) == list(DEFAULT_MESSAGES)


def test_a_plain_training_prompt_is_the_example():
    assert example_messages(Dataset.from_dict({"prompt": [DEMO_PROMPT]})) == DEMO_PROMPT
    assert example_messages(Dataset.from_dict({"prompt": ["hello"]})) == [
        {"role": "user", "content": "hello"}
    ]


def test_a_run_writes_the_card_and_its_quick_start_runs(policy_dir, tokenizer, tmp_path):
    """The job's trainer class writes the card where TRL would (at a checkpoint), PEFT's save keeps it,
    and the quick start loads the saved adapter on the named base."""
    output_dir = tmp_path / "demo"
    trainer = with_model_card(make_variant_trainer("dapo", GRPOTrainer))(
        model=AutoModelForCausalLM.from_pretrained(policy_dir),
        args=GRPOConfig(
            output_dir=str(output_dir),
            use_cpu=True,
            report_to=[],
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=4,
            bf16=False,
            save_strategy="no",
        ),
        reward_funcs=length_reward,
        train_dataset=Dataset.from_dict({"prompt": [DEMO_PROMPT] * 4}),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, target_modules="all-linear"),
    )
    trainer.create_model_card(model_name=output_dir.name)  # what TRL's _save_checkpoint calls
    trainer.save_model(str(output_dir))  # PEFT updates the card in place
    tokenizer.save_pretrained(str(output_dir))

    text = (output_dir / README_FILE).read_text()
    assert f"LoRA adapter for `{policy_dir}`" in text
    assert "[None]" not in text and '"None"' not in text
    code = quick_start_code(text)
    assert f"output_dir = {str(output_dir)!r}" in code
    assert repr(DEMO_PROMPT) in code

    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "quick_start", "exec"), namespace)
    assert isinstance(namespace["model"], PeftModel)
    assert namespace["model"].peft_config["default"].base_model_name_or_path == str(policy_dir)
    assert namespace["output"].shape[1] > namespace["inputs"]["input_ids"].shape[1]
