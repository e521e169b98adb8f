"""``python -m trainer_service check CONFIG.yaml``: validate a run config and print what a run would use.

Nothing trains and nothing is started. In order, each failure printed as ``check: <key>: <message>`` with
exit status 2:

1. the config itself (every key, the cross-key rules: :func:`~trainer_service.config.run_config.load_config`),
   every error on a line of its own;
2. the data: both splits read and converted as a run reads them (a bad row is named);
3. the device, ``per_device_train_batch_size: auto`` (:mod:`trainer_service.training.batch_sizing`) and
   TRL's own ``GRPOConfig`` checks on the GRPOConfig the run would build;
4. the rewards: when ``services.reward`` is set and answers, every reward term must be offered and available
   there, and every row must carry the metadata the service's ``ListRewards`` says it requires; otherwise
   (unset or unreachable: a run would start its own) the rows are checked against the built-in rewards'
   requirements, and the output says so.

Then it prints the resolved settings as YAML: the config with every default filled in, and the derived
values (device and precision, the chosen batch size, the GRPOConfig loss fields, generation batch, reward
weights).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from grpo_runtime.call_errors import ServiceCallError
from reward_service.client import RewardClient
from trainer_service.config.run_config import ConfigError, RunConfig, load_config
from trainer_service.training.batch_sizing import resolve_batch_size
from trainer_service.training.builders import build_grpo_config, resolve_device
from trainer_service.training.data import REWARD_METADATA, DataError, read_split, validate_reward_metadata
from trainer_service.training.job import reward_requirements

# Seconds to wait for the reward service's ListRewards: check answers quickly when it is down.
LIST_REWARDS_TIMEOUT_S = 10.0


class CheckFailed(Exception):
    """A check that failed; the message names the key (or the split and row)."""


def _requirements(config: RunConfig) -> tuple[Mapping[str, Sequence[str]], str]:
    """The metadata each reward term needs, and where that came from."""
    target = config.services.reward
    if target is None:
        return REWARD_METADATA, "built-in rewards' requirements (services.reward unset: a run starts its own)"
    try:
        with RewardClient(
            target,
            admin_token=config.services.resolved_admin_token(),
            timeout_s=LIST_REWARDS_TIMEOUT_S,
            retry_budget_s=0.0,
        ) as client:
            return reward_requirements(
                client, config.training.rewards.reward_terms
            ), f"ListRewards of {target}"
    except ServiceCallError as error:  # not reachable, or refused
        return (
            REWARD_METADATA,
            f"built-in rewards' requirements (reward service {target} did not answer: {error})",
        )


def resolved_settings(config: RunConfig) -> dict[str, Any]:
    """Run checks 2-4 of the module docstring on a valid config; return what a run would use."""
    rows = {split: read_split(config.data, split=split) for split in ("train", "eval")}
    device = resolve_device(config)
    config, choice = resolve_batch_size(config, device)
    try:
        args = build_grpo_config(config, device)
    except ConfigError:
        raise
    except ValueError as exc:  # TRL's GRPOConfig.__post_init__
        raise CheckFailed(f"GRPOConfig: {exc}") from exc
    requirements, source = _requirements(config)
    for split, split_rows in rows.items():
        if split_rows is not None:
            validate_reward_metadata(
                split_rows, config.training.rewards.reward_terms, split=split, requirements=requirements
            )
    precision = "bf16" if device.bf16 else "fp16" if device.fp16 else "fp32"
    return {
        "config": config.model_dump(mode="json"),
        "resolved": {
            "device": f"{device.type} ({precision})",
            "batch_size": config.training.optimizer.per_device_train_batch_size,
            "batch_size_auto": choice.describe() if choice is not None else None,
            "rows": {split: len(split_rows) for split, split_rows in rows.items() if split_rows is not None},
            "reward_metadata_checked_against": source,
            "reward_weights": {term.name: term.weight for term in config.training.rewards.reward_terms},
            "grpo_config": {
                "loss_type": args.loss_type,
                "importance_sampling_level": args.importance_sampling_level,
                "epsilon": args.epsilon,
                "epsilon_high": args.epsilon_high,
                "delta": args.delta,
                "beta": args.beta,
                "scale_rewards": args.scale_rewards,
                "mask_truncated_completions": args.mask_truncated_completions,
                "per_device_train_batch_size": args.per_device_train_batch_size,
                "generation_batch_size": args.generation_batch_size,
                "num_generations": args.num_generations,
                "max_completion_length": args.max_completion_length,
            },
        },
    }


def check(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="trainer_service check",
        description="Validate a run config (data, batch size, reward metadata); print the resolved settings.",
    )
    parser.add_argument("config", type=Path, help="training config YAML")
    args = parser.parse_args(argv)
    try:
        settings = resolved_settings(load_config(args.config))
    except ConfigError as exc:
        for line in exc.lines():
            print(f"check: {line}", file=sys.stderr)
        return 2
    except (DataError, CheckFailed) as exc:
        print(f"check: {exc}", file=sys.stderr)
        return 2
    print(yaml.safe_dump(settings, sort_keys=False, allow_unicode=True), end="")
    print("check: ok", file=sys.stderr)
    return 0
