"""Tokenized sequences as the batcher and the engines pass them around."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(eq=False)
class Prefix:
    """Leading tokens shared by several sequences of a request, run through the model once.

    ``kv`` holds its keys and values once computed, shape (layers, 2, kv_heads, P, head_dim)
    (index 0 keys, 1 values), reused by every forward that holds one of its sequences (a flush
    cut into several forwards computes it once). Only the model's worker thread touches it; it is
    freed with the request's sequences.
    """

    input_ids: tuple[int, ...]
    kv: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def computed_kv(self) -> torch.Tensor:
        """``kv`` of a prefix already run through the model."""
        if self.kv is None:
            raise RuntimeError("the prefix's keys and values are read before they were computed")
        return self.kv


@dataclass(frozen=True)
class Encoded:
    """One tokenized sequence: ``input_ids`` (T,), the positions read out of its logits, and the
    ``prefix`` it shares with other sequences (its first ``prefix_tokens`` ids), if any."""

    input_ids: list[int]
    positions: list[int] = field(default_factory=list)
    prefix: Prefix | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def prefix_tokens(self) -> int:
        return self.prefix.num_tokens if self.prefix is not None else 0

    @property
    def suffix_tokens(self) -> int:
        """Tokens a forward computes for this sequence (the prefix comes from its KV cache)."""
        return self.num_tokens - self.prefix_tokens
