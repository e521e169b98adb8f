"""Validation and tokenization of Generate requests.

Every rejection is an InvalidArgument naming the offending field with its index
(``prompts[3]``, ``sampling.top_p``), raised before anything reaches the engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from grpo_runtime.errors import InvalidArgument
from rollout_service.core.types import GenerateRequest, GenerationJob, PromptInput, SamplingSpec


def validate_sampling(s: SamplingSpec) -> SamplingSpec:
    """Check ranges; returns the spec with ``top_k`` −1 normalised to 0 (off)."""
    if not math.isfinite(s.temperature) or s.temperature < 0:
        raise InvalidArgument(f"must be >= 0, got {s.temperature}", field="sampling.temperature")
    if not math.isfinite(s.top_p) or not 0 < s.top_p <= 1:
        raise InvalidArgument(f"must be in (0, 1], got {s.top_p}", field="sampling.top_p")
    if s.top_k < -1:
        raise InvalidArgument(f"must be >= -1 (-1 or 0 = off), got {s.top_k}", field="sampling.top_k")
    if not math.isfinite(s.min_p) or not 0 <= s.min_p <= 1:
        raise InvalidArgument(f"must be in [0, 1], got {s.min_p}", field="sampling.min_p")
    if s.max_tokens < 1:
        raise InvalidArgument(f"must be >= 1, got {s.max_tokens}", field="sampling.max_tokens")
    if not math.isfinite(s.repetition_penalty) or s.repetition_penalty <= 0:
        raise InvalidArgument(f"must be > 0, got {s.repetition_penalty}", field="sampling.repetition_penalty")
    if s.min_tokens > s.max_tokens:
        raise InvalidArgument(
            f"must be <= max_tokens ({s.max_tokens}), got {s.min_tokens}", field="sampling.min_tokens"
        )
    for i, stop in enumerate(s.stop):
        if not stop:
            raise InvalidArgument("stop strings must not be empty", field=f"sampling.stop[{i}]")
    if s.seed is not None and not 0 <= s.seed < 2**63:
        raise InvalidArgument("must be < 2**63", field="sampling.seed")
    if s.top_k == -1:
        return SamplingSpec(**{**s.__dict__, "top_k": 0})
    return s


@dataclass(frozen=True)
class RequestValidator:
    """Turns a GenerateRequest into a GenerationJob of token ids, or raises InvalidArgument.

    ``max_model_len``: prompt tokens + ``max_tokens`` may not exceed it.
    """

    tokenizer: PreTrainedTokenizerBase
    max_model_len: int
    vocab_size: int
    max_prompts: int = 4096
    max_n: int = 1024

    def to_job(self, request: GenerateRequest) -> GenerationJob:
        if not request.prompts:
            raise InvalidArgument("at least one prompt is required", field="prompts")
        if len(request.prompts) > self.max_prompts:
            raise InvalidArgument(
                f"{len(request.prompts)} prompts, the server takes at most {self.max_prompts}",
                field="prompts",
            )
        if request.n < 1:
            raise InvalidArgument(f"must be >= 1, got {request.n}", field="n")
        if request.n > self.max_n:
            raise InvalidArgument(f"must be <= {self.max_n}, got {request.n}", field="n")
        sampling = validate_sampling(request.sampling)
        token_ids = [self.tokenize(p, i) for i, p in enumerate(request.prompts)]
        for i, ids in enumerate(token_ids):
            if len(ids) + sampling.max_tokens > self.max_model_len:
                raise InvalidArgument(
                    f"prompts[{i}] has {len(ids)} tokens; with max_tokens {sampling.max_tokens} that exceeds "
                    f"the model's context of {self.max_model_len}",
                    field="sampling.max_tokens",
                )
        return GenerationJob(prompt_token_ids=token_ids, n=request.n, sampling=sampling)

    def tokenize(self, prompt: PromptInput, index: int) -> list[int]:
        """Token ids of one prompt: chat template (+ generation prompt), plain text, or ids as is."""
        field = f"prompts[{index}]"
        forms = [
            name
            for name, v in (
                ("messages", prompt.messages),
                ("text", prompt.text),
                ("token_ids", prompt.token_ids),
            )
            if v
        ]
        if len(forms) != 1:
            given = ", ".join(forms) if forms else "none"
            raise InvalidArgument(
                f"set exactly one of messages, text, token_ids (given: {given})", field=field
            )
        if prompt.messages:
            for j, (role, _) in enumerate(prompt.messages):
                if not role:
                    raise InvalidArgument("role must not be empty", field=f"{field}.messages[{j}].role")
            messages = [{"role": role, "content": content} for role, content in prompt.messages]
            ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            ids = list(ids["input_ids"]) if isinstance(ids, dict) else list(ids)
        elif prompt.text:
            ids = list(self.tokenizer(prompt.text)["input_ids"])
        else:
            ids = list(prompt.token_ids)
            for j, t in enumerate(ids):
                if not 0 <= t < self.vocab_size:
                    raise InvalidArgument(
                        f"token id {t} is outside the vocabulary [0, {self.vocab_size})",
                        field=f"{field}.token_ids[{j}]",
                    )
        if not ids:
            raise InvalidArgument("the prompt has no tokens", field=field)
        return ids
