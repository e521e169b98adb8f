"""Async rollout: generate step s+1's completions while the trainer scores, backpropagates and steps on s.

Design (single process):

* **Which prompts come next.** TRL draws prompts through the train DataLoader, and accelerate's
  ``DataLoaderShard`` always pulls one batch ahead of the one it yields. :class:`RecordingSampler` wraps the
  trainer's sampler (:meth:`AsyncServiceRollout.record`, the trainer's ``wrap_sampler``) and
  appends every index it hands out to a queue, so when TRL calls ``rollout_func`` for step s the indices of
  step s+1 are already known. No TRL semantics change: the same rows, in the same order, reach the loss.
* **Overlap.** ``rollout_func(prompts_s)`` returns step s's completions, then starts a background thread that
  asks the rollout service for step s+1's prompts. That generation runs during step s's reward scoring, loss
  and backward, which is the time a synchronous loop waits. The weight push after step s-1's optimizer step
  streams in the background too (``WeightSync.push_in_background``): it gets its version at once, the
  prefetch waits for it to reach the replicas before generating, and step s's optimizer step waits for it
  to end (it streams the model's own tensors).
* **Versions and the staleness bound.** Every completion carries the ``policy_version`` of the weights that
  produced it. At consumption the trainer's version is ``c`` = the version of its weights after ``s``
  optimizer steps (given by the last push, which may still be streaming). A prefetched batch whose oldest
  completion has version ``v`` is trained on only if ``c - v <= max_staleness`` (and ``v <= c``: newer means
  foreign weights); otherwise all of it is dropped, counted in ``async/stale_dropped``, and step s is
  regenerated synchronously with version ``c`` exactly. With ``max_staleness: 1`` the usual case is
  ``v = c - 1`` (generated from the weights before step s-1's optimizer step) and is accepted;
  ``max_staleness: 0`` drops every such prefetch, so it trains exactly like the synchronous loop (at the cost
  of the wasted generation).
* **Partial rollouts** (``training.rollout.partial_rollouts``, default on). A prefetch asks the service to
  continue across weight updates: the push after step s no longer waits for step s+1's prefetch, the prefetch
  pauses at a token boundary, takes the new weights and goes on, and every token carries the version that
  sampled it. The bound then holds per token (:mod:`trainer_service.rollout.token_staleness`): tokens more
  than ``max_staleness`` versions behind get zero loss weight, the rest train, and no batch is thrown away for
  staleness (``async/discarded`` stays 0). Off: the batch-level rule above, and a push waits for the prefetch
  in flight.
* **Importance sampling.** The rollout logprobs (under the generating version's weights) are returned to TRL,
  whose importance-sampling correction (``vllm_importance_sampling_correction`` in the variant trainer)
  reweights the loss by ``π_θ / π_rollout`` per token, which is what makes a 1-step-stale batch unbiased.
* **Replicas.** A prefetch is sharded over the replicas that serve the trainer's version when it starts
  (``WeightSync.ready``), like a synchronous generation; a replica that joins during it is used from the
  next generation on, and one dropped during it keeps its client until the membership changes again.
* **Cores.** On one CPU machine the trainer runs on its share of the cores while a prefetch generates and
  borrows the rollout's share once it has finished (:mod:`trainer_service.rollout.core_borrowing`).
* **Failures.** A prefetch that fails (service down, restarted) or whose prompts do not match what TRL asks
  for (resume skipping batches, epoch boundary) is a miss: the step generates synchronously through
  :class:`ServiceRollout`, which waits with backoff and re-pushes the weights.

Multi-process runs and vLLM sleep mode are refused by the config: the lookahead is per process and a
sleeping engine cannot generate during the optimizer step.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch.utils.data import Sampler

from grpo_runtime.prompt_groups import prompt_key, prompt_runs
from trainer_service.rollout.core_borrowing import CoreBorrowing
from trainer_service.rollout.prompt_images import prompts_with_images
from trainer_service.rollout.replicas import RolloutUnavailable
from trainer_service.rollout.service_rollout import ServiceRollout
from trainer_service.rollout.token_staleness import TokenStaleness, bound_tokens

log = logging.getLogger(__name__)


class RecordingSampler(Sampler):
    """Yield the wrapped sampler's indices unchanged and append each to ``issued`` as it is handed out."""

    def __init__(self, inner: Sampler, issued: deque[int]):
        self.inner = inner
        self.issued = issued

    def __iter__(self) -> Iterator[int]:
        for index in self.inner:
            self.issued.append(int(index))
            yield index

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # set_epoch, seed, ... of the wrapped sampler.
        return getattr(self.inner, name)


@dataclass(frozen=True)
class StalenessDecision:
    """Whether a prefetched batch may be trained on at trainer version ``current``."""

    accept: bool
    staleness: int  # current - oldest version in the batch (negative = newer than the trainer's weights)


def judge_staleness(versions: list[int], current: int, max_staleness: int) -> StalenessDecision:
    """Accept iff every version ``v`` satisfies ``0 <= current - v <= max_staleness``.

    ``staleness`` = ``current - min(versions)``; a version above ``current`` (weights the trainer never
    pushed) is refused whatever the bound.
    """
    if not versions:
        raise ValueError("a batch without completions has no version")
    staleness = current - min(versions)
    fresh_enough = staleness <= max_staleness and max(versions) <= current
    return StalenessDecision(accept=fresh_enough, staleness=staleness)


@dataclass
class AsyncStats:
    """Counters written to metrics.jsonl (cumulative over the run, except ``staleness``)."""

    prefetch_hits: int = 0
    prefetch_misses: int = 0
    stale_dropped: int = 0  # completions generated but never trained on (too stale)
    staleness: int = 0  # staleness of the latest trained batch, in versions
    max_staleness_seen: int = 0
    discarded: int = 0  # completions thrown away whole for staleness (the batch-level rule only)
    partial_completions: int = 0  # trained completions whose tokens came from more than one version
    masked_tokens: int = 0  # tokens given zero loss weight by the per-token bound
    regenerated: int = 0  # completions of groups sampled again because one of them kept no token
    max_token_staleness: int = 0  # largest lag of any prefetched token
    tokens: TokenStaleness | None = None  # the latest trained prefetch (partial rollouts)


class AsyncServiceRollout:
    """``rollout_func`` that overlaps the next step's generation with the current optimizer step.

    ``inner`` is the synchronous :class:`ServiceRollout` (client, weight sync, sampling); this class adds the
    lookahead, the background generation and the staleness bound ``max_staleness`` (versions). ``cores``:
    the trainer's thread count follows the prefetches (a rollout service on the same CPU machine), or None.
    ``partial``: prefetches continue across weight updates and the bound holds per token (module docstring).
    """

    def __init__(
        self,
        inner: ServiceRollout,
        max_staleness: int,
        cores: CoreBorrowing | None = None,
        *,
        partial: bool = True,
    ):
        if max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")
        self.inner = inner
        self.max_staleness = max_staleness
        self.partial = partial
        self.cores = cores
        self.stats = AsyncStats()
        self.issued: deque[int] = deque()
        self._prompt_of: Any = None  # index -> prompt, set by attach()
        self._pending: tuple[list[str], Future] | None = None
        # Version of the weights the latest trained batch was checked against.
        self.trainer_version: int | None = None
        self._direct = False

    # -- wiring ---------------------------------------------------------------------------------------------
    def record(self, sampler: Sampler) -> Sampler:
        """The trainer's train sampler, wrapped so every index it issues is recorded (the trainer's
        ``wrap_sampler``, :class:`trainer_service.training.sampler_hook.WrappedSamplerTrainer`)."""
        return RecordingSampler(sampler, self.issued)

    def attach(self, trainer: Any) -> None:
        """Read prompts from the trainer's train dataset and, with core borrowing, switch its model's threads
        (call before ``trainer.train()``)."""
        dataset = trainer.train_dataset
        self._prompt_of = lambda index: prompts_with_images([dataset[index]])[0]
        if self.cores is not None:
            self.cores.attach(trainer.model)

    @property
    def last_versions(self) -> list[int]:
        return self.inner.last_versions

    @property
    def last_tool_metrics(self) -> dict[str, float]:
        return self.inner.last_tool_metrics

    @property
    def last_version(self) -> int | None:
        """Oldest policy version among the completions of the latest trained batch."""
        return min(self.inner.last_versions) if self.inner.last_versions else None

    @contextmanager
    def direct(self) -> Iterator[None]:
        """Calls inside generate synchronously (:class:`ServiceRollout`), leaving the pending prefetch and
        the sampler lookahead alone: dynamic sampling's replacement prompts are not in the sampler's order."""
        self._direct = True
        try:
            yield
        finally:
            self._direct = False

    # -- the rollout_func -----------------------------------------------------------------------------------
    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        if self._direct:
            return self.inner(prompts, trainer)
        keys = [prompt_key(p) for p in prompts]
        step = int(trainer.state.global_step)
        result = self._take_prefetched(keys, trainer, prompts)
        if result is None:
            result = self.inner(prompts, trainer)
            self.trainer_version = self.inner.sync.current_version
            self.stats.tokens = None  # this batch is synchronous: every token of lag 0
            self.stats.staleness = 0
        self._start_prefetch(keys, step + 1)
        return result

    def _take_prefetched(self, keys: list[str], trainer: Any, prompts: list[Any]) -> dict[str, list] | None:
        pending, self._pending = self._pending, None
        if pending is None:
            self.stats.prefetch_misses += 1
            return None
        expected_keys, future = pending
        try:
            completions = future.result()
        except Exception as error:  # the sync path retries with backoff and reports what persists
            log.warning("prefetched generation failed (%s); generating this step synchronously", error)
            self.stats.prefetch_misses += 1
            return None
        if expected_keys != keys:
            self.stats.prefetch_misses += 1
            self.stats.stale_dropped += len(completions)
            return None
        sync = self.inner.sync
        if sync.enabled and sync.push_pending and not sync.transferring:
            # The last push failed (service restarting): the sync path waits, re-pushes and regenerates. A
            # push still streaming in the background has its version already: the bound is judged against it.
            self.stats.prefetch_misses += 1
            self.stats.stale_dropped += len(completions)
            return None
        current = sync.current_version if sync.enabled else sync.follow_service_version(trainer)
        assert current is not None  # sync on: the last push's version (settled, or still streaming)
        if self.partial:
            return self._bounded_per_token(completions, int(current), prompts, trainer)
        versions = [int(c.policy_version) for c in completions]
        decision = judge_staleness(versions, int(current), self.max_staleness)
        if not decision.accept:
            log.info(
                "dropping %d prefetched completions: staleness %d > %d (or foreign version)",
                len(completions),
                decision.staleness,
                self.max_staleness,
            )
            self.stats.stale_dropped += len(completions)
            self.stats.discarded += len(completions)
            self.stats.prefetch_misses += 1
            return None
        self.stats.prefetch_hits += 1
        self.stats.staleness = decision.staleness
        self.stats.max_staleness_seen = max(self.stats.max_staleness_seen, decision.staleness)
        self.trainer_version = int(current)
        return self.inner.to_trl(completions, expected_version=None)

    def _bounded_per_token(
        self, completions: list[Any], current: int, prompts: list[Any], trainer: Any
    ) -> dict[str, list] | None:
        """Train on the prefetch, each token weighted by the per-token bound at version ``current``.

        A group with a completion that keeps no token (all of it sampled before the last ``max_staleness``
        pushes) is sampled again at ``current``: training on it would only spend a step on a group whose
        advantages come from a completion the loss never sees. The rest of the batch stays as generated.
        None (a miss: the synchronous path retries) when that generation fails.
        """
        keep, summary = bound_tokens(_token_versions(completions), current, self.max_staleness)
        stats = self.stats
        stats.max_token_staleness = max(stats.max_token_staleness, summary.max_lag)
        stale = [
            (start, count)
            for start, count in prompt_runs(prompts, self.inner.num_generations)
            if any(completions[i].token_ids and not any(keep[i]) for i in range(start, start + count))
        ]
        if stale:
            again = [prompts[i] for start, count in stale for i in range(start, start + count)]
            try:
                with self.inner.sync.generation(trainer) as version:
                    fresh = iter(self.inner.generate(again, int(trainer.state.global_step)))
            except Exception as error:
                log.warning(
                    "regenerating %d stale completions failed (%s); generating synchronously",
                    len(again),
                    error,
                )
                self.stats.prefetch_misses += 1
                return None
            completions = list(completions)
            for start, count in stale:
                for i in range(start, start + count):
                    completions[i] = next(fresh)
            stats.regenerated += len(again)
            current = int(version)
            keep, summary = bound_tokens(_token_versions(completions), current, self.max_staleness)
        stats.prefetch_hits += 1
        stats.tokens = summary
        stats.partial_completions += summary.partial_completions
        stats.masked_tokens += summary.masked
        stats.staleness = current - min(int(c.policy_version) for c in completions)
        stats.max_staleness_seen = max(stats.max_staleness_seen, stats.staleness)
        self.trainer_version = current
        return self.inner.to_trl(completions, expected_version=None, token_keep=keep)

    def _next_prompts(self, keys: list[str]) -> list[Any] | None:
        """The prompts of the batch after the one whose keys are ``keys``, from the recorded indices."""
        if self._prompt_of is None:
            return None
        size = len(keys)
        # Drop indices consumed without a generation (resume skipping batches) until the queue starts with
        # the current batch; give up when it is not there.
        while len(self.issued) >= size:
            window = [prompt_key(self._prompt_of(i)) for i in list(self.issued)[:size]]
            if window == keys:
                break
            self.issued.popleft()
        else:
            return None
        for _ in range(size):
            self.issued.popleft()
        if len(self.issued) < size:
            return None
        return [self._prompt_of(i) for i in list(self.issued)[:size]]

    def _start_prefetch(self, keys: list[str], step: int) -> None:
        prompts = self._next_prompts(keys)
        if prompts is None:
            if self.cores is not None:
                self.cores.rollout_idle()
            return
        future: Future = Future()
        if self.cores is not None:
            self.cores.lend(future)
        sync = self.inner.sync

        def generate() -> None:
            try:
                # The weights of the step that just ended may still be streaming to the replicas.
                sync.wait_for_transfer()
                if sync.enabled and sync.push_pending:
                    raise RolloutUnavailable(f"version {sync.current_version} did not reach the replicas")
                future.set_result(self.inner.generate(prompts, step, partial=self.partial))
            except BaseException as error:  # handed to the consuming step
                future.set_exception(error)

        threading.Thread(target=generate, name=f"rollout-prefetch-{step}", daemon=True).start()
        self._pending = ([prompt_key(p) for p in prompts], future)

    def metrics(self) -> dict[str, float | None]:
        """Extra metrics.jsonl fields of the latest step."""
        metrics: dict[str, float | None] = {
            "async/prefetch_hits": self.stats.prefetch_hits,
            "async/prefetch_misses": self.stats.prefetch_misses,
            "async/stale_dropped": self.stats.stale_dropped,
            "async/staleness": self.stats.staleness,
            "async/max_staleness_seen": self.stats.max_staleness_seen,
            "async/discarded": self.stats.discarded,
            "trainer_version": self.trainer_version,
        }
        if self.partial:
            tokens = self.stats.tokens
            metrics["async/partial_completions"] = self.stats.partial_completions
            metrics["async/masked_tokens"] = self.stats.masked_tokens
            metrics["async/regenerated"] = self.stats.regenerated
            metrics["async/max_token_staleness"] = self.stats.max_token_staleness
            # The latest trained batch (a synchronous step: every token of lag 0, nothing masked).
            fractions = tokens.lag_fractions() if tokens is not None else {0: 1.0}
            for lag in range(self.max_staleness + 2):
                metrics[f"async/tokens_lag{lag}"] = fractions.get(lag, 0.0)
            metrics["async/max_trained_token_lag"] = tokens.max_trained_lag if tokens is not None else 0
        if self.cores is not None:
            metrics["async/cores_borrowed"] = self.cores.borrows
        return metrics


def _token_versions(completions: list[Any]) -> list[list[int]]:
    """Each completion's per-token versions (a server without them: every token of ``policy_version``)."""
    out = []
    for index, c in enumerate(completions):
        versions = [int(v) for v in c.token_versions] or [int(c.policy_version)] * len(c.token_ids)
        if len(versions) != len(c.token_ids):
            raise RuntimeError(
                f"completion {index} has {len(c.token_ids)} tokens but {len(versions)} token versions"
            )
        out.append(versions)
    return out
