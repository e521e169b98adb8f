"""The loss of a `trl.GRPOTrainer` subclass is one of `trainer_service.training.losses`' variants, for real.

The subclass overrides `_compute_loss` (which TRL's `compute_loss` and `prediction_step` call) with the same
structure as TRL 1.16's: it recomputes the per-token log-probabilities WITH grad through TRL's own
`_get_per_token_logps_and_entropies`, then calls the variant's pure policy term and aggregation from `losses`,
and keeps TRL's extra terms identical: off-policy sequence mask, top-entropy mask, rollout (vLLM) importance-
sampling correction, β·KL (k3, bias-corrected by the ratio when `use_bias_correction_kl`), entropy bonus, MoE
aux loss, and the metrics (`entropy`, `kl`, `clip_ratio/*`, `cispo_clip_ratio`, `vespo/phi_seq_mean`). It
never falls back to another loss: a missing input key raises `MissingLossInputError` (a `KeyError`) naming the
key, and a `GRPOConfig` that disagrees with the variant is rejected at construction, naming the field.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import torch
from trl import GRPOConfig
from trl.trainer.utils import nanmax, nanmin

from grpo_runtime.config import ConfigError
from trainer_service.config.variants import (
    VARIANT_PARAM_KEYS,
    VARIANT_SPECS,
    Aggregation,
    VariantSpec,
    validate_variant_params,
)
from trainer_service.training import losses
from trainer_service.training.importance_sampling import (
    EXACT_RATIO_TOLERANCE,
    EXACTNESS_RECHECK_BATCHES,
    ImportanceSamplingPlan,
    importance_ratio_deviation,
)
from trainer_service.training.trainer_host import GRPOTrainerHost

log = logging.getLogger(__name__)

# Keys `_compute_loss` always reads from the batch TRL's `_generate_and_score_completions` returns.
REQUIRED_INPUT_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")

# Optional multimodal inputs forwarded to the forward pass, as TRL does.
_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


class MissingLossInputError(KeyError):
    """The batch TRL handed to the loss lacks a key the selected variant needs (never silently ignored)."""

    def __init__(self, key: str, variant: str, why: str, present: list[str]):
        self.key = key
        self.message = (
            f"GRPO loss variant {variant!r} needs inputs[{key!r}] ({why}), but the batch has only "
            f"{sorted(present)}; the TRL version or the rollout path changed what it produces"
        )
        super().__init__(key)

    def __str__(self) -> str:
        return self.message


def check_args_match_variant(variant: str, args: GRPOConfig) -> None:
    """Reject a `GRPOConfig` whose loss fields contradict `variant` (message names the GRPOConfig field)."""
    spec = VARIANT_SPECS[variant]
    if args.loss_type != spec.trl_loss_type:
        raise ConfigError(
            f"is {args.loss_type!r} but variant {variant!r} needs {spec.trl_loss_type!r}; build the "
            "config with grpo_config_overrides()",
            key="GRPOConfig.loss_type",
        )
    required_level = spec.importance_sampling_level
    if required_level is not None and args.importance_sampling_level != required_level:
        raise ConfigError(
            f"is {args.importance_sampling_level!r} but variant {variant!r} needs {required_level!r}",
            key="GRPOConfig.importance_sampling_level",
        )
    params = {
        key: getattr(args, key)
        for key in VARIANT_PARAM_KEYS.get(variant, ())
        if getattr(args, key) != GRPOConfig.__dataclass_fields__[key].default
    }
    try:
        validate_variant_params(
            variant,
            grpo_delta=args.delta,
            epsilon=args.epsilon,
            epsilon_high=args.epsilon_high,
            params=params,
        )
    except ConfigError as error:
        # The catalog names the loss block's keys, which are GRPOConfig's (a variant parameter is a field).
        field = (error.key or "").removeprefix("params.")
        raise ConfigError(str(error).split(": ", 1)[1], key=f"GRPOConfig.{field}") from error


def loss_params_from_args(args: GRPOConfig, epsilon_low: float, epsilon_high: float) -> losses.LossParams:
    """The `LossParams` a trainer with `args` uses (ε values as TRL resolved them on the trainer)."""
    return losses.LossParams(
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        delta=args.delta,
        importance_sampling_level=args.importance_sampling_level,
        sapo_temperature_pos=args.sapo_temperature_pos,
        sapo_temperature_neg=args.sapo_temperature_neg,
        vespo_k_pos=args.vespo_k_pos,
        vespo_lambda_pos=args.vespo_lambda_pos,
        vespo_k_neg=args.vespo_k_neg,
        vespo_lambda_neg=args.vespo_lambda_neg,
    )


class VariantLossMixin(GRPOTrainerHost):
    """`_compute_loss` for a `GRPOTrainer` subclass; the class attribute `grpo_variant` selects the variant.

    Mirrors TRL 1.16 `GRPOTrainer._compute_loss` step by step, with the policy term and aggregation replaced
    by `losses.policy_loss` / `losses.aggregate`.
    """

    grpo_variant: str
    zero_spread: torch.Tensor | None  # set by DynamicSamplingMixin below in the MRO

    def __init__(
        self, *args: Any, importance_sampling: ImportanceSamplingPlan | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        check_args_match_variant(self.grpo_variant, self.args)
        # The rollout_func correction: the plan (default: on exactly when GRPOConfig turns it on, as in TRL).
        correction = bool(self.vllm_importance_sampling_correction)
        if importance_sampling is None:
            importance_sampling = ImportanceSamplingPlan(
                "on" if correction else "off", "GRPOConfig.vllm_importance_sampling_correction"
            )
        if (importance_sampling.mode != "off") != correction:
            raise ConfigError(
                f"is {correction} but the importance-sampling plan is {importance_sampling.mode!r}; "
                f"set it to {importance_sampling.mode != 'off'}",
                key="GRPOConfig.vllm_importance_sampling_correction",
            )
        self.importance_sampling_plan = importance_sampling
        # Generation batches seen in "verify" mode, and how the latest one per mode is corrected: "batch" (its
        # micro-batches carry the ratio), "deferred" (the loss computes it), "none".
        self._is_batches = 0
        self._is_state = {
            "train": "batch" if correction else "none",
            "eval": "batch" if correction else "none",
        }
        if self.rollout_func is not None and not self.use_vllm:
            log.info(
                "rollout importance sampling: %s (%s)", importance_sampling.mode, importance_sampling.reason
            )
        rollout_is = self.vllm_importance_sampling_correction and (
            self.use_vllm or self.rollout_func is not None
        )
        if (
            rollout_is
            and self.grpo_variant == "vespo"
            and not self.vllm_importance_sampling_mode.startswith("token")
        ):
            raise ConfigError(
                f"is {self.vllm_importance_sampling_mode!r} but vespo folds a per-token IS ratio into its "
                "weight: use 'token_truncate' or 'token_mask' (grpo_config_overrides sets it)",
                key="GRPOConfig.vllm_importance_sampling_mode",
            )

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        if self.grpo_variant == "gpg":
            # α over the groups of the whole generation batch (every process; after dynamic sampling's
            # merge when it is on), carried as a 0-d tensor that TRL's
            # shuffle/split hand unchanged to every micro-batch.
            if self.zero_spread is None:
                raise RuntimeError("GPG needs the zero-spread groups of the batch (DynamicSamplingMixin)")
            alpha = losses.gpg_rescaling_factor(self.zero_spread)
            output["gpg_alpha"] = torch.tensor(alpha, device=output["advantages"].device)
        # TRL corrects for the sampler only on its own vLLM path; a rollout_func sampler (the rollout service)
        # gets the same correction here, from the log-probs it returned.
        if self.rollout_func is not None and not self.use_vllm and self.vllm_importance_sampling_correction:
            mode = "train" if self.model.training else "eval"
            state = "none"
            if self._rollout_correction_due():
                if output.get("sampling_per_token_logps") is None:
                    raise ValueError(
                        "vllm_importance_sampling_correction is on but the rollout_func returned no "
                        "'logprobs'; return the sampler's per-token log-probs or set "
                        "vllm_importance_sampling_correction=False"
                    )
                if output.get("old_per_token_logps") is None:
                    # TRL skipped π_θold: the whole batch trains before the next optimizer step, so π_θold is
                    # the loss's own forward, detached. The ratio is computed there, with no extra forward.
                    state = "deferred"
                else:
                    self._add_rollout_importance_sampling(output)
                    state = "batch"
            self._is_state[mode] = state
            self._metrics[mode]["sampling/importance_sampling_applied"].append(float(state != "none"))
        return output

    def _rollout_correction_due(self) -> bool:
        """Whether this generation batch gets the correction under the plan (counts "verify" batches)."""
        plan = self.importance_sampling_plan
        if plan.mode != "verify":
            return plan.mode == "on"
        due = self._is_batches % EXACTNESS_RECHECK_BATCHES == 0
        self._is_batches += 1
        return due

    def _check_exactness(self, ratio: torch.Tensor, mask: torch.Tensor) -> None:
        """In "verify" mode: keep skipping only while max |ρ − 1| <= EXACT_RATIO_TOLERANCE, else switch on."""
        if self.importance_sampling_plan.mode != "verify":
            return
        local = torch.tensor(importance_ratio_deviation(ratio.detach(), mask))
        deviation = float(self.accelerator.gather(local.to(self.accelerator.device)).max())
        if deviation > EXACT_RATIO_TOLERANCE:
            log.warning(
                "the rollout is not exactly on-policy (max |importance ratio - 1| = %.3g > %.0e): rollout "
                "importance sampling is on for the rest of the run",
                deviation,
                EXACT_RATIO_TOLERANCE,
            )
            self.importance_sampling_plan = ImportanceSamplingPlan(
                "on", f"verification measured max |ratio - 1| = {deviation:.3g} > {EXACT_RATIO_TOLERANCE:.0e}"
            )

    def _add_rollout_importance_sampling(self, output: dict[str, Any]) -> None:
        """Add `importance_sampling_ratio` to a generation batch that carries `old_per_token_logps` (TRL
        computed them: the batch spans optimizer steps), with TRL's sampling metrics, as TRL's vLLM branch."""
        mask = output["completion_mask"]
        if output.get("tool_mask") is not None:
            mask = mask * output["tool_mask"]
        mode = "train" if self.model.training else "eval"
        output["importance_sampling_ratio"] = self._rollout_ratio(
            output["old_per_token_logps"], output["sampling_per_token_logps"], mask, mode
        )

    def _rollout_ratio(
        self, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, mode: str
    ) -> torch.Tensor:
        """TRL's sampler ratio ρ(π_θold, π_sampler) under `vllm_importance_sampling_mode`, its `sampling/*`
        metrics, and the "verify" check. Shapes (B, T) → (B, T) or (B, 1) for sequence-level modes."""
        old = old.detach()
        ratio = losses.rollout_importance_ratio(
            old,
            sampling,
            mask,
            self.vllm_importance_sampling_mode,
            self.vllm_importance_sampling_clip_min,
            self.vllm_importance_sampling_clip_max,
        )
        self._check_exactness(ratio, mask)
        metrics = self._metrics[mode]
        active = mask.bool()
        delta = torch.abs(old - sampling)
        delta = delta[active & ~torch.isnan(delta)]
        zero = torch.tensor(0.0, device=old.device)
        metrics["sampling/sampling_logp_difference/mean"].append(
            self.accelerator.gather(delta.mean() if delta.numel() else zero).mean().item()
        )
        metrics["sampling/sampling_logp_difference/max"].append(
            self.accelerator.gather(delta.max() if delta.numel() else zero).max().item()
        )
        flat = ratio.flatten() if ratio.shape[1] == 1 else ratio[active]
        metrics["sampling/importance_sampling_ratio/min"].append(
            nanmin(self.accelerator.gather(flat.min() if flat.numel() else zero)).item()
        )
        metrics["sampling/importance_sampling_ratio/mean"].append(
            self.accelerator.gather(flat.mean() if flat.numel() else zero).nanmean().item()
        )
        metrics["sampling/importance_sampling_ratio/max"].append(
            nanmax(self.accelerator.gather(flat.max() if flat.numel() else zero)).item()
        )
        return ratio

    def _require(self, inputs: Mapping[str, Any], key: str, why: str) -> Any:
        if key not in inputs or inputs[key] is None:
            raise MissingLossInputError(key, self.grpo_variant, why, list(inputs))
        return inputs[key]

    def _compute_loss(self, model: torch.nn.Module, inputs: Mapping[str, Any]) -> torch.Tensor:
        spec = VARIANT_SPECS[self.grpo_variant]
        prompt_ids, prompt_mask, completion_ids, completion_mask, advantages = (
            self._require(inputs, key, "every GRPO loss") for key in REQUIRED_INPUT_KEYS
        )
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]

        # ℓ_θ with grad, through TRL's own forward (same chunking, autocast and fused LM head as TRL's loss).
        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in _FORWARD_KEYS},
        )
        assert entropies is not None  # compute_entropy=True

        entropy_mask = (
            self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
            if self.top_entropy_quantile < 1.0
            else None
        )
        advantages = losses.as_column(advantages)
        # On-policy (no old log-probs in the batch): ℓ_old = sg(ℓ_θ), so r = 1 with the right gradient.
        old_per_token_logps = inputs.get("old_per_token_logps")
        if old_per_token_logps is None:
            old_per_token_logps = per_token_logps.detach()

        off_policy_mask = self._off_policy_mask(
            inputs, advantages, per_token_logps, old_per_token_logps, mask
        )
        is_ratio = self._rollout_is_ratio(inputs, per_token_logps, mask)
        policy, per_token_kl = self._policy_and_kl(
            inputs, per_token_logps, old_per_token_logps, advantages, mask, is_ratio
        )
        per_token_loss = policy.per_token_loss
        for token_mask in (off_policy_mask, entropy_mask):
            if token_mask is not None:
                per_token_loss = per_token_loss * token_mask
        if is_ratio is not None and not spec.folds_rollout_is_ratio:
            per_token_loss = per_token_loss * is_ratio
        if per_token_kl is not None:
            per_token_loss = per_token_loss + self.beta * per_token_kl

        mode = "train" if self.model.training else "eval"
        loss, policy_loss = self._aggregate(inputs, spec, per_token_loss, mask, policy, mode)
        if self._entropy_bonus_enabled:
            loss = self._add_entropy_bonus(loss, entropies, mask, entropy_mask, policy_loss, mode)
        if self.aux_loss_enabled:
            assert aux_loss is not None  # compute_aux_loss=self.aux_loss_enabled
            loss = self._add_aux_loss(loss, aux_loss, mode)
        self._log_loss_metrics(mode, spec, mask, entropies, advantages, policy, per_token_kl)
        return loss

    def _off_policy_mask(
        self,
        inputs: Mapping[str, Any],
        advantages: torch.Tensor,
        per_token_logps: torch.Tensor,
        old_per_token_logps: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor | None:
        """TRL's off-policy sequence mask (``off_policy_mask_threshold``), or None when it is unset."""
        if self.off_policy_mask_threshold is None:
            return None
        return losses.off_policy_sequence_mask(
            advantages,
            per_token_logps,
            inputs.get("sampling_per_token_logps", old_per_token_logps),
            mask,
            self.off_policy_mask_threshold,
        )

    def _rollout_is_ratio(
        self, inputs: Mapping[str, Any], per_token_logps: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor | None:
        """The rollout importance ratio π_θold/π_sampling this batch trains with, or None.

        TRL's vLLM path corrects every batch; a rollout_func batch as the plan decided at its generation:
        with the ratio in the batch, or deferred to here (π_θold = this forward, detached).
        """
        is_ratio = inputs.get("importance_sampling_ratio")
        mode = "train" if self.model.training else "eval"
        state = self._is_state[mode]
        if self.vllm_importance_sampling_correction and self.rollout_func is not None and not self.use_vllm:
            if state == "deferred" and is_ratio is None:
                sampling = self._require(inputs, "sampling_per_token_logps", "the rollout importance ratio")
                is_ratio = self._rollout_ratio(per_token_logps, sampling, mask, mode)
            elif state == "batch":
                self._require(
                    inputs, "importance_sampling_ratio", "vllm_importance_sampling_correction is on"
                )
        elif self.vllm_importance_sampling_correction and self.use_vllm:
            self._require(inputs, "importance_sampling_ratio", "vllm_importance_sampling_correction is on")
        return is_ratio

    def _policy_and_kl(
        self,
        inputs: Mapping[str, Any],
        per_token_logps: torch.Tensor,
        old_per_token_logps: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        is_ratio: torch.Tensor | None,
    ) -> tuple[losses.PolicyLoss, torch.Tensor | None]:
        """The variant's policy term and, with ``beta != 0``, the per-token k3 KL to the reference model
        (times the policy ratio with ``use_bias_correction_kl``), both (batch, completion tokens)."""
        variant = self.grpo_variant
        params = loss_params_from_args(self.args, self.epsilon_low, self.epsilon_high)
        if variant == "gpg":
            alpha = self._require(inputs, "gpg_alpha", "GPG's rescaling factor over the generation batch")
            params = dataclasses.replace(params, gpg_alpha=float(alpha))
        policy = losses.policy_loss(
            variant,
            per_token_logps,
            old_per_token_logps,
            advantages,
            mask,
            params,
            importance_sampling_ratio=is_ratio,
        )
        if self.beta == 0.0:
            return policy, None
        ref_per_token_logps = self._require(inputs, "ref_per_token_logps", f"beta={self.beta} (KL term)")
        per_token_kl = losses.k3_kl(per_token_logps, ref_per_token_logps)
        if self.args.use_bias_correction_kl:
            per_token_kl = per_token_kl * policy.ratio
        return policy, per_token_kl

    def _aggregate(
        self,
        inputs: Mapping[str, Any],
        spec: VariantSpec,
        per_token_loss: torch.Tensor,
        mask: torch.Tensor,
        policy: losses.PolicyLoss,
        mode: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss for backward, its detached value before any 1/GA scaling): the variant's aggregation of
        ``per_token_loss`` (batch, completion tokens) to a scalar."""
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        num_tokens = None
        if spec.aggregation is Aggregation.GLOBAL_TOKEN:
            # num_items_in_batch counts the generation batch over all processes; rescale to one window here.
            num_items = self._require(
                inputs, "num_items_in_batch", f"{self.grpo_variant} normalises by global tokens"
            )
            num_tokens = num_items.clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                num_tokens = (
                    num_tokens * self.current_gradient_accumulation_steps / self.args.steps_per_generation
                )
        loss = losses.aggregate(
            per_token_loss,
            mask if policy.aggregation_mask is None else policy.aggregation_mask,
            spec.aggregation,
            max_completion_length=self.max_completion_length,
            num_tokens=num_tokens,
        )
        policy_loss = loss.detach()
        if losses.scaled_by_caller(spec.aggregation):
            loss = loss / accumulation
        return loss, policy_loss

    def _add_aux_loss(self, loss: torch.Tensor, aux_loss: torch.Tensor, mode: str) -> torch.Tensor:
        """MoE router load-balancing loss, weighted by ``router_aux_loss_coef``, per accumulation window."""
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
        self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        return loss

    def _add_entropy_bonus(
        self,
        loss: torch.Tensor,
        entropies: torch.Tensor,
        mask: torch.Tensor,
        entropy_mask: torch.Tensor | None,
        policy_loss: torch.Tensor,
        mode: str,
    ) -> torch.Tensor:
        """Skywork-OR1 entropy bonus, exactly as TRL 1.16: loss − c·mean_tokens(H)/GA, with the adaptive
        controller updating c at optimizer-step boundaries from the window-global entropy."""
        effective_mask = mask if entropy_mask is None else mask * entropy_mask
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        entropy_loss = (entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0) / accumulation
        if self.use_adaptive_entropy:
            apply_coef = self.entropy_coef if self._last_world_entropy <= self.args.entropy_target else 0.0
        else:
            apply_coef = self.entropy_coef
        loss = loss - apply_coef * entropy_loss
        self._metrics[mode]["policy_loss"].append(self.accelerator.gather(policy_loss).nanmean().item())
        if self.use_adaptive_entropy and mode == "train":
            stats = torch.stack([(entropies * effective_mask).sum(), effective_mask.sum()]).detach()
            self._entropy_window_stats = (
                stats if self._entropy_window_stats is None else self._entropy_window_stats + stats
            )
            if self.accelerator.sync_gradients:
                window = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                world_entropy = (window[0] / window[1].clamp(min=1.0)).item()
                if world_entropy <= self.args.entropy_target:
                    self.entropy_coef = min(
                        self.entropy_coef + self.args.entropy_coef_delta, self.args.entropy_coef_max
                    )
                else:
                    self.entropy_coef = max(
                        self.entropy_coef - self.args.entropy_coef_delta, self.args.entropy_coef_min
                    )
                self._last_world_entropy = world_entropy
                self._entropy_window_stats = None
        if mode == "train" and self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        return loss

    def _log_loss_metrics(
        self,
        mode: str,
        spec: VariantSpec,
        mask: torch.Tensor,
        entropies: torch.Tensor,
        advantages: torch.Tensor,
        policy: losses.PolicyLoss,
        per_token_kl: torch.Tensor | None,
    ) -> None:
        """TRL's loss metrics under TRL's names: entropy, kl, clip ratios (PPO-style and cispo), vespo φ."""

        def masked_seq_mean(x: torch.Tensor) -> torch.Tensor:
            if x.shape[1] == 1:  # sequence-level quantity: one value per sequence already
                return x.squeeze(1)
            return (x * mask).sum(-1) / mask.sum(-1)

        def global_masked_mean(x: torch.Tensor) -> float:
            if x.shape[1] == 1:
                local_sum, local_count = x.sum(), torch.tensor(float(x.shape[0]), device=x.device)
            else:
                local_sum, local_count = (x * mask).sum(), mask.sum().float()
            totals = self.accelerator.reduce(torch.stack([local_sum, local_count]), reduction="sum")
            return (totals[0] / totals[1].clamp(min=1.0)).item()

        metrics = self._metrics[mode]
        if per_token_kl is not None:
            metrics["kl"].append(global_masked_mean(per_token_kl))
        metrics["entropy"].append(global_masked_mean(entropies))
        ratio = policy.ratio
        if spec.clip_metrics == "ppo":
            low, high = self.epsilon_low, self.epsilon_high
            if spec.delta_role == "half_width":  # two_sided clips symmetrically at δ
                assert self.args.delta is not None  # two_sided's policy term refused a config without it
                low = high = self.args.delta
            is_low = (ratio < 1 - low) & (advantages < 0)
            is_high = (ratio > 1 + high) & (advantages > 0)
            metrics["clip_ratio/low_mean"].append(global_masked_mean(is_low.float()))
            metrics["clip_ratio/high_mean"].append(global_masked_mean(is_high.float()))
            metrics["clip_ratio/region_mean"].append(global_masked_mean((is_low | is_high).float()))
            metrics["clip_ratio/low_min"].append(
                nanmin(self.accelerator.gather(masked_seq_mean(is_low.float()))).item()
            )
            metrics["clip_ratio/high_max"].append(
                nanmax(self.accelerator.gather(masked_seq_mean(is_high.float()))).item()
            )
        elif spec.clip_metrics == "cispo":
            clipped = (ratio > self.epsilon_high) & (advantages > 0)
            metrics["cispo_clip_ratio"].append(global_masked_mean(clipped.float()))
        if policy.sequence_weights is not None:
            metrics["vespo/phi_seq_mean"].append(global_masked_mean(policy.sequence_weights))
        if policy.aggregation_mask is not None:
            # rft: share of completion tokens that train (positive-advantage completions).
            share = policy.aggregation_mask.sum() / mask.sum().clamp(min=1.0)
            metrics["rft/positive_token_fraction"].append(
                self.accelerator.gather(share.detach()).mean().item()
            )
