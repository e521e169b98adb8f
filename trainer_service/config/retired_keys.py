"""Keys of the flat run config that moved into ``training:``'s blocks (or were retired), and their new place.

A config that still uses one is refused with an error naming the new place: an old key is never ignored and
never accepted as an alias, so one config never means two things. The check reads the raw mapping, before
pydantic validates it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Old dotted key -> where it went (a dotted key, with a note where the meaning changed).
RETIRED_KEYS: dict[str, str] = {
    "data.max_length": "training.generation.max_completion_length (completion tokens; prompts are bounded by "
    "data.max_prompt_length)",
    "training.epochs": "training.num_train_epochs",
    "training.lr": "training.optimizer.learning_rate",
    "training.lr_scheduler_type": "training.optimizer.lr_scheduler_type",
    "training.warmup_ratio": "training.optimizer.warmup_ratio",
    "training.weight_decay": "training.optimizer.weight_decay",
    "training.max_grad_norm": "training.optimizer.max_grad_norm",
    "training.optim": "training.optimizer.optim",
    "training.batch_size": "training.optimizer.per_device_train_batch_size",
    "training.gradient_accumulation_steps": "training.optimizer.gradient_accumulation_steps",
    "training.gradient_checkpointing": "training.optimizer.gradient_checkpointing",
    "training.lora": "training.model.lora",
    "training.quantization": "training.model.quantization",
    "training.deepspeed_config": "training.model.deepspeed",
    "training.fsdp_config": "training.model.fsdp_config",
    "training.device": "training.model.device",
    "training.cpu_threads": "training.model.cpu_threads",
    "training.num_generations": "training.generation.num_generations",
    "training.temperature": "training.generation.temperature",
    "training.top_p": "training.generation.top_p",
    "training.top_k": "training.generation.top_k",
    "training.min_p": "training.generation.min_p",
    "training.max_completion_length": "training.generation.max_completion_length",
    "training.generation_seed": "training.generation.generation_seed",
    "training.grpo_variant": "training.loss.variant",
    "training.grpo_beta": "training.loss.beta",
    "training.grpo_epsilon": "training.loss.epsilon",
    "training.grpo_epsilon_high": "training.loss.epsilon_high",
    "training.grpo_delta": "training.loss.delta",
    "training.variant_params": "training.loss.params",
    "training.scale_rewards": "training.loss.scale_rewards",
    "training.mask_truncated_completions": "training.loss.mask_truncated_completions",
    "training.importance_sampling": "training.loss.importance_sampling",
    "training.reward_fn": "training.rewards.reward_fn",
    "training.reward_params": "training.rewards.params",
    "training.prm_reward": "training.rewards.prm",
    "training.prm_aggregate": "training.rewards.prm_aggregate",
    "training.env_reward_weight": "training.rewards.environment_weight",
    "training.dynamic_sampling": "training.sampling.dynamic_sampling",
    "training.curriculum": "training.sampling.curriculum",
    "training.async_rollout": "training.rollout.async_rollout",
    "training.max_staleness": "training.rollout.max_staleness",
    "training.partial_rollouts": "training.rollout.partial_rollouts",
    "training.weight_sync": "training.rollout.weight_sync",
    "training.weight_transport": "training.rollout.weight_transport",
    "training.weight_bucket_mb": "training.rollout.weight_bucket_mb",
    "training.weight_group_host": "training.rollout.weight_group_host",
    "training.vllm_sleep_mode": "training.rollout.vllm_enable_sleep_mode",
    "training.sleep_level": "training.rollout.sleep_level",
    "training.eval_steps": "training.evaluation.eval_steps",
    "training.num_generations_eval": "training.evaluation.num_generations_eval",
    "training.eval_pass_threshold": "training.evaluation.pass_threshold",
    "training.environment": "training.tools.environment",
    "training.environments": "training.tools.environments",
    "training.max_tool_calling_iterations": "training.tools.max_tool_calling_iterations",
    "training.max_tool_calls": "training.tools.max_tool_calls",
    "training.max_turns": "training.tools.max_tool_calling_iterations (= max_turns − 1)",
}

# ``training.tools`` is a block now; the list of functions it used to be moved into it.
RETIRED_TOOLS_LIST = "training.tools.functions"


def without_retired_keys(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``raw`` without the retired keys it uses, and one ``(old key, "moved to NEW")`` error for each.

    Only the ``data`` and ``training`` mappings are copied (the rest is shared with ``raw``); removing the
    keys keeps pydantic from reporting them a second time as unknown.
    """
    cleaned = dict(raw)
    errors: list[tuple[str, str]] = []
    for block in ("data", "training"):
        section = raw.get(block)
        if not isinstance(section, Mapping):
            continue
        kept = {}
        for key, value in section.items():
            dotted = f"{block}.{key}"
            if dotted in RETIRED_KEYS:
                errors.append((dotted, f"moved to {RETIRED_KEYS[dotted]}"))
            elif dotted == "training.tools" and isinstance(value, list):
                errors.append((dotted, f"a list of functions moved to {RETIRED_TOOLS_LIST}"))
            else:
                kept[key] = value
        cleaned[block] = kept
    return cleaned, errors
