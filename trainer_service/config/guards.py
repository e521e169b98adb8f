"""The ``training.guards`` block of the run config: soup-cli's training guards, each with an action.

Every guard is off unless its block is present. ``action``: ``warn`` (record it in ``guards.jsonl`` and the
run's events), ``halt`` (stop the run after a checkpoint), ``rollback`` (restore the newest checkpoint saved
at a step where no guard fired, then lower ``lr`` / raise β as ``rollback`` says; after
``rollback.max_attempts`` rollbacks a firing rollback guard halts instead). The detection logic is
:mod:`trainer_service.training.guards`; torch-free, like the rest of ``config/``.

Example::

    guards:
      echo_trap: {action: warn, ngram: 4, max_repeat_ratio: 0.5, max_fraction: 0.5}
      reward_hacking: {action: warn, window: 10, max_length_growth: 0.5}
      loss_watchdog: {action: rollback, threshold: 10.0, grad_norm_threshold: 100.0, patience: 2}
      eval_gate: {action: halt, metric: accuracy_greedy, max_drop: 0.05}
      rollback: {max_attempts: 2, lr_factor: 0.5}
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

GuardAction = Literal["warn", "halt", "rollback"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class EchoTrapConfig(_Strict):
    """Completions that repeat themselves: a completion echoes when the share of its token n-grams that
    repeat an earlier n-gram of it, ``1 − distinct/total``, reaches ``max_repeat_ratio``; the guard fires
    when echoing completions make up at least ``max_fraction`` of the step's batch."""

    action: GuardAction = "warn"
    ngram: int = Field(default=4, ge=1, le=64)
    max_repeat_ratio: float = Field(default=0.5, ge=0.0, le=1.0)
    max_fraction: float = Field(default=0.5, ge=0.0, le=1.0)


class RewardHackingConfig(_Strict):
    """Signals that the policy games the reward, over the last ``window`` steps (each None = off):

    - ``max_length_growth``: mean completion length (TRL ``completions/mean_length``) of the window's last
      step over its first, minus 1 (0.5 = grew by half);
    - ``max_term_divergence``: with several reward terms, the largest rise of one term's mean minus the
      largest fall of another over the window (one term bought at another's cost);
    - ``max_frac_zero_std``: TRL's ``frac_reward_zero_std`` (groups whose rewards are all equal) of the step.
    """

    action: GuardAction = "warn"
    window: int = Field(default=10, ge=2)
    max_length_growth: float | None = Field(default=0.5, ge=0.0)
    max_term_divergence: float | None = Field(default=None, ge=0.0)
    max_frac_zero_std: float | None = Field(default=None, ge=0.0, le=1.0)


class LossWatchdogConfig(_Strict):
    """The loss: a NaN or infinite loss (or gradient norm) fires at once; ``|loss| > threshold`` fires after
    ``patience`` consecutive steps, and so does ``grad_norm > grad_norm_threshold`` (None = off). TRL logs
    ``grad_norm`` before clipping (``training.max_grad_norm``), so a clipped spike still counts."""

    action: GuardAction = "halt"
    threshold: float = Field(default=10.0, ge=0.0)
    grad_norm_threshold: float | None = Field(default=None, gt=0.0)
    patience: int = Field(default=1, ge=1)


class EvalGateConfig(_Strict):
    """Held-out regression (needs ``training.eval_steps``): fires when an evaluation after step 0 has
    ``metric`` below the baseline minus ``max_drop``. The baseline is the step-0 evaluation, or the value of
    ``metric`` in ``baseline_file`` (a JSON object, e.g. an ``eval_metrics.jsonl`` row of an earlier run)."""

    action: GuardAction = "warn"
    metric: str = "accuracy_greedy"
    max_drop: float = Field(default=0.0, ge=0.0)
    baseline_file: str | None = None


class RollbackConfig(_Strict):
    """What a rollback changes: ``lr_factor`` multiplies the learning rate, ``beta_factor`` the KL
    coefficient β (needs ``grpo_beta > 0``: at 0 there is no reference model); ``max_attempts`` bounds the
    rollbacks of a run."""

    max_attempts: int = Field(default=2, ge=1, le=100)
    lr_factor: float = Field(default=0.5, gt=0.0, le=1.0)
    beta_factor: float = Field(default=1.0, ge=1.0, le=100.0)


class GuardsConfig(_Strict):
    echo_trap: EchoTrapConfig | None = None
    reward_hacking: RewardHackingConfig | None = None
    loss_watchdog: LossWatchdogConfig | None = None
    eval_gate: EvalGateConfig | None = None
    rollback: RollbackConfig = Field(default_factory=RollbackConfig)

    def actions(self) -> dict[str, GuardAction]:
        """The configured guards by name (``echo_trap``, ...) and their actions."""
        names = ("echo_trap", "reward_hacking", "loss_watchdog", "eval_gate")
        return {name: getattr(self, name).action for name in names if getattr(self, name) is not None}
