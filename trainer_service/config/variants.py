"""The GRPO loss-variant catalog: names, what each maps to in TRL's `GRPOConfig`, and parameter checks.

Plain configuration, importable without torch or TRL (the run config validates `training.loss.variant` with
it); the tensor math of every variant is in `trainer_service.training.losses`, the trainer that runs it in
`trainer_service.training.variant_loss`, and docs/losses.md states each formula.

API for the config builder::

    from trainer_service.config.variants import grpo_config_overrides
    from trainer_service.training.variant_trainer import make_variant_trainer

    overrides = grpo_config_overrides(
        loss.variant, grpo_delta=loss.delta, epsilon=loss.epsilon,
        epsilon_high=loss.epsilon_high, params=loss.params,
    )   # raises ConfigError(key=...) on a bad combination
    args = GRPOConfig(..., beta=loss.beta, **overrides)
    trainer = make_variant_trainer(loss.variant)(
        model=..., args=args, reward_funcs=..., train_dataset=..., rollout_func=..., peft_config=...,
    )

`grpo_config_overrides` sets these `GRPOConfig` fields (always all of the first five):

    variant     loss_type  importance_sampling_level  delta (from loss.delta)         loss.params keys
    grpo        grpo       token                      INTELLECT-2 cap > 1+ε_high | -  -
    dr_grpo     dr_grpo    token                      cap | -                         -
    dapo        dapo       token                      cap | -                         -
    bnpo        bnpo       token                      cap | -                         -
    luspo       luspo      sequence                   cap | -                         -
    gspo        grpo       sequence                   cap | -                         -
    cispo       cispo      token                      - (rejected)                    -
    sapo        sapo       token                      -                               sapo_temperature_pos/neg
    vespo       vespo      token                      -                               vespo_k/lambda_pos/neg
    two_sided   dapo       token                      half-width δ ∈ (0, 1] REQUIRED  -
    rft         bnpo       token                      -                               -
    gpg         dapo       token                      -                               -

plus `epsilon`, `epsilon_high` as given, and `vllm_importance_sampling_mode="token_truncate"` for vespo (it
folds a per-token sampler ratio into its weight). "standard" is an alias of "dapo", TRL 1.16's default
`loss_type`.
For the extra variants (two_sided, rft, gpg) TRL's own loss never runs, so `loss_type` only picks TRL's
construction-time warnings and `delta` carries two_sided's δ with its own meaning (see `losses.two_sided`).
cispo needs `epsilon_high` > 1 (TRL clamps its weight there; unset it would be `epsilon`, 0.2, which only
scales the gradient down); ScaleRL uses 5.0. gspo takes its paper's clip range (`PAPER_CLIP_RANGES`) when
the run config sets no ε.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from grpo_runtime.config import ConfigError


class Aggregation(StrEnum):
    """How the per-token loss ℓ becomes a scalar (before gradient-accumulation scaling).

    SEQUENCE_MEAN  mean_i [Σ_t M ℓ / max(Σ_t M, 1)]            grpo, sapo, gspo (each sequence weighs 1)
    TOKEN_MEAN     Σ M ℓ / max(Σ M, 1) over the micro-batch    bnpo, rft
    FIXED_LENGTH   Σ M ℓ / (B · max_completion_length)         dr_grpo (no length bias)
    GLOBAL_TOKEN   Σ M ℓ / N                                   dapo, cispo, vespo, two_sided, gpg
                   (N = active tokens of the accumulation window on this process)
    SEQUENCE_SUM   mean_i [Σ_t M ℓ]                            luspo (length-weighted sequence objective)
    """

    SEQUENCE_MEAN = "sequence_mean"
    TOKEN_MEAN = "token_mean"
    FIXED_LENGTH = "fixed_length"
    GLOBAL_TOKEN = "global_token"
    SEQUENCE_SUM = "sequence_sum"


@dataclass(frozen=True)
class VariantSpec:
    """A selectable loss variant, as configuration (torch-free).

    aggregation: how ℓ is reduced (the policy term is `training.losses.POLICY_TERMS[name]`). trl_loss_type:
    the `GRPOConfig.loss_type` that names the same objective in TRL (for the extra variants, the TRL type
    whose aggregation and warnings are closest; TRL's own loss never runs for them).
    importance_sampling_level: the level the variant requires, or None when both work (taken from the config).
    delta_role: what `delta` means for it ("cap" = TRL/INTELLECT-2 upper cap > 1 + ε_high, "half_width" =
    two_sided's δ ∈ (0, 1], None = not accepted). clip_metrics: "ppo" (TRL's clip_ratio/*), "cispo"
    (cispo_clip_ratio) or None. folds_rollout_is_ratio: the policy term consumes the rollout IS ratio itself
    instead of having the loss multiplied by it.
    """

    aggregation: Aggregation
    trl_loss_type: str
    importance_sampling_level: str | None
    delta_role: str | None
    clip_metrics: str | None
    description: str
    trl_native: bool = True
    folds_rollout_is_ratio: bool = False


VARIANT_SPECS: dict[str, VariantSpec] = {
    "grpo": VariantSpec(
        Aggregation.SEQUENCE_MEAN, "grpo", None, "cap", "ppo",
        "GRPO (arXiv:2402.03300): clipped surrogate, per-sequence length-normalised mean",
    ),
    "dr_grpo": VariantSpec(
        Aggregation.FIXED_LENGTH, "dr_grpo", None, "cap", "ppo",
        "Dr. GRPO, 'GRPO done right' (arXiv:2503.20783): clipped surrogate, Σ/(B·max_completion_length)",
    ),
    "dapo": VariantSpec(
        Aggregation.GLOBAL_TOKEN, "dapo", None, "cap", "ppo",
        "DAPO (arXiv:2503.14476): clipped surrogate (clip-higher via epsilon_high), global token mean",
    ),
    "bnpo": VariantSpec(
        Aggregation.TOKEN_MEAN, "bnpo", None, "cap", "ppo",
        "bnpo (TRL): clipped surrogate, micro-batch token mean (= grpo when one completion per micro-batch)",
    ),
    "luspo": VariantSpec(
        Aggregation.SEQUENCE_SUM, "luspo", "sequence", "cap", "ppo",
        "LUSPO (arXiv:2602.05261): sequence-level clipped surrogate weighted by length, mean over sequences",
    ),
    "gspo": VariantSpec(
        Aggregation.SEQUENCE_MEAN, "grpo", "sequence", "cap", "ppo",
        "GSPO (arXiv:2507.18071): sequence-level geometric-mean ratio, clipped, per-sequence mean",
    ),
    "cispo": VariantSpec(
        Aggregation.GLOBAL_TOKEN, "cispo", None, None, "cispo",
        "CISPO (arXiv:2506.13585): stop-grad clipped IS weight × A × logp, global token mean",
    ),
    "sapo": VariantSpec(
        Aggregation.SEQUENCE_MEAN, "sapo", None, None, None,
        "SAPO (arXiv:2511.20347): sigmoid-gated soft clip, per-sequence mean",
    ),
    "vespo": VariantSpec(
        Aggregation.GLOBAL_TOKEN, "vespo", "token", None, None,
        "VESPO: gamma-weighted sequence-level REINFORCE, global token mean",
        folds_rollout_is_ratio=True,
    ),
    "two_sided": VariantSpec(
        Aggregation.GLOBAL_TOKEN, "dapo", "token", "half_width", "ppo",
        "two-sided: symmetric clip [1−δ, 1+δ] (delta ∈ (0, 1]), global token mean",
        trl_native=False,
    ),
    "rft": VariantSpec(
        Aggregation.TOKEN_MEAN, "bnpo", "token", None, None,
        "RFT (arXiv:2308.01825): NLL on positive-advantage completions, token mean over them",
        trl_native=False,
    ),
    "gpg": VariantSpec(
        Aggregation.GLOBAL_TOKEN, "dapo", "token", None, None,
        "GPG (arXiv:2504.02546): plain group policy gradient −α·A·logp, no clip, global token mean",
        trl_native=False,
    ),
}  # fmt: skip

ALIASES: dict[str, str] = {"standard": "dapo"}

VARIANTS: dict[str, str] = {name: spec.description for name, spec in VARIANT_SPECS.items()}

# Parameters a variant takes from `training.loss.params`; each is a GRPOConfig field of the same name.
# Clip range (ε_low, ε_high) a variant's paper uses, taken when the config sets neither `epsilon` nor
# `epsilon_high`: GSPO's sequence ratio stays within ~1e-3 of 1, so TRL's token-level 0.2 never clips it
# (GSPO paper, §5.1; TRL paper_index.md recipe).
PAPER_CLIP_RANGES: dict[str, tuple[float, float]] = {"gspo": (3e-4, 4e-4)}

VARIANT_PARAM_KEYS: dict[str, tuple[str, ...]] = {
    "sapo": ("sapo_temperature_pos", "sapo_temperature_neg"),
    "vespo": ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"),
}


def normalize_variant(variant: str) -> str:
    """Lower-cased canonical name; raises ConfigError(key="variant") for an unknown one."""
    if not isinstance(variant, str):
        raise ConfigError(f"must be a string, got {type(variant).__name__}", key="variant")
    name = variant.strip().lower()
    name = ALIASES.get(name, name)
    if name not in VARIANT_SPECS:
        choices = ", ".join(sorted([*VARIANT_SPECS, *ALIASES]))
        raise ConfigError(f"unknown variant {variant!r}; choose one of: {choices}", key="variant")
    return name


def _finite_number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"must be a finite number, got {value!r}", key=key)
    return float(value)


def validate_variant_params(
    variant: str,
    *,
    grpo_delta: float | None = None,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    params: Mapping[str, Any] | None = None,
) -> str:
    """Check the variant's parameters; return the canonical variant name.

    Rules (errors are `ConfigError` naming the key): cispo needs epsilon_high > 1; two_sided needs
    grpo_delta ∈ (0, 1]; the clipped TRL variants (grpo, dr_grpo, dapo, bnpo, luspo, gspo) accept grpo_delta
    only as INTELLECT-2's ratio cap, > 1 + epsilon_high; the others reject it. `params` may only hold the
    keys in `VARIANT_PARAM_KEYS[variant]`, each a finite number > 0 (vespo's k may be 0).
    """
    name = normalize_variant(variant)
    spec = VARIANT_SPECS[name]
    epsilon = _finite_number(epsilon, "epsilon")
    if epsilon <= 0:
        raise ConfigError(f"must be > 0, got {epsilon}", key="epsilon")
    eps_high = epsilon if epsilon_high is None else _finite_number(epsilon_high, "epsilon_high")
    if eps_high <= 0:
        raise ConfigError(f"must be > 0, got {eps_high}", key="epsilon_high")
    if grpo_delta is not None:
        delta = _finite_number(grpo_delta, "delta")
        if spec.delta_role is None:
            raise ConfigError(f"is not used by variant {name!r}; remove it", key="delta")
        if spec.delta_role == "half_width" and not 0.0 < delta <= 1.0:
            raise ConfigError(
                f"two_sided clips the ratio to [1 − δ, 1 + δ], so δ must be in (0, 1]; got {delta}",
                key="delta",
            )
        if spec.delta_role == "cap" and delta <= 1.0 + eps_high:
            raise ConfigError(
                f"for {name!r} it is INTELLECT-2's upper cap on the ratio and must be > 1 + epsilon_high "
                f"({1.0 + eps_high}); got {delta} (a symmetric clip is variant 'two_sided')",
                key="delta",
            )
    elif spec.delta_role == "half_width":
        raise ConfigError("two_sided needs delta in (0, 1]", key="delta")
    if name == "cispo" and eps_high <= 1.0:
        # CISPO's weight is sg(min(r, ε_max)): on-policy r = 1, so ε_max <= 1 clamps every token's weight to
        # ε_max, which only scales the whole gradient down (ScaleRL: ε_max = 5.0).
        raise ConfigError(
            f"is {eps_high}{' (unset: epsilon)' if epsilon_high is None else ''}, but cispo clips its "
            "importance weight at this value, and a cap <= 1 only scales the gradient down (the on-policy "
            "weight is 1); set it > 1, e.g. 5.0 as ScaleRL",
            key="epsilon_high",
        )
    allowed = VARIANT_PARAM_KEYS.get(name, ())
    for key, value in (params or {}).items():
        if key not in allowed:
            hint = f"allowed: {', '.join(allowed)}" if allowed else "this variant takes none"
            raise ConfigError(f"unknown parameter for variant {name!r} ({hint})", key=f"params.{key}")
        number = _finite_number(value, f"params.{key}")
        minimum_ok = number >= 0 if key.startswith("vespo_k") else number > 0
        if not minimum_ok:
            raise ConfigError(f"must be > 0, got {number}", key=f"params.{key}")
    return name


def grpo_config_overrides(
    variant: str,
    *,
    grpo_delta: float | None = None,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`GRPOConfig` keyword arguments that make TRL's configuration agree with `variant` (table in the module
    docstring). Validates first (`validate_variant_params`)."""
    name = validate_variant_params(
        variant, grpo_delta=grpo_delta, epsilon=epsilon, epsilon_high=epsilon_high, params=params
    )
    spec = VARIANT_SPECS[name]
    overrides: dict[str, Any] = {
        "loss_type": spec.trl_loss_type,
        "importance_sampling_level": spec.importance_sampling_level or "token",
        "delta": None if grpo_delta is None else float(grpo_delta),
        "epsilon": float(epsilon),
        "epsilon_high": None if epsilon_high is None else float(epsilon_high),
    }
    if name == "vespo":
        # VESPO folds the sampler IS ratio into its sequence weight token by token (TRL requires token_*).
        overrides["vllm_importance_sampling_mode"] = "token_truncate"
    overrides.update({key: float(value) for key, value in (params or {}).items()})
    return overrides
