"""A vision row's prompt with its pictures in it, as TRL builds the prompts of a training batch.

TRL's ``GRPOTrainer`` fills the ``{"type": "image"}`` placeholders of a row's messages with the row's
``images`` (or ``[image]``) in order, or puts the images before the first user turn when there are none
(``trl.data_utils.prepare_multimodal_messages``). Code that reads prompts from the dataset itself (held-out
evaluation, async prefetching) fills them the same way, so the rollout service sees the same prompts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from trl.data_utils import prepare_multimodal_messages

IMAGE_COLUMNS = ("image", "images")


def prompts_with_images(rows: Iterable[Mapping[str, Any]]) -> list[Any]:
    """Each row's prompt with its images filled in, as TRL fills a training batch's
    (``prepare_multimodal_messages``: placeholders in order, or the images before the first user turn)."""
    out = []
    for row in rows:
        images = row.get("images") or ([row["image"]] if row.get("image") is not None else [])
        out.append(prepare_multimodal_messages(row["prompt"], images=images) if images else row["prompt"])
    return out
