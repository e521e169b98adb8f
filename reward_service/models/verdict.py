"""Reading a causal LM's verdict between two tokens at chosen positions (step-tag PRMs, judges).

At each read-out position t of a sequence, with ``a``/``b`` the positive/negative token ids and
``z = logits[t]`` (vocabulary logits, float32)::

    score_t = softmax(z[[a, b]])[0] = p(a) / (p(a) + p(b))

(the softmax over the whole vocabulary, renormalised over the two tokens). The fast head computes the
same two logits as the decoder's hidden state at t times the two rows ``W[[a, b]]`` of the LM head,
instead of the (B, T, V) logits of which two per position are read.
"""

from __future__ import annotations

from typing import Any

import torch

from reward_service.models.engine import Encoded, RewardModelEngine


class TokenPairEngine(RewardModelEngine):
    """An engine whose output per sequence is ``score_t`` at each of its ``positions`` (floats)."""

    def _pair(self) -> list[int]:
        return list(self.loaded.token_pair())

    def _pair_supported(self) -> bool:
        """Whether this model is read through the token pair (a PRM may have another head)."""
        return True

    def _readout(self, logits: torch.Tensor, batch: list[Encoded]) -> list[list[float]]:
        """logits (B, T, V) → per sequence the pair score at each of its positions."""
        results = []
        for row, encoded in enumerate(batch):
            at = [t - encoded.prefix_tokens for t in encoded.positions]
            judged = logits[row, at].float()[:, self._pair()]  # (positions, 2); softmax in float32
            results.append(judged.softmax(dim=-1)[:, 0].tolist())
        return results

    def _set_fast_head(self, on: bool) -> bool:
        supported = self._pair_supported()
        self.fast_head = on and supported
        return supported

    def _run(self, inputs: dict[str, Any], batch: list[Encoded]) -> list[Any]:
        """With the fast head: hidden states at the positions times ``W[[a, b]]`` of the LM head. Same dot
        products; ``check_fast_paths`` keeps it off for heads that do more than one linear map."""
        if not self.fast_head:
            return super()._run(inputs, batch)
        hidden = self._backbone()(**inputs).last_hidden_state  # (B, T, H)
        rows = torch.tensor([r for r, e in enumerate(batch) for _ in e.positions], device=hidden.device)
        cols = torch.tensor([t - e.prefix_tokens for e in batch for t in e.positions], device=hidden.device)
        head = self.loaded.model.get_output_embeddings()
        pair = self._pair()
        bias = head.bias[pair] if getattr(head, "bias", None) is not None else None
        judged = torch.nn.functional.linear(hidden[rows, cols], head.weight[pair], bias).float()  # (n, 2)
        scores = judged.softmax(dim=-1)[:, 0].tolist()
        results, start = [], 0
        for encoded in batch:
            results.append(scores[start : start + len(encoded.positions)])
            start += len(encoded.positions)
        return results
