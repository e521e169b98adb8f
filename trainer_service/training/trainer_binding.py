"""The trainer hands itself to the collaborators that act on it, once, at the end of its construction.

Weight sync, the held-out evaluator, the guards and async rollout's prefetch act on the trainer (its
accelerator, model, optimizer, train dataset), and the trainer is built from them (callbacks,
``rollout_func``): one side of that cycle must learn of the other after it exists. Here it is the trainer, in
one place, once it is complete, so no caller patches a ``trainer`` attribute in afterwards and none can
forget one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Binder = Callable[[Any], None]


class TrainerBindingMixin:
    """``Trainer(..., binders=[f, g])`` calls ``f(trainer)`` then ``g(trainer)`` once the whole trainer is
    built (first in the MRO, so after every other mixin's ``__init__``)."""

    def __init__(self, *args: Any, binders: Sequence[Binder] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for bind in binders:
            bind(self)
