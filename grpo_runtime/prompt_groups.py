"""How TRL lays out a generation batch: each prompt repeated ``num_generations`` times, consecutively.

Both sides of the trio read groups from that layout — the reward client (group-relative rewards score each
group together) and the trainer's rollout (one Generate request of ``n`` completions per group) — so the rule
lives here once: a run of equal consecutive prompts is one group.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def prompt_key(prompt: Any) -> str:
    """A hashable, order-stable identity of one prompt (message list or string); equal prompts, equal keys."""
    return json.dumps(prompt, sort_keys=True, default=str)


def prompt_runs(prompts: Sequence[Any], max_run: int | None = None) -> list[tuple[int, int]]:
    """``(start, length)`` of each run of equal consecutive prompts, a run split every ``max_run`` prompts.

    ``[a, a, b, b] → [(0, 2), (2, 2)]``. Two different rows with the same prompt that happen to be adjacent
    form one longer run; ``max_run`` (G) splits it so no group is larger than a generation group.
    """
    runs: list[tuple[int, int]] = []
    previous = None
    for index, prompt in enumerate(prompts):
        key = prompt_key(prompt)
        if runs and key == previous and (max_run is None or runs[-1][1] < max_run):
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((index, 1))
        previous = key
    return runs
