"""The supervised warm start of a shipped tiny policy: train until a validation measure reaches its target.

The text demo (``tiny_models.demo``) and the vision demo (``tiny_models.vision``) both stop their policy
below the task's ceiling, where sampling still mixes right and wrong answers in a group, which is what GRPO
needs to learn from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import torch
from transformers import PreTrainedModel


def train_until(
    model: PreTrainedModel,
    next_batch: Callable[[], Mapping[str, Any]],
    measure: Callable[[], float],
    *,
    name: str,
    target: float,
    learning_rate: float,
    max_steps: int,
    eval_every: int,
    log: Callable[[str], Any] = print,
) -> list[dict]:
    """Supervised steps on ``next_batch()`` (model inputs with ``labels``) until ``measure()`` >= ``target``.

    AdamW at a constant ``learning_rate`` (no weight decay), gradients clipped to norm 1; every
    ``eval_every`` steps, and at ``max_steps``, ``measure()`` is recorded under ``name`` and training stops
    at the first value >= ``target``. Returns the evaluation log: dicts with step, loss (mean over the
    interval) and ``name``; the model is left in eval mode.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    history: list[dict] = []
    losses: list[float] = []
    model.train()
    for step in range(1, max_steps + 1):
        loss = model(**next_batch()).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % eval_every == 0 or step == max_steps:
            value = measure()
            history.append({"step": step, "loss": sum(losses) / len(losses), name: value})
            log(json.dumps(history[-1]))
            losses = []
            if value >= target:
                break
    model.eval()
    return history
