"""A `trl.GRPOTrainer` whose train sampler passes through a wrapper the caller gives.

Async rollout needs to know the next batch's prompts before TRL asks for them: its wrapper records every index
the sampler issues (:class:`trainer_service.rollout.async_rollout.RecordingSampler`). The sampler comes from
TRL's ``_get_train_sampler``, which ``get_train_dataloader`` calls at ``train()`` time; overriding it here
keeps that hook on the trainer class instead of patching a trainer instance from outside.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import Sampler
from trl import GRPOTrainer


def chain(wrappers: Sequence[Callable[[Sampler], Sampler]]) -> Callable[[Sampler], Sampler]:
    """One ``wrap_sampler`` applying ``wrappers`` in order (the first wraps TRL's sampler)."""

    def wrap(sampler: Sampler) -> Sampler:
        for wrapper in wrappers:
            sampler = wrapper(sampler)
        return sampler

    return wrap


class WrappedSamplerTrainer(GRPOTrainer):
    """``GRPOTrainer(..., wrap_sampler=f)``: trains on ``f(sampler)`` instead of TRL's train sampler."""

    def __init__(self, *args: Any, wrap_sampler: Callable[[Sampler], Sampler], **kwargs: Any) -> None:
        self.wrap_sampler = wrap_sampler
        super().__init__(*args, **kwargs)

    def _get_train_sampler(self, *args: Any, **kwargs: Any) -> Sampler:
        return self.wrap_sampler(super()._get_train_sampler(*args, **kwargs))
