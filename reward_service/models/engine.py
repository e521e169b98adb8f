"""The small interface every reward-model engine implements (PRM formats, ORM).

A request flows ``encode`` (per sample, tokenizer only) → dynamic batcher → ``forward`` (one padded
batch, worker thread) → ``finish`` (per sample, params applied). ``forward`` returns only the few
numbers each sequence needs (step probabilities, one logit), so no big tensor crosses threads.
"""

from __future__ import annotations

import abc
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_runtime.errors import InvalidArgument
from reward_service.models.loading import LoadedModel
from reward_service.types import ComponentResult, Message, ParamInfo, RewardDescription, Sample


class SampleError(Exception):
    """A sample this model cannot score; becomes that sample's ``ComponentResult.error``."""


@dataclass(frozen=True)
class Encoded:
    """One tokenized sequence: ``input_ids`` (T,) and the positions read out of its logits."""

    input_ids: list[int]
    positions: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


def chat_messages(messages: tuple[Message, ...] | list[Message]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


class RewardModelEngine(abc.ABC):
    """Scores samples with one loaded model."""

    params: tuple[ParamInfo, ...] = ()

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        # Fast tokenizers are not safe to call from several threads at once.
        self._tokenizer_lock = threading.Lock()

    @abc.abstractmethod
    def _encode(self, sample: Sample) -> Encoded:
        """Token ids (and readout positions) of one sample; raises SampleError."""

    @abc.abstractmethod
    def _readout(self, logits: torch.Tensor, batch: list[Encoded]) -> list[Any]:
        """Per-sequence results from the padded batch's logits (model dtype; upcast what is read)."""

    @abc.abstractmethod
    def finish(self, output: Any, params: dict[str, Any]) -> ComponentResult:
        """The component result of one sample from its ``forward`` output."""

    @abc.abstractmethod
    def describe(self, reward_name: str) -> RewardDescription: ...

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with defaults filled in; InvalidArgument naming ``params.<key>``."""
        known = {p.name: p for p in self.params}
        for key in params:
            if key not in known:
                raise InvalidArgument(
                    f"unknown parameter; accepted: {', '.join(known) or 'none'}", field=f"params.{key}"
                )
        return {name: params.get(name, p.default) for name, p in known.items()}

    def encode(self, sample: Sample) -> Encoded:
        """Tokenize one sample; SampleError when it is empty or longer than the model accepts."""
        with self._tokenizer_lock:
            encoded = self._encode(sample)
        limit = self.loaded.max_positions
        if encoded.num_tokens > limit:
            raise SampleError(
                f"the input is {encoded.num_tokens} tokens, over the model's {limit} positions "
                "(max_position_embeddings); scoring it would need truncation"
            )
        return encoded

    def forward(self, batch: list[Encoded]) -> list[Any]:
        """One right-padded forward over ``batch`` (B sequences, T = longest); worker thread.

        Right padding keeps every real token at its unpadded position, so a sequence scores the
        same alone or in any batch (TRL pads reward-model inputs on the right too).
        """
        pad = self.loaded.pad_token_id
        width = max(e.num_tokens for e in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, encoded in enumerate(batch):
            input_ids[row, : encoded.num_tokens] = torch.tensor(encoded.input_ids, dtype=torch.long)
            attention_mask[row, : encoded.num_tokens] = 1
        device = self.loaded.device
        with torch.inference_mode():
            out = self.loaded.model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device))
            logits = out.logits if hasattr(out, "logits") else out[0]
            return self._readout(logits, batch)
