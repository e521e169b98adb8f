"""Held-out evaluation metrics (pass@k, avg@n, greedy accuracy), their config keys and the eval panel."""

from __future__ import annotations

import json
import math
from itertools import combinations

import pytest
from PIL import Image

from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.training.callbacks import plot_reward_curve
from trainer_service.training.eval_metrics import pass_at_k, report_ks, summarize
from trainer_service.training.evaluation import greedy_accuracy_change


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_fraction_of_k_subsets_holding_a_pass(n):
    """The estimator equals its definition: over every k-subset of n samples with c passes, the share that
    contains at least one pass (and 1 − C(n−c, k)/C(n, k) by math.comb)."""
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(combinations(samples, k))
            expected = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
            assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_stays_finite_where_the_binomials_overflow_floats():
    # C(2000, 1000) ≈ 2e600 overflows a float; the product form does not.
    value = pass_at_k(2000, 3, 1000)
    assert value == pytest.approx(1 - 0.5**3, abs=1e-3)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_report_ks():
    assert report_ks(1) == [1]
    assert report_ks(4) == [1, 2, 4]
    assert report_ks(6) == [1, 2, 4, 6]


def test_summarize_per_term_with_the_primary_term_unprefixed():
    greedy = {"accuracy": [1.0, 0.0, None], "format": [0.2, 0.2, 0.2]}
    sampled = {
        "accuracy": [[1.0, 0.0], [0.0, 0.0], [1.0, None]],
        "format": [[0.2, 0.2], [0.2, 0.0], [0.2, 0.2]],
    }
    metrics = summarize(greedy, sampled, threshold=1.0)
    assert metrics["accuracy_greedy/accuracy"] == pytest.approx(1 / 3)
    # avg@2 leaves the missing value out; pass@1 counts it as a failure.
    assert metrics["avg@2/accuracy"] == pytest.approx(2 / 5)
    assert metrics["pass@1/accuracy"] == pytest.approx((0.5 + 0 + 0.5) / 3)
    assert metrics["pass@2/accuracy"] == pytest.approx(2 / 3)
    assert metrics["accuracy_greedy/format"] == 0.0  # 0.2 < threshold 1
    assert metrics["avg@2/format"] == pytest.approx(1.0 / 6)
    assert {key: metrics[key] for key in ("accuracy_greedy", "avg@2", "pass@1", "pass@2")} == {
        key: metrics[f"{key}/accuracy"] for key in ("accuracy_greedy", "avg@2", "pass@1", "pass@2")
    }
    assert summarize(greedy, sampled, threshold=0.2)["accuracy_greedy/format"] == 1.0


MINIMAL = {"base": "models/policy", "data": {"train": "train.jsonl"}}


@pytest.mark.parametrize(
    ("source", "key", "fragment"),
    [
        (
            {**MINIMAL, "training": {"evaluation": {"eval_steps": 10}}},
            "training.evaluation.eval_steps",
            "data.eval",
        ),
        (
            {**MINIMAL, "training": {"evaluation": {"num_generations_eval": 4}}},
            "training.evaluation.num_generations_eval",
            "eval_steps",
        ),
        (
            {
                **MINIMAL,
                "data": {"train": "t", "eval": "e"},
                "training": {"evaluation": {"eval_steps": 5, "num_generations_eval": 0}},
            },
            "training.evaluation.num_generations_eval",
            "greater than or equal to 1",
        ),
    ],
)
def test_eval_keys_refused_in_wrong_combinations(source, key, fragment):
    with pytest.raises(ConfigError) as caught:
        parse_config(source)
    assert caught.value.key == key and fragment in str(caught.value)


def test_eval_keys_accepted_with_an_eval_split():
    config = parse_config(
        {
            **MINIMAL,
            "data": {"train": "t", "eval": "e"},
            "training": {"evaluation": {"eval_steps": 5}},
        }
    )
    assert (
        config.training.evaluation.num_generations_eval is None
        and config.training.evaluation.pass_threshold == 1.0
    )


def test_reward_curve_gains_the_held_out_panel(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "reward": s / 10}) + "\n" for s in range(1, 5)))
    rows = [
        {"step": 0, "accuracy_greedy": 0.3, "pass@1": 0.2},
        {"step": 4, "accuracy_greedy": 0.5, "pass@1": 0.4},
    ]
    evals = tmp_path / "eval_metrics.jsonl"
    evals.write_text("".join(json.dumps(row) + "\n" for row in rows))
    alone = plot_reward_curve(metrics, tmp_path / "alone.png")
    both = plot_reward_curve(metrics, tmp_path / "both.png", evals)
    assert Image.open(both).size[0] > Image.open(alone).size[0]  # a second panel beside the reward curve
    assert greedy_accuracy_change(rows) == "held-out greedy accuracy 0.300 (step 0) → 0.500 (step 4)"
    assert greedy_accuracy_change(rows[:1]) is None
