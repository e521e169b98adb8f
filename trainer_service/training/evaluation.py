"""Held-out evaluation during training: the ``data.eval`` split through the rollout and reward services.

At step 0, every ``training.evaluation.eval_steps`` optimizer steps and after the last step,
:class:`HeldOutEvaluator` generates, for every eval prompt, one greedy completion (temperature 0) and
``num_generations_eval`` sampled ones (the run's sampling parameters) on the rollout replicas serving the
trainer's current weights, scores them with every reward term in one reward-service call per chunk, and
appends one row to ``eval_metrics.jsonl``: ``{"step", "accuracy_greedy", "avg@n", "pass@k", ... per term}``
(:mod:`trainer_service.training.eval_metrics`).

Generation goes through :class:`~trainer_service.rollout.service_rollout.ServiceRollout` (the weight-sync
bracket, retries with backoff, the version check) and scoring through
:class:`~trainer_service.training.rewards.BatchScorer`, exactly as a training step does; completions are
decoded as TRL decodes them (``skip_special_tokens``) so the reward sees the same text. A tool-using run is
evaluated on whole episodes; a run with ``training.agents`` on its agent's episodes
(:class:`~trainer_service.rollout.agent_rollout.AgentRollout`, each session pinned to the pass's sampling,
greedy included, whatever the agent asks), scored by ``reward_fn``'s terms (the agent's own reward is a
training signal, not a held-out term).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import datasets
from transformers import PreTrainedTokenizerBase, TrainerCallback, TrainerControl, TrainerState

from trainer_service.core.types import EventSink, JobEvent, RunState, discard
from trainer_service.rollout.agent_episodes import AgentEpisodes
from trainer_service.rollout.agent_rollout import AgentRollout
from trainer_service.rollout.episodes import EpisodePlan
from trainer_service.rollout.prompt_images import IMAGE_COLUMNS, prompts_with_images
from trainer_service.rollout.replicas import RolloutReplicas
from trainer_service.rollout.service_rollout import SamplingConfig, ServiceRollout
from trainer_service.rollout.weight_sync import WeightSync
from trainer_service.training.callbacks import EVAL_METRICS_FILE
from trainer_service.training.eval_metrics import Value, summarize
from trainer_service.training.rewards import BatchScorer

# Prompts per Generate / Score call: far below the services' request limits (4096) at any G.
CHUNK_PROMPTS = 64


class HeldOutEvaluator:
    """Evaluates the current policy on ``dataset`` (rows with ``prompt`` and the reward metadata columns).

    ``sampling``: the run's sampling parameters (the sampled pass uses them, the greedy pass the same with
    temperature 0); ``num_samples``: sampled completions per prompt; ``threshold``: the value at which a
    sample passes a reward term.
    """

    def __init__(
        self,
        dataset: datasets.Dataset,
        replicas: RolloutReplicas,
        sync: WeightSync,
        sampling: SamplingConfig,
        scorer: BatchScorer,
        tokenizer: PreTrainedTokenizerBase,
        *,
        num_samples: int,
        threshold: float,
        retry_timeout_s: float = 300.0,
        episodes: EpisodePlan | None = None,
        agents: AgentEpisodes | None = None,
    ):
        self.dataset = dataset
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.num_samples = num_samples
        self.threshold = threshold
        greedy = replace(sampling, temperature=0.0, top_p=1.0, top_k=None, min_p=None, seed=None)

        # A tool-using run is evaluated on whole episodes, and an agent run on its agent's, as it trains.
        def rollout(sampling: SamplingConfig, n: int) -> ServiceRollout:
            if agents is not None:
                return AgentRollout(
                    replicas, sync, sampling, n, agents, retry_timeout_s=retry_timeout_s, name="eval"
                )
            return ServiceRollout(
                replicas, sync, sampling, n, retry_timeout_s=retry_timeout_s, episodes=episodes
            )

        self._greedy = rollout(greedy, 1)
        self._sampled = rollout(sampling, num_samples)

    def evaluate(self, trainer: Any) -> dict[str, float]:
        """The metrics of the policy the trainer holds now (its pushed weights)."""
        greedy: dict[str, list[Value]] = {}
        sampled: dict[str, list[list[Value]]] = {}
        for start in range(0, len(self.dataset), CHUNK_PROMPTS):
            rows = self.dataset.select(range(start, min(start + CHUNK_PROMPTS, len(self.dataset))))
            for term, values in self._score(rows, self._greedy, 1, trainer).items():
                greedy.setdefault(term, []).extend(values)
            n = self.num_samples
            for term, values in self._score(rows, self._sampled, n, trainer).items():
                sampled.setdefault(term, []).extend(values[i : i + n] for i in range(0, len(values), n))
        return summarize(greedy, sampled, threshold=self.threshold)

    def _score(
        self, rows: datasets.Dataset, rollout: ServiceRollout, n: int, trainer: Any
    ) -> dict[str, list[Value]]:
        """Each term's value of ``n`` completions per row, prompt-major."""
        prompts = [prompt for prompt in prompts_with_images(rows) for _ in range(n)]
        generated = rollout(prompts, trainer)
        texts = self.tokenizer.batch_decode(generated["completion_ids"], skip_special_tokens=True)
        # TRL's completion of a chat prompt is one assistant message.
        completions = [
            text if isinstance(prompt, str) else [{"role": "assistant", "content": text}]
            for prompt, text in zip(prompts, texts, strict=True)
        ]
        columns = {
            name: [value for value in rows[name] for _ in range(n)]
            for name in rows.column_names
            if name not in ("prompt", *IMAGE_COLUMNS)
        }
        components = self.scorer.components(prompts, completions, generated["completion_ids"], columns)
        return {term: [component.value for component in values] for term, values in components.items()}


class EvaluationCallback(TrainerCallback):
    """Runs the evaluator at step 0, every ``eval_steps`` optimizer steps and after the last step, and
    appends each row to ``output_dir/eval_metrics.jsonl`` (main process only writes; every process
    generates, so collective weight syncs stay in step). The trainer binds itself at its construction.

    Register it after the weight-sync callback, so each evaluation sees the weights just pushed, and after
    the metrics callback, whose resume truncation of the file comes first.
    """

    def __init__(
        self,
        evaluator: HeldOutEvaluator,
        eval_steps: int,
        output_dir: Path,
        sink: EventSink = discard,
    ):
        self.evaluator = evaluator
        self.eval_steps = eval_steps
        self.path = Path(output_dir) / EVAL_METRICS_FILE
        self.trainer: Any = None  # the trainer that registered it, from bind()
        self._sink = sink
        # The latest evaluation: (step, metrics), read by the eval gate.
        self.last: tuple[int, dict[str, float]] | None = None

    def bind(self, trainer: Any) -> None:
        """Evaluate ``trainer``'s policy (called once, by the trainer's constructor)."""
        self.trainer = trainer

    def _evaluate(self, state: TrainerState) -> None:
        step = int(state.global_step)
        metrics = self.evaluator.evaluate(self.trainer)
        self.last = (step, metrics)
        if state.is_world_process_zero:
            with self.path.open("a") as out:
                out.write(json.dumps({"step": step, **metrics}, allow_nan=True) + "\n")
            message = f"held-out eval at step {step}: greedy accuracy {metrics['accuracy_greedy']:.3f}"
            self._sink(
                JobEvent(step=step, total_steps=state.max_steps, state=RunState.RUNNING, message=message)
            )

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        if state.global_step == 0:
            self._evaluate(state)

    def on_step_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        if state.global_step % self.eval_steps == 0:
            self._evaluate(state)
        return control

    def on_train_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        # A run stopped early (StopRun) only checkpoints: its evaluation waits for the resumed run's end.
        finished = state.global_step >= state.max_steps
        if finished and (self.last is None or self.last[0] != state.global_step):
            self._evaluate(state)


def greedy_accuracy_change(rows: Sequence[dict[str, float]]) -> str | None:
    """``held-out greedy accuracy 0.310 (step 0) → 0.420 (step 200)`` from eval rows, or None without two."""
    if len(rows) < 2:
        return None
    first, last = rows[0], rows[-1]
    return (
        f"held-out greedy accuracy {first['accuracy_greedy']:.3f} (step {int(first['step'])}) → "
        f"{last['accuracy_greedy']:.3f} (step {int(last['step'])})"
    )
