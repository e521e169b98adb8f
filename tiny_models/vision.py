"""The tiny vision-language model, warm-started on the synthetic visual task (``tiny_models/vision_task.py``).

``python -m tiny_models.vision --out models/vision --data data/vision`` writes:

- ``data/vision``: the task's ``train.jsonl`` / ``test.jsonl`` and their PNG files
  (``vision_task.write_task``);
- ``models/vision``: a ``LlavaForConditionalGeneration`` (637,824 parameters, fp32 safetensors of 2.6 MB)
  and its ``LlavaProcessor``, loadable with ``AutoModelForImageTextToText`` and ``AutoProcessor``
  without torchvision (the processor's image processor is the Pillow-backed ``LlavaImageProcessorPil``):

  - vision tower: CLIP, hidden 64, 2 layers of 2 heads, 56-pixel images cut into 28-pixel patches, so a
    picture is 4 patch features (the class token is dropped: ``vision_feature_select_strategy="default"``),
    one per cell of the task's 2 × 2 grid;
  - projector: LLaVA's two-layer GELU MLP from 64 to 128;
  - language model: Qwen2 in the shared tiny shape (``qwen2_config``: hidden 128, 2 heads of head_dim 64,
    2 layers) with the shared tokenizer plus one special token ``<image>``, which the processor expands to
    the picture's 4 image tokens;
  - chat template: the shared ChatML one, where a message's content may also be a list of parts rendered in
    order, ``{"type": "image"}`` as ``<image>`` and ``{"type": "text"}`` as its text.

Warm start: supervised next-token loss on the answer tokens of ``template(prompt) + answer + <|im_end|>``,
AdamW at a constant rate, batch 32, in two phases (``PHASES``), each measured on 200 validation pictures (a
split drawn from its own stream, never written) every 5 steps and stopped at its target:

1. format: every picture replaced by ``blank_image()`` (answers balanced, so no signal), lr 1e-3, until 0.95
   of completions sampled at temperature 1.0 are a count ``"1"``-``"4"``;
2. counting: the real pictures, lr 1e-4, until greedy validation accuracy reaches ``--target`` (default
   0.45).

The shipped model (seed 0) stopped after 50 format steps (count rate 0.975) and 55 counting steps (greedy
validation accuracy 0.50). On the 400 test pictures it is right 0.505 of the time greedily and 0.28 sampled
at temperature 1.0 (0.945 of samples are a count), and 0.25 (chance) with ``blank_image()`` in place of
every picture: the answer comes from the image, and sampling mixes right and wrong answers in a group,
which is what GRPO needs to learn from.

Deterministic for a given seed on one CPU thread.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypedDict

import torch
from PIL import Image
from transformers import (
    AutoProcessor,
    BatchFeature,
    CLIPVisionConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaImageProcessorPil,
    LlavaProcessor,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from grpo_runtime.tokenizing import token_id
from tiny_models import vision_task
from tiny_models.demo import is_correct
from tiny_models.make import _save, qwen2_config
from tiny_models.tokenizer import PARTS_CHAT_TEMPLATE, build_tokenizer
from tiny_models.warm_start import train_until

IMAGE_TOKEN = "<image>"
PATCH_SIZE = 28
# 4 patches of 28 pixels, plus CLIP's class token, which the "default" strategy drops.
IMAGE_TOKENS = (vision_task.IMAGE_SIZE // PATCH_SIZE) ** 2
# The answer is one digit; two spare tokens leave room for <|im_end|> and a stray token.
MAX_NEW_TOKENS = 3


def vision_tokenizer() -> PreTrainedTokenizerFast:
    """The shared tokenizer plus the special token ``<image>``, with the chat template of content parts."""
    tokenizer = build_tokenizer()
    tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    tokenizer.chat_template = PARTS_CHAT_TEMPLATE
    return tokenizer


def vision_processor(tokenizer: PreTrainedTokenizerFast) -> LlavaProcessor:
    """LLaVA's processor: pictures resized and centre-cropped to 56 × 56 pixels, CLIP-normalised to
    ``pixel_values`` of shape (B, 3, 56, 56); each ``<image>`` in the text expanded to ``IMAGE_TOKENS``."""
    size = vision_task.IMAGE_SIZE
    image_processor = LlavaImageProcessorPil(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        chat_template=PARTS_CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
    )


class VisionShape(TypedDict):
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int


# CLIP tower sizes beside each shared Qwen2 shape (``tiny_models.make.SHAPES``).
VISION_SHAPES: dict[str, VisionShape] = {
    "small": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2},
    "large": {
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
    },
}


def llava_config(tokenizer: PreTrainedTokenizerFast, shape: str = "small") -> LlavaConfig:
    """A CLIP tower over 28-pixel patches under the shared Qwen2 of ``shape``: small (hidden 64, 2 layers,
    under the 0.4M tiny Qwen2) or large (hidden 256, 4 layers, under the 23M one, for benchmarks)."""
    vision = CLIPVisionConfig(
        **VISION_SHAPES[shape], image_size=vision_task.IMAGE_SIZE, patch_size=PATCH_SIZE
    )
    return LlavaConfig(
        vision_config=vision,
        text_config=qwen2_config(tokenizer, shape),
        image_token_index=token_id(tokenizer, IMAGE_TOKEN),
        image_seq_length=IMAGE_TOKENS,
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        tie_word_embeddings=True,
    )


def served_processor(processor: LlavaProcessor, config: LlavaConfig, out: Path) -> LlavaProcessor:
    """``processor`` as every consumer loads it from the model directory ``out`` (with ``AutoProcessor``),
    where it is saved beside ``config``; a model trained here is trained on what that processor gives."""
    out.mkdir(parents=True, exist_ok=True)
    processor.save_pretrained(out)
    config.save_pretrained(out)
    return AutoProcessor.from_pretrained(out)


def encode(
    processor: LlavaProcessor, images: Sequence[Image.Image], answers: Sequence[str] | None = None
) -> BatchFeature:
    """The task's prompt with each picture, left-padded: input_ids and attention_mask (B, T), pixel_values
    (B, 3, 56, 56). With ``answers``, each row ends in ``answer + <|im_end|>`` and ``labels`` (B, T) are
    those tokens' ids, -100 elsewhere, so the loss covers only what the model will generate."""
    prompt = processor.apply_chat_template(vision_task.prompt(), add_generation_prompt=True, tokenize=False)
    eos = processor.tokenizer.eos_token
    texts = [prompt] * len(images) if answers is None else [prompt + a + eos for a in answers]
    batch = processor(images=list(images), text=texts, return_tensors="pt", padding=True, padding_side="left")
    if answers is not None:
        labels = torch.full_like(batch["input_ids"], -100)
        for row, answer in enumerate(answers):
            trained = len(processor.tokenizer(answer + eos, add_special_tokens=False)["input_ids"])
            labels[row, -trained:] = batch["input_ids"][row, -trained:]
        batch["labels"] = labels
    return batch


@torch.no_grad()
def generate_answers(
    model: PreTrainedModel,
    processor: LlavaProcessor,
    images: Sequence[Image.Image],
    *,
    temperature: float | None = None,
    batch_size: int = 200,
) -> list[str]:
    """Completions of the task's prompt for each picture: greedy when ``temperature`` is None, else sampled
    from the full distribution (top_k 0, top_p 1, as TRL and vLLM do at their defaults)."""
    assert isinstance(model, LlavaForConditionalGeneration)
    sampling = (
        {"do_sample": False}
        if temperature is None
        else {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    )
    completions: list[str] = []
    for start in range(0, len(images), batch_size):
        batch = encode(processor, images[start : start + batch_size])
        # transformers types generate's self as a Protocol that mypy finds PreTrainedModel not to meet.
        output = model.generate(**batch, max_new_tokens=MAX_NEW_TOKENS, **sampling)  # type: ignore[misc]
        new_tokens = output[:, batch["input_ids"].shape[1] :]
        completions.extend(processor.batch_decode(new_tokens, skip_special_tokens=True))
    return completions


def _completions(
    model: PreTrainedModel,
    processor: LlavaProcessor,
    pictures: Sequence[vision_task.Picture],
    *,
    temperature: float | None,
    blank: bool,
) -> list[str]:
    """:func:`generate_answers` in eval mode for the pictures, or for ``blank_image()`` in place of each."""
    was_training = model.training
    model.eval()
    images = [vision_task.blank_image() if blank else p.image() for p in pictures]
    completions = generate_answers(model, processor, images, temperature=temperature)
    model.train(was_training)
    return completions


def accuracy(
    model: PreTrainedModel,
    processor: LlavaProcessor,
    pictures: Sequence[vision_task.Picture],
    *,
    temperature: float | None = None,
    blank: bool = False,
) -> float:
    """Share of pictures whose completion :func:`is_correct` (greedy, or sampled at ``temperature``); with
    ``blank``, the model is shown ``blank_image()`` in place of every picture (chance is 0.25)."""
    completions = _completions(model, processor, pictures, temperature=temperature, blank=blank)
    return sum(is_correct(c, p.answer) for c, p in zip(completions, pictures, strict=True)) / len(pictures)


def count_rate(
    model: PreTrainedModel,
    processor: LlavaProcessor,
    pictures: Sequence[vision_task.Picture],
    *,
    temperature: float | None = 1.0,
    blank: bool = True,
) -> float:
    """Share of completions that are one of the task's counts ``"1"`` to ``"4"``, right or wrong: sampled at
    temperature 1.0 for ``blank_image()`` by default, the answer format alone."""
    counts = {str(n) for n in range(1, vision_task.MAX_SQUARES + 1)}
    completions = _completions(model, processor, pictures, temperature=temperature, blank=blank)
    return sum(c.strip() in counts for c in completions) / len(pictures)


Metric = Callable[[PreTrainedModel, LlavaProcessor, Sequence[vision_task.Picture]], float]


@dataclass(frozen=True)
class Phase:
    """One stage of the warm start: the pictures shown (``blank``: ``blank_image()`` in place of each, with
    the picture's answer), AdamW's learning rate, and the validation ``metric`` whose ``target`` ends it."""

    name: str
    blank: bool
    learning_rate: float
    metric: Metric
    target: float


# The counting phase alone learns which count a picture shows (greedy validation accuracy 0.97 by step 60
# at 3e-4) long before it answers in the format (a count, then <|im_end|>), so a model stopped at greedy
# 0.45 samples a count almost never. The format is taught first on blank pictures, where the answers are
# balanced and carry no signal: the model then samples each count about one time in four. Counting then
# runs at a low rate because greedy accuracy, an argmax over four near-equal logits, jumps by tens of
# points between evaluations at 3e-4.
PHASES = (
    Phase("format", blank=True, learning_rate=1e-3, metric=count_rate, target=0.95),
    Phase("counting", blank=False, learning_rate=1e-4, metric=accuracy, target=0.45),
)


def pretrain(
    model: PreTrainedModel,
    processor: LlavaProcessor,
    train: Sequence[vision_task.Picture],
    validation: Sequence[vision_task.Picture],
    phase: Phase,
    *,
    max_steps: int,
    batch_size: int,
    eval_every: int,
    seed: int,
    log=print,
) -> list[dict]:
    """Supervised training on the answer tokens until ``phase.metric`` on ``validation`` reaches its target
    (:func:`~tiny_models.warm_start.train_until` at ``phase.learning_rate``). Returns the evaluation log:
    dicts with phase, step, loss (mean over the interval) and ``val_<metric>``."""
    rng = random.Random(f"{seed}:{phase.name}")

    def next_batch() -> BatchFeature:
        sample = rng.sample(train, batch_size)
        images = [vision_task.blank_image() if phase.blank else p.image() for p in sample]
        return encode(processor, images, [p.answer for p in sample])

    history = train_until(
        model,
        next_batch,
        lambda: phase.metric(model, processor, validation),
        name=f"val_{phase.metric.__name__}",
        target=phase.target,
        learning_rate=phase.learning_rate,
        max_steps=max_steps,
        eval_every=eval_every,
        log=log,
    )
    return [{"phase": phase.name} | record for record in history]


def build_vision(
    out: Path,
    data: Path,
    *,
    seed: int = 0,
    splits: dict[str, int] = vision_task.SPLITS,
    n_val: int = 200,
    phases: Sequence[Phase] = PHASES,
    max_steps: int = 1000,
    batch_size: int = 32,
    eval_every: int = 5,
    log=print,
) -> dict:
    """Write the dataset and the warm-started model with its processor; returns a summary (accuracies,
    steps of each phase)."""
    torch.manual_seed(seed)
    vision_task.write_task(data, seed, splits)
    train, test = (vision_task.pictures(name, splits[name], seed) for name in ("train", "test"))
    validation = vision_task.pictures("validation", n_val, seed)

    tokenizer = vision_tokenizer()
    config = llava_config(tokenizer)
    processor = served_processor(vision_processor(tokenizer), config, out)
    model = LlavaForConditionalGeneration(config)
    summary: dict = {}
    for phase in phases:
        history = pretrain(
            model,
            processor,
            train,
            validation,
            phase,
            max_steps=max_steps,
            batch_size=batch_size,
            eval_every=eval_every,
            seed=seed,
            log=log,
        )
        summary[f"{phase.name}_steps"] = history[-1]["step"]
        summary |= {k: v for k, v in history[-1].items() if k.startswith("val_")}
    _save(model, processor.tokenizer, out)
    processor = AutoProcessor.from_pretrained(out)
    torch.manual_seed(seed)
    summary |= {
        "greedy_test_accuracy": accuracy(model, processor, test),
        "sampled_test_accuracy_t1": accuracy(model, processor, test, temperature=1.0),
        "blank_image_greedy_test_accuracy": accuracy(model, processor, test, blank=True),
        "sampled_test_count_rate_t1": count_rate(model, processor, test, blank=False),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    log(json.dumps(summary))
    return summary


def write_untrained(out: Path, shape: str = "large", seed: int = 0) -> Path:
    """A randomly initialised model of ``shape`` with its processor in ``out``: what benchmarks time, where
    per-step overheads must be measured against real compute (its answers are noise)."""
    torch.manual_seed(seed)
    tokenizer = vision_tokenizer()
    config = llava_config(tokenizer, shape)
    processor = served_processor(vision_processor(tokenizer), config, out)
    _save(LlavaForConditionalGeneration(config), processor.tokenizer, out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the vision dataset and warm-start the tiny VLM.")
    parser.add_argument("--out", type=Path, default=Path("models/vision"), help="model directory")
    parser.add_argument("--data", type=Path, default=Path("data/vision"), help="dataset directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.45, help="greedy validation accuracy to stop at")
    parser.add_argument("--max-steps", type=int, default=1000, help="most steps of each phase")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 = reproducible)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    build_vision(
        args.out,
        args.data,
        seed=args.seed,
        phases=(PHASES[0], replace(PHASES[1], target=args.target)),
        max_steps=args.max_steps,
    )


if __name__ == "__main__":
    main()
