"""TRL reward functions of a run: one reward-service Score call per generation batch for all reward terms.

TRL calls every reward function in turn on the same batch (the same ``completions`` list) and sums the
results with ``reward_weights``. :class:`BatchScorer` sends the first of those calls as one ScoreRequest
listing every term of the run; the reward service returns each term as a component of every sample, and the
functions of the other terms read their component from that answer. Each term is sent with weight 1: TRL
applies ``reward_weights`` itself (NaN-aware) and logs every term as ``rewards/<name>/mean``, exactly as
with one call per term.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from reward_service.client import ComponentResult, RewardClient, RewardRequest, trl_samples
from trainer_service.config.reward_terms import RewardTerm


def term_params(term: RewardTerm, max_completion_length: int | None) -> dict[str, Any]:
    """The params sent for ``term``. ``soft_overlong`` without ``max_completion_len`` gets the run's
    ``max_completion_length`` as L_max (the length TRL cuts completions at), and then, unless set,
    ``soft_punish_cache`` = L_max // 4 (the service defaults' proportion, 4096 of 16384), so that a short run
    is not penalised for every completion by the default L_c of 4096."""
    params = dict(term.params)
    if term.name == "soft_overlong" and max_completion_length and "max_completion_len" not in params:
        params["max_completion_len"] = max_completion_length
        params.setdefault("soft_punish_cache", max_completion_length // 4)
    return params


class BatchScorer:
    """Scores a generation batch with all of ``terms`` in one Score call and hands each term's values to its
    TRL reward function (:meth:`reward_funcs`). ``max_completion_length``: the run's, see ``term_params``."""

    def __init__(
        self,
        client: RewardClient,
        terms: Sequence[RewardTerm],
        max_completion_length: int | None = None,
        *,
        observe: Callable[[Sequence[Any], dict[str, list[ComponentResult]]], None] | None = None,
    ):
        if not terms:
            raise ValueError("a run needs at least one reward term")
        self._client = client
        self._requests = [
            RewardRequest(name=term.name, weight=1.0, params=term_params(term, max_completion_length))
            for term in terms
        ]
        # The batch scored last (TRL's completions list, kept so its identity cannot be reused) and, per
        # term, each sample's component.
        self._scored: tuple[Sequence[Any], dict[str, list[ComponentResult]]] | None = None
        # Called with every scored batch's prompts and components (the curriculum's pass counts).
        self._observe = observe

    def reward_funcs(self) -> list[TermReward]:
        """One TRL reward function per term, in the terms' order (the order of ``reward_weights``)."""
        return [TermReward(self, request.name) for request in self._requests]

    def components(
        self,
        prompts: Sequence[Any] | None,
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None,
        columns: dict[str, Any],
    ) -> dict[str, list[ComponentResult]]:
        """Every term's component of every sample of the batch; the Score call happens once per batch."""
        if self._scored is not None and self._scored[0] is completions:
            return self._scored[1]
        samples = trl_samples(prompts, completions, completion_ids, columns)
        results = self._client.score(samples, self._requests)
        by_term: dict[str, list[ComponentResult]] = {request.name: [] for request in self._requests}
        for index, result in enumerate(results):
            found = dict(result.components)
            for name, values in by_term.items():
                if name not in found:
                    raise RuntimeError(f"the reward service sent no {name!r} component for sample {index}")
                values.append(found[name])
        self._scored = (completions, by_term)
        if self._observe is not None and prompts is not None:
            self._observe(prompts, by_term)
        return by_term


class TermReward:
    """TRL's reward-function contract for one term, ``f(prompts, completions, completion_ids=None,
    **columns) -> list[float | None]``: None where the service gave the term no value (TRL turns it into NaN).
    Its ``__name__`` is the term's name. Per-sample errors are logged as the ``<name>_error`` column of TRL's
    completions table."""

    def __init__(self, scorer: BatchScorer, name: str):
        self._scorer = scorer
        self.__name__ = name

    def __call__(
        self,
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] = (),
        completion_ids: Sequence[Sequence[int]] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        if not completions:
            return []
        components = self._scorer.components(prompts, completions, completion_ids, columns)[self.__name__]
        errors = [component.error for component in components]
        log_extra = columns.get("log_extra")
        if callable(log_extra) and any(errors):
            log_extra(f"{self.__name__}_error", errors)
        return [component.value for component in components]
