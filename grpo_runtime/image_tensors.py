"""Vision-language processors' image inputs of several prompts, batched together.

Processors lay pictures out in one of two ways: one row per picture (LLaVA's ``pixel_values`` of shape
(images, channels, height, width)), or one row per prompt with its pictures along dim 1 (Idefics3's
``pixel_values`` of shape (prompts, images, channels, height, width) and ``pixel_attention_mask`` of shape
(prompts, images, height, width)), where the processor gives a batch's prompts with fewer pictures all-zero
slots up to the most, which the model skips. The rollout service's HF engine and the trainer's dynamic
sampling both batch such inputs of separately processed prompts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def concat_image_rows(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``tensors`` (one image input of several prompts) concatenated along dim 0. Where they differ in dim 1
    (the per-prompt layout), each is first zero-filled along dim 1 to the widest, as the processor does."""
    widest = max(t.shape[1] for t in tensors) if tensors[0].dim() > 1 else 0
    padded = [
        torch.cat([t, t.new_zeros(t.shape[0], widest - t.shape[1], *t.shape[2:])], 1)
        if t.dim() > 1 and t.shape[1] < widest
        else t
        for t in tensors
    ]
    return torch.cat(padded)
