"""GRPO policy-loss variants as pure tensor functions.

Every variant maps per-token log-probabilities to a per-token loss; an aggregation then reduces it to the
scalar that is back-propagated. Nothing here touches a model or a trainer: `variant_loss` computes the
inputs with TRL's own forward pass and calls these functions, and the unit tests call them on plain tensors.

Shapes and symbols used throughout (B = completions in the micro-batch, T = padded completion length):

    ℓ_θ    per_token_logps      (B, T)  log π_θ(o_t | q, o_<t) WITH grad (temperature-scaled, as in TRL)
    ℓ_old  old_per_token_logps  (B, T)  log π_old of the same tokens, no grad (ℓ_θ.detach() when on-policy)
    A      advantages           (B,) or (B, 1)  group-relative advantage of each completion (broadcast over t)
    M      mask                 (B, T)  1 for completion tokens that train (completion_mask × tool_mask)
    r      importance ratio     exp(ℓ_θ − ℓ_old) per token (B, T), or per sequence (B, 1) at sequence level:
           (GSPO) r_i = exp(Σ_t M_it (ℓ_θ − ℓ_old)_it / max(Σ_t M_it, 1)) = (π_θ/π_old)^(1/|o_i|)

Variant functions return a `PolicyLoss` (per-token loss ℓ, the unclamped ratio r for the bias-corrected KL and
the clip metrics, optionally a replacement aggregation mask and per-sequence weights). `aggregate` applies the
variant's `Aggregation` (catalog: `trainer_service.config.variants`). The TRL-native variants reproduce TRL
1.16 `GRPOTrainer._compute_loss` operation by operation (the parity tests compare them to TRL to 1e-6);
`two_sided`, `rft` and `gpg` are the extra variants.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from trainer_service.config.variants import VARIANT_SPECS, Aggregation

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class LossParams:
    """Hyper-parameters of the policy terms (TRL `GRPOConfig` names where TRL has the knob).

    epsilon_low / epsilon_high: PPO clip range [1 − ε_low, 1 + ε_high] (TRL `epsilon` / `epsilon_high`;
        for cispo `epsilon_high` is the ratio cap ε_max).
    delta: for the clipped TRL variants, INTELLECT-2's upper cap on r (TRL `delta`, > 1 + ε_high, None = no
        cap); for `two_sided`, the symmetric half-width δ ∈ (0, 1].
    importance_sampling_level: "token" or "sequence" (GSPO).
    sapo_temperature_pos/neg: SAPO gate temperatures τ for A > 0 / A ≤ 0.
    vespo_k_pos/lambda_pos/k_neg/lambda_neg: VESPO gamma-weight shape for A ≥ 0 / A < 0.
    gpg_alpha: GPG's rescaling factor α of the generation batch (:func:`gpg_rescaling_factor`).
    """

    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    delta: float | None = None
    importance_sampling_level: str = "token"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    gpg_alpha: float = 1.0


class PolicyLoss(NamedTuple):
    """Output of a variant's policy term.

    per_token_loss: (B, T) or (B, 1) loss before masking/aggregation.
    ratio: r = exp(log importance weight), (B, T) or (B, 1), before any cap; multiplies the KL with TRL's bias
        correction and feeds the clip metrics.
    aggregation_mask: (B, T) mask to aggregate over instead of M (rft: positive-advantage tokens), or None.
    sequence_weights: (B, 1) per-sequence weights worth logging (vespo's φ), or None.
    """

    per_token_loss: torch.Tensor
    ratio: torch.Tensor
    aggregation_mask: torch.Tensor | None = None
    sequence_weights: torch.Tensor | None = None


def as_column(advantages: torch.Tensor) -> torch.Tensor:
    """(B,) → (B, 1); (B, 1) or per-token (B, T) advantages are returned unchanged."""
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def importance_log_weights(
    per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor, mask: torch.Tensor, level: str
) -> torch.Tensor:
    """log r: token level (ℓ_θ − ℓ_old) of shape (B, T); sequence level (GSPO, Zheng et al. 2025,
    arXiv:2507.18071) Σ_t M (ℓ_θ − ℓ_old) / max(Σ_t M, 1) of shape (B, 1)."""
    log_ratio = per_token_logps - old_per_token_logps
    if level == "token":
        return log_ratio
    if level == "sequence":
        return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    raise ValueError(f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, got {level!r}")


def clipped_surrogate(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    params: LossParams,
) -> PolicyLoss:
    """PPO clipped surrogate used by TRL's grpo, bnpo, dr_grpo, dapo, luspo (and gspo at sequence level).

        ℓ = −min(min(r, δ)·A, clip(r, 1 − ε_low, 1 + ε_high)·A)

    clip() is taken from the UNcapped r; the optional cap δ (INTELLECT-2, arXiv:2505.07291, δ > 1 + ε_high)
    bounds the unclipped branch, which only matters for A < 0 where min picks the larger ratio. GRPO: Shao et
    al. 2024, arXiv:2402.03300; clip-higher ε_high > ε_low: DAPO, Yu et al. 2025, arXiv:2503.14476.
    """
    advantages = as_column(advantages)
    ratio = torch.exp(
        importance_log_weights(per_token_logps, old_per_token_logps, mask, params.importance_sampling_level)
    )
    clipped = torch.clamp(ratio, 1 - params.epsilon_low, 1 + params.epsilon_high)
    capped = ratio if params.delta is None else torch.clamp(ratio, max=params.delta)
    per_token_loss = -torch.min(capped * advantages, clipped * advantages)
    return PolicyLoss(per_token_loss, ratio)


def cispo(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    params: LossParams,
) -> PolicyLoss:
    """CISPO (MiniMax-M1, arXiv:2506.13585): clip the importance weight, not the update, so every token keeps
    a gradient.

        ℓ = −sg(min(r, ε_max)) · A · ℓ_θ        (ε_max = epsilon_high; sg = stop-gradient)
    """
    advantages = as_column(advantages)
    ratio = torch.exp(
        importance_log_weights(per_token_logps, old_per_token_logps, mask, params.importance_sampling_level)
    )
    clamped = torch.clamp(ratio, max=params.epsilon_high).detach()
    return PolicyLoss(-clamped * advantages * per_token_logps, ratio)


def sapo(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    params: LossParams,
) -> PolicyLoss:
    """SAPO (Soft Adaptive Policy Optimization, Gao et al. 2025, arXiv:2511.20347): a smooth sigmoid gate
    instead of a hard clip.

        τ = τ_pos if A > 0 else τ_neg;   ℓ = −σ(τ (r − 1)) · 4/τ · A

    (σ(τ(r−1))·4/τ has slope 1 at r = 1, so the on-policy gradient equals the vanilla policy gradient.)
    """
    advantages = as_column(advantages)
    ratio = torch.exp(
        importance_log_weights(per_token_logps, old_per_token_logps, mask, params.importance_sampling_level)
    )
    temperatures = torch.where(advantages > 0, params.sapo_temperature_pos, params.sapo_temperature_neg)
    gate = torch.sigmoid(temperatures * (ratio - 1)) * 4 / temperatures
    return PolicyLoss(-gate * advantages, ratio)


@torch.no_grad()
def vespo_gamma_weights(
    advantages: torch.Tensor,
    log_ratio_per_token: torch.Tensor,
    mask: torch.Tensor,
    importance_sampling_ratio: torch.Tensor | None,
    params: LossParams,
) -> torch.Tensor:
    """VESPO's per-sequence gamma weight φ(w) (no grad), shape (B, 1).

        s = Σ_t M·clamp(ℓ_θ − ℓ_old, −20, 20) + Σ_t clamp(log IS_rollout, log 1e-8, 20)
        log w = clamp(s, log 1e-8, 20)
        φ(w) = exp(λ + k·log w − λ·w),  (k, λ) = (k_pos, λ_pos) if A ≥ 0 else (k_neg, λ_neg);  φ(1) = 1

    IS_rollout is the token-level trainer/sampler ratio (vLLM IS correction) when present: w then measures the
    distance from the sampling policy itself.
    """
    lower = math.log(1e-8)
    seq_log_ratio = torch.sum(torch.clamp(log_ratio_per_token, -20.0, 20.0) * mask, dim=-1, keepdim=True)
    if importance_sampling_ratio is not None:
        log_is_ratio = torch.clamp(torch.log(importance_sampling_ratio), lower, 20.0)
        seq_log_ratio += torch.sum(log_is_ratio, dim=-1, keepdim=True)
    log_w = torch.clamp(seq_log_ratio, lower, 20.0)
    w = torch.exp(log_w)
    nonneg = advantages >= 0
    k = torch.where(nonneg, params.vespo_k_pos, params.vespo_k_neg)
    lam = torch.where(nonneg, params.vespo_lambda_pos, params.vespo_lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * w).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    params: LossParams,
    importance_sampling_ratio: torch.Tensor | None = None,
) -> PolicyLoss:
    """VESPO (variational sequence-level soft policy optimization, arXiv:2602.10693 as cited by TRL):
    REINFORCE weighted by a smooth gamma function of the sequence-level ratio w (see `vespo_gamma_weights`).

        ℓ = −φ(w) · A · ℓ_θ        (φ without grad, so ∇ℓ = −φ(w) A ∇ℓ_θ)

    The rollout IS ratio is folded into w instead of multiplying the loss.
    """
    advantages = as_column(advantages)
    ratio = torch.exp(
        importance_log_weights(per_token_logps, old_per_token_logps, mask, params.importance_sampling_level)
    )
    phi = vespo_gamma_weights(
        advantages, per_token_logps - old_per_token_logps, mask, importance_sampling_ratio, params
    )
    return PolicyLoss(-phi * advantages * per_token_logps, ratio, sequence_weights=phi)


def two_sided(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    params: LossParams,
) -> PolicyLoss:
    """Symmetric clip with soup-cli's δ semantics (`grpo_delta` ∈ (0, 1]), token-level ratio.

        r = exp(ℓ_θ − ℓ_old);   ℓ = −min(r·A, clip(r, 1 − δ, 1 + δ)·A)

    i.e. PPO (Schulman et al. 2017, arXiv:1707.06347) with one half-width δ on both sides, aggregated as a
    global token mean (`Aggregation.GLOBAL_TOKEN`). Not the same knob as TRL's `delta`: INTELLECT-2's
    two-sided clipping (arXiv:2505.07291) keeps the [1 − ε, 1 + ε] clip and adds an upper CAP δ > 1 + ε on r
    for A < 0; here δ is the clip half-width itself, and the A < 0 branch stays unbounded as in plain PPO.
    """
    if params.delta is None or not 0.0 < params.delta <= 1.0:
        raise ValueError(f"two_sided needs delta (grpo_delta) in (0, 1], got {params.delta!r}")
    advantages = as_column(advantages)
    ratio = torch.exp(per_token_logps - old_per_token_logps)
    clipped = torch.clamp(ratio, 1 - params.delta, 1 + params.delta)
    return PolicyLoss(-torch.min(ratio * advantages, clipped * advantages), ratio)


def rft(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    params: LossParams,
) -> PolicyLoss:
    """Rejection-sampling fine-tuning (RFT, Yuan et al. 2023, arXiv:2308.01825): supervised NLL on the
    completions that beat their group (A > 0), ignoring the advantage's magnitude.

        loss = −Σ ℓ_θ · 1[A > 0] · M / max(Σ 1[A > 0] · M, 1)

    Returns ℓ = −ℓ_θ·1[A>0] with aggregation_mask = M·1[A>0] for `Aggregation.TOKEN_MEAN`. A micro-batch with
    no positive completion gives loss 0 and zero gradient. With β > 0 the KL term is averaged over the
    same positive tokens (the objective is SFT on accepted samples, regularised where it trains).
    """
    advantages = as_column(advantages)
    positive = (advantages > 0).to(per_token_logps.dtype)
    ratio = torch.exp(per_token_logps - old_per_token_logps)
    return PolicyLoss(-per_token_logps * positive, ratio, aggregation_mask=mask * positive)


def gpg_rescaling_factor(zero_spread: torch.Tensor) -> float:
    """GPG's gradient-rescaling factor over one generation batch (Chu et al. 2025, arXiv:2504.02546):

        α = B / (B − M)

    ``zero_spread``: (B,) bool, one flag per group of the generation batch (all processes), True where the
    group's rewards have no spread (std = 0, so every advantage of the group is 0 and it gives no gradient);
    M = their number. α undoes the dilution of the batch mean by those groups; a batch of only such groups
    gets α = 1 (its loss is 0 anyway). A completion with A = 0 inside a group with spread does not count.
    """
    total = int(zero_spread.numel())
    flat = int(zero_spread.sum())
    return total / (total - flat) if flat < total else 1.0


def gpg(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    params: LossParams,
) -> PolicyLoss:
    """GPG (Group Policy Gradient, Chu et al. 2025, arXiv:2504.02546): plain policy gradient with the group
    baseline, no ratio, no clip, no KL surrogate, times the paper's gradient-rescaling factor α.

        ℓ = −α · A · ℓ_θ,   α = ``params.gpg_alpha`` = B / (B − M) over the generation batch

    aggregated as a global token mean. α is counted over whole groups of the generation batch
    (:func:`gpg_rescaling_factor`), not over a micro-batch, so every micro-batch of a batch gets the same α.
    """
    advantages = as_column(advantages)
    ratio = torch.exp(per_token_logps - old_per_token_logps)
    return PolicyLoss(-params.gpg_alpha * advantages * per_token_logps, ratio)


def k3_kl(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π_θ ‖ π_ref) (Schulman 2020), (B, T):
    exp(ℓ_ref − ℓ_θ) − (ℓ_ref − ℓ_θ) − 1."""
    diff = ref_per_token_logps - per_token_logps
    return torch.exp(diff) - diff - 1


def off_policy_sequence_mask(
    advantages: torch.Tensor,
    per_token_logps: torch.Tensor,
    sampling_per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """DeepSeek-V3.2 off-policy sequence mask (arXiv:2512.02556), (B, 1): keep a sequence when A ≥ 0 or its
    mean per-token KL estimate Σ_t M (ℓ_sampler − ℓ_θ) / max(Σ_t M, 1) ≤ threshold. NaN sampler log-probs
    count as 0."""
    kl = torch.nan_to_num(sampling_per_token_logps - per_token_logps.detach(), nan=0.0)
    avg_seq_kl = (kl * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return ((as_column(advantages) >= 0) | (avg_seq_kl <= threshold)).to(dtype=mask.dtype)


ROLLOUT_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def rollout_importance_ratio(
    old_per_token_logps: torch.Tensor,
    sampling_per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """Trainer/sampler importance ratio that corrects for the rollout engine's numerics (TRL's vLLM IS
    correction; truncated IS "TIS" / masked IS "MIS", Yao et al. 2025, "Your efficient RL framework secretly
    brings you off-policy RL training").

        d = nan_to_num(M (ℓ_old − ℓ_sampler), 0)       per token; summed over t for sequence_* modes
        ρ = exp(d)                                     (B, T) for token_*, (B, 1) for sequence_*
        *_truncate: ρ ← clamp(ρ, clip_min, clip_max);   *_mask: ρ ← 0 where ρ ∉ [clip_min, clip_max]

    ℓ_old are the trainer's log-probs of the sampled tokens at generation time, ℓ_sampler the engine's (NaN
    where the engine could not score a token: ratio 1 there). The loss is multiplied by ρ (vespo folds it in).
    """
    if mode not in ROLLOUT_IS_MODES:
        raise ValueError(f"rollout IS mode must be one of {ROLLOUT_IS_MODES}, got {mode!r}")
    diff = torch.nan_to_num((old_per_token_logps - sampling_per_token_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def aggregate(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    aggregation: Aggregation,
    *,
    max_completion_length: int | None = None,
    num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Reduce the per-token loss ℓ (B, T) or (B, 1) to a scalar over mask M (B, T); see `Aggregation`.

    max_completion_length is needed by FIXED_LENGTH; num_tokens (N, already clamped ≥ 1 and scaled to one
    accumulation window) by GLOBAL_TOKEN. Gradient-accumulation scaling is the caller's job
    (`scaled_by_caller`).
    """
    if aggregation is Aggregation.SEQUENCE_MEAN:
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if aggregation is Aggregation.TOKEN_MEAN:
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if aggregation is Aggregation.FIXED_LENGTH:
        if max_completion_length is None:
            raise ValueError("FIXED_LENGTH aggregation needs max_completion_length")
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
    if aggregation is Aggregation.GLOBAL_TOKEN:
        if num_tokens is None:
            raise ValueError("GLOBAL_TOKEN aggregation needs num_tokens")
        return (per_token_loss * mask).sum() / num_tokens
    if aggregation is Aggregation.SEQUENCE_SUM:
        return (per_token_loss * mask).sum(-1).mean()
    raise ValueError(f"unknown aggregation {aggregation!r}")


PolicyTerm = Callable[..., PolicyLoss]


# The policy term of each variant of `config.variants.VARIANT_SPECS`.
POLICY_TERMS: dict[str, PolicyTerm] = {
    "grpo": clipped_surrogate,
    "dr_grpo": clipped_surrogate,
    "dapo": clipped_surrogate,
    "bnpo": clipped_surrogate,
    "luspo": clipped_surrogate,
    "gspo": clipped_surrogate,
    "cispo": cispo,
    "sapo": sapo,
    "vespo": vespo,
    "two_sided": two_sided,
    "rft": rft,
    "gpg": gpg,
}


def scaled_by_caller(aggregation: Aggregation) -> bool:
    """True when the caller must divide the aggregated loss by the gradient-accumulation steps (TRL does this
    for every aggregation except GLOBAL_TOKEN, whose N already spans the accumulation window)."""
    return aggregation is not Aggregation.GLOBAL_TOKEN


def policy_loss(
    variant: str,
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    params: LossParams,
    *,
    importance_sampling_ratio: torch.Tensor | None = None,
) -> PolicyLoss:
    """Run `variant`'s policy term; vespo folds `importance_sampling_ratio` into its weight, the others ignore
    it here (the trainer multiplies their loss by it)."""
    term = POLICY_TERMS[variant]
    if VARIANT_SPECS[variant].folds_rollout_is_ratio:
        return term(
            per_token_logps,
            old_per_token_logps,
            advantages,
            mask,
            params,
            importance_sampling_ratio=importance_sampling_ratio,
        )
    return term(per_token_logps, old_per_token_logps, advantages, mask, params)
