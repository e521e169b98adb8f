"""The shipped tiny vision-language model: loads with the Auto classes, expands an image to one token per
cell, renders content parts, and answers from the image."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image, ImageChops
from transformers import (
    AutoModelForImageTextToText,
    AutoProcessor,
    LlavaForConditionalGeneration,
    LlavaImageProcessorPil,
    LlavaProcessor,
)

from tiny_models import vision_task
from tiny_models.demo import is_correct, read_jsonl
from tiny_models.tokenizer import build_tokenizer
from tiny_models.vision import IMAGE_TOKEN, IMAGE_TOKENS, build_vision, encode, generate_answers

ROOT = Path(__file__).resolve().parents[3]
MODEL_DIR = ROOT / "models" / "vision"
DATA_DIR = ROOT / "data" / "vision"
PROMPT_TEXT = (
    "<|im_start|>user\n<image>How many squares are in the picture?<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def shipped() -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    processor = AutoProcessor.from_pretrained(MODEL_DIR)
    model = AutoModelForImageTextToText.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()
    return model, processor


@pytest.fixture(scope="module")
def test_rows() -> list[dict]:
    return read_jsonl(DATA_DIR / "test.jsonl")


def _images(rows: list[dict]) -> list[Image.Image]:
    return [Image.open(DATA_DIR / row["image"]).convert("RGB") for row in rows]


def test_shipped_directory_loads_with_the_auto_classes(shipped):
    model, processor = shipped
    assert isinstance(processor, LlavaProcessor)
    assert isinstance(processor.image_processor, LlavaImageProcessorPil)
    assert isinstance(model, LlavaForConditionalGeneration)
    assert model.config.text_config.head_dim == 64
    assert model.config.image_token_id == processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    assert model.generation_config.eos_token_id == processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    for name in ("processor_config.json", "tokenizer.json", "chat_template.jinja", "config.json"):
        assert (MODEL_DIR / name).exists(), name


def test_an_image_expands_to_one_token_per_cell(shipped):
    _, processor = shipped
    batch = processor(images=[vision_task.blank_image()], text=[PROMPT_TEXT], return_tensors="pt")
    image_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    assert IMAGE_TOKENS == 4
    assert (batch["input_ids"][0] == image_id).sum().item() == IMAGE_TOKENS
    assert tuple(batch["pixel_values"].shape) == (1, 3, vision_task.IMAGE_SIZE, vision_task.IMAGE_SIZE)


def test_chat_template_renders_image_parts_and_plain_strings(shipped):
    _, processor = shipped
    rendered = processor.apply_chat_template(vision_task.prompt(), add_generation_prompt=True, tokenize=False)
    assert rendered == PROMPT_TEXT
    # A string content renders as the shared ChatML template renders it.
    text_only = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}]
    shared = build_tokenizer().apply_chat_template(text_only, tokenize=False)
    assert processor.apply_chat_template(text_only, tokenize=False) == shared


def test_encode_trains_only_on_answer_and_end_of_turn(shipped):
    _, processor = shipped
    batch = encode(processor, [vision_task.blank_image()] * 2, ["3", "1"])
    tokenizer = processor.tokenizer
    for row, answer in enumerate(["3", "1"]):
        trained = [label for label in batch["labels"][row].tolist() if label != -100]
        assert trained == [*tokenizer(answer, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        assert batch["input_ids"][row].tolist()[-len(trained) :] == trained


def test_forward_with_pixel_values_gives_finite_logits(shipped, test_rows):
    model, processor = shipped
    batch = encode(processor, _images(test_rows[:4]))
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (4, batch["input_ids"].shape[1], model.config.text_config.vocab_size)
    assert torch.isfinite(logits).all()


def test_shipped_data_is_what_the_task_writes(test_rows):
    pictures = vision_task.pictures("test", len(test_rows))
    assert test_rows == list(vision_task.rows("test", pictures))
    for row, picture in list(zip(test_rows, pictures, strict=True))[:8]:
        image = Image.open(DATA_DIR / row["image"]).convert("RGB")
        assert ImageChops.difference(image, picture.image()).getbbox() is None


def test_build_vision_writes_data_and_a_loadable_model(tmp_path):
    summary = build_vision(
        tmp_path / "model",
        tmp_path / "data",
        splits={"train": 16, "test": 8},
        n_val=8,
        max_steps=2,
        batch_size=4,
        eval_every=1,
        log=lambda _: None,
    )
    assert summary["format_steps"] <= 2 and summary["counting_steps"] <= 2
    assert len(read_jsonl(tmp_path / "data" / "train.jsonl")) == 16
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "model")
    assert isinstance(model, LlavaForConditionalGeneration)
    assert isinstance(AutoProcessor.from_pretrained(tmp_path / "model"), LlavaProcessor)


@pytest.mark.slow
def test_shipped_model_answers_from_the_image(shipped, test_rows):
    model, processor = shipped
    rows = test_rows  # answers cycle through 1-4, so chance is 0.25
    seen = generate_answers(model, processor, _images(rows))
    blank = generate_answers(model, processor, [vision_task.blank_image()] * len(rows))
    greedy = sum(is_correct(c, r["answer"]) for c, r in zip(seen, rows, strict=True)) / len(rows)
    greedy_blank = sum(is_correct(c, r["answer"]) for c, r in zip(blank, rows, strict=True)) / len(rows)
    assert greedy >= 0.4
    assert greedy_blank <= 0.35
    torch.manual_seed(0)
    sampled = generate_answers(model, processor, _images(rows), temperature=1.0)
    rewards = [is_correct(c, r["answer"]) for c, r in zip(sampled, rows, strict=True)]
    # GRPO learns only where samples disagree: some right, some wrong.
    assert 0.1 <= sum(rewards) / len(rewards) <= 0.7
