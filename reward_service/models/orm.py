"""Outcome reward models scored exactly as TRL's GRPOTrainer scores a reward *model*.

TRL 1.16 ``GRPOTrainer._calculate_rewards`` (model branch), for conversational data::

    texts = [apply_chat_template({"messages": prompt + completion}, tok)["text"] ...]
    inputs = tok(text=texts, return_tensors="pt", padding=True, padding_side="right",
                 add_special_tokens=False)
    reward = model(**inputs).logits[:, 0]

i.e. the chat template over the prompt turns followed by ``{"role": "assistant", "content":
completion}`` (no generation prompt), no added special tokens, right padding, and the first logit of
the sequence-classification head (which pools the last non-pad token). The value is unbounded.
Samples always carry the prompt as chat turns, so TRL's conversational branch is the one followed;
a sample without prompt turns is rendered as the lone assistant turn.
"""

from __future__ import annotations

from typing import Any

import torch

from reward_service.core.types import ComponentResult, RewardDescription, Sample
from reward_service.models.engine import Encoded, RewardModelEngine, chat_messages


class OutcomeRewardModel(RewardModelEngine):
    """``orm:<name>``: one scalar per sample, no parameters."""

    def _encode(self, sample: Sample) -> Encoded:
        tokenizer = self.loaded.tokenizer
        messages = [*chat_messages(sample.prompt), {"role": "assistant", "content": sample.completion}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        return Encoded(input_ids=tokenizer(text, add_special_tokens=False)["input_ids"])

    def _readout(self, logits: torch.Tensor, batch: list[Encoded]) -> list[float]:
        """logits (B, num_labels), already pooled at each sequence's last token → logits[:, 0]."""
        return logits[:, 0].float().tolist()

    def finish(self, output: float, params: dict[str, Any]) -> ComponentResult:
        return ComponentResult(value=float(output))

    def describe(self, reward_name: str) -> RewardDescription:
        return RewardDescription(
            name=reward_name,
            description=f"Outcome reward model from {self.loaded.spec.path}: sequence classification "
            "logits[:, 0] on the chat-templated prompt + completion, as TRL's GRPOTrainer scores reward "
            "models (right padding, no added special tokens). Unbounded.",
        )
