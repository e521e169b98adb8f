"""The trainer hands itself to its collaborators once, after every mixin's construction."""

from __future__ import annotations

from typing import Any

import pytest

from trainer_service.training.trainer_binding import TrainerBindingMixin
from trainer_service.training.variant_trainer import make_variant_trainer


class Checked:
    """Stands for a mixin that checks its arguments after its base is built (as VariantLossMixin does)."""

    def __init__(self, value: int) -> None:
        if value < 0:
            raise ValueError("value must be >= 0")
        self.value = value


class Bound(TrainerBindingMixin, Checked):
    pass


def test_binders_run_in_order_on_the_complete_object():
    seen: list[Any] = []
    built = Bound(3, binders=[seen.append, lambda obj: seen.append(obj.value)])
    assert seen == [built, 3]


def test_no_collaborator_sees_an_object_whose_construction_failed():
    seen: list[Any] = []
    with pytest.raises(ValueError, match="value must be >= 0"):
        Bound(-1, binders=[seen.append])
    assert seen == []


def test_every_variant_trainer_binds_after_its_other_mixins():
    mro = make_variant_trainer("dapo").__mro__
    assert mro[1] is TrainerBindingMixin
