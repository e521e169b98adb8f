"""Cutting sequences into padded forwards: cost of a batch and the least-cost split of a sorted list."""

from __future__ import annotations

from collections.abc import Sequence

from reward_service.models.sequences import Encoded


def padded_cost(items: Sequence[Encoded]) -> int:
    """Tokens a right-padded forward of ``items`` computes: B x T_max, T = ``suffix_tokens``."""
    return len(items) * max((item.suffix_tokens for item in items), default=0)


def split_by_cost(items: Sequence[Encoded], max_batch_tokens: int) -> list[list[Encoded]]:
    """Consecutive chunks whose padded cost stays within ``max_batch_tokens`` (at least one item each)."""
    chunks: list[list[Encoded]] = []
    current: list[Encoded] = []
    width = 0
    for item in items:
        new_width = max(width, item.suffix_tokens)
        if current and (len(current) + 1) * new_width > max_batch_tokens:
            chunks.append(current)
            current, new_width = [], item.suffix_tokens
        current.append(item)
        width = new_width
    if current:
        chunks.append(current)
    return chunks


def plan_batches(lengths: Sequence[int], max_batch_tokens: int, overhead_tokens: int) -> list[int]:
    """Sizes of consecutive batches over ascending ``lengths`` of least total cost.

    cost(batch) = size x its last (longest) length + ``overhead_tokens``; a batch of two or more
    stays within ``max_batch_tokens``. Dynamic programming over the end of the last batch,
    O(n x largest batch); ties go to fewer, larger batches.
    """
    n = len(lengths)
    best = [0] + [0] * n  # best[j]: least cost of the first j sequences
    size = [0] * (n + 1)  # size[j]: the last batch in that optimum
    for j in range(1, n + 1):
        width = lengths[j - 1]
        best[j], size[j] = best[j - 1] + width + overhead_tokens, 1
        k = 2
        while k <= j and k * width <= max_batch_tokens:
            cost = best[j - k] + k * width + overhead_tokens
            if cost <= best[j]:
                best[j], size[j] = cost, k
            k += 1
    sizes = []
    j = n
    while j > 0:
        sizes.append(size[j])
        j -= size[j]
    return sizes[::-1]
