"""DAPO's dynamic sampling: groups whose rewards have no spread are replaced by groups of new prompts.

A group whose G rewards are all equal (std = 0, TRL's ``frac_reward_zero_std``) has advantage 0 for every
completion: it gives no policy gradient, yet it takes a slot of the batch (and its tokens count in the
token-mean normalisers). DAPO (Yu et al. 2025, arXiv:2503.14476, §3.2) over-samples and keeps only groups
with spread; verl calls it ``algorithm.filter_groups`` (``metric: acc``, ``max_num_gen_batches``), TRL has no
equivalent (huggingface/trl#3708).

Here (``training.sampling.dynamic_sampling: {filter: zero_std, max_gen_batches: N}``), for one generation
batch of ``B`` groups:

1. TRL generates and scores the batch as usual (:meth:`DynamicSamplingMixin._generate_and_score_completions`
   wraps TRL's own, so rollout, rewards and advantages are TRL's);
2. groups with zero reward spread are dropped; while fewer than ``B`` groups are kept and fewer than
   ``max_gen_batches`` generation batches were used, another batch of ``B`` new prompts is generated and
   scored the same way (prompts drawn from the train split without replacement, seeded by the run's seed,
   the optimizer step and the round, so a resumed run draws the same ones);
3. the first ``B`` kept groups form the batch. If the budget is spent first, the batch is filled up with
   dropped groups, unchanged (as a run without dynamic sampling would train on them: advantage 0), and
   ``dynamic_sampling/padded_groups`` counts them. verl raises instead ("Generated too many"); a filled-up
   batch keeps a long run going through a stretch of too-easy or too-hard prompts.

Advantages are computed by TRL per generation batch: with ``scale_rewards: batch`` the std is that of the
batch the group was generated in (the dropped groups included), not of the final batch.

Metrics (train, per step): ``dynamic_sampling/filtered_groups`` (groups dropped, over all rounds),
``dynamic_sampling/generation_batches`` (rounds used, 1..max_gen_batches), ``dynamic_sampling/padded_groups``.
TRL's own reward metrics (``reward``, ``frac_reward_zero_std``, ...) are logged once per round, so they
describe everything generated, filtered or not.

Async rollout: the first round is the prefetched batch; replacement rounds generate synchronously through
the rollout's ``direct()`` context, which leaves the prefetch of the next step and its sampler lookahead
alone. Single-process runs only (the number of rounds would differ between ranks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from trl.trainer.utils import nanstd

from grpo_runtime.image_tensors import concat_image_rows
from trainer_service.training.trainer_host import GRPOTrainerHost

# Batch keys whose rows are left-padded (TRL pads prompts on the left, completions on the right).
_LEFT_PADDED = frozenset({"prompt_ids", "prompt_mask"})
# Padding of the right-padded keys beyond a row's completion (never read: completion_mask is 0 there).
_PAD_VALUES = {"tool_mask": 1}
_ID_KEYS = frozenset({"prompt_ids", "completion_ids"})
# Multimodal batch keys: one row per image (a LLaVA-style processor's), merged by ``num_images``, or one row
# per completion with its pictures along dim 1 (Idefics3's 5-d ``pixel_values`` and its mask; see
# ``grpo_runtime.image_tensors``), merged by completion.
_PER_IMAGE_KEYS = frozenset({"pixel_values", "image_sizes"})
_PER_COMPLETION_IMAGE_KEYS = frozenset({"pixel_attention_mask"})
_IMAGE_KEYS = _PER_IMAGE_KEYS | _PER_COMPLETION_IMAGE_KEYS


@dataclass(frozen=True)
class DynamicSamplingSettings:
    """``training.sampling.dynamic_sampling`` as the trainer uses it: ``max_gen_batches`` rounds at most per
    step."""

    max_gen_batches: int

    def __post_init__(self) -> None:
        if self.max_gen_batches < 1:
            raise ValueError("max_gen_batches must be >= 1")


def zero_spread_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which groups have no reward spread, as TRL's ``frac_reward_zero_std`` counts them.

    ``rewards``: (B·G,) weighted reward sums, prompt-major, NaN for unscorable completions. Returns (B,) bool:
    True where the group's std is ≈ 0 (``torch.isclose``), or undefined (every completion unscorable; TRL
    gives those advantage 0 as well).
    """
    std = nanstd(rewards.reshape(-1, group_size), dim=1)
    return torch.isclose(std, torch.zeros_like(std)) | torch.isnan(std)


def pick_groups(spread_free: Sequence[torch.Tensor], wanted: int) -> tuple[list[tuple[int, int]], int]:
    """Which ``(round, group)`` pairs make the batch, and how many of them are padding.

    ``spread_free[r]``: the zero-spread flags of round r's groups. The first ``wanted`` groups with spread, in
    round order; if there are fewer, the batch is filled up with zero-spread groups in the same order.
    """
    informative = [
        (r, g) for r, flags in enumerate(spread_free) for g, flat in enumerate(flags.tolist()) if not flat
    ]
    picks = informative[:wanted]
    padded = wanted - len(picks)
    if padded:
        flat_groups = [
            (r, g) for r, flags in enumerate(spread_free) for g, flat in enumerate(flags.tolist()) if flat
        ]
        picks += flat_groups[:padded]
    if len(picks) != wanted:
        raise ValueError(f"{wanted} groups wanted but the rounds hold only {len(picks)}")
    return picks, padded


def _pad_to(tensor: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    missing = width - tensor.size(1)
    if missing == 0:
        return tensor
    pad = torch.full((tensor.size(0), missing), value, dtype=tensor.dtype, device=tensor.device)
    return torch.cat([pad, tensor] if left else [tensor, pad], dim=1)


def merge_groups(
    batches: Sequence[dict[str, Any]], picks: Sequence[tuple[int, int]], group_size: int, pad_token_id: int
) -> dict[str, Any]:
    """One batch of TRL's ``_generate_and_score_completions`` layout from the groups ``picks`` of ``batches``.

    Per-sample tensors (dim 0 = completions, prompt-major groups of ``group_size``) are gathered group by
    group and padded to a common width (prompts on the left, completions on the right);
    ``num_items_in_batch`` is recounted as the active loss tokens (``completion_mask`` × ``tool_mask``) of
    the merged batch; a round without ``tool_mask`` counts as all ones beside rounds with one. A vision
    batch's images follow their completions (``_merge_images``); a key this function does not know how to
    merge is an error.
    """
    keys = list(batches[0])
    images = _merge_images(batches, picks, group_size) if "num_images" in keys else {}
    merged: dict[str, Any] = {}  # in the batch's key order: TRL's split_tensor_dict sizes by the first key
    for key in keys:
        if key in images:
            merged[key] = images[key]
            continue
        if key == "num_items_in_batch":
            continue
        values = [batch.get(key) for batch in batches]
        if key == "tool_mask" and any(value is not None for value in values):
            # TRL reads a missing tool_mask as "every completion token trains"; a round that masked tokens
            # (tool results, stale tokens of a partial rollout) can meet one that masked none.
            values = [
                torch.ones_like(batch["completion_mask"]) if value is None else value
                for batch, value in zip(batches, values, strict=True)
            ]
        if any(value is None for value in values):
            if all(value is None for value in values):
                merged[key] = None
                continue
            raise ValueError(f"batch key {key!r} is present in some generation rounds only")
        tensors = [value for value in values if isinstance(value, torch.Tensor) and value.ndim in (1, 2)]
        if len(tensors) < len(values):
            raise ValueError(f"dynamic sampling cannot merge batch key {key!r} (not a per-sample tensor)")
        rows = [tensors[r][g * group_size : (g + 1) * group_size] for r, g in picks]
        if rows[0].ndim == 2:
            width = max(row.size(1) for row in rows)
            fill = pad_token_id if key in _ID_KEYS else _PAD_VALUES.get(key, 0)
            rows = [_pad_to(row, width, fill, key in _LEFT_PADDED) for row in rows]
        merged[key] = torch.cat(rows, dim=0)
    mask = merged["completion_mask"]
    if merged.get("tool_mask") is not None:
        mask = mask * merged["tool_mask"]
    merged["num_items_in_batch"] = mask.sum()
    return merged


def _merge_images(
    batches: Sequence[dict[str, Any]], picks: Sequence[tuple[int, int]], group_size: int
) -> dict[str, Any]:
    """The picked groups' images: ``num_images`` (one count per completion) and the image tensors, laid out
    one row per image (``pixel_values`` of shape (images, channels, height, width), ``image_sizes``), whose
    rows belong to the completions in order, or one row per completion (``pixel_attention_mask``, a 5-d
    ``pixel_values``: Idefics3's pictures, or their tiles, along dim 1), zero-filled along dim 1 to the most
    (``concat_image_rows``). An architecture whose pixel rows are a batch's flattened patches or carry tile
    counts (``image_grid_thw``, ``num_tiles``) is not merged: its keys stay unknown and refused."""
    keys = _IMAGE_KEYS & set(batches[0])
    merged: dict[str, Any] = {"num_images": [], **{key: [] for key in keys}}
    for r, g in picks:
        counts = batches[r]["num_images"]
        completions = slice(g * group_size, (g + 1) * group_size)
        images = slice(sum(counts[: completions.start]), sum(counts[: completions.stop]))
        merged["num_images"] += counts[completions]
        for key in keys:
            tensor = batches[r][key]
            if _per_completion(key, tensor):
                merged[key].append(tensor[completions])
            elif tensor.size(0) != sum(counts):
                raise ValueError(f"dynamic sampling cannot merge batch key {key!r} (not one row per image)")
            else:
                merged[key].append(tensor[images])
    return {key: value if key == "num_images" else concat_image_rows(value) for key, value in merged.items()}


def _per_completion(key: str, tensor: torch.Tensor) -> bool:
    return key in _PER_COMPLETION_IMAGE_KEYS or (key == "pixel_values" and tensor.ndim == 5)


def draw_prompts(dataset_size: int, count: int, seed: int) -> list[int]:
    """``count`` dataset indices for a replacement round, without replacement (cycling when ``count`` exceeds
    the dataset), from a generator seeded with ``seed``."""
    order = torch.randperm(dataset_size, generator=torch.Generator().manual_seed(seed)).tolist()
    return [order[i % dataset_size] for i in range(count)]


class DynamicSamplingMixin(GRPOTrainerHost):
    """``_generate_and_score_completions`` with DAPO's dynamic sampling (module docstring), for a
    ``trl.GRPOTrainer`` subclass: ``GRPOTrainer(..., dynamic_sampling=DynamicSamplingSettings(...) | None)``.

    With ``None`` it only records which groups of each batch have no reward spread (``zero_spread``, used by
    GPG's rescaling factor). Sits below the loss-variant mixin in the MRO, so the variant's per-batch work
    (importance-sampling correction, GPG's α) sees the merged batch.
    """

    def __init__(self, *args: Any, dynamic_sampling: DynamicSamplingSettings | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if dynamic_sampling is not None and self.accelerator.num_processes > 1:
            raise ValueError("training.sampling.dynamic_sampling supports single-process runs only")
        self.dynamic_sampling = dynamic_sampling
        # (B,) zero-spread flags of the groups of the latest batch (all processes), set per generation.
        self.zero_spread: torch.Tensor | None = None
        self._round_rewards: torch.Tensor | None = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # The weighted sum R TRL normalises (sum_then_normalize), NaN where every reward function gave None.
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        self._round_rewards = rewards
        return rewards_per_func

    def _scored_round(
        self, inputs: list[dict[str, Any]], group_size: int
    ) -> tuple[dict[str, Any], torch.Tensor]:
        output = super()._generate_and_score_completions(inputs)
        assert self._round_rewards is not None
        return output, zero_spread_groups(self._round_rewards, group_size)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        training = self.model.training
        group_size = self.num_generations if training else self.num_generations_eval
        output, flags = self._scored_round(inputs, group_size)
        settings = self.dynamic_sampling
        if settings is None or not training:
            self.zero_spread = flags
            return output
        wanted = len(inputs) // group_size
        rounds, spread_free = [output], [flags]
        direct = getattr(self.rollout_func, "direct", None)
        while sum(int((~f).sum()) for f in spread_free) < wanted and len(rounds) < settings.max_gen_batches:
            replacement = self._replacement_inputs(wanted, group_size, len(rounds))
            with direct() if direct is not None else contextlib.nullcontext():
                output, flags = self._scored_round(replacement, group_size)
            rounds.append(output)
            spread_free.append(flags)
        picks, padded = pick_groups(spread_free, wanted)
        pad_token_id = getattr(self.processing_class, "pad_token_id", None)
        if pad_token_id is None:
            pad_token_id = self.processing_class.tokenizer.pad_token_id
        if len(rounds) == 1 and not padded:
            merged = rounds[0]  # every group has spread: the batch as TRL made it
        else:
            merged = merge_groups(rounds, picks, group_size, pad_token_id)
        self.zero_spread = torch.stack([spread_free[r][g] for r, g in picks])
        metrics = self._metrics["train"]
        metrics["dynamic_sampling/filtered_groups"].append(float(sum(int(f.sum()) for f in spread_free)))
        metrics["dynamic_sampling/generation_batches"].append(float(len(rounds)))
        metrics["dynamic_sampling/padded_groups"].append(float(padded))
        return merged

    def _replacement_inputs(self, groups: int, group_size: int, round_index: int) -> list[dict[str, Any]]:
        """TRL-style inputs for one replacement round: ``groups`` new train rows, each repeated G times."""
        dataset = self.train_dataset
        step = int(self.state.global_step)
        seed = self.args.seed + 1_000_003 * (step + 1) + 7_919 * round_index
        indices = draw_prompts(len(dataset), groups, seed)
        return [dict(dataset[index]) for index in indices for _ in range(group_size)]
