"""Helpers shared by the trainer unit tests (fixtures proper live in conftest.py)."""

from __future__ import annotations

from typing import Any

import torch

from trainer_service.config.variants import VARIANT_SPECS, Aggregation
from trainer_service.training import losses


def length_reward(completions: list[Any], **_: Any) -> list[float]:
    """A real (if silly) reward: characters in the completion, so groups have non-zero spread."""
    return [float(len(c if isinstance(c, str) else c[-1]["content"])) for c in completions]


def offset_rollout(tokenizer, offset: float):
    """A real rollout_func (no service): random completions scored by the trainer's own model, reported with
    log-probs `offset` nats off, as a rollout engine with different numerics would."""

    def rollout(prompts: list[str], trainer) -> dict[str, list]:
        g = torch.Generator().manual_seed(7)
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for prompt in prompts:
            ids = tokenizer(prompt)["input_ids"]
            completion = torch.randint(3, trainer.model.config.vocab_size, (5,), generator=g).tolist()
            with torch.no_grad():
                logits = trainer.model(input_ids=torch.tensor([ids + completion])).logits[
                    0, len(ids) - 1 : -1
                ]
            logps = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
            out["prompt_ids"].append(ids)
            out["completion_ids"].append(completion)
            out["logprobs"].append((logps + offset).tolist())
        return out

    return rollout


def variant_loss(
    variant: str,
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    params: losses.LossParams,
    *,
    max_completion_length: int | None = None,
    num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Scalar policy loss of `variant` on one micro-batch: policy term + its aggregation (no KL, no rollout IS
    correction, no gradient-accumulation scaling). For GLOBAL_TOKEN variants N defaults to Σ M."""
    spec = VARIANT_SPECS[variant]
    out = losses.policy_loss(variant, per_token_logps, old_per_token_logps, advantages, mask, params)
    agg_mask = mask if out.aggregation_mask is None else out.aggregation_mask
    if spec.aggregation is Aggregation.GLOBAL_TOKEN and num_tokens is None:
        num_tokens = mask.sum().clamp(min=1.0)
    return losses.aggregate(
        out.per_token_loss,
        agg_mask,
        spec.aggregation,
        max_completion_length=max_completion_length,
        num_tokens=num_tokens,
    )
