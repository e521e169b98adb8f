"""Held-out evaluation metrics: greedy accuracy, avg@k and the unbiased pass@k (plain Python, no torch).

For every eval prompt the evaluation has one greedy completion and ``n`` sampled ones, each scored per reward
term. A sample *passes* a term when its value is at least the pass threshold; a missing value (the reward
service gave none) never passes and is left out of the means.

- ``accuracy_greedy/<term>``: fraction of prompts whose greedy completion passes;
- ``avg@n/<term>``: mean value over all sampled completions (mean reward at n samples);
- ``pass@k/<term>``: the mean over prompts of the unbiased estimator :func:`pass_at_k` with ``c`` = the
  prompt's passing samples, for every ``k`` of :func:`report_ks`.

The keys without ``/<term>`` repeat those of the run's first reward term (its primary reward).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` of the ``n`` samples, drawn without replacement, passes, when
    ``c`` of them pass (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1):

        pass@k = 1 − C(n − c, k) / C(n, k) = 1 − ∏_{i = n − c + 1}^{n} (1 − k / i)

    The product form avoids the huge binomials; it is 1 when ``n − c < k`` (every draw of k holds a pass).
    """
    if not 0 <= c <= n:
        raise ValueError(f"c must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got {k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def report_ks(n: int) -> list[int]:
    """The ``k`` values reported for ``n`` samples: 1, the powers of two below n, and n."""
    ks = {1, n}
    power = 2
    while power < n:
        ks.add(power)
        power *= 2
    return sorted(ks)


Value = float | None


def _passes(value: Value, threshold: float) -> bool:
    return value is not None and math.isfinite(value) and value >= threshold


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarize(
    greedy: Mapping[str, Sequence[Value]],
    sampled: Mapping[str, Sequence[Sequence[Value]]],
    *,
    threshold: float,
) -> dict[str, float]:
    """The metrics of one evaluation.

    ``greedy[term][p]``: the value of prompt p's greedy completion; ``sampled[term][p]``: the values of its
    ``n`` sampled completions (the same n for every prompt). Terms in the run's order; the first is primary.
    """
    if not greedy:
        raise ValueError("an evaluation needs at least one reward term")
    metrics: dict[str, float] = {}
    for term, greedy_values in greedy.items():
        groups = sampled[term]
        if len(groups) != len(greedy_values):
            raise ValueError(f"{term}: {len(groups)} sampled groups for {len(greedy_values)} prompts")
        n = len(groups[0]) if groups else 0
        metrics[f"accuracy_greedy/{term}"] = _mean([float(_passes(v, threshold)) for v in greedy_values])
        finite = [v for group in groups for v in group if v is not None and math.isfinite(v)]
        metrics[f"avg@{n}/{term}"] = _mean(finite)
        for k in report_ks(n) if n else []:
            metrics[f"pass@{k}/{term}"] = _mean(
                [pass_at_k(n, sum(_passes(v, threshold) for v in group), k) for group in groups]
            )
    primary = next(iter(greedy))
    for key in [key for key in metrics if key.endswith(f"/{primary}")]:
        metrics[key.removesuffix(f"/{primary}")] = metrics[key]
    return metrics
