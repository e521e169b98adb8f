"""Process reward models: one score per reasoning step, then an aggregate.

Two input formats (REFERENCE.md §4.4):

* Token classification (Qwen2.5-Math-PRM, model card): steps = the completion split on blank lines
  ``"\\n\\n"`` (each stripped, empty ones dropped); the chat is ``[system: QWEN_PRM_SYSTEM_PROMPT,
  the prompt's non-system turns, assistant: sep.join(steps) + sep]`` with ``sep = "<extra_0>"``,
  rendered by the tokenizer's chat template; the model gives logits (T, 2) and

      step_score_k = softmax(logits[t_k])[1]        t_k = position of the k-th separator.

* Step tag (Math-Shepherd, arXiv 2312.08935; huggingface/search-and-learn): a causal LM over
  ``f"{question} {steps}"`` where every step ends in ``" ки"`` (steps joined by ``" ки\\n\\n"``,
  ``" ки"`` appended), question = the prompt's non-system turns joined by ``"\\n"``; with the
  vocabulary logits (T, V),

      step_score_k = softmax(logits[t_k, [id('+'), id('-')]])[0]    t_k = position of the k-th tag.

Aggregate (param ``aggregate``): ``min`` (default; Math-Shepherd, PURE arXiv 2504.15275), ``prod``
(Lightman et al.), ``last`` (search-and-learn's default), ``mean``. Every step score and every
aggregate lies in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from grpo_runtime.errors import InvalidArgument
from reward_service.core.types import ComponentResult, ParamInfo, RewardDescription, Sample
from reward_service.models.engine import Encoded, SampleError, chat_messages
from reward_service.models.spec import QWEN_PRM_SYSTEM_PROMPT, PrmFormat
from reward_service.models.verdict import TokenPairEngine

AGGREGATES: dict[str, Callable[[list[float]], float]] = {
    "min": min,
    "prod": math.prod,
    "last": lambda scores: scores[-1],
    "mean": lambda scores: sum(scores) / len(scores),
}

STEP_DELIMITER = "\n\n"


def split_steps(completion: str) -> list[str]:
    """Reasoning steps: the completion split on blank lines, stripped, empty steps dropped."""
    return [step.strip() for step in completion.split(STEP_DELIMITER) if step.strip()]


def aggregate(scores: list[float], how: str) -> float:
    return float(AGGREGATES[how](scores))


class ProcessRewardModel(TokenPairEngine):
    """``prm:<name>`` in either format; ``forward`` yields each sequence's step scores."""

    params = (
        ParamInfo(
            name="aggregate",
            type="string",
            default="min",
            description="How step scores become the value: min, prod, last or mean.",
            choices=("min", "prod", "last", "mean"),
        ),
    )

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        resolved = super().validate_params(params)
        if resolved["aggregate"] not in AGGREGATES:
            raise InvalidArgument(
                f"{resolved['aggregate']!r} is not one of {', '.join(AGGREGATES)}", field="params.aggregate"
            )
        return resolved

    def _encode(self, sample: Sample) -> Encoded:
        steps = split_steps(sample.completion)
        if not steps:
            raise SampleError("the completion has no reasoning steps (empty after splitting on blank lines)")
        loaded = self.loaded
        tokenizer = loaded.tokenizer
        turns = [m for m in sample.prompt if m.role != "system"]
        if loaded.prm_format is PrmFormat.TOKEN_CLASSIFICATION:
            separator = loaded.step_token
            messages = [
                {"role": "system", "content": QWEN_PRM_SYSTEM_PROMPT},
                *chat_messages(turns),
                {"role": "assistant", "content": separator.join(steps) + separator},
            ]
            text = tokenizer.apply_chat_template(messages, tokenize=False)
            input_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            tag = " " + loaded.step_token
            question = "\n".join(m.content for m in turns)
            text = f"{question} {(tag + STEP_DELIMITER).join(steps)}{tag}"
            # Math-Shepherd tokenizes with the tokenizer's own special tokens (BOS for Mistral).
            input_ids = tokenizer(text)["input_ids"]
        positions = [i for i, token in enumerate(input_ids) if token == loaded.step_token_id]
        if len(positions) != len(steps):
            raise SampleError(
                f"found {len(positions)} step markers for {len(steps)} steps: the prompt or a step "
                "contains the step token itself"
            )
        return Encoded(input_ids=input_ids, positions=positions)

    def _readout(self, logits: torch.Tensor, batch: list[Encoded]) -> list[list[float]]:
        """logits (B, T, C) → per sequence the step scores at its marker positions."""
        if self.loaded.prm_format is not PrmFormat.TOKEN_CLASSIFICATION:
            return super()._readout(logits, batch)  # step tag: softmax over '+'/'-'
        results = []
        for row, encoded in enumerate(batch):
            at = [t - encoded.prefix_tokens for t in encoded.positions]
            results.append(logits[row, at].float().softmax(dim=-1)[:, 1].tolist())  # softmax in float32
        return results

    def _pair_supported(self) -> bool:
        """Step tag only: a token-classification head has no '+'/'-' rows to read."""
        return self.loaded.prm_format is PrmFormat.STEP_TAG

    def finish(self, output: list[float], params: dict[str, Any]) -> ComponentResult:
        return ComponentResult(value=aggregate(output, params["aggregate"]), step_scores=list(output))

    def describe(self, reward_name: str) -> RewardDescription:
        loaded = self.loaded
        if loaded.prm_format is PrmFormat.TOKEN_CLASSIFICATION:
            how = (
                "token-classification PRM (Qwen2.5-Math-PRM format): steps split on blank lines, "
                "each followed by the separator; step score = softmax(logits)[1] at each separator"
            )
        else:
            how = (
                "step-tag PRM (Math-Shepherd format): causal LM over 'question steps' with each step "
                "ending in the tag; step score = softmax(logits[[+, -]])[0] at each tag"
            )
        return RewardDescription(
            name=reward_name,
            description=f"Process reward model from {loaded.spec.path}, {how}; value = aggregate of the "
            "step scores (min, prod, last or mean).",
            params=self.params,
            min_value=0.0,
            max_value=1.0,
        )
