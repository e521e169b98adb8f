"""The per-token staleness bound of partial rollouts.

With partial rollouts a completion may span weight updates: ``token_versions[t]`` is the policy version
whose weights sampled token t (its rollout logprob is that version's, so TRL's per-token importance ratio
π_θ / π_rollout corrects each token for the weights that actually sampled it). At trainer version ``c``
the lag of a token is ``c - token_versions[t]``. The bound holds per token:

    keep[t] = 1  if 0 <= c - token_versions[t] <= max_staleness
              0  otherwise (too old, or newer than the trainer's weights: foreign)

A kept token trains with its importance ratio; a dropped one gets zero loss weight (it is multiplied into
the ``env_mask`` TRL trains on, ``completion_mask × tool_mask``), and still conditions the tokens after it,
as the prompt does. Nothing is discarded wholesale: the fresh tail of a completion whose head is too old
still trains. A completion left with no kept token would add nothing to the loss while its reward still
shapes its group's advantages, so the async rollout samples that group again at the trainer's version
(``AsyncServiceRollout``; counted in ``async/regenerated``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field


def token_keep_mask(token_versions: Sequence[int], current: int, max_staleness: int) -> list[int]:
    """1 where ``0 <= current - v <= max_staleness``, else 0, per token (formula in the module docstring)."""
    return [1 if 0 <= current - v <= max_staleness else 0 for v in token_versions]


@dataclass(frozen=True)
class TokenStaleness:
    """How one batch's tokens stand against the bound.

    ``lag_counts``: number of tokens per lag ``current - v`` (negative = foreign); ``masked``: tokens with
    zero loss weight; ``partial_completions``: completions whose tokens come from more than one version;
    ``max_lag``: largest lag of any token; ``max_trained_lag``: largest lag of a kept token (−1: none kept).
    """

    lag_counts: dict[int, int] = field(default_factory=dict)
    masked: int = 0
    partial_completions: int = 0
    max_lag: int = 0
    max_trained_lag: int = -1

    @property
    def tokens(self) -> int:
        return sum(self.lag_counts.values())

    def lag_fractions(self) -> dict[int, float]:
        """Share of the batch's tokens per lag (sums to 1; empty for a batch without tokens)."""
        total = self.tokens
        return {lag: count / total for lag, count in sorted(self.lag_counts.items())} if total else {}


def bound_tokens(
    versions_per_completion: Sequence[Sequence[int]], current: int, max_staleness: int
) -> tuple[list[list[int]], TokenStaleness]:
    """The keep mask of every completion (:func:`token_keep_mask`) and the batch's summary."""
    masks = [token_keep_mask(versions, current, max_staleness) for versions in versions_per_completion]
    lags: Counter[int] = Counter()
    trained: list[int] = []
    for versions, mask in zip(versions_per_completion, masks, strict=True):
        for version, keep in zip(versions, mask, strict=True):
            lags[current - version] += 1
            if keep:
                trained.append(current - version)
    summary = TokenStaleness(
        lag_counts=dict(lags),
        masked=sum(len(m) - sum(m) for m in masks),
        partial_completions=sum(len(set(v)) > 1 for v in versions_per_completion),
        max_lag=max(lags, default=0),
        max_trained_lag=max(trained, default=-1),
    )
    return masks, summary
