"""Rollout importance-sampling policy: when the trainer corrects for the sampler, and the exactness check.

Rollout IS correction: TRL computes `importance_sampling_ratio` (trainer vs sampler logprobs, TIS/MIS) only on
its own vLLM path. With a `rollout_func` (the rollout service) and `vllm_importance_sampling_correction=True`
(TRL's default) this trainer applies the same ratio under `vllm_importance_sampling_mode` / `_clip_min` /
`_clip_max`, from the `logprobs` the rollout_func returned, and logs TRL's `sampling/*` metrics. π_θold is
the policy at generation time. TRL's vLLM branch spends one no-grad forward over the whole batch on it; here,
when TRL itself left `old_per_token_logps` out (the whole generation batch trains before the next optimizer
step: `steps_per_generation` = GA, one iteration, TRL's default), the weights at generation and at the loss
are the same, so π_θold is the loss's own forward, detached, and the ratio is computed in `_compute_loss`
(per micro-batch, the same values) at no extra cost. When TRL did compute `old_per_token_logps`, the ratio
is added to the batch after generation. Set `vllm_importance_sampling_correction=False` to train without it.
Whenever the correction applies to a batch it is computed or required (a missing input is an error); a ratio
present in the batch is always applied, as in TRL.

When the correction is pure cost: the ratio ρ = π_θold / π_sampler corrects for the sampler generating from
other weights or with other numerics than the trainer's forward. In a synchronous run that pushes the weights
after every optimizer step (generation waits for the push) with an fp32 HF rollout engine (the same forward
in the same precision, adapter merged: log-probs agree to ~1e-6) and an fp32 trainer, the rollout is exactly
on-policy: ρ = 1 ± 1e-5, and multiplying by it changes the loss by less than that (where π_θold needs its
own forward, about a fifth of a CPU step, skipping also saves that forward). `resolve_importance_sampling`
(the run config's `training.loss.importance_sampling`) decides, and the trainer takes the result as
`importance_sampling=ImportanceSamplingPlan(...)`:

    setting  conditions                                                    plan
    on       -                                                             on: every generation batch
    off      sync mode only (rejected with async rollout)                  off: never
    auto     async rollout (completions up to max_staleness versions old)  on
    auto     weight sync off (the service keeps other weights)             on
    auto     engine not "hf" (vLLM: own kernels, bf16, sampler) or unknown on
    auto     trainer in bf16/fp16 or quantized (numerics differ)           on
    auto     otherwise (sync, pushed every step, fp32 HF engine + trainer) verify

`verify` trusts but checks: the correction runs on the first generation batch and on every
`EXACTNESS_RECHECK_BATCHES`-th one after it; while the measured max |ρ − 1| stays within
`EXACT_RATIO_TOLERANCE` the batches in between skip it (logged as `sampling/importance_sampling_applied` 0),
and the first check that exceeds it (a bf16 engine, another model on the service, a replica that differs)
turns the correction on for the rest of the run, with a warning. Async rollout is never exact: a batch
generated during the previous step comes from weights one version behind, so there it is always `on`.

Per token: the ratio is formed token by token from the rollout logprob of each token, and with partial
rollouts a completion's tokens may come from several versions (`Completion.token_versions`); the rollout
service gives each token the logprob of the weights that sampled it (it recomputes the prefix under new
weights, `rollout_service/engines/hf.py`), so ρ_t = π_θold(t) / π_{v_t}(t) corrects each token for its own
sampler. Tokens beyond the staleness bound carry zero weight in the mask the ratio and its sequence-level
modes are taken over (`trainer_service/rollout/token_staleness.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from grpo_runtime.config import ConfigError

# A rollout counts as exactly on-policy while TRL's sampler ratio ρ stays within 1 ± this on every active
# token (sequence-level modes: every sequence): skipping the correction changes each token's loss by < 0.1 %.
# Measured: the fp32 HF engine vs the fp32 trainer give |ρ − 1| < 1e-5 on 32-token completions.
EXACT_RATIO_TOLERANCE = 1e-3
# In "verify" mode the correction runs on the first generation batch and then on every this many batches.
EXACTNESS_RECHECK_BATCHES = 50

ImportanceSamplingSetting = Literal["auto", "on", "off"]


@dataclass(frozen=True)
class ImportanceSamplingPlan:
    """How a trainer with a `rollout_func` applies the rollout importance-sampling correction.

    ``mode``: "on" every generation batch, "off" never, "verify" on the first batch and every
    `EXACTNESS_RECHECK_BATCHES`-th, skipped in between while |ρ − 1| <= `EXACT_RATIO_TOLERANCE` (module
    docstring). ``reason``: why, in words (logged at the start of training).
    """

    mode: Literal["on", "off", "verify"]
    reason: str


def resolve_importance_sampling(
    setting: ImportanceSamplingSetting,
    *,
    async_rollout: bool,
    weight_sync: bool,
    rollout_engine: str | None,
    trainer_fp32: bool,
) -> ImportanceSamplingPlan:
    """The plan for ``training.loss.importance_sampling`` (table in the module docstring).

    ``rollout_engine``: what the rollout service reports ("hf", "vllm"; None = could not ask).
    ``trainer_fp32``: the trainer's forward runs in fp32 (no bf16/fp16 autocast, no quantized base).
    Raises ConfigError(key="training.loss.importance_sampling") for "off" with async rollout.
    """
    if setting == "on":
        return ImportanceSamplingPlan("on", "training.loss.importance_sampling is 'on'")
    if setting == "off":
        if async_rollout:
            raise ConfigError(
                "cannot be 'off' with async rollout: completions come from older weights, and only the "
                "correction makes training on them unbiased",
                key="training.loss.importance_sampling",
            )
        return ImportanceSamplingPlan("off", "training.loss.importance_sampling is 'off'")
    if setting != "auto":
        raise ConfigError(
            f"must be auto, on or off, got {setting!r}", key="training.loss.importance_sampling"
        )
    if async_rollout:
        return ImportanceSamplingPlan("on", "async rollout trains on completions from older weights")
    if not weight_sync:
        return ImportanceSamplingPlan("on", "weight sync is off: the rollout service samples other weights")
    if rollout_engine != "hf":
        engine = "unknown (status unavailable)" if rollout_engine is None else repr(rollout_engine)
        return ImportanceSamplingPlan(
            "on", f"rollout engine {engine} is not the fp32 HF engine whose log-probs match the trainer's"
        )
    if not trainer_fp32:
        return ImportanceSamplingPlan("on", "the trainer computes in bf16/fp16 or on quantized weights")
    return ImportanceSamplingPlan(
        "verify",
        "sync rollout, weights pushed every step, HF engine and fp32 trainer: on-policy up to rounding; "
        f"checked on the first batch and every {EXACTNESS_RECHECK_BATCHES}th",
    )


def importance_ratio_deviation(ratio: torch.Tensor, mask: torch.Tensor) -> float:
    """max |ρ − 1| over active tokens ((B, T) ratio) or over sequences ((B, 1) ratio); 0 for an empty batch.
    NaN entries count as infinitely far off."""
    values = ratio.flatten() if ratio.shape[1] == 1 else ratio[mask.bool()]
    if values.numel() == 0:
        return 0.0
    deviation = torch.nan_to_num((values.double() - 1.0).abs(), nan=math.inf)
    return float(deviation.max())
