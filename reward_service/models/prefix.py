"""Shared prompt prefixes: finding them among the sequences of one request.

A GRPO request carries several completions of the same prompt, so its sequences start with the same
tokens (the chat-templated prompt). In a causal model a token's keys and values depend only on the
tokens before it, so the shared prefix can run once and its KV cache serve every sequence: the forward
then computes ``P + sum(S_i)`` tokens instead of ``sum(P + S_i)`` (P prefix, S_i suffix lengths),
with the same logits (vLLM and SGLang call this prefix caching).

Grouping is done in token space, after tokenization, so it is exact whatever the tokenizer merges
across the prompt/completion boundary: two sequences share exactly their longest common run of
leading token ids. A prefix never reaches a read-out position (its logits come from the suffix pass)
and leaves at least one token to every sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from reward_service.models.sequences import Encoded, Prefix

# Most sequences one prefix serves; past that the saving ``(n - 1) / n`` of the prefix hardly grows,
# and the grouping stays O(n x MAX_GROUP).
MAX_GROUP = 64


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def shareable_length(item: Encoded) -> int:
    """Longest prefix of ``item`` that may be computed apart: before its first read-out position
    (PRM step markers) and leaving its last token (ORM pooling) to the suffix pass."""
    limit = item.num_tokens - 1
    if item.positions:
        limit = min(limit, item.positions[0])
    return max(limit, 0)


def share_prefixes(items: Sequence[Encoded], min_prefix_tokens: int) -> list[Encoded]:
    """``items`` (same order) with a ``Prefix`` attached to the members of each sharing group.

    Sequences are sorted by their token ids, so sequences with a common prefix are neighbours and
    the common prefix of a run of neighbours is the minimum of their pairwise neighbour prefixes.
    The runs are chosen by dynamic programming to maximise the prefix tokens not recomputed,
    ``sum over groups of (members - 1) x prefix_length``; a group whose prefix is shorter than
    ``min_prefix_tokens`` is not formed (its saving would not pay for the extra pass).
    """
    n = len(items)
    if n < 2:
        return list(items)
    order = sorted(range(n), key=lambda i: items[i].input_ids)
    caps = [shareable_length(items[i]) for i in order]
    # neighbour[k]: tokens shared by order[k - 1] and order[k] (neighbour[0] unused).
    neighbour = [0] + [
        common_prefix_length(items[order[k - 1]].input_ids, items[order[k]].input_ids) for k in range(1, n)
    ]
    best = [0] * (n + 1)  # best[j]: most tokens saved over the first j sorted sequences
    cut = [0] * (n + 1)  # cut[j]: start of the last group in that optimum
    for j in range(1, n + 1):
        best[j], cut[j] = best[j - 1], j - 1  # sequence j - 1 alone
        length = caps[j - 1]
        for i in range(j - 2, max(j - MAX_GROUP, 0) - 1, -1):  # group = sorted[i : j]
            length = min(length, neighbour[i + 1], caps[i])
            if length < min_prefix_tokens:
                break  # only shrinks as the group grows
            saved = best[i] + (j - 1 - i) * length
            if saved > best[j]:
                best[j], cut[j] = saved, i
    shared = list(items)
    j = n
    while j > 0:
        i = cut[j]
        if j - i >= 2:
            members = order[i:j]
            length = min(min(caps[i:j]), *neighbour[i + 1 : j])
            prefix = Prefix(input_ids=tuple(items[order[i]].input_ids[:length]))
            for index in members:
                shared[index] = replace(items[index], prefix=prefix)
        j = i
    return shared
