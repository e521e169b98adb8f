"""DAPO dynamic sampling and GPG's batch-level α: pure helpers by hand, then a real tiny GRPOTrainer whose
rollout_func is a real (service-free) sampler, showing the batch it trains on changes."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import GRPOConfig

from tests.unit.trainer.fixtures import offset_rollout
from trainer_service.config.variants import grpo_config_overrides
from trainer_service.training.dynamic_sampling import (
    DynamicSamplingSettings,
    draw_prompts,
    merge_groups,
    pick_groups,
    zero_spread_groups,
)
from trainer_service.training.variant_trainer import make_variant_trainer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
G = 4


def test_zero_spread_groups_match_trl_zero_std():
    nan = float("nan")
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.1, 0.1, 0.1, nan, nan, nan, nan, nan])
    assert zero_spread_groups(rewards, G).tolist() == [True, False, True, True]


def test_pick_groups_takes_groups_with_spread_first_then_pads():
    rounds = [torch.tensor([True, False]), torch.tensor([True, True]), torch.tensor([False, False])]
    assert pick_groups(rounds, 2) == ([(0, 1), (2, 0)], 0)
    assert pick_groups(rounds[:2], 2) == ([(0, 1), (0, 0)], 1)  # budget spent: filled with a dropped group


def _round(prompt_width: int, completion_width: int, advantages: list[float]) -> dict[str, Any]:
    rows = len(advantages)
    prompt_mask = torch.ones(rows, prompt_width, dtype=torch.long)
    prompt_mask[:, 0] = 0  # left padding
    completion_mask = torch.ones(rows, completion_width, dtype=torch.long)
    completion_mask[:, -1] = 0  # right padding
    return {
        "prompt_ids": torch.full((rows, prompt_width), 5),
        "prompt_mask": prompt_mask,
        "completion_ids": torch.full((rows, completion_width), 6),
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages),
        "num_items_in_batch": completion_mask.sum(),
        "sampling_per_token_logps": torch.full((rows, completion_width), -1.0),
        "ref_per_token_logps": None,
    }


def test_merge_groups_pads_prompts_left_completions_right_and_recounts_tokens():
    first = _round(3, 4, [0.0] * G + [1.0, -1.0, 0.5, -0.5])
    second = _round(5, 2, [2.0, -2.0, 0.0, 0.0])
    merged = merge_groups([first, second], [(0, 1), (1, 0)], G, pad_token_id=0)
    assert merged["advantages"].tolist() == [1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.0, 0.0]
    assert merged["prompt_ids"].shape == (8, 5) and merged["completion_ids"].shape == (8, 4)
    # first round's prompts gain two pad columns on the left, second's completions two on the right
    assert merged["prompt_mask"][0].tolist() == [0, 0, 0, 1, 1]
    assert merged["completion_mask"][G].tolist() == [1, 0, 0, 0]
    assert merged["prompt_ids"][0, :2].tolist() == [0, 0]
    assert int(merged["num_items_in_batch"]) == G * 3 + G * 1
    assert merged["ref_per_token_logps"] is None


def test_merge_groups_reads_a_missing_tool_mask_as_all_ones_beside_a_round_with_one():
    first = _round(3, 4, [0.0] * G + [1.0, -1.0, 0.5, -0.5])
    first["tool_mask"] = torch.ones_like(first["completion_mask"])
    first["tool_mask"][:, 0] = 0  # e.g. a stale token of a partial rollout
    second = _round(5, 2, [2.0, -2.0, 0.0, 0.0])
    merged = merge_groups([first, second], [(0, 1), (1, 0)], G, pad_token_id=0)
    assert merged["tool_mask"][0].tolist() == [0, 1, 1, 1]
    assert merged["tool_mask"][G].tolist() == [1, 1, 1, 1]  # all ones, padded with ones
    assert int(merged["num_items_in_batch"]) == G * 2 + G * 1


def test_merge_groups_takes_each_picked_completions_pictures():
    """A vision batch: one pixel row per image, ``num_images`` per completion; the pictures go with their
    completions (here one each, numbered by round and completion)."""
    rounds = [_round(3, 4, [0.0] * 2 * G), _round(3, 4, [1.0] * G)]
    for r, batch in enumerate(rounds):
        completions = batch["advantages"].size(0)
        batch["num_images"] = [1] * completions
        batch["pixel_values"] = (
            torch.arange(completions).float().view(-1, 1, 1, 1).expand(-1, 3, 2, 2) + 100 * r
        )
    merged = merge_groups(rounds, [(0, 1), (1, 0)], G, pad_token_id=0)
    assert merged["num_images"] == [1] * 2 * G
    assert merged["pixel_values"][:, 0, 0, 0].tolist() == [4.0, 5.0, 6.0, 7.0, 100.0, 101.0, 102.0, 103.0]
    rounds[0]["pixel_values"] = rounds[0]["pixel_values"][:3]  # rows that are not one per image
    with pytest.raises(ValueError, match="'pixel_values' \\(not one row per image\\)"):
        merge_groups(rounds, [(0, 1), (1, 0)], G, pad_token_id=0)


def test_merge_groups_takes_idefics3_style_rows_of_pictures():
    """Idefics3's processor gives one row per completion with its pictures along dim 1: a round whose
    completions hold two pictures meets one whose hold one, whose missing slot is zero-filled."""
    rounds = [_round(3, 4, [0.0] * 2 * G), _round(3, 4, [1.0] * G)]
    for r, batch in enumerate(rounds):
        completions, pictures = batch["advantages"].size(0), 2 - r
        batch["num_images"] = [pictures] * completions
        rows = torch.arange(completions).float().view(-1, 1, 1, 1, 1) + 100 * r + 1
        batch["pixel_values"] = rows.expand(-1, pictures, 3, 2, 2)
        batch["pixel_attention_mask"] = torch.ones(completions, pictures, 2, 2, dtype=torch.bool)
    merged = merge_groups(rounds, [(0, 1), (1, 0)], G, pad_token_id=0)
    assert merged["num_images"] == [2] * G + [1] * G
    assert merged["pixel_values"].shape == (2 * G, 2, 3, 2, 2)
    assert merged["pixel_values"][:, 0, 0, 0, 0].tolist() == [5.0, 6.0, 7.0, 8.0, 101.0, 102.0, 103.0, 104.0]
    assert merged["pixel_values"][G:, 1].abs().sum() == 0  # the one-picture completions' empty slot
    assert merged["pixel_attention_mask"].sum(dim=(2, 3)).tolist() == [[4, 4]] * G + [[4, 0]] * G


def test_replacement_draws_are_seeded_and_cover_the_split():
    assert draw_prompts(6, 6, seed=3) == draw_prompts(6, 6, seed=3)
    assert sorted(draw_prompts(6, 6, seed=3)) == list(range(6))
    assert len(draw_prompts(3, 7, seed=1)) == 7


def flat_or_varied_reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
    """Prompts saying "flat" always score 1 (no spread), the others score the completion's length."""
    return [1.0 if "flat" in p else float(len(c)) for p, c in zip(prompts, completions, strict=True)]


@pytest.fixture
def trainer_for(policy_dir, tokenizer, tmp_path):
    def _make(prompts: list[str], variant: str = "dapo", max_gen_batches: int | None = 4):
        args = GRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            report_to=[],
            bf16=False,
            gradient_checkpointing=False,
            per_device_train_batch_size=2 * G,
            num_generations=G,
            max_completion_length=5,
            vllm_importance_sampling_correction=False,
            seed=11,
            **grpo_config_overrides(variant),
        )
        settings = None if max_gen_batches is None else DynamicSamplingSettings(max_gen_batches)
        trainer = make_variant_trainer(variant)(
            model=AutoModelForCausalLM.from_pretrained(policy_dir),
            args=args,
            reward_funcs=flat_or_varied_reward,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            processing_class=tokenizer,
            rollout_func=offset_rollout(tokenizer, offset=0.0),
            dynamic_sampling=settings,
        )
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        return trainer

    return _make


def grad_norm(trainer, batch: dict[str, Any]) -> float:
    trainer.model.zero_grad(set_to_none=True)
    trainer.compute_loss(trainer.model, batch).backward()
    return sum(float(p.grad.abs().sum()) for p in trainer.model.parameters() if p.grad is not None)


PROMPTS = ["flat one", "flat two", "varied three", "varied four", "flat five", "varied six"]


def test_zero_spread_groups_are_replaced_and_the_batch_trains(trainer_for):
    inputs = [{"prompt": p} for p in ("flat one", "flat two") for _ in range(G)]

    plain = trainer_for(PROMPTS, max_gen_batches=None)
    batch = plain._generate_and_score_completions([dict(row) for row in inputs])
    assert torch.all(batch["advantages"] == 0)
    assert grad_norm(plain, batch) == 0.0  # without dynamic sampling this step learns nothing

    trainer = trainer_for(PROMPTS)
    batch = trainer._generate_and_score_completions([dict(row) for row in inputs])
    metrics = trainer._metrics["train"]
    assert batch["completion_ids"].size(0) == 2 * G  # the batch is still full
    groups = batch["advantages"].reshape(-1, G)
    assert torch.all((groups != 0).any(dim=1)), "a group without spread was kept"
    assert metrics["dynamic_sampling/filtered_groups"][0] >= 2
    assert 2 <= metrics["dynamic_sampling/generation_batches"][0] <= 4
    assert metrics["dynamic_sampling/padded_groups"] == [0.0]
    active = batch["completion_mask"].sum()
    assert int(batch["num_items_in_batch"]) == int(active)
    assert grad_norm(trainer, batch) > 0.0


def test_spent_budget_fills_the_batch_with_dropped_groups(trainer_for):
    trainer = trainer_for(["flat a", "flat b", "flat c"], max_gen_batches=3)
    batch = trainer._generate_and_score_completions([{"prompt": "flat a"} for _ in range(2 * G)])
    metrics = trainer._metrics["train"]
    assert batch["completion_ids"].size(0) == 2 * G
    assert metrics["dynamic_sampling/generation_batches"] == [3.0]
    assert metrics["dynamic_sampling/filtered_groups"] == [6.0]
    assert metrics["dynamic_sampling/padded_groups"] == [2.0]


def test_gpg_alpha_counts_groups_of_the_generation_batch(trainer_for):
    trainer = trainer_for(PROMPTS, variant="gpg", max_gen_batches=None)
    inputs = [{"prompt": p} for p in ("flat one", "varied three") for _ in range(G)]
    batch = trainer._generate_and_score_completions(inputs)
    assert float(batch["gpg_alpha"]) == pytest.approx(2.0)  # B / (B − M) = 2 / (2 − 1)
    # Every micro-batch of the batch gets the batch's α, whatever groups it holds.
    half = {k: (v[:G] if isinstance(v, torch.Tensor) and v.ndim else v) for k, v in batch.items()}
    loss_half = trainer.compute_loss(trainer.model, half).detach()
    unscaled = trainer.compute_loss(trainer.model, {**half, "gpg_alpha": torch.tensor(1.0)}).detach()
    assert loss_half.item() == pytest.approx(2.0 * unscaled.item(), rel=1e-5)
