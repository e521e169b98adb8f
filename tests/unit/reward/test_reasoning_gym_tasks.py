"""The reasoning-gym task policy both services apply: withheld tasks, bounds of configs and metadata."""

from __future__ import annotations

import json

import pytest
import reasoning_gym
from reasoning_gym.factory import CURRICULA, DATASETS

from reward_service.checkers.reasoning_gym_tasks import (
    METADATA_SLACK,
    BoundsError,
    check_config,
    check_entry_metadata,
    offered_tasks,
    value_bounds,
    withheld_reason,
)


def test_withheld_tasks_say_why_and_the_rest_are_offered():
    assert "evaluates text" in withheld_reason("countdown")
    assert "other tasks" in withheld_reason("composite")
    assert withheld_reason("leg_counting") is None
    offered = offered_tasks()
    assert offered == sorted(offered)
    assert set(offered) == {t for t in DATASETS if withheld_reason(t) is None}
    assert len(offered) == 86  # of reasoning-gym 0.1.25's 106


def test_bounds_are_the_largest_default_or_curriculum_level():
    bounds = value_bounds("tower_of_hanoi")
    # HanoiCurriculum's num_disks levels end at 15 (default max_disks 7), num_pegs at 5 (default 4).
    assert bounds["max_disks"] == bounds["min_disks"] == bounds["num_disks"] == 15
    assert bounds["max_pegs"] == bounds["num_pegs"] == 5
    assert "size" not in bounds and "seed" not in bounds


@pytest.mark.parametrize("task", sorted(set(offered_tasks()) & set(CURRICULA)))
def test_every_curriculum_level_passes_the_config_bounds(task):
    """The hardest configuration a task's own curriculum makes is within bounds, so no documented setting is
    refused."""
    curriculum = CURRICULA[task]()
    curriculum.set_global_level(1000)  # each attribute's last level
    config = vars(curriculum.generate_configuration())
    plain = (bool, int, float, str, list, tuple)
    check_config(
        task, {k: v for k, v in config.items() if k not in ("size", "seed") and isinstance(v, plain)}
    )


@pytest.mark.slow
def test_generated_entries_pass_the_metadata_bounds():
    """No entry reasoning-gym generates with a task's default config is refused (about 10 s for all tasks)."""
    for task in offered_tasks():
        for entry in reasoning_gym.create_dataset(task, size=3, seed=1):
            check_entry_metadata(task, json.loads(json.dumps(entry["metadata"], default=str)))


@pytest.mark.parametrize(
    ("config", "field", "fragment"),
    [
        ({"max_disks": 16}, "max_disks", "config.max_disks is 16, beyond ±15"),
        ({"min_disks": -16}, "min_disks", "config.min_disks is -16"),
        ({"max_disks": float("inf")}, "max_disks", "config.max_disks is inf"),
        ({"visualize": 3}, "visualize", "config.visualize takes no number"),
        ({"max_disks": [[[[[[1]]]]]]}, "max_disks", "nests lists deeper than 4"),
        ({"seed": 3}, "seed", "config.seed is set by the data source"),
    ],
)
def test_config_values_past_their_bounds_are_named(config, field, fragment):
    with pytest.raises(BoundsError, match=fragment) as refused:
        check_config("tower_of_hanoi", config)
    assert refused.value.field == field


def test_metadata_numbers_get_slack_but_not_orders_of_magnitude():
    check_entry_metadata("tower_of_hanoi", {"num_disks": 15 * METADATA_SLACK, "solution_length": 10**9})
    check_entry_metadata("tower_of_hanoi", {"num_disks": True, "num_pegs": "many"})  # left to the task
    for bad in (15 * METADATA_SLACK + 1, -(10**9), float("nan")):
        with pytest.raises(BoundsError, match=r"metadata\.num_disks is"):
            check_entry_metadata("tower_of_hanoi", {"num_disks": bad})
