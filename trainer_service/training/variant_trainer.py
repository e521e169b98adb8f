"""`trl.GRPOTrainer` subclasses that train with one of the loss variants (`VariantLossMixin` + a TRL base),
with optional DAPO dynamic sampling (`DynamicSamplingMixin`, constructor argument ``dynamic_sampling``),
FSDP2 on CPU processes (`CpuFsdpMixin`) and the collaborators it binds itself to once built
(`TrainerBindingMixin`, constructor argument ``binders``)."""

from __future__ import annotations

import functools

from trl import GRPOTrainer

from trainer_service.config.variants import VARIANTS, normalize_variant
from trainer_service.training.cpu_fsdp import CpuFsdpMixin
from trainer_service.training.dynamic_sampling import DynamicSamplingMixin
from trainer_service.training.trainer_binding import TrainerBindingMixin
from trainer_service.training.variant_loss import VariantLossMixin


@functools.cache
def _variant_class(name: str, base: type) -> type:
    cls = type(
        f"{base.__name__}_{name}",
        # Dynamic sampling below the variant: the variant's per-batch work sees the merged batch. Binding
        # first: collaborators see the trainer only once every mixin has checked and set it up.
        (TrainerBindingMixin, VariantLossMixin, DynamicSamplingMixin, CpuFsdpMixin, base),
        {
            "grpo_variant": name,
            "__doc__": f"{base.__name__} training with loss variant {name!r}: {VARIANTS[name]}.",
            "__module__": __name__,
        },
    )
    return cls


def make_variant_trainer(variant: str, base: type = GRPOTrainer) -> type:
    """The cached `base` subclass that trains with `variant` (case-insensitive; "standard" = "dapo").

    Same constructor as `base`; its `args` must agree with the variant (use `grpo_config_overrides`), else
    `ConfigError` naming the GRPOConfig field.
    """
    if not (isinstance(base, type) and issubclass(base, GRPOTrainer)):
        raise TypeError(f"base must be a trl.GRPOTrainer subclass, got {base!r}")
    # A class is hashable; mypy reads type[X] as not Hashable, the cache's argument type (python/mypy#11470).
    return _variant_class(normalize_variant(variant), base)  # type: ignore[arg-type]
