"""Curriculum: per-prompt pass rates from each group's rewards, prime-rl's difficulty pools, and a train
sampler that draws prompts by their pool's weight (config: :mod:`trainer_service.config.curriculum`).

- **Tracking.** Every scored batch (:class:`~trainer_service.training.rewards.BatchScorer` hands it over)
  adds, per prompt, its completions to ``attempts`` and those whose first reward term reaches
  ``pass_threshold`` to ``passes``. Prompts are known by their identity
  (:func:`~grpo_runtime.prompt_groups.prompt_key`): dataset rows with the same prompt share their counts.
- **Pools.** pass rate ≥ ``easy_pass_rate``: easy; ≤ ``hard_pass_rate``: hard; otherwise, or never seen:
  normal.
- **Sampling.** :class:`CurriculumSampler` keeps the layout of TRL's ``RepeatSampler`` (chunks of distinct
  prompts, each repeated G times, each chunk ``repeat_count`` times) and draws each chunk's prompts without
  replacement with probability ∝ their pool's weight, from the weights of the moment it draws and TRL's
  seeded generator.
- **Checkpoints.** ``state_dict`` (the counts) is saved as ``curriculum.json`` in every checkpoint and
  loaded on resume.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Sampler
from transformers import TrainerCallback
from trl.trainer.utils import RepeatSampler

from grpo_runtime.prompt_groups import prompt_key
from trainer_service.config.curriculum import CurriculumConfig

CURRICULUM_FILE = "curriculum.json"
POOLS = ("easy", "normal", "hard")


class Curriculum:
    """Pass counts of the prompts of ``prompts`` (the train dataset's, in row order); ``term``: the reward
    term whose value decides a pass (the run's first)."""

    def __init__(self, prompts: Sequence[Any], config: CurriculumConfig, term: str):
        self.config = config
        self.term = term
        self.keys = [prompt_key(p) for p in prompts]
        self.passes: dict[str, int] = {}
        self.attempts: dict[str, int] = {}

    def observe(self, prompts: Sequence[Any], values: Sequence[float | None]) -> None:
        """Count one scored batch: ``values[i]`` is completion i's first reward term (None = no value, a
        failure)."""
        threshold = self.config.pass_threshold
        for prompt, value in zip(prompts, values, strict=True):
            key = prompt_key(prompt)
            passed = value is not None and math.isfinite(value) and value >= threshold
            self.attempts[key] = self.attempts.get(key, 0) + 1
            self.passes[key] = self.passes.get(key, 0) + int(passed)

    def observe_scored(self, prompts: Sequence[Any], components: Mapping[str, Sequence[Any]]) -> None:
        """:class:`~trainer_service.training.rewards.BatchScorer`'s ``observe``: every term's components."""
        self.observe(prompts, [component.value for component in components[self.term]])

    def pool(self, key: str) -> str:
        attempts = self.attempts.get(key, 0)
        if not attempts:
            return "normal"
        rate = self.passes[key] / attempts
        if rate >= self.config.easy_pass_rate:
            return "easy"
        if rate <= self.config.hard_pass_rate:
            return "hard"
        return "normal"

    def weights(self) -> list[float]:
        """Sampling weight of every dataset row."""
        by_pool = {pool: getattr(self.config, f"{pool}_weight") for pool in POOLS}
        return [by_pool[self.pool(key)] for key in self.keys]

    def metrics(self) -> dict[str, float]:
        """Rows per pool (``curriculum/easy`` ...) for metrics.jsonl."""
        counts = dict.fromkeys(POOLS, 0)
        for key in self.keys:
            counts[self.pool(key)] += 1
        return {f"curriculum/{pool}": float(count) for pool, count in counts.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"passes": dict(self.passes), "attempts": dict(self.attempts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.passes = {str(k): int(v) for k, v in state["passes"].items()}
        self.attempts = {str(k): int(v) for k, v in state["attempts"].items()}

    def save(self, directory: Path) -> None:
        """Write the counts beside a checkpoint; replaced whole, so a kill mid-write leaves no torn file."""
        path = Path(directory) / CURRICULUM_FILE
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(self.state_dict()))
        os.replace(partial, path)

    def load(self, directory: Path) -> bool:
        """Load the counts saved in a checkpoint directory; False when it has none."""
        path = Path(directory) / CURRICULUM_FILE
        if not path.is_file():
            return False
        self.load_state_dict(json.loads(path.read_text()))
        return True

    def wrap(self, sampler: Sampler) -> CurriculumSampler:
        """The trainer's ``wrap_sampler``: TRL's RepeatSampler replaced by the weighted one."""
        if not isinstance(sampler, RepeatSampler):
            raise TypeError(f"the curriculum replaces TRL's RepeatSampler, got {type(sampler).__name__}")
        return CurriculumSampler(sampler, self)


class CurriculumSampler(Sampler):
    """TRL's ``RepeatSampler`` layout with weighted chunks (reads ``mini_repeat_count``, ``batch_size``,
    ``repeat_count``, ``num_samples`` and ``generator`` of the sampler it replaces)."""

    def __init__(self, inner: RepeatSampler, curriculum: Curriculum):
        self.inner = inner
        self.curriculum = curriculum

    def __iter__(self) -> Iterator[int]:
        inner = self.inner
        chunks = inner.num_samples // inner.batch_size
        for _ in range(chunks):
            weights = torch.tensor(self.curriculum.weights(), dtype=torch.float64)
            chunk = torch.multinomial(
                weights, inner.batch_size, replacement=False, generator=getattr(inner, "generator", None)
            )
            for _ in range(inner.repeat_count):
                for index in chunk.tolist():
                    for _ in range(inner.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        return len(self.inner)


class CurriculumCallback(TrainerCallback):
    """Writes the curriculum's counts into every checkpoint the trainer saves (main process)."""

    def __init__(self, curriculum: Curriculum):
        self.curriculum = curriculum

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if checkpoint.is_dir():
                self.curriculum.save(checkpoint)
